import functools
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from collectors import EnvError, RolloutCollector, WorkerDiedError, env_seeds
from tests import factories as f
from tests.messages import not_names, raises

BACKENDS = ["serial", "sync", "async"]


def collect_all(env_fns, policy_factory, backend, rollouts=3, num_steps=50, seed=7, **kw):
    with RolloutCollector(env_fns, policy_factory(), backend=backend, num_steps=num_steps, seed=seed, **kw) as c:
        out = []
        for _ in range(rollouts):
            rollout = c.collect()
            out.append((rollout.batch, rollout.next_observations.clone(), list(rollout.episodes)))
        return out


def assert_identical(a, b):
    for (ba, la, ea), (bb, lb, eb) in zip(a, b, strict=True):
        assert set(ba.keys()) == set(bb.keys())
        for k in ba.keys():
            assert torch.equal(ba[k], bb[k]), k
        assert torch.equal(la, lb)
        assert ea == eb


@pytest.mark.parametrize("name, env_fns, nvec", [
    ("cartpole", [f.cartpole] * 5, 2),
    ("vr_edge", [f.vr_edge] * 5, [6, 6, 6]),
    ("vr_edge_native_batch", [f.vr_edge_batch, f.vr_edge, functools.partial(f.vr_edge_batch, 2)], [6, 6, 6]),
])
def test_backends_return_identical_batches_over_consecutive_rollouts(name, env_fns, nvec):
    results = {b: collect_all(env_fns, lambda: f.RandomPolicy(nvec), b, num_workers=1) for b in BACKENDS}
    assert sum(len(e) for _, _, e in results["serial"]) > 0, "no episode ended; the test would not check autoreset"
    assert_identical(results["serial"], results["sync"])
    assert_identical(results["serial"], results["async"])


def test_async_without_main_share_matches_serial():
    env_fns = [f.vr_edge] * 4
    a = collect_all(env_fns, lambda: f.RandomPolicy([6, 6, 6]), "serial", rollouts=2)
    b = collect_all(env_fns, lambda: f.RandomPolicy([6, 6, 6]), "async", rollouts=2, num_workers=2, main_share=False)
    assert_identical(a, b)


def test_batch_layout_and_autoreset_semantics():
    (batch, last, episodes), = collect_all([f.vr_edge] * 3, lambda: f.RandomPolicy([6, 6, 6]), "sync", rollouts=1,
                                           num_steps=120)
    t, n = 120, 3
    assert batch.batch_size == torch.Size([t, n])
    assert batch["observations"].shape == (t, n, 7 * 3 + 5) and batch["observations"].dtype == torch.float32
    assert batch["actions"].shape == (t, n, 3) and batch["actions"].dtype == torch.int64
    assert batch["rewards"].dtype == torch.float32 and batch["terminated"].dtype == torch.bool
    assert set(batch.keys()) >= {"log_probs", "values", "final_observations", "final_observation_mask"}
    mask = batch["final_observation_mask"]
    assert torch.equal(mask, batch["terminated"] | batch["truncated"])
    assert not (batch["terminated"] & batch["truncated"]).any()
    assert mask.any()
    # the first observation of a new episode shows episode progress 0; the final one does not
    progress = -1
    ts, envs_ = torch.nonzero(mask[:-1], as_tuple=True)
    for ti, ni in zip(ts.tolist(), envs_.tolist()):
        assert batch["observations"][ti + 1, ni, progress] == 0
        assert batch["final_observations"][ti, ni, progress] > 0
    assert last.shape == (n, 7 * 3 + 5)
    assert len(episodes) == int(mask.sum())
    assert all({"return", "length", "env", "quality", "stall_s", "switches"} <= set(e) for e in episodes)


def test_final_observation_is_the_true_last_observation():
    # replay one env by hand with the same seed and actions
    (batch, _, _), = collect_all([f.cartpole], lambda: f.RandomPolicy(2), "sync", rollouts=1, num_steps=200, seed=3)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=env_seeds(3, 1)[0])
    for t in range(200):
        np.testing.assert_array_equal(batch["observations"][t, 0].numpy(), obs)
        obs, r, term, trunc, _ = env.step(int(batch["actions"][t, 0]))
        assert (bool(batch["terminated"][t, 0]), bool(batch["truncated"][t, 0])) == (term, trunc)
        if term or trunc:
            np.testing.assert_array_equal(batch["final_observations"][t, 0].numpy(), obs)
            obs, _ = env.reset()
    assert batch["terminated"].any()


