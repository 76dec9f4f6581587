import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.settings import ConfigError, help_of
from envs.vr_edge import decode_observation, processor_sharing_times
from tests.messages import raises


def rollout(env, actions, reset_seed):
    obs, _ = env.reset(seed=reset_seed)
    out = [obs]
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append(np.append(obs, [r, term, trunc]))
        if term or trunc:
            obs, _ = env.reset()
            out.append(obs)
    return out


def test_passes_gymnasium_env_checker():
    check_env(envs.SyntheticVREdgeEnv(num_users=3, seed=0), skip_render_check=True)


def test_registered_and_configurable_through_make():
    env = gym.make("VREdge-v0", num_users=4)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (7 * 4 + 4 + 1,)
    assert env.action_space == gym.spaces.MultiDiscrete([6] * 4)


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code", [
    "import envs, gymnasium; env = gymnasium.make('VREdge-v0', num_users=4)",  # import the package, then make
    "import gymnasium; env = gymnasium.make('envs:VREdge-v0', num_users=4)",  # Gymnasium's module:id form
    "import gymnasium, envs; env = gymnasium.make('VREdge-v0', num_users=4)",  # Gymnasium loaded first
])
def test_gymnasium_conventions_make_the_env_in_a_fresh_process(code):
    """Both of Gymnasium's conventions for a package's envs work, whichever of the two is imported first (a fresh
    process: this one registered the env long ago)."""
    done = subprocess.run([sys.executable, "-c", f"{code}; print(env.observation_space.shape)"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(33,)"]


def test_importing_envs_loads_neither_gymnasium_nor_numpy_nor_torch():
    """``import envs`` (and ``envs.settings``, which the trainer's ``--help`` reads) stays light: it registers the env
    when Gymnasium loads, without loading it."""
    code = "import sys, envs, envs.settings; print(sorted({'gymnasium', 'numpy', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_same_seed_and_actions_give_same_trajectory_and_different_seeds_differ():
    actions = np.random.default_rng(0).integers(0, 6, size=(400, 8))
    a = rollout(envs.SyntheticVREdgeEnv(), actions, reset_seed=5)
    b = rollout(envs.SyntheticVREdgeEnv(), actions, reset_seed=5)
    c = rollout(envs.SyntheticVREdgeEnv(), actions, reset_seed=6)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_constructor_seed_is_used_by_first_reset():
    a, _ = envs.SyntheticVREdgeEnv(seed=3).reset()
    b, _ = envs.SyntheticVREdgeEnv().reset(seed=3)
    np.testing.assert_array_equal(a, b)


def test_get_state_set_state_round_trip_mid_episode():
    env = envs.SyntheticVREdgeEnv(seed=1)
    env.reset()
    gen = np.random.default_rng(1)
    for _ in range(37):
        env.step(gen.integers(0, 3, size=8))
    state = env.get_state()
    actions = gen.integers(0, 6, size=(120, 8))
    first = [env.step(a)[:4] for a in actions]
    other = envs.SyntheticVREdgeEnv(seed=99)
    other.reset()
    other.set_state(state)
    second = [other.step(a)[:4] for a in actions]
    for (o1, r1, t1, u1), (o2, r2, t2, u2) in zip(first, second):
        np.testing.assert_array_equal(o1, o2)
        assert (r1, t1, u1) == (r2, t2, u2)


def test_set_state_rejects_foreign_state():
    env = envs.SyntheticVREdgeEnv(num_users=2, seed=0)
    env.reset()
    with raises(ValueError, "(1, 3)", "(1, 2)"):  # the state's shape, and this env's
        env.set_state(_state_of(envs.SyntheticVREdgeEnv(num_users=3, seed=0)))
    with raises(ValueError, "['buffer']", "'channel_logit'"):  # the keys given, and one it lacks
        env.set_state({"buffer": np.zeros(2)})


def _state_of(env):
    env.reset()
    return env.get_state()


def test_both_termination_and_truncation_occur():
    venv = envs.VREdgeVectorEnv(64, num_users=8, seed=0, max_steps=100)
    obs, _ = venv.reset()
    policy = envs.make_baseline("random", venv.config, seed=0)
    careful = envs.make_baseline("lowest", venv.config)
    terminated = truncated = 0
    for _ in range(300):
        # half the envs play recklessly (abandonment), half play safe (time limit)
        actions = np.concatenate([policy(obs[:32]), careful(obs[32:])])
        obs, _, term, trunc, info = venv.step(actions)
        terminated += term.sum()
        truncated += trunc.sum()
        assert not np.any(term & trunc)
    assert terminated > 0 and truncated > 0


def test_reward_is_documented_formula_of_info_components():
    env = envs.SyntheticVREdgeEnv(num_users=4, seed=2, stall_weight=3.0, switch_weight=0.5)
    env.reset()
    cfg = env.config
    prev_q = np.zeros(4)
    gen = np.random.default_rng(0)
    for _ in range(50):
        a = gen.integers(0, 6, size=4)
        _, r, term, trunc, info = env.step(a)
        q = info["quality"]
        expected = np.mean(q - 3.0 * info["stall_s"] - 0.5 * np.abs(q - prev_q))
        assert r == pytest.approx(expected)
        np.testing.assert_allclose(q, cfg.quality[a])
        prev_q = q
        if term or trunc:
            break


def test_processor_sharing_hand_computed():
    # works 1, 2, 3 with three users: finish at 3*1, 1 + 2*2, 1 + 2 + 3
    np.testing.assert_allclose(processor_sharing_times(np.array([[2.0, 3.0, 1.0]])), [[5.0, 6.0, 3.0]])


@pytest.mark.parametrize("steps", [400, pytest.param(2500, marks=pytest.mark.slow)])  # 2 episodes, or 16
def test_vector_env_matches_single_envs_over_thousands_of_steps_across_resets(steps):
    n, seeds = 6, [11, 12, 13, 14, 15, 16]
    kwargs = dict(num_users=3, max_steps=150)
    venv = envs.VREdgeVectorEnv(n, **kwargs)
    singles = [envs.SyntheticVREdgeEnv(**kwargs) for _ in range(n)]
    vobs, _ = venv.reset(seed=seeds)
    sobs = np.stack([e.reset(seed=s)[0] for e, s in zip(singles, seeds)])
    np.testing.assert_allclose(vobs, sobs, rtol=1e-6)
    gen = np.random.default_rng(0)
    episodes_ended = 0
    for _ in range(steps):
        actions = gen.integers(0, 6, size=(n, 3))
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(actions)
        for i, env in enumerate(singles):
            obs, rew, term, trunc, info = env.step(actions[i])
            assert (term, trunc) == (vterm[i], vtrunc[i])
            assert rew == pytest.approx(vrew[i], rel=1e-9, abs=1e-12)
            if term or trunc:
                episodes_ended += 1
                np.testing.assert_allclose(vinfo["final_obs"][i], obs, rtol=1e-6)
                assert vinfo["final_info"]["episode_metrics"]["quality"][i] == pytest.approx(
                    info["episode_metrics"]["quality"])
                obs, _ = env.reset()
            np.testing.assert_allclose(vobs[i], obs, rtol=1e-6)
    assert episodes_ended >= n * (steps // kwargs["max_steps"])  # every episode ends by its last step


def test_vector_env_state_round_trip():
    venv = envs.VREdgeVectorEnv(5, num_users=2, seed=3)
    venv.reset()
    for _ in range(20):
        venv.step(np.ones((5, 2), dtype=np.int64))
    state = venv.get_state()
    a = [venv.step(np.full((5, 2), 3))[0] for _ in range(30)]
    venv.set_state(state)
    b = [venv.step(np.full((5, 2), 3))[0] for _ in range(30)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))


@pytest.mark.parametrize("name", sorted(envs.BASELINES))
def test_baselines_produce_valid_batched_actions(name):
    venv = envs.VREdgeVectorEnv(16, num_users=5, seed=0)
    obs, _ = venv.reset()
    policy = envs.make_baseline(name, venv.config)
    for _ in range(30):
        actions = policy(obs)
        assert actions.shape == (16, 5) and np.issubdtype(actions.dtype, np.integer)
        assert venv.single_action_space.contains(actions[0].astype(np.int64))
        obs, *_ = venv.step(actions)


def test_tuned_baselines_beat_the_trivial_ones():
    venv = envs.VREdgeVectorEnv(64, seed=0)
    scores = {}
    for name in [n for n in envs.BASELINES if n != "robust_mpc"]:  # (robust_mpc: in the slow planner test)
        obs, _ = venv.reset(seed=123)
        policy = envs.make_baseline(name, venv.config)
        total = 0.0
        for _ in range(300):
            obs, r, *_ = venv.step(policy(obs))
            total += r.mean()
        scores[name] = total / 300
    for smart in ("throughput", "buffer", "fair_share", "bola"):
        assert scores[smart] > max(scores["lowest"], scores["random"]) + 0.3, scores


def test_decode_observation_inverts_observe():
    env = envs.SyntheticVREdgeEnv(num_users=3, seed=0)
    obs, _ = env.reset()
    obs, *_ = env.step(np.array([1, 2, 3]))
    f = decode_observation(env.config, obs[None])
    np.testing.assert_array_equal(f["last_level"], [[1, 2, 3]])
    np.testing.assert_allclose(f["buffer"], env.get_state()["buffer"], rtol=1e-6)


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_users=0), "num_users"),
    (dict(bitrates_mbps=()), "bitrates_mbps"),
    (dict(bitrates_mbps=(5.0, 3.0)), "bitrates_mbps"),
    (dict(stall_weight=-1.0), "stall_weight"),
    (dict(regime_stay_prob=1.5), "regime_stay_prob"),
    (dict(max_steps=0), "max_steps"),
    (dict(step_cost_us=-5), "step_cost_us"),
    (dict(users="9-3"), "users"),
    (dict(churn=-0.1), "churn"),
])
def test_bad_constructor_arguments_name_the_argument(kwargs, name):
    with raises(ValueError, name):
        envs.SyntheticVREdgeEnv(**kwargs)


