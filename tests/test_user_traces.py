"""Each user on a recorded link (user_traces): its own file and start, the set's mean at the synthetic channel's,
a joiner's new draw, with and without a traced cell; the default env untouched."""

import numpy as np
import pytest

import envs
from envs import rng
from envs.make_traces import write_traces
from envs.vr_edge import MEAN_CHANNEL_QUALITY, USER_FEATURES, channel_of
from tests.messages import raises

CHANNEL = USER_FEATURES.index("channel")


@pytest.fixture(scope="module")
def links(tmp_path_factory):
    folder = tmp_path_factory.mktemp("links")
    write_traces(folder, files=5, seconds=40, mean_mbps=3.0, seed=7)
    return str(folder)


def test_each_user_replays_its_own_trace_window_by_window(links):
    env = envs.SyntheticVREdgeEnv(num_users=4, seed=3, user_traces=links)
    obs, _ = env.reset()
    traces = env.config.link_traces
    start = env.get_state()
    trace, pos = start["user_trace"][0], start["user_trace_pos"][0]
    assert len({(t, p) for t, p in zip(trace, pos)}) == 4  # a file and a start of its own
    np.testing.assert_allclose(obs[CHANNEL:4 * 7:7], traces.capacity(trace, pos), rtol=1e-6)  # (float32)
    for t in range(1, 60):  # wraps around the 40 windows
        obs, *_ = env.step(np.full(4, 2))
        want = traces.capacity(trace, (pos + t) % traces.lengths[trace])
        np.testing.assert_array_equal(channel_of(env.config, env.get_state())[0], want)
        np.testing.assert_allclose(obs[CHANNEL:4 * 7:7], want, rtol=1e-6)  # what the user measured, not the next


def test_the_sets_mean_maps_to_the_synthetic_channels_mean(links):
    traces = envs.VREdgeConfig(user_traces=links).link_traces
    assert traces.rates.mean() == pytest.approx(MEAN_CHANNEL_QUALITY, rel=1e-3)  # (the 1% floor lifts it a little)
    synthetic = envs.VREdgeVectorEnv(64, num_users=8, max_steps=300)
    synthetic.reset(seed=0)
    seen = []
    for _ in range(200):
        obs, *_ = synthetic.step(np.zeros((64, 8), dtype=np.int64))
        seen.append(obs[:, CHANNEL:8 * 7:7])
    assert np.mean(seen) == pytest.approx(MEAN_CHANNEL_QUALITY, abs=0.02)  # what it maps to: today's mean


def test_the_users_traces_draw_from_the_seed(links):
    def drawn(seed):
        env = envs.SyntheticVREdgeEnv(num_users=3, seed=seed, user_traces=links)
        env.reset()
        return env.get_state()["user_trace_pos"].tolist()

    assert drawn(1) == drawn(1) and drawn(1) != drawn(2)


def test_a_traced_cell_and_traced_users_together(links, tmp_path):
    write_traces(tmp_path, files=2, seconds=30, seed=9)
    env = envs.SyntheticVREdgeEnv(num_users=2, seed=5, capacity_trace=str(tmp_path), user_traces=links,
                                  trace_scale=1.0)
    env.reset()
    cell, users = env.config.traces, env.config.link_traces
    for _ in range(10):
        *_, info = env.step(np.ones(2, dtype=np.int64))
        s = env.get_state()
        assert info["capacity_mbps"] == cell.capacity(s["trace"], s["trace_pos"])[0]
        np.testing.assert_array_equal(channel_of(env.config, s), users.capacity(s["user_trace"], s["user_trace_pos"]))


