"""The device backend: a torch env stepped next to the policy, returning what the sync backend returns."""

import functools

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import envs
from collectors import DeviceCollector, RolloutCollector, make_collector
from tests import factories as f
from tests.messages import raises

ENV = {"num_users": 3, "max_steps": 12, "abandon_stall_s": 2.0}  # short episodes: both kinds of ends occur
N, T = 6, 40


def both(policy_fn, seed=3, rollouts=2):
    """Rollouts of the sync and the device backend over the same envs, seeds and (fresh, equal) policies."""
    out = {}
    for backend, env_cls in (("sync", envs.VREdgeVectorEnv), ("device", envs.VREdgeTorchEnv)):
        with make_collector([functools.partial(env_cls, N, **ENV)], policy_fn(), backend=backend, num_steps=T,
                            seed=seed) as c:
            out[backend] = [c.collect() for _ in range(rollouts)], c.get_state()
    return out


def assert_rollouts_match(a, b):
    """Float observations and returns to float64 tolerance (torch's exp/log/cos may differ from NumPy's in the
    last bit, which can move a float32 observation by one step); everything discrete exactly."""
    assert set(a.batch.keys()) == set(b.batch.keys()) and a.batch.batch_size == b.batch.batch_size
    for k in a.batch.keys():
        x, y = a.batch[k], b.batch[k]
        assert x.dtype == y.dtype and x.shape == y.shape, k
        if x.dtype.is_floating_point:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, msg=k)
        else:
            assert torch.equal(x, y), k
    torch.testing.assert_close(a.next_observations, b.next_observations, rtol=1e-6, atol=1e-6)
    assert a.policy_version == b.policy_version and a.envs == b.envs
    assert [(e["env"], e["length"]) for e in a.episodes] == [(e["env"], e["length"]) for e in b.episodes]
    for x, y in zip(a.episodes, b.episodes):
        assert set(x) == set(y) and all(abs(x[k] - y[k]) <= 1e-5 for k in x), (x, y)


def test_device_rollouts_equal_sync_rollouts_with_a_greedy_policy():
    space = envs.VREdgeVectorEnv(1, **ENV)
    out = both(lambda: f.greedy_policy(space.single_observation_space, space.single_action_space))
    (sync, sync_state), (device, device_state) = out["sync"], out["device"]
    for a, b in zip(sync, device):
        assert_rollouts_match(a, b)
    assert sum(int(r.batch["terminated"].sum()) for r in sync) > 0
    assert sum(int(r.batch["truncated"].sum()) for r in sync) > 0
    assert sum(len(r.episodes) for r in sync) > 0
    np.testing.assert_array_equal(sync_state["steps"], device_state["steps"])
    np.testing.assert_array_equal(sync_state["episode_length"], device_state["episode_length"])


def test_device_rollouts_equal_sync_rollouts_with_the_keyed_sampling_policy():
    # keyed noise depends only on (env seed, step): sampled actions agree too (the policy rounds no differently)
    space = envs.VREdgeVectorEnv(1, **ENV)
    out = both(lambda: f.keyed_policy(space.single_observation_space, space.single_action_space))
    for a, b in zip(out["sync"][0], out["device"][0]):
        assert_rollouts_match(a, b)


def test_state_restores_into_a_device_collector_and_from_the_sync_one():
    space = envs.VREdgeVectorEnv(1, **ENV)
    policy = functools.partial(f.greedy_policy, space.single_observation_space, space.single_action_space)
    fn = functools.partial(envs.VREdgeTorchEnv, N, **ENV)
    with DeviceCollector([fn], policy(), num_steps=T, seed=5) as c:
        c.collect()
        state = c.get_state()
        want = c.collect()
    with DeviceCollector([fn], policy(), num_steps=T, seed=5) as c:
        assert c.set_state(state)
        got = c.collect()
    assert all(torch.equal(want.batch[k], got.batch[k]) for k in want.batch.keys())
    assert want.episodes == got.episodes
    with RolloutCollector([functools.partial(envs.VREdgeVectorEnv, N, **ENV)], policy(), num_steps=T, seed=5) as c:
        assert c.set_state(state)  # a device state continues on the sync backend
        assert_rollouts_match(want, c.collect())


def test_update_policy_bumps_the_version_and_loads_weights():
    space = envs.VREdgeVectorEnv(1, **ENV)
    policy = f.greedy_policy(space.single_observation_space, space.single_action_space)
    other = f.greedy_policy(space.single_observation_space, space.single_action_space, seed=9)
    with DeviceCollector([functools.partial(envs.VREdgeTorchEnv, N, **ENV)], policy, num_steps=4) as c:
        assert c.collect().policy_version == 0
        c.update_policy(other.state_dict())
        assert c.collect().policy_version == 1
        assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), other.state_dict().values()))