def test_consecutive_rollouts_continue_episodes():
    with RolloutCollector([f.vr_edge] * 2, f.RandomPolicy([6, 6, 6]), backend="sync", num_steps=10, seed=1) as c:
        first = c.collect()
        last = first.next_observations.clone()
        second = c.collect().batch
    assert torch.equal(second["observations"][0], last)
    assert not torch.equal(first.batch["observations"][0], second["observations"][0])


def test_seeds_come_from_seed_sequence_and_neighbouring_runs_share_none():
    a, b = set(env_seeds(1, 64)), set(env_seeds(2, 64))
    assert len(a) == 64 and not a & b
    assert env_seeds(1, 3) == [int(c.generate_state(1)[0]) for c in np.random.SeedSequence(1).spawn(3)]


def test_a_batched_env_reset_with_an_integer_seeds_its_envs_as_a_collector_does():
    """One derivation: ``reset(seed=s)`` of a natively batched env gives its envs ``env_seeds(s, N)``."""
    import envs
    first, _ = envs.VREdgeVectorEnv(5, num_users=2).reset(seed=11)
    np.testing.assert_array_equal(first, envs.VREdgeVectorEnv(5, num_users=2).reset(seed=env_seeds(11, 5))[0])
    with RolloutCollector([functools.partial(envs.VREdgeVectorEnv, 5, num_users=2)], f.RandomPolicy([6, 6]),
                          num_steps=1, seed=11) as c:
        np.testing.assert_array_equal(c.collect().batch["observations"][0].numpy(), first)


def test_episode_returns_are_sums_of_rewards():
    with RolloutCollector([f.cartpole] * 2, f.RandomPolicy(2), backend="sync", num_steps=100, seed=0) as c:
        rollout = c.collect()
        batch, episodes = rollout.batch, rollout.episodes
    # first episode of env 0 starts at t=0 in the first rollout
    end = int(torch.nonzero(batch["final_observation_mask"][:, 0])[0])
    first = next(e for e in episodes if e["env"] == 0)
    assert first["length"] == end + 1
    assert first["return"] == pytest.approx(float(batch["rewards"][: end + 1, 0].sum()))