def test_a_joiner_draws_a_trace_of_its_own(links):
    cfg = dict(num_users=4, users="1-4", churn=0.3, max_steps=500, abandon_stall_s=1e6, user_traces=links)
    env = envs.SyntheticVREdgeEnv(seed=11, **cfg)
    env.reset()
    joins = 0
    for _ in range(100):
        before = env.get_state()
        env.step(np.zeros(4, dtype=np.int64))
        after = env.get_state()
        joined = after["active"][0] & ~before["active"][0]
        u = rng.uniform_block(before["key"], before["counter"], env.config.block_size)  # the round's draws
        trace, pos = env.config.link_traces.start(u[:, 5:9], u[:, 9:13])
        stayed = after["active"][0] & before["active"][0]
        assert np.array_equal(after["user_trace"][0][joined], trace[0][joined])
        assert np.array_equal(after["user_trace_pos"][0][joined], pos[0][joined])
        assert np.array_equal(after["user_trace"][0][stayed], before["user_trace"][0][stayed])  # the stayers keep
        joins += int(joined.sum())
    assert joins >= 10


def test_single_and_batched_envs_agree_with_user_traces_and_churn(links):
    n, seeds = 4, [3, 4, 5, 6]
    kwargs = dict(num_users=3, users="1-3", churn=0.1, max_steps=30, abandon_stall_s=2.0, user_traces=links)
    venv = envs.VREdgeVectorEnv(n, **kwargs)
    singles = [envs.SyntheticVREdgeEnv(**kwargs) for _ in range(n)]
    vobs, _ = venv.reset(seed=seeds)
    np.testing.assert_array_equal(vobs, np.stack([e.reset(seed=s)[0] for e, s in zip(singles, seeds)]))
    gen, ended = np.random.default_rng(0), 0
    for _ in range(150):
        actions = gen.integers(0, 6, size=(n, 3))
        vobs, vrew, vterm, vtrunc, _ = venv.step(actions)
        for i, env in enumerate(singles):
            obs, rew, term, trunc, _ = env.step(actions[i])
            assert (rew, term, trunc) == (vrew[i], vterm[i], vtrunc[i])
            if term or trunc:
                ended += 1
                obs, _ = env.reset()
            np.testing.assert_array_equal(vobs[i], obs)
    assert ended >= n


def test_state_round_trip_and_size_with_user_traces(links):
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=2, user_traces=links)
    env.reset()
    env.step(np.ones(3, dtype=np.int64))
    state = env.get_state()
    assert env.config.state_bytes == sum(v.nbytes for v in state.values())
    first = [env.step(np.full(3, 4))[:2] for _ in range(20)]
    env.set_state(state)
    again = [env.step(np.full(3, 4))[:2] for _ in range(20)]
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again))
    with raises(ValueError, "'user_trace'"):
        envs.SyntheticVREdgeEnv(num_users=3).set_state(state)


def test_user_traces_leave_the_synthetic_draws_and_the_cell_alone(links):
    """The cell (capacity, regime) steps as without user traces: the users' traces take no draw of their own."""
    plain = envs.SyntheticVREdgeEnv(num_users=3, seed=8)
    traced = envs.SyntheticVREdgeEnv(num_users=3, seed=8, user_traces=links)
    plain.reset()
    traced.reset()
    for _ in range(30):
        a = plain.step(np.ones(3, dtype=np.int64))[4]
        b = traced.step(np.ones(3, dtype=np.int64))[4]
        assert a["capacity_mbps"] == b["capacity_mbps"]
    assert plain.get_state()["counter"] == traced.get_state()["counter"]


def test_bad_user_traces_are_one_line(tmp_path):
    """At first use (the config reads no file: its ``link_traces``, an env) and where the trainer checks its env
    arguments."""
    from envs.vr_edge_profile import check_arguments

    def refused(path, *named):
        config = envs.VREdgeConfig(user_traces=str(path))  # pure data: the files are not read here
        for first_use in (lambda: config.link_traces, lambda: envs.SyntheticVREdgeEnv(user_traces=str(path)),
                          lambda: check_arguments({"user_traces": str(path)}, "serial")):
            with raises(ValueError, *named):
                first_use()

    refused(tmp_path / "missing", "user_traces", tmp_path / "missing")
    (tmp_path / "bad.log").write_text("0 1\n1 -1\n")
    refused(tmp_path / "bad.log", f"{tmp_path / 'bad.log'}:2")
    with raises(ValueError, "trace_split", "user_traces"):
        envs.VREdgeConfig(trace_split="test")