def test_envs_without_a_torch_implementation_are_refused():
    with raises(ValueError, "backend='device'", "CartPoleEnv", "backend='sync'"):  # the env, and the way out
        make_collector([f.cartpole], lambda o: torch.zeros(len(o), dtype=torch.int64), backend="device")
    with raises(ValueError, "backend='device'", "2 factories"):
        make_collector([functools.partial(envs.VREdgeTorchEnv, 2)] * 2, lambda o: o, backend="device")
    with raises(ValueError, "background=True", "--overlap", "serial", "sync", "async"):  # the backends it is for
        make_collector([functools.partial(envs.VREdgeTorchEnv, 2)], lambda o: o, backend="device", background=True)
    with raises(ValueError, "backend='device'", "num_workers"):
        make_collector([functools.partial(envs.VREdgeTorchEnv, 2)], lambda o: o, backend="device", num_workers=2)


def test_bad_policy_output_is_a_clear_error():
    fn = functools.partial(envs.VREdgeTorchEnv, 2, num_users=3)
    with raises(TypeError, "torch.float32", "MultiDiscrete([6 6 6])"):
        DeviceCollector([fn], lambda o: torch.zeros(len(o), 3), num_steps=2).collect()
    with raises(ValueError, "(2,)", "(2, 3)"):  # got, expected
        DeviceCollector([fn], lambda o: torch.zeros(len(o), dtype=torch.int64), num_steps=2).collect()


@pytest.mark.slow  # two compilations, ~30 s with a cold inductor cache
def test_graphed_acting_and_env_steps_hand_out_copies_and_collect_what_eager_ones_collect():
    """With "reduce-overhead" (CUDA graphs on CUDA; on the CPU the same code path without graphs) the policy's
    outputs and the env step's are copied out of the graphs' pool before the next graphed call reads them."""
    space = envs.VREdgeVectorEnv(1, **ENV)
    rollouts = []
    for compile in (False, "reduce-overhead"):
        policy = f.greedy_policy(space.single_observation_space, space.single_action_space)
        env_fn = functools.partial(envs.VREdgeTorchEnv, N, compile=compile, **ENV)
        with DeviceCollector([env_fn], policy, num_steps=T, compile_policy=compile) as c:
            rollouts.append([c.collect() for _ in range(2)])
    for eager, graphed in zip(*rollouts):
        assert_rollouts_match(eager, graphed)


def test_a_graphed_policys_outputs_are_copies():
    from collectors.base import _outputs_copied
    held = torch.arange(4.0)
    for out in (held, {"action": held}, TensorDict({"action": held}, batch_size=[4])):
        copied = _outputs_copied(lambda obs, out=out: out)(None)
        action = copied if isinstance(copied, torch.Tensor) else copied["action"]
        assert torch.equal(action, held) and action.data_ptr() != held.data_ptr()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", [False, True, "reduce-overhead"])  # eager, compiled, captured as CUDA graphs
def test_no_host_to_device_copy_per_rollout_on_cuda(compile):
    from benchmarks.device_check import count_h2d_copies
    assert count_h2d_copies(num_envs=8, num_steps=32, backend="device", compile=compile) == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_collect_what_the_eager_device_collector_collects():
    space = envs.VREdgeVectorEnv(1, **ENV)
    rollouts = []
    for compile in (False, "reduce-overhead"):
        policy = f.keyed_policy(space.single_observation_space, space.single_action_space).to("cuda")
        env_fn = functools.partial(envs.VREdgeTorchEnv, N, compile=compile, **ENV)
        with DeviceCollector([env_fn], policy, num_steps=16, device="cuda", compile_policy=compile) as c:
            rollouts.append([c.collect().batch.clone() for _ in range(3)])  # replays reuse the graphs' memory
    for eager, graphed in zip(*rollouts):
        assert (eager["actions"] == graphed["actions"]).float().mean().item() > 0.99
    first_eager, first_graphed = rollouts[0][0]["observations"][0], rollouts[1][0]["observations"][0]
    assert torch.allclose(first_eager, first_graphed, atol=1e-5)  # both start from the same reset


def test_no_numpy_array_is_made_per_step(monkeypatch):
    # counted around collect(): conversions once per rollout (the episodes at its end) are allowed, per step none
    made = []
    real_numpy, real_from_numpy, real_asarray = torch.Tensor.numpy, torch.from_numpy, np.asarray
    monkeypatch.setattr(torch.Tensor, "numpy", lambda self, *a, **k: made.append(1) or real_numpy(self, *a, **k))
    monkeypatch.setattr(torch, "from_numpy", lambda a: made.append(1) or real_from_numpy(a))
    monkeypatch.setattr(np, "asarray", lambda *a, **k: made.append(1) or real_asarray(*a, **k))
    space = envs.VREdgeVectorEnv(1, **ENV)
    counts = []
    for num_steps in (4, 32):
        policy = f.keyed_policy(space.single_observation_space, space.single_action_space)
        with DeviceCollector([functools.partial(envs.VREdgeTorchEnv, N, **ENV)], policy, num_steps=num_steps) as c:
            c.collect()  # the first rollout fixes the output layout
            made.clear()
            rollout = c.collect()
            counts.append(len(made))
    assert rollout.episodes  # episodes were read (by one copy at the end)
    assert counts[0] == counts[1], counts
