"""Double-buffered async collection (``num_splits``) and keyed policy sampling."""

import functools
import multiprocessing as mp
import time

import gymnasium as gym
import pytest
import torch

from collectors import EnvError, RolloutCollector, WorkerDiedError, env_seeds
from collectors.base import takes_noise_keys
from collectors.seeding import noise_keys
from tests import factories as f
from tests.messages import raises

ENV_DATA = ("observations", "actions", "rewards", "terminated", "truncated", "final_observations",
            "final_observation_mask")
SPACES = {"cartpole": f.cartpole, "vr_edge": f.vr_edge, "pendulum": f.pendulum}


def keyed(env_fn):
    env = env_fn()
    if isinstance(env, gym.vector.VectorEnv):
        return f.keyed_policy(env.single_observation_space, env.single_action_space)
    return f.keyed_policy(env.observation_space, env.action_space)


def run(env_fns, backend, rollouts=3, num_steps=30, seed=7, policy=None, state=None, **kw):
    """``[(batch, last observations, episodes)]`` per rollout, and the collector state at the end."""
    policy = policy or keyed(env_fns[0])
    with RolloutCollector(env_fns, policy, backend=backend, num_steps=num_steps, seed=seed, **kw) as c:
        if state is not None:
            assert c.set_state(state)
        out = []
        for _ in range(rollouts):
            r = c.collect()
            out.append((r.batch, r.next_observations.clone(), list(r.episodes)))
        return out, c.get_state()


