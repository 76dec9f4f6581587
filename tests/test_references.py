"""The literature's baselines (robustMPC, BOLA), the clairvoyant planner and the reporting metrics."""

import functools
import itertools
import math

import gymnasium as gym
import numpy as np
import pytest

import envs
import trainer.evaluation.episodes as episodes_module
from envs.baselines import bola_parameters, mpc_levels, robust_capacity
from envs.planner import ClairvoyantPlanner
from envs.vr_edge import observe
from tests.messages import raises
from trainer.evaluation import gap_closed, jain_index, reference_episodes, run_episodes, summarize, t_quantile_975

SMALL = dict(bitrates_mbps=(1.0, 2.0, 4.0), max_buffer_s=4.0, segment_s=1.0)  # quality 0, 0.5, 1


def test_robust_capacity_hand_computed():
    # harmonic mean 4 / (1/100 + 1/200 + 1/200 + 1/400) = 177.78; errors of the window's own predictions:
    # 100 -> 200: 0.5; hm(100, 200) = 133.3 -> 200: 0.333; hm(100, 200, 200) = 150 -> 400: 0.625
    got = robust_capacity(np.array([[100.0, 200.0, 200.0, 400.0], [50.0, 50.0, 50.0, 50.0]]))
    np.testing.assert_allclose(got, [(4 / 0.0225) / 1.625, 50.0])


def test_mpc_hand_computed_lookahead_changes_the_decision():
    cfg = envs.VREdgeConfig(num_users=1, switch_weight=0.5, **SMALL)
    # buffer 2.5 s, last level 1, 2 Mbit/s: download times 0.5, 1, 2 s.
    # one segment: level 2 earns 1 - 0.5 * 0.5 = 0.75 > level 1's 0.5.
    assert mpc_levels(cfg, np.array([2.5]), np.array([1]), np.array([2.0]), horizon=1).tolist() == [2]
    # two segments: (2, 2) stalls 0.5 s in the second: 0.75 + 1 - 4 * 0.5 = -0.25; (2, 1): 0.75 + 0.25 = 1.0;
    # (1, 2): 0.5 + 0.75 = 1.25 (the buffer is still 2.5 s); (1, 1): 1.0 -> level 1 first
    assert mpc_levels(cfg, np.array([2.5]), np.array([1]), np.array([2.0]), horizon=2).tolist() == [1]


def _best_plan_first_level(cfg, buffer, last, rate, horizon):
    """The first level of the best plan by enumerating every plan (the lowest plan of equal QoE)."""
    q = cfg.quality
    best, first = -math.inf, None
    for plan in itertools.product(range(cfg.num_levels), repeat=horizon):
        buf, prev, value = buffer, last, 0.0
        for level in plan:
            download = cfg.ladder[level] * cfg.segment_s / rate
            value += (cfg.quality_weight * q[level] - cfg.switch_weight * abs(q[level] - q[prev])
                      - cfg.stall_weight * max(download - buf, 0.0))
            buf, prev = min(max(buf - download, 0.0) + cfg.segment_s, cfg.max_buffer_s), level
        if value > best + 1e-9:
            best, first = value, plan[0]
    return first


@pytest.mark.parametrize("horizon", [1, 2, 3, 4])
def test_mpc_levels_are_the_first_levels_of_the_best_plans_enumerated(horizon):
    cfg = envs.VREdgeConfig(num_users=1, switch_weight=0.5, **SMALL)
    rng = np.random.default_rng(horizon)
    buffer = np.round(rng.uniform(0, 4, 300), 1)  # rounded: plans of equal QoE, decided by the tie rule
    last = rng.integers(0, cfg.num_levels, 300)
    rate = np.round(rng.lognormal(0.5, 1.0, 300), 1) + 0.1
    expected = [_best_plan_first_level(cfg, b, p, r, horizon) for b, p, r in zip(buffer, last, rate)]
    np.testing.assert_array_equal(mpc_levels(cfg, buffer, last, rate, horizon), expected)  # many users at once
    np.testing.assert_array_equal(mpc_levels(cfg, buffer.reshape(20, 15), last.reshape(20, 15),
                                             rate.reshape(20, 15), horizon).reshape(-1), expected)


@pytest.mark.parametrize("weights", [{}, {"stall_weight": 0.0}, {"quality_weight": 0.0, "switch_weight": 0.0}])
def test_mpc_levels_searched_by_branch_and_bound_are_the_enumerations_to_the_last_bit(weights):
    """The search drops most plans; what it plays is what scoring every plan plays, near-ties included (buffers and
    rates rounded), in a cell of the default ladder and in one where every plan ties (nothing to drop: enumerated)."""
    cfg = envs.VREdgeConfig(num_users=1, **weights)
    q = cfg.quality
    gain = cfg.quality_weight * q - cfg.switch_weight * np.abs(q - q[:, None])
    rng = np.random.default_rng(7)
    buffer = np.concatenate([np.round(rng.uniform(0, 4, 600), 1), rng.uniform(0, 4, 600)])
    last = rng.integers(0, cfg.num_levels, 1200)
    rate = np.concatenate([np.round(rng.lognormal(3, 1.2, 600), 0) + 1, rng.lognormal(3, 1.2, 600)])
    for horizon in (2, 5):
        enumerated = envs.baselines._enumerated_first_levels(cfg, buffer, last, rate, horizon, gain)
        np.testing.assert_array_equal(mpc_levels(cfg, buffer, last, rate, horizon), enumerated)