class ArgmaxPolicy(torch.nn.Module):
    """A deterministic module policy whose actions follow its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, obs):
        return self.net(obs).argmax(-1)


def test_update_policy_loads_a_state_dict_swaps_a_callable_and_counts_versions():
    acting, learner = ArgmaxPolicy(), ArgmaxPolicy()
    with torch.no_grad():
        learner.net.bias.copy_(torch.tensor([0.0, 1e6]))  # the learner's weights always pick action 1
        acting.net.bias.copy_(torch.tensor([1e6, 0.0]))  # the acting copy's always pick action 0
    with RolloutCollector([f.cartpole], acting, backend="sync", num_steps=4, seed=0) as c:
        first = c.collect()
        assert (first.batch["actions"] == 0).all() and first.policy_version == 0
        c.update_policy(learner.state_dict())
        second = c.collect()
        assert (second.batch["actions"] == 1).all() and second.policy_version == c.policy_version == 1
        assert c.policy is acting  # weights were copied in, the module kept
        c.update_policy(lambda obs: torch.zeros(len(obs), dtype=torch.int64))
        assert (c.collect().batch["actions"] == 0).all() and c.policy_version == 2
        with raises(TypeError, "state_dict", "torch.nn.Module"):  # what it got, what the policy is not
            c.update_policy(learner.state_dict())
        with raises(TypeError, "update_policy", "int"):
            c.update_policy(3)
        assert c.policy_version == 2  # refused updates count nothing


@pytest.mark.parametrize("kwargs, exc, named", [
    (dict(env_fns=[]), ValueError, ["env_fns"]),
    (dict(num_steps=0), ValueError, ["num_steps", "0", "1"]),
    (dict(backend="threads"), ValueError, ["threads", "sync"]),  # and the backends there are
    (dict(backend="async", num_workers=0), ValueError, ["num_workers", "0", "[1, 1]"]),  # the range, computed
    (dict(backend="async", num_workers=5), ValueError, ["num_workers", "5", "[1, 1]"]),
    (dict(env_fns=[f.cartpole, f.pendulum]), ValueError, ["observation", "(3,)", "(4,)"]),  # the two spaces
    (dict(env_fns=[gym.make("CartPole-v1")]), TypeError, ["env_fns[0]", "TimeLimit"]),
    (dict(env_fns=[lambda: 3]), TypeError, ["int", "gymnasium.Env"]),
    (dict(seed=-1), ValueError, ["seed", "-1"]),
])
def test_bad_arguments_raise_clear_errors(kwargs, exc, named):
    args = dict(env_fns=[f.cartpole] * 2, policy=lambda o: torch.zeros(len(o), dtype=torch.int64), num_steps=4)
    args.update(kwargs)
    with raises(exc, *named):
        RolloutCollector(**args)


def test_non_picklable_factory_is_rejected_before_workers_start():
    with raises(TypeError, "env factory 0", "functools.partial"):  # which factory, and the way out
        RolloutCollector([lambda: gym.make("CartPole-v1")] * 2, lambda o: o, backend="async", num_workers=1)


@pytest.mark.parametrize("policy, exc, named", [
    (lambda o: torch.zeros(len(o) + 1, dtype=torch.int64), ValueError, ["(3,)", "(2,)"]),  # got, expected
    (lambda o: torch.zeros(len(o)), TypeError, ["torch.float32", "Discrete(2)"]),
    (lambda o: {"act": torch.zeros(len(o))}, ValueError, ["'action'", "['act']"]),  # missing, and the keys there
    (lambda o: {"action": torch.zeros(len(o), dtype=torch.int64), "value": torch.zeros(len(o), 2)},
     ValueError, ["value", "(2, 2)", "(2,)"]),
])
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_bad_policy_output_raises_and_leaves_no_workers(policy, exc, named, backend):
    import multiprocessing as mp
    c = RolloutCollector([f.cartpole] * 2, policy, backend=backend, num_steps=4, num_workers=1)
    with raises(exc, *named):
        c.collect()
    assert not mp.active_children()


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_exception_names_the_env_and_keeps_the_traceback(backend):
    import multiprocessing as mp
    env_fns = [f.cartpole, f.cartpole, f.exploding, f.cartpole]
    with RolloutCollector(env_fns, f.RandomPolicy(2), backend=backend, num_steps=20, num_workers=1) as c:
        with raises(EnvError, "env 2", "simulator exploded", lines=None) as info:  # the env's own error, traceback
            c.collect()
    assert info.value.env_index == 2
    assert not mp.active_children()


def test_a_worker_killed_while_it_builds_its_envs_is_named_in_words():
    import multiprocessing as mp
    with raises(WorkerDiedError, "worker 0", "factories 1", "start", "SIGKILL", "out-of-memory"):  # who, when, how
        RolloutCollector([f.cartpole, f.killed_while_built], f.RandomPolicy(2), backend="async", num_workers=1)
    assert not mp.active_children()


def test_dead_worker_is_detected_quickly_and_nothing_is_left_behind():
    import multiprocessing as mp
    c = RolloutCollector([f.cartpole, f.suicidal], f.RandomPolicy(2), backend="async", num_steps=20, num_workers=1)
    start = time.monotonic()
    with raises(WorkerDiedError, "exit code 13"):
        c.collect()
    assert time.monotonic() - start < 10
    assert not mp.active_children()


@pytest.mark.parametrize("then, sent", [pytest.param("collect", "step", marks=pytest.mark.slow),
                                        ("get_state", "get_states"),
                                        pytest.param("set_state", "reset", marks=pytest.mark.slow)])
def test_a_worker_killed_between_rollouts_is_named_by_the_next_command(then, sent):
    """Killed while the learner updates (most of an iteration): the next command's send finds its pipe closed
    and says which worker died, as a reply would (it was a ``BrokenPipeError`` traceback)."""
    import multiprocessing as mp
    c = RolloutCollector([f.cartpole] * 4, f.RandomPolicy(2), backend="async", num_steps=8, num_workers=2)
    c.collect()
    state = c.get_state()
    victim = c.stepper.procs[1]
    victim.kill()
    victim.join(timeout=10)
    with raises(WorkerDiedError, "worker 1", f"pid {victim.pid}", sent, "SIGKILL", "out-of-memory"):
        c.collect() if then == "collect" else c.get_state() if then == "get_state" else c.set_state(state)
    assert not mp.active_children()


def test_keyboard_interrupt_during_collect_closes_workers():
    import multiprocessing as mp

    def interrupting(obs, calls=[0]):  # noqa: B006 - a counter shared across calls
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return torch.zeros(len(obs), dtype=torch.int64)

    c = RolloutCollector([f.cartpole] * 2, interrupting, backend="async", num_steps=20, num_workers=1)
    with pytest.raises(KeyboardInterrupt):
        c.collect()
    assert not mp.active_children()


def test_continuous_actions_and_log_prob_free_policy():
    policy = lambda o: torch.zeros((len(o), 1))  # noqa: E731
    with RolloutCollector([f.pendulum] * 2, policy, backend="sync", num_steps=5) as c:
        batch = c.collect().batch
    assert batch["actions"].shape == (5, 2, 1) and "log_probs" not in batch.keys()


def test_vector_env_with_next_step_autoreset_is_rejected():
    def make_vec():
        return gym.vector.SyncVectorEnv([f.cartpole])
    with raises(ValueError, "NEXT_STEP", "SAME_STEP"):  # the mode it has, the one to pass
        RolloutCollector([make_vec], lambda o: o, backend="sync")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_host_to_device_copy_per_rollout():
    from benchmarks.device_check import count_h2d_copies
    assert count_h2d_copies(num_envs=8, num_steps=32) == 1


def test_interpreter_exit_without_close_leaves_no_workers(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "leaky.py"
    script.write_text(
        "import torch\n"
        "from collectors import RolloutCollector\n"
        "from tests import factories as f\n"
        "if __name__ == '__main__':\n"
        "    c = RolloutCollector([f.cartpole] * 2, f.RandomPolicy(2), backend='async', num_steps=4, num_workers=1)\n"
        "    c.collect()\n"
        "    print(' '.join(str(p.pid) for p in c.stepper.procs), flush=True)\n"
        "    raise SystemExit(0)  # no close(): the interpreter's exit must clean up\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert pids
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead, only not yet reaped by init
        return fh.read().split()[2] != "Z"


def test_missing_ray_says_how_to_install(monkeypatch):
    import sys

    from collectors.backends import ray_
    monkeypatch.setitem(sys.modules, "ray", None)
    with raises(ImportError, "pip install -e '.[ray]'"):
        ray_.require_ray()


def test_local_rollouts_carry_the_current_policy_version_and_cover_all_envs():
    with RolloutCollector([f.cartpole] * 3, f.RandomPolicy(2), backend="sync", num_steps=4) as c:
        for expected in (0, 1, 2, 3):
            rollout = c.collect()
            assert rollout.policy_version == c.policy_version == expected and rollout.envs == slice(0, 3)
            c.update_policy(f.RandomPolicy(2))


def test_make_collector_picks_the_class_and_refuses_options_a_backend_lacks():
    from collectors import make_collector
    with make_collector([f.cartpole] * 2, f.RandomPolicy(2), backend="serial", num_steps=3) as c:
        assert isinstance(c, RolloutCollector) and c.collect().batch.batch_size == torch.Size([3, 2])
    for option in ({"keep_collecting": True}, {"ray_address": "auto"}, {"envs_per_worker": 2}):
        with raises(ValueError, "backend='sync'", next(iter(option)), "backend='ray'"):
            make_collector([f.cartpole] * 2, f.RandomPolicy(2), backend="sync", **option)
    with raises(ValueError, "'threads'"):
        make_collector([f.cartpole], f.RandomPolicy(2), backend="threads")
    with raises(ValueError, "backend='ray'", "make_collector"):  # the way to it
        RolloutCollector([f.cartpole], f.RandomPolicy(2), backend="ray")


def test_the_local_collector_does_not_import_ray_plumbing():
    """RolloutCollector knows nothing of Ray: importing the package pulls in no Ray module."""
    import subprocess
    import sys
    code = ("import sys, collectors, trainer.train; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'collectors.ray', "
            "'collectors.backends.ray_'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_typo_is_refused_without_a_ray_hint():
    from collectors import make_collector
    with raises(ValueError, "backend='sync'", "num_stpes", "num_steps") as info:  # and the options it has
        make_collector([f.cartpole], f.RandomPolicy(2), backend="sync", num_stpes=4)
    not_names(str(info.value), "backend='ray'")
