"""The torch VR-edge env against the NumPy one: same draws and trajectories, no recompiles, device-free states."""

import numpy as np
import pytest
import torch

import envs
from envs import rng
from envs.make_traces import write_traces
from envs.vr_edge_torch import uniform_block
from tests.messages import raises

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_uniform_block_draws_numpys_bits_for_keys_and_counters_across_the_uint64_range():
    g = np.random.default_rng(0)
    keys = g.integers(0, 2**64, 256, dtype=np.uint64, endpoint=False)
    counters = np.concatenate([np.arange(128, dtype=np.uint64), g.integers(2**62, 2**64, 128, dtype=np.uint64)])
    want = rng.uniform_block(keys, counters, 21)
    got = uniform_block(torch.from_numpy(keys.view(np.int64)), torch.from_numpy(counters.view(np.int64)), 21)
    assert np.array_equal(got.numpy(), want)


def run_both(num_envs: int, steps: int, **config):
    """Step the NumPy and the torch env side by side with the same random actions; return what differs."""
    numpy_env, torch_env = envs.VREdgeVectorEnv(num_envs, **config), envs.VREdgeTorchEnv(num_envs, **config)
    o_np, _ = numpy_env.reset(seed=7)
    o_t, _ = torch_env.reset(seed=7)
    worst = {"obs": float(np.abs(o_np - o_t.numpy()).max()), "reward": 0.0, "final_obs": 0.0}
    ends = {"terminated": 0, "truncated": 0}
    actions = np.random.default_rng(1).integers(0, numpy_env.config.num_levels, (steps, num_envs,
                                                                               numpy_env.config.num_users))
    for t, a in enumerate(actions):
        o_np, r_np, term_np, trunc_np, info_np = numpy_env.step(a)
        o_t, r_t, term_t, trunc_t, info_t = torch_env.step(torch.from_numpy(a))
        assert np.array_equal(term_np, term_t.numpy()) and np.array_equal(trunc_np, trunc_t.numpy()), f"step {t}"
        worst["obs"] = max(worst["obs"], float(np.abs(o_np - o_t.numpy()).max()))
        worst["reward"] = max(worst["reward"], float(np.abs(r_np - r_t.numpy()).max()))
        done = term_np | trunc_np
        assert np.array_equal(info_t["_final_obs"].numpy(), done)
        if done.any():
            worst["final_obs"] = max(worst["final_obs"], float(np.abs(info_np["final_obs"] - info_t["final_obs"]
                                                                      .numpy()).max()))
            for k, v in info_np["final_info"]["episode_metrics"].items():
                assert np.allclose(v[done], info_t["final_info"]["episode_metrics"][k].numpy()[done], rtol=0,
                                   atol=1e-12), k
        ends["terminated"] += int(term_np.sum())
        ends["truncated"] += int(trunc_np.sum())
    state_np, state_t = numpy_env.get_state(), torch_env.get_state()
    for k in ("key", "counter"):  # the RNG positions: every draw was taken, and in the same order
        assert np.array_equal(state_t[k].numpy().view(np.uint64), state_np[k])
    # a varying cell's users: the same leaves, joins and draws per episode; the same trace files and windows
    for k in ("active", "users", "level", "trace", "trace_pos", "user_trace", "user_trace_pos"):
        if k in state_np:
            assert np.array_equal(state_t[k].numpy(), state_np[k]), k
    return worst, ends


def assert_equivalent(num_envs: int, steps: int, **config):
    worst, ends = run_both(num_envs, steps, **config)
    # rewards and observations may differ in the last bits: torch's exp/log/cos round differently from NumPy's
    assert worst["reward"] <= 1e-12 and worst["obs"] <= 1e-12 and worst["final_obs"] <= 1e-12, worst
    assert ends["terminated"] > 0 and ends["truncated"] > 0, ends  # both kinds of autoreset were exercised


def test_torch_env_follows_the_numpy_env_short():
    assert_equivalent(16, 300, max_steps=40, abandon_stall_s=3.0)


@pytest.mark.slow
def test_torch_env_follows_the_numpy_env_for_3000_steps_of_64_envs():
    assert_equivalent(64, 3_000)  # ten episodes per env: drift would show long before (10,000 steps took 64 s)