def test_out_of_range_actions_are_rejected():
    env = envs.SyntheticVREdgeEnv(num_users=2, seed=0)
    env.reset()
    with raises(ValueError, "[0, 5]", "6"):  # the range, and the level out of it
        env.step(np.array([0, 6]))
    with raises(ValueError, "(3,)", "(2,)"):
        env.step(np.array([0, 1, 2]))
    venv = envs.VREdgeVectorEnv(2, num_users=2, seed=0)
    venv.reset()
    with raises(ValueError, "[0, 5]", "-1"):
        venv.step(np.array([[0, 1], [-1, 0]]))
    with raises(ValueError, "num_envs", "0"):
        envs.VREdgeVectorEnv(0)
    with raises(ValueError, "'oracle'", "fair_share"):  # and the baselines there are
        envs.make_baseline("oracle", venv.config)


def test_reveal_hidden_state_appends_regime_and_fade_and_keeps_the_rest():
    plain = envs.VREdgeVectorEnv(8, seed=3)
    told = envs.VREdgeVectorEnv(8, seed=3, reveal_hidden_state=True)
    assert told.single_observation_space.shape[0] == plain.single_observation_space.shape[0] + 4
    assert told.head_observation_layout == (7, plain.head_observation_layout[1] + 4)
    obs_p, _ = plain.reset()
    obs_t, _ = told.reset()
    actions = np.ones((8, plain.config.num_users), dtype=np.int64)
    for _ in range(40):
        state = told.get_state()
        n = obs_p.shape[1]
        np.testing.assert_array_equal(obs_t[:, :n], obs_p)  # same dynamics, same features first
        np.testing.assert_array_equal(obs_t[:, n:n + 3], np.eye(3)[state["regime"]])
        np.testing.assert_array_equal(obs_t[:, -1], state["fade"])
        obs_p, *_ = plain.step(actions)
        obs_t, *_ = told.step(actions)
    with raises(ValueError, "reveal_hidden_state", "capacity_trace"):
        envs.VREdgeConfig(reveal_hidden_state=True, capacity_trace="traces/")