def test_robust_mpc_policy_plays_mpc_on_each_users_share_of_the_robust_capacity():
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=0, **SMALL)
    env.reset()
    state = env.get_state()
    state["cap_history"][:] = [[3.0, 6.0, 6.0, 12.0]]
    state["buffer"][:] = [[0.5, 2.5, 4.0]]
    state["level"][:] = [[0, 1, 2]]
    obs = observe(env.config, state)
    channel = 0.25 + 0.75 / (1 + np.exp(-state["channel_logit"]))
    rate = 1.3 * (4 / (1 / 3 + 1 / 6 + 1 / 6 + 1 / 12) / 1.625) * channel / 3  # share 1.3 of the equal airtime
    expected = mpc_levels(env.config, state["buffer"], state["level"], rate, horizon=5)
    np.testing.assert_array_equal(envs.make_baseline("robust_mpc", env.config, share=1.3)(obs), expected)


def test_robust_mpc_plans_the_active_users_alone_as_it_played_every_slot_before():
    venv = envs.VREdgeVectorEnv(8, num_users=6, users="1-4", churn=0.2, seed=3)
    obs, _ = venv.reset()
    for _ in range(5):  # users have left and joined
        obs, *_ = venv.step(np.ones((8, 6), dtype=np.int64))
    cfg = venv.config
    f = envs.vr_edge.decode_observation(cfg, obs)
    assert 0 < f["active"].sum() < f["active"].size
    rate = 0.85 * robust_capacity(f["cap_history"])[:, None] * f["channel"] / f["active"].sum(axis=1, keepdims=True)
    every_slot = mpc_levels(cfg, f["buffer"], f["last_level"], np.where(f["active"], rate, cfg.ladder[0]), 5)
    played = envs.make_baseline("robust_mpc", cfg)(obs)
    np.testing.assert_array_equal(played, np.where(f["active"], every_slot, 0))


def test_bola_parameters_and_decisions_hand_computed():
    cfg = envs.VREdgeConfig(num_users=3, **SMALL)
    # utilities 0, ln2, 2 ln2; c_01 = -ln2, c_12 = 0; thresholds V (gamma + c) pinned at 1 s and 3 s
    v, gamma = bola_parameters(cfg, low_s=1.0, high_s=3.0)
    assert v == pytest.approx(2 / math.log(2)) and gamma == pytest.approx(1.5 * math.log(2))
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=0, **SMALL)
    env.reset()
    state = env.get_state()
    state["buffer"][:] = [[0.5, 2.0, 3.5]]  # at 2 s the scores are 1, 1.5, 1.25: level 1
    got = envs.make_baseline("bola", cfg, low_s=1.0, high_s=3.0)(observe(cfg, state))
    assert got.tolist() == [[0, 1, 2]]
    with raises(ValueError, "low_s=3.0", "high_s=1.0"):
        bola_parameters(cfg, low_s=3.0, high_s=1.0)


def test_planner_sees_the_future_the_env_then_produces():
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=4)
    env.reset()
    planner = ClairvoyantPlanner(env.config, lookahead=6)
    capacity, channel = planner.future(env.get_state())
    gen = np.random.default_rng(0)
    for h in range(6):  # whatever the actions
        _, _, _, _, info = env.step(gen.integers(0, 6, size=3))
        assert info["capacity_mbps"] == capacity[0, h]
        np.testing.assert_array_equal(0.25 + 0.75 / (1 + np.exp(-env.get_state()["channel_logit"][0])), channel[0, h])


@pytest.mark.slow
def test_planner_is_never_worse_than_any_baseline_on_a_set_of_seeds():
    kwargs = dict(num_users=4, max_steps=60)
    env_fn = functools.partial(gym.make, "VREdge-v0", **kwargs)
    cfg = envs.VREdgeConfig(**kwargs)
    seeds = list(range(100, 108))
    planned = reference_episodes(ClairvoyantPlanner(cfg), env_fn, len(seeds), 0, seeds=seeds)
    again = reference_episodes(ClairvoyantPlanner(cfg), env_fn, len(seeds), 0, seeds=seeds, num_envs=3)
    assert planned == again  # deterministic, whatever the batching
    for name in envs.BASELINES:
        played = run_episodes(envs.make_baseline(name, cfg), env_fn, len(seeds), 0, seeds=seeds)
        for p, b in zip(planned, played):
            assert p["reward_per_step"] >= b["reward_per_step"], (name, p, b)