def test_torch_env_follows_the_numpy_env_on_a_cell_of_varying_users():
    """A range of users per episode with churn: the same active sets, joiners, rewards and both kinds of end."""
    assert_equivalent(16, 300, users="2-6", churn=0.1, max_steps=40, abandon_stall_s=3.0)
    assert_equivalent(8, 200, num_users=4, users=4, churn=0.2, max_steps=30, abandon_stall_s=2.0,
                      reveal_hidden_state=True)  # every slot drawn, churn only: joins at rate 1
    assert_equivalent(16, 200, users="2-6", churn="0-0.3", max_steps=40, abandon_stall_s=3.0)  # drawn per episode


def test_torch_env_follows_the_numpy_env_with_outages(trace_sets):
    """The outage chain (a Gilbert-Elliott channel over the capacity) on the same draws: the synthetic cell, a
    varying one and a recorded trace."""
    outages = dict(outage_prob=0.1, outage_end_prob=0.3, outage_depth=0.05)
    assert_equivalent(8, 200, max_steps=30, abandon_stall_s=3.0, **outages)
    assert_equivalent(8, 150, users="2-6", churn=0.1, max_steps=30, abandon_stall_s=3.0, **outages)
    assert_equivalent(8, 150, max_steps=30, abandon_stall_s=3.0, capacity_per_user_mbps=40.0,
                      capacity_trace=trace_sets[0], **outages)


def test_a_varying_cells_nominal_capacity_is_float64_on_torch_too():
    """users x capacity_per_user_mbps in float64 as NumPy computes it (an int64 tensor times a float was float32:
    33.3 Mbit/s per user drifted past 1e-12)."""
    assert_equivalent(8, 200, users="2-8", churn=0.1, capacity_per_user_mbps=33.3, max_steps=30, abandon_stall_s=3.0)


def test_observe_active_alone_masks_the_observation_alike():
    worst, _ = run_both(4, 50, num_users=3, observe_active=True, max_steps=20)
    assert worst["obs"] <= 1e-12 and envs.VREdgeTorchEnv(2, observe_active=True).active_user_feature == 7


def test_varying_cell_step_compiles_to_one_graph():
    env = envs.VREdgeTorchEnv(8, users="2-7", churn=0.1, max_steps=3)
    env._step, graphs = counting_compile(env.dynamics.step)
    env.reset(seed=0)
    for _ in range(6):
        env.step(torch.randint(0, 6, (8, 8)))
    assert len(graphs) == 1


def test_reveal_hidden_state_observations_match():
    worst, _ = run_both(4, 50, num_users=3, reveal_hidden_state=True, max_steps=20)
    assert worst["obs"] <= 1e-12