def test_every_argument_is_declared_with_its_help_and_checked_by_the_settings_rule():
    """VR-edge's arguments are settings (``envs.settings.setting``): each has help and limits, and a value out of
    them is the trainer's one message form, named by the argument's key (an env argument has no flag)."""
    declared = [f for f in dataclasses.fields(envs.VREdgeConfig) if f.init]
    assert declared and all(help_of(f) and "limits" in f.metadata for f in declared)
    with pytest.raises(ConfigError) as info:
        envs.VREdgeConfig(num_users=0)
    assert str(info.value) == "num_users must be >= 1, got 0"
    with pytest.raises(ConfigError) as info:
        envs.VREdgeConfig(fade_depth=1.5)
    assert str(info.value) == "fade_depth must be > 0 and <= 1, got 1.5"


OUTAGES = dict(outage_prob=0.05, outage_end_prob=0.25, outage_depth=0.1)  # a sixth of the steps, 4 steps each


def _outage_run(steps: int, num_envs: int = 32, **kwargs):
    """Each step's outage flags ``[steps, num_envs]`` and the capacity the envs played and would have played without
    the outage chain (from the state's regime, noise, fade, or trace window), in envs that never end early."""
    from envs.vr_edge_dynamics import episode_nominal, synthetic_capacity, trace_capacity
    env = envs.VREdgeVectorEnv(num_envs, num_users=2, abandon_stall_s=1e9, max_steps=10_000, **OUTAGES, **kwargs)
    env.reset(seed=list(range(num_envs)))
    cfg, flags, played, underlying = env.config, [], [], []
    for _ in range(steps):
        *_, info = env.step(np.zeros((num_envs, 2), dtype=np.int64))
        s = env.get_state()
        nominal = episode_nominal(cfg, s)
        base = (trace_capacity(cfg, s["trace"], s["trace_pos"], nominal) if cfg.traces is not None else
                synthetic_capacity(cfg, s["regime"], s["noise"], s["fade"], nominal))
        flags.append(s["outage"].copy())
        played.append(info["capacity_mbps"])
        underlying.append(base)
    return np.array(flags), np.array(played), np.array(underlying)