def test_qoe_lin_in_info_is_the_literature_formula():
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=1, max_steps=40)
    env.reset()
    prev = np.full(3, env.config.bitrates_mbps[0])
    gen = np.random.default_rng(1)
    for _ in range(40):
        a = gen.integers(0, 6, size=3)
        *_, info = env.step(a)
        bitrate = np.array(env.config.bitrates_mbps)[a]
        np.testing.assert_allclose(info["bitrate_mbps"], bitrate)
        np.testing.assert_allclose(info["qoe_lin"], bitrate - 4.3 * info["stall_s"] - np.abs(bitrate - prev))
        prev = bitrate


def test_episode_records_hold_mean_qoe_lin_and_fairness():
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=2, max_steps=5)
    steps = []
    env = env_fn()
    env.reset(seed=7)
    for _ in range(5):
        steps.append(env.step(np.array([0, 5]))[-1])
    record = run_episodes(lambda obs: np.tile([0, 5], (len(obs), 1)), env_fn, 1, 0, seeds=[7])[0]
    assert record["qoe_lin"] == pytest.approx(np.mean([s["qoe_lin"] for s in steps]))
    quality = np.mean([s["quality"] for s in steps], axis=0)  # user 0 at quality 0, user 1 at 1
    assert record["fairness"] == pytest.approx(jain_index(quality)) and record["fairness"] == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs", [{}, {"num_users": 12, "users": "4-12", "churn": 0.05}, {"trace": True},
                                    {"user_traces": "pensieve", "churn": 0.05}])
def test_episodes_in_a_batched_env_are_the_single_envs_episodes(kwargs, tmp_path, monkeypatch):
    """VR-edge's episodes are played in its batched env: the records (random play: episodes of many lengths, an env
    restarted mid-batch) are those of one env per episode, to the last bit."""
    if kwargs.pop("trace", False):
        (tmp_path / "t.log").write_text("".join(f"{t} {20 + 15 * (t % 7)}\n" for t in range(400)))
        kwargs = {"capacity_trace": str(tmp_path / "t.log")}
    env_fn = functools.partial(gym.make, "VREdge-v0", **kwargs)
    cfg = gym.make("VREdge-v0", **kwargs).unwrapped.config
    assert episodes_module.native_vector_env(env_fn) is not None
    for name in ("random", "fair_share"):
        batched = run_episodes(envs.make_baseline(name, cfg), env_fn, 11, 4, num_envs=4)
        with monkeypatch.context() as m:
            m.setattr(episodes_module, "native_vector_env", lambda env_fn: None)
            single = run_episodes(envs.make_baseline(name, cfg), env_fn, 11, 4, num_envs=4)
        assert len(batched) == 11 and batched == single
    lengths = {r["length"] for r in run_episodes(envs.make_baseline("random", cfg), env_fn, 11, 4, num_envs=4)}
    assert len(lengths) > 1 or kwargs, "random play should end episodes at different steps (abandonment)"


def test_jain_index_hand_computed():
    assert jain_index(np.array([1.0, 1.0, 1.0, 1.0])) == 1.0
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == 0.25
    assert jain_index(np.array([1.0, 2.0])) == pytest.approx(9 / 10)
    assert jain_index(np.zeros(3)) == 1.0


def test_gap_closed_hand_computed():
    rec = lambda values: [{"reward_per_step": v} for v in values]  # noqa: E731
    base, ref = rec([0.4, 0.6]), rec([0.6, 0.8])
    half = gap_closed(rec([0.5, 0.7]), base, ref)
    assert half["fraction"] == pytest.approx(0.5) and half["ci95"] == pytest.approx(0.0) and half["gap"] == 0.2
    # gains 0.1 and 0.3 over a gap of 0.2: fraction 1; residuals -0.1, 0.1 (std 0.1414):
    # t(1) 12.706 * 0.1414 / (1.414 * 0.2)
    full = gap_closed(rec([0.5, 0.9]), base, ref)
    assert full["fraction"] == pytest.approx(1.0) and full["ci95"] == pytest.approx(12.7062 * 0.5, rel=1e-4)
    with raises(ValueError, "gap_closed", "1", "2"):  # the episode counts that differ
        gap_closed(rec([0.5]), base, ref)


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (15, 2.1314), (49, 2.0096),
                                          (10_000, 1.9602)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile_975(df) == pytest.approx(expected, abs=1e-4)


def test_summary_ci_uses_t_for_few_episodes():
    s = summarize([{"reward_per_step": x} for x in (1.0, 2.0, 3.0)])  # std 1, 3 episodes: t(2) 4.3027 / sqrt 3
    assert s["reward_per_step_ci95"] == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
