"""VR-edge's cell of varying users (``users``, ``churn``, ``observe_active``): the default stays today's env, the
active set is drawn, churned and masked as documented, and the baselines and the clairvoyant reference count the
active users."""

import numpy as np
import pytest

import envs
from envs.planner import ClairvoyantPlanner
from envs.settings import ConfigError
from envs.vr_edge import USER_FEATURES, VREdgeConfig, decode_observation, processor_sharing_times
from tests.messages import raises

F = len(USER_FEATURES) + 1  # features per user slot in a masked observation


def trajectory(env: envs.VREdgeVectorEnv, steps: int, seed: int = 0) -> list[np.ndarray]:
    """Everything a vector env gives over ``steps`` random steps from ``reset(seed=3)``, and its final state."""
    obs, _ = env.reset(seed=3)
    out = [obs]
    actions = np.random.default_rng(seed).integers(0, env.config.num_levels, (steps, env.num_envs,
                                                                           env.config.num_users))
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out += [obs, reward, terminated, truncated, info["quality"], info["capacity_mbps"]]
    return out + list(env.get_state().values())


def test_the_default_cell_is_every_slot_for_good():
    cfg = VREdgeConfig()
    assert not cfg.varies and not cfg.masked and cfg.users_range == (8, 8)
    assert (cfg.block_size, cfg.obs_dim, cfg.state_bytes) == (21, 61, 545)  # 5 + 2 x 8; 7 x 8 + 4 + 1; as today
    env = envs.VREdgeVectorEnv(2)
    assert env.head_observation_layout == (7, 5) and env.active_user_feature is None
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.zeros((2, 8), dtype=np.int64))
    assert "active" not in info and set(env.get_state()) == {
        "key", "counter", "t", "regime", "noise", "fade", "channel_logit", "buffer", "level", "throughput",
        "download_time", "stall", "cum_stall", "cap_history", "ep_quality", "ep_stall", "ep_switches"}