def counting_compile(fn):
    """``torch.compile(fn, fullgraph=True)`` with a backend that counts the graphs it is given (and runs them)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend), graphs


def test_step_compiles_to_one_graph_across_steps_and_resets():
    env = envs.VREdgeTorchEnv(8, max_steps=3)
    env._step, graphs = counting_compile(env.dynamics.step)
    env.reset(seed=0)
    done = 0
    for _ in range(10):
        _, _, term, trunc, _ = env.step(torch.randint(0, 6, (8, 8)))
        done += int((term | trunc).sum())
    assert done >= 8 * 3 and len(graphs) == 1


@pytest.mark.slow
def test_inductor_compiled_step_follows_the_eager_step():
    torch._dynamo.reset()
    compiled, eager = envs.VREdgeTorchEnv(8, max_steps=4, compile=True), envs.VREdgeTorchEnv(8, max_steps=4)
    compiled.reset(seed=2)
    eager.reset(seed=2)
    for _ in range(10):
        a = torch.randint(0, 6, (8, 8))
        c, e = compiled.step(a), eager.step(a)
        assert torch.equal(c[2], e[2]) and torch.equal(c[3], e[3])
        assert torch.allclose(c[0], e[0], rtol=0, atol=1e-6) and torch.allclose(c[1], e[1], rtol=0, atol=1e-12)
    assert torch.equal(compiled.get_state()["counter"], eager.get_state()["counter"])


def test_state_round_trips_through_cpu_tensors_and_from_the_numpy_env():
    env = envs.VREdgeTorchEnv(4, max_steps=10)
    env.reset(seed=3)
    actions = [torch.randint(0, 6, (4, 8), generator=torch.Generator().manual_seed(i)) for i in range(15)]
    for a in actions[:5]:
        env.step(a)
    state = env.get_state()
    assert all(v.device.type == "cpu" for v in state.values())
    later = [env.step(a)[1] for a in actions[5:]]
    restored = envs.VREdgeTorchEnv(4, max_steps=10)
    restored.set_state(state)
    assert all(torch.equal(r, restored.step(a)[1]) for r, a in zip(later, actions[5:]))
    # a NumPy env's state continues on the torch env (and back): checkpoints do not depend on the backend
    numpy_env = envs.VREdgeVectorEnv(4, max_steps=10)
    numpy_env.set_state({k: v.numpy() for k, v in state.items()})
    restored.set_state(numpy_env.get_state())
    a = actions[5].numpy()
    assert np.allclose(numpy_env.step(a)[1], restored.step(actions[5])[1].numpy(), rtol=0, atol=1e-12)


def test_unsupported_settings_are_refused_naming_the_alternative():
    with raises(ValueError, "step_cost_us", "--backend sync"):  # the argument, and the way out
        envs.VREdgeTorchEnv(2, step_cost_us=5.0)


@pytest.fixture(scope="module")
def trace_sets(tmp_path_factory):
    cell, links = tmp_path_factory.mktemp("cell"), tmp_path_factory.mktemp("links")
    write_traces(cell, files=4, seconds=25, seed=1)
    write_traces(links, files=5, seconds=17, mean_mbps=2.0, seed=2)
    return str(cell), str(links)


@pytest.mark.parametrize("which", ["cell", "users", "both", "both, varying users", "scaled cell, varying users",
                                   "cell at its median, varying users"])
def test_torch_env_follows_the_numpy_env_with_traces(trace_sets, which):
    """Recorded traces replayed from tensors: the same files and windows drawn at every reset (many per env) and
    per joiner, the same terminations, rewards within 1e-12."""
    cell, links = trace_sets
    traces = {"cell": dict(capacity_trace=cell), "users": dict(user_traces=links),
              "both": dict(capacity_trace=cell, user_traces=links, trace_split="train"),
              "both, varying users": dict(capacity_trace=cell, user_traces=links, users="2-6", churn=0.1),
              "scaled cell, varying users": dict(capacity_trace=cell, trace_scale=25.0, users="1-5", churn=0.2),
              "cell at its median, varying users": dict(capacity_trace=cell, trace_quantile=0.5, users="1-5",
                                                        churn=0.2)}
    assert_equivalent(16, 300, max_steps=30, abandon_stall_s=3.0, capacity_per_user_mbps=40.0, **traces[which])


def test_the_pensieve_set_on_the_torch_env():
    assert_equivalent(8, 200, num_users=4, max_steps=30, abandon_stall_s=3.0, capacity_per_user_mbps=40.0,
                      capacity_trace="pensieve",
                      user_traces="pensieve", trace_split="test")


def test_traced_step_compiles_to_one_graph(trace_sets):
    env = envs.VREdgeTorchEnv(8, users="2-7", churn=0.1, max_steps=3, capacity_trace=trace_sets[0],
                              user_traces=trace_sets[1])
    env._step, graphs = counting_compile(env.dynamics.step)
    env.reset(seed=0)
    for _ in range(6):
        env.step(torch.randint(0, 6, (8, 8)))
    assert len(graphs) == 1  # no data-dependent branch: gathers only


def test_bad_actions_are_a_one_line_error():
    env = envs.VREdgeTorchEnv(2)
    env.reset(seed=0)
    with raises(ValueError, "int64", "(2, 8)", "ndarray"):  # what it takes, what it got
        env.step(np.zeros((2, 8), dtype=np.int64))
    with raises(ValueError, "int64", "(2, 8)", "torch.float32"):
        env.step(torch.zeros(2, 8))


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("traces", [{}, dict(capacity_trace="pensieve", user_traces="pensieve", users="2-8",
                                             churn=0.1)])
def test_cuda_env_follows_the_cpu_env_and_its_state_resumes_on_the_cpu(traces):
    cpu = envs.VREdgeTorchEnv(64, max_steps=20, **traces)
    cuda = envs.VREdgeTorchEnv(64, max_steps=20, device="cuda", **traces)
    cpu.reset(seed=1)
    cuda.reset(seed=1)
    for i in range(50):
        a = torch.randint(0, 6, (64, 8), generator=torch.Generator().manual_seed(i))
        c, g = cpu.step(a), cuda.step(a.cuda())
        assert torch.equal(c[2], g[2].cpu()) and torch.allclose(c[1], g[1].cpu(), rtol=0, atol=1e-12)
    cpu.set_state(cuda.get_state())
    a = torch.zeros(64, 8, dtype=torch.int64)
    assert torch.allclose(cpu.step(a)[1], cuda.step(a.cuda())[1].cpu(), rtol=0, atol=1e-12)