def test_the_outage_chain_multiplies_the_capacity_by_its_depth_while_it_lasts():
    flags, played, underlying = _outage_run(60)
    np.testing.assert_allclose(played, underlying * np.where(flags, OUTAGES["outage_depth"], 1.0), rtol=1e-12)
    assert flags.any() and not flags.all()


def test_the_outage_chain_holds_its_stationary_share_and_mean_length():
    """A two-state Markov chain: in an outage a share p / (p + q) of the steps, each outage 1 / q steps on average
    (32 envs x 600 steps: about 4,800 effective samples of the share, its standard error about 0.005)."""
    flags, _, _ = _outage_run(600)
    p, q = OUTAGES["outage_prob"], OUTAGES["outage_end_prob"]
    assert flags.mean() == pytest.approx(p / (p + q), abs=0.03)
    ends = (flags[:-1] & ~flags[1:]).sum()
    assert flags[:-1].sum() / ends == pytest.approx(1 / q, rel=0.15)


def test_outages_apply_to_a_recorded_trace_too(tmp_path):
    from envs.make_traces import write_traces
    write_traces(tmp_path, files=2, seconds=30)
    flags, played, underlying = _outage_run(40, num_envs=8, capacity_trace=str(tmp_path))
    np.testing.assert_allclose(played, underlying * np.where(flags, OUTAGES["outage_depth"], 1.0), rtol=1e-12)
    assert flags.any()


def test_without_outages_the_cell_draws_and_holds_what_it_did():
    """The default: no outage draw in a block, no outage flag in the state (its streams, state and checkpoints as
    before: tests/test_landed_runs.py resumes runs stored before outages existed)."""
    from envs.vr_edge_draws import DrawLayout
    from envs.vr_edge_dynamics import initial_state
    zero = np.zeros(1, np.uint64)
    assert envs.VREdgeConfig().block_size == DrawLayout.of(8, False).size == 5 + 2 * 8
    assert "outage" not in initial_state(envs.VREdgeConfig(), zero, zero)
    assert envs.VREdgeConfig(outage_prob=0.1).block_size == 5 + 2 * 8 + 1


def test_outage_settings_out_of_range_and_the_filter_that_cannot_follow_them_are_one_line():
    from envs.belief import filter_refusal
    with raises(ConfigError, "outage_end_prob", "> 0"):
        envs.VREdgeConfig(outage_prob=0.1, outage_end_prob=0.0)
    with raises(ConfigError, "outage_depth", "> 0"):
        envs.VREdgeConfig(outage_prob=0.1, outage_depth=0.0)
    assert "outage_prob" in filter_refusal(envs.VREdgeConfig(outage_prob=0.1))
    assert filter_refusal(envs.VREdgeConfig()) == ""