@pytest.mark.parametrize("explicit", [dict(users=8, churn=0.0), dict(users="8"), dict(users="8-8")])
def test_all_users_without_churn_given_explicitly_is_the_default_stream(explicit):
    want = trajectory(envs.VREdgeVectorEnv(6, max_steps=30, abandon_stall_s=3.0), 120)
    got = trajectory(envs.VREdgeVectorEnv(6, max_steps=30, abandon_stall_s=3.0, **explicit), 120)
    assert len(want) == len(got) and all(np.array_equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("kwargs, value", [
    (dict(users=0), "0"), (dict(users=9), "9"), (dict(num_users=16, users="12-4"), "'12-4'"),
    (dict(users="a-b"), "'a-b'"), (dict(users="-3"), "'-3'"), (dict(users="2-"), "'2-'"),
])
def test_users_outside_the_slots_or_a_bad_range_is_one_line(kwargs, value):
    with raises(ConfigError, "users", value, "LOW-HIGH", f"1..num_users ({kwargs.get('num_users', 8)})"):
        VREdgeConfig(**kwargs)


def test_bad_churn_and_kinds_are_one_line():
    with raises(ConfigError, "churn", "1.5", "<= 1"):
        VREdgeConfig(churn=1.5)
    with raises(ConfigError, "users", "2.5", "a number or a range"):
        VREdgeConfig(users=2.5)
    with raises(ConfigError, "observe_active", "true or false"):
        VREdgeConfig(observe_active="yes")


@pytest.mark.parametrize("churn", ["abc", "0.2-0.1", "0-1.5", -0.1, "0.1-"])
def test_a_bad_churn_range_is_one_line(churn):
    with raises(ConfigError, "churn", str(churn), "LOW-HIGH"):
        VREdgeConfig(churn=churn)


def test_a_churn_range_is_drawn_per_episode_and_each_episode_churns_at_its_draw():
    """Each env's churn is uniform over the range, kept for its episode, and its users leave at that rate; a
    range of one value is that fixed churn, its random stream included."""
    counts, states = churn_run(200, num_users=8, users=4, churn="0-0.4")
    drawn = states[0]["churn"]
    assert drawn.min() < 0.05 and drawn.max() > 0.35 and abs(drawn.mean() - 0.2) < 0.04  # 128 uniform draws
    assert all(np.array_equal(s["churn"], drawn) for s in states)  # no episode ends in 200 steps here
    left = np.sum([a["active"] & ~b["active"] for a, b in zip(states, states[1:])], axis=(0, 2))
    stayed = np.sum([a["active"] for a in states[:-1]], axis=(0, 2))
    assert np.corrcoef(left / stayed, drawn)[0, 1] > 0.95  # the leave rate follows the episode's churn
    assert abs(counts[50:].mean() - 4) < 0.2  # the joins keep the draw's count, whatever the churn
    _, fixed = churn_run(20, num_users=8, users=4, churn=0.1)
    _, single = churn_run(20, num_users=8, users=4, churn="0.1-0.1")
    assert all(np.array_equal(a["active"], b["active"]) and "churn" not in b for a, b in zip(fixed, single))


def test_the_trainer_takes_users_as_env_kwargs_and_answers_a_bad_range_in_one_line():
    from trainer.config import TrainConfig, format_env_kwargs, parse_env_kwargs
    assert parse_env_kwargs("users=4-12,churn=0.05") == {"users": "4-12", "churn": 0.05}
    assert parse_env_kwargs(format_env_kwargs({"users": "4-12"})) == {"users": "4-12"}
    TrainConfig(env_kwargs="num_users=12,users=4-12,churn=0.05").validate()
    with raises(ConfigError, "--env-kwargs", "users", "'9-3'"):
        TrainConfig(env_kwargs="users=9-3").validate()


def test_a_range_draws_every_count_uniformly_and_activates_the_first_slots():
    env = envs.VREdgeVectorEnv(4000, num_users=8, users="3-6")
    obs, _ = env.reset(seed=11)
    state = env.get_state()
    counts = np.bincount(state["users"], minlength=9)
    assert counts[:3].sum() == 0 and counts[7:].sum() == 0
    assert np.all(np.abs(counts[3:7] / 4000 - 0.25) < 0.03), counts  # 4 sigma is about 0.027
    np.testing.assert_array_equal(state["active"], np.arange(8) < state["users"][:, None])
    np.testing.assert_array_equal(obs[:, 7:8 * F:F], state["active"])  # the flags, user by user
    np.testing.assert_allclose(obs[:, -2], 1 / state["users"], rtol=1e-6)  # every drawn user active at reset
    np.testing.assert_allclose(obs[:, -1], 1.0)


def test_capacity_follows_the_drawn_users_so_each_count_has_the_same_headroom_per_user():
    per_user = {}
    for users in (2, 6):
        env = envs.VREdgeVectorEnv(200, users=users, max_steps=1000)
        env.reset(seed=0)
        zeros = np.zeros((200, 8), dtype=np.int64)
        per_user[users] = np.mean([env.step(zeros)[4]["capacity_mbps"] / users for _ in range(150)])
    assert abs(per_user[2] / per_user[6] - 1) < 0.06, per_user  # the same cell process around 100 Mbit/s a user
    assert 70 < per_user[2] < 130


def churn_run(steps: int, **config) -> tuple[np.ndarray, list[dict]]:
    """Active counts ``[steps, envs]`` of 128 envs under lowest-level actions, and every step's state."""
    env = envs.VREdgeVectorEnv(128, max_steps=10_000, abandon_stall_s=1e6, **config)
    env.reset(seed=5)
    zeros = np.zeros((128, env.config.num_users), dtype=np.int64)
    states = [env.get_state()]
    for _ in range(steps):
        env.step(zeros)
        states.append(env.get_state())
    return np.array([s["active"].sum(axis=1) for s in states]), states


def test_churn_keeps_the_mean_active_count_at_the_draw_and_users_come_and_go():
    counts, states = churn_run(400, num_users=8, users=3, churn=0.1)
    assert abs(counts[50:].mean() - 3) < 0.15, counts.mean()  # the stationary mean is the draw
    assert counts.min() >= 1 and counts.max() > 3 and (counts < 3).any()  # it fluctuates around it
    changed = np.mean([np.any(a["active"] != b["active"]) for a, b in zip(states, states[1:])])
    assert changed > 0.5  # about 1 - 0.9^3 x (1 - 0.06)^5 of the steps change the set


def test_at_least_one_user_stays_when_everyone_would_leave():
    counts, _ = churn_run(300, num_users=4, users=1, churn=0.9)
    assert counts.min() == 1 and (counts == 1).mean() > 0.2  # many steps hang on the one who stays


def test_a_joiner_starts_like_a_user_at_reset():
    cfg = VREdgeConfig(users=3, churn=0.2)
    _, states = churn_run(60, users=3, churn=0.2)
    joined = 0
    for before, after in zip(states, states[1:]):
        new = ~before["active"] & after["active"]
        joined += int(new.sum())
        np.testing.assert_array_equal(after["buffer"][new], cfg.initial_buffer_s)
        np.testing.assert_array_equal(after["level"][new], 0)
        np.testing.assert_array_equal(after["throughput"][new], cfg.bitrates_mbps[0])
        for k in ("download_time", "stall", "cum_stall"):
            np.testing.assert_array_equal(after[k][new], 0.0)
    assert joined > 100


def masked_steps(steps: int = 40, **config):
    """(obs before, state before, actions, obs after, reward, info) per step of a churning cell of 32 envs."""
    env = envs.VREdgeVectorEnv(32, max_steps=25, abandon_stall_s=4.0, **config)
    obs, _ = env.reset(seed=2)
    g = np.random.default_rng(0)
    for _ in range(steps):
        state, a = env.get_state(), g.integers(0, env.config.num_levels, (32, env.config.num_users))
        after, reward, terminated, truncated, info = env.step(a)
        yield obs, state, a, after, reward, info, terminated | truncated
        obs = after


def test_an_inactive_slot_shows_all_zero_features_and_gets_no_share():
    seen = 0
    for obs, state, _a, _, _, info, _ in masked_steps(users="2-5", churn=0.1):
        users = obs[:, :8 * F].reshape(32, 8, F)
        inactive = ~state["active"]
        seen += int(inactive.sum())
        assert np.all(users[inactive] == 0) and np.all(users[~inactive][:, -1] == 1)
        for k in ("quality", "stall_s", "switches", "bitrate_mbps", "qoe_lin"):
            assert np.all(info[k][inactive] == 0), k
        np.testing.assert_array_equal(info["active"], state["active"])
    assert seen > 1000


def test_the_reward_is_the_mean_over_active_users_of_their_terms():
    cfg = VREdgeConfig(users="2-5", churn=0.1)
    for _, state, a, _, reward, info, _ in masked_steps(users="2-5", churn=0.1):
        active = state["active"]
        change = np.abs(cfg.quality[np.where(active, a, 0)] - cfg.quality[state["level"]])
        terms = cfg.quality_weight * info["quality"] - cfg.stall_weight * info["stall_s"] - cfg.switch_weight * change
        want = np.array([terms[i][active[i]].mean() for i in range(len(a))])
        np.testing.assert_allclose(reward, want, rtol=0, atol=1e-12)


def test_an_inactive_slots_action_changes_nothing():
    env, twin = (envs.VREdgeVectorEnv(16, users="1-4", churn=0.2, max_steps=20, abandon_stall_s=3.0)
                 for _ in range(2))
    env.reset(seed=9)
    g = np.random.default_rng(3)
    for _ in range(60):
        twin.set_state(env.get_state())
        active = env.get_state()["active"]
        a = g.integers(0, 6, (16, 8))
        other = np.where(active, a, g.integers(0, 6, (16, 8)))
        assert np.any(other != a)
        out, twin_out = env.step(a), twin.step(other)
        for x, y in zip(out[:4], twin_out[:4]):
            np.testing.assert_array_equal(x, y)
        for k in out[4]:
            if k not in ("final_info", "_final_info"):
                np.testing.assert_array_equal(out[4][k], twin_out[4][k])
        assert all(np.array_equal(v, twin.get_state()[k]) for k, v in env.get_state().items())


def test_a_varying_cell_passes_the_gymnasium_env_checker_and_its_observations_stay_in_the_box():
    from gymnasium.utils.env_checker import check_env
    env = envs.SyntheticVREdgeEnv(users="1-5", churn=0.2, seed=0, max_steps=20)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    for _ in range(100):
        assert env.observation_space.contains(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()


def test_processor_sharing_gives_zero_work_slots_nothing_and_the_others_their_times_without_them():
    g = np.random.default_rng(0)
    for _ in range(50):
        work = g.exponential(1.0, (4, 6))
        slots = np.zeros((4, 10))
        where = np.sort(np.argsort(g.random((4, 10)), axis=1)[:, :6], axis=1)
        np.put_along_axis(slots, where, work, axis=1)
        times = processor_sharing_times(slots)
        np.testing.assert_array_equal(np.take_along_axis(times, where, axis=1), processor_sharing_times(work))
        assert np.all(times[slots == 0] == 0)


def test_single_env_and_state_round_trip_follow_the_batch_on_a_varying_cell():
    kwargs = dict(users="2-7", churn=0.1, max_steps=15, abandon_stall_s=3.0)
    venv = envs.VREdgeVectorEnv(3, **kwargs)
    singles = [envs.SyntheticVREdgeEnv(**kwargs) for _ in range(3)]
    obs, _ = venv.reset(seed=[4, 5, 6])
    for i, env in enumerate(singles):
        np.testing.assert_array_equal(env.reset(seed=[4, 5, 6][i])[0], obs[i])
    g = np.random.default_rng(1)
    for t in range(80):
        if t == 40:
            venv.set_state(venv.get_state())
        a = g.integers(0, 6, (3, 8))
        obs, reward, *_ = venv.step(a)
        for i, env in enumerate(singles):
            o, r, terminated, truncated, _ = env.step(a[i])
            if terminated or truncated:
                o, _ = env.reset()
            np.testing.assert_array_equal(o, obs[i])
            assert r == reward[i]
    assert VREdgeConfig(**kwargs).state_bytes == sum(v.nbytes for v in venv.get_state().values()) // 3
    with raises(ValueError, "active", "users"):
        envs.VREdgeVectorEnv(3, **kwargs).set_state(_default_state())


def _default_state():
    env = envs.VREdgeVectorEnv(3)
    env.reset(seed=0)
    return env.get_state()


def test_decode_observation_gives_the_mask_and_the_episodes_capacity():
    env = envs.VREdgeVectorEnv(64, users="1-8", churn=0.1)
    env.reset(seed=1)
    for _ in range(5):
        obs, *_ = env.step(np.ones((64, 8), dtype=np.int64))
    state, f = env.get_state(), decode_observation(env.config, obs)
    np.testing.assert_array_equal(f["active"], state["active"])
    np.testing.assert_allclose(f["cap_history"], state["cap_history"], rtol=1e-6)
    np.testing.assert_allclose(f["buffer"], np.where(state["active"], state["buffer"], 0), rtol=1e-6)
    told = envs.VREdgeVectorEnv(2, observe_active=True)  # every slot active, the mask shown anyway
    obs, _ = told.reset(seed=0)
    assert told.active_user_feature == 7 and told.head_observation_layout == (8, 7) and "active" not in \
        told.get_state()
    assert decode_observation(told.config, obs)["active"].all() and np.allclose(obs[:, -2:], [1 / 8, 1.0])


@pytest.mark.parametrize("name", ["fair_share", "robust_mpc", "bola", "throughput", "buffer"])
def test_a_baseline_acts_on_k_active_slots_as_in_a_cell_of_k_slots(name):
    """users=k of 8 slots without churn: the active slots' actions are those the baseline takes in a k-slot cell
    shown the same users and the same cell (the same observation, less the empty slots and the mask)."""
    k = 3
    env = envs.VREdgeVectorEnv(16, users=k, max_steps=30, abandon_stall_s=3.0)
    small = VREdgeConfig(num_users=k, max_steps=30, abandon_stall_s=3.0)
    policy, small_policy = envs.make_baseline(name, env.config), envs.make_baseline(name, small)
    obs, _ = env.reset(seed=0)
    for _ in range(30):
        a = policy(obs)
        users = obs[:, :8 * F].reshape(16, 8, F)[:, :k, :-1].reshape(16, -1)
        cell = obs[:, 8 * F:8 * F + small.num_cell_features]
        np.testing.assert_array_equal(a[:, :k], small_policy(np.concatenate([users, cell], axis=1)))
        assert np.all(a[:, k:] == 0)
        obs, *_ = env.step(a)


class _KnownFuture(ClairvoyantPlanner):
    """A planner told the future capacities and channels instead of rolling them out."""

    def __init__(self, config, capacity, channel):
        super().__init__(config, lookahead=capacity.shape[1], sweeps=2)
        self.known = capacity, channel

    def future(self, state):
        return self.known


def test_the_reference_plans_the_active_users_as_a_cell_of_that_many_slots():
    env = envs.VREdgeVectorEnv(4, users=3, max_steps=30)
    env.reset(seed=0)
    for _ in range(3):
        env.step(np.full((4, 8), 2))
    state = env.get_state()
    capacity, channel = ClairvoyantPlanner(env.config, lookahead=4).future(state)
    small_cfg = VREdgeConfig(num_users=3, max_steps=30)
    small_state = {k: v[:, :3] if v.ndim == 2 and v.shape[1] == 8 else v for k, v in state.items()
                   if k not in ("active", "users")}
    big = _KnownFuture(env.config, capacity, channel).plan(state)
    small = _KnownFuture(small_cfg, capacity, channel[..., :3]).plan(small_state)
    np.testing.assert_array_equal(big[:, :3], small)
    assert np.all(big[:, 3:] == 0) and np.any(small > 0)