def assert_same_env_data(a, b, exact_policy_outputs: bool) -> None:
    """Env data bit for bit; log-probs and values bit for bit or, across batch sizes, to float32 rounding."""
    for (ba, la, ea), (bb, lb, eb) in zip(a, b, strict=True):
        assert set(ba.keys()) == set(bb.keys())
        for k in ENV_DATA:
            assert torch.equal(ba[k], bb[k]), k
        assert torch.equal(la, lb) and ea == eb
        for k in ("log_probs", "values"):
            if exact_policy_outputs:
                assert torch.equal(ba[k], bb[k]), k
            else:  # matmul kernels may round differently for other batch sizes (docs/collectors.md#keyed-sampling)
                torch.testing.assert_close(ba[k], bb[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", [pytest.param("cartpole", marks=pytest.mark.slow), "vr_edge"])
def test_double_buffered_async_returns_the_sync_batch(name):
    fns = [SPACES[name]] * 8
    reference, _ = run(fns, "sync")
    assert sum(len(e) for _, _, e in reference) > 0, "no episode ended; autoreset would go unchecked"
    split, _ = run(fns, "async", num_workers=1, num_splits=2)
    assert_same_env_data(reference, split, exact_policy_outputs=False)


@pytest.mark.slow
@pytest.mark.parametrize("fns, kw", [
    ([f.vr_edge] * 8, dict(num_workers=2, main_share=False, num_splits=2)),
    ([f.vr_edge] * 9, dict(num_workers=2, num_splits=3)),
    ([f.vr_edge_batch, f.vr_edge, functools.partial(f.vr_edge_batch, 2), f.vr_edge], dict(num_workers=1,
                                                                                            num_splits=2)),
])
def test_double_buffered_async_returns_the_sync_batch_in_other_layouts(fns, kw):
    assert_same_env_data(run(fns, "sync")[0], run(fns, "async", **kw)[0], exact_policy_outputs=False)


@pytest.mark.parametrize("policy", [pytest.param("keyed", marks=pytest.mark.slow), "generator"])
def test_a_fixed_seed_and_layout_gives_the_same_batch_every_time(policy):
    fns = [f.vr_edge] * 4

    def make():
        return keyed(f.vr_edge) if policy == "keyed" else f.RandomPolicy([6, 6, 6])
    first, _ = run(fns, "async", policy=make(), num_workers=1, num_splits=2)
    second, _ = run(fns, "async", policy=make(), num_workers=1, num_splits=2)
    assert_same_env_data(first, second, exact_policy_outputs=True)


def test_an_envs_actions_do_not_depend_on_the_other_envs():
    seeds = env_seeds(3, 8)
    alone, _ = run([f.cartpole] * 4, "sync", seed=seeds[:4])
    with_others, _ = run([f.cartpole] * 8, "sync", seed=seeds)
    with_strangers, _ = run([f.cartpole] * 8, "sync", seed=seeds[:4] + env_seeds(99, 4))
    for other in (with_others, with_strangers):
        for (ba, _, _), (bb, _, _) in zip(alone, other, strict=True):
            for k in ("observations", "actions", "rewards", "terminated"):
                assert torch.equal(ba[k], bb[k][:, :4]), k


def test_keyed_policy_gets_env_keys_and_step_counters_which_resume():
    calls = []

    def policy(obs, *, noise_keys, steps):
        calls.append((noise_keys.clone(), steps.clone()))
        return torch.zeros(len(obs), dtype=torch.int64)

    assert takes_noise_keys(policy)
    _, state = run([f.cartpole] * 3, "sync", rollouts=2, num_steps=5, seed=4, policy=policy)
    keys = torch.tensor(noise_keys(env_seeds(4, 3)))
    assert all(torch.equal(k, keys) for k, _ in calls)
    assert [s.tolist() for _, s in calls] == [[t] * 3 for t in range(10)]
    assert state["steps"].tolist() == [10] * 3
    with RolloutCollector([f.cartpole] * 2, policy, num_steps=2, seed=4) as c:
        c.set_state({**c.get_state(), "steps": torch.tensor([7, 9]).numpy()})
        calls.clear()
        c.collect()
    assert [s.tolist() for _, s in calls] == [[7, 9], [8, 10]]


def test_which_policies_take_noise_keys():
    def plain(obs):
        return obs

    def keyword_only(obs, *, noise_keys, steps):
        return obs

    def catch_all(obs, **kwargs):
        return obs

    env = f.cartpole()
    assert not takes_noise_keys(plain) and not takes_noise_keys(catch_all) and not takes_noise_keys(len)
    assert takes_noise_keys(keyword_only)
    assert takes_noise_keys(keyed(f.cartpole))  # an nn.Module: its forward's signature counts
    assert not takes_noise_keys(f.greedy_policy(env.observation_space, env.action_space))
    assert not takes_noise_keys(torch.nn.Identity())


@pytest.mark.parametrize("backend_kw", [
    pytest.param(dict(backend="sync"), marks=pytest.mark.slow),
    dict(backend="async", num_workers=2, main_share=False, num_splits=2),  # another process layout, the same groups
])
def test_resume_mid_run_continues_bit_for_bit(backend_kw):
    fns = [f.vr_edge] * 4
    straight, _ = run(fns, "async", rollouts=3, num_workers=1, num_splits=2)
    _, state = run(fns, "async", rollouts=1, num_workers=1, num_splits=2)
    backend = backend_kw.pop("backend")
    resumed, _ = run(fns, backend, rollouts=2, state=state, **backend_kw)
    same_layout = backend == "async"  # the same groups: the same policy batch sizes
    assert_same_env_data(straight[1:], resumed, exact_policy_outputs=same_layout)


def test_pipelined_groups_step_in_the_workers_while_the_policy_runs(tmp_path):
    calls = []

    def slow_policy(obs):
        start = time.monotonic()
        time.sleep(0.03)
        calls.append((start, time.monotonic()))
        return torch.zeros(len(obs), dtype=torch.int64)

    def overlaps(num_splits):
        log = tmp_path / f"steps{num_splits}.txt"
        calls.clear()
        env_fn = functools.partial(f.TimedEnv, str(log), 0.03)
        with RolloutCollector([env_fn] * 4, slow_policy, backend="async", num_steps=4, num_workers=1,
                              main_share=False, num_splits=num_splits) as c:
            c.collect()
            worker = c.stepper.procs[0].pid
        steps = [(float(a), float(b)) for pid, a, b in (line.split() for line in log.read_text().splitlines())
                 if int(pid) == worker]
        assert len(steps) == 4 * 4  # 4 steps of the worker's 4 envs
        return sum(min(b, d) - max(a, c) > 0.005 for a, b in steps for c, d in calls)

    assert overlaps(1) == 0  # lockstep: the worker waits for the policy, and the policy for the worker
    assert overlaps(2) >= 4  # double-buffered: the worker steps one group while the policy acts on the other


@pytest.mark.parametrize("env_fns, exc, named", [
    ([f.cartpole, f.cartpole, f.cartpole, f.exploding], EnvError, "env 3"),  # the worker's second group
    ([f.cartpole, f.cartpole, f.exploding, f.cartpole], EnvError, "env 2"),  # this process's second group
    ([f.cartpole, f.suicidal, f.cartpole, f.cartpole], WorkerDiedError, "exit code 13"),  # worker, first group
])
def test_faults_during_a_pipelined_step_are_clear_and_leave_no_workers(env_fns, exc, named):
    start = time.monotonic()
    with RolloutCollector(env_fns, f.RandomPolicy(2), backend="async", num_steps=20, num_workers=1,
                          num_splits=2) as c:
        with raises(exc, named, lines=None):  # an env's error keeps its traceback
            c.collect()
    assert time.monotonic() - start < 30
    assert not mp.active_children()


def test_interrupt_while_a_group_is_in_flight_closes_workers():
    def interrupting(obs, calls=[0]):  # noqa: B006 - a counter shared across calls
        calls[0] += 1
        if calls[0] == 6:  # step 3, first group: step 2's second group is stepping in the worker
            raise KeyboardInterrupt
        return torch.zeros(len(obs), dtype=torch.int64)

    c = RolloutCollector([f.cartpole] * 4, interrupting, backend="async", num_steps=20, num_workers=1, num_splits=2)
    with pytest.raises(KeyboardInterrupt):
        c.collect()
    assert not mp.active_children()


@pytest.mark.parametrize("kwargs, named", [
    (dict(backend="async", num_workers=1, num_splits=0), ["num_splits", "0", "1"]),
    (dict(backend="async", num_workers=1, num_splits=3), ["num_splits", "3", "6", "4"]),  # needed, given
    (dict(backend="sync", num_splits=2), ["num_splits", "2", "backend='async'", "'sync'"]),
])
def test_bad_num_splits_is_a_clear_error(kwargs, named):
    with raises(ValueError, *named):
        RolloutCollector([f.cartpole] * 4, f.RandomPolicy(2), num_steps=4, **kwargs)
