"""Randomised network conditions: ``outage_prob`` and ``capacity_scale`` drawn per episode from a range 'LOW-HIGH'.

Each range is drawn at reset, kept in the env's state for the episode (exact resume through get_state/set_state),
drawn alike by the NumPy and the torch env, and a fixed value (the default included) draws as it did before.
"""

import numpy as np
import pytest
import torch

import envs
from envs import rng
from envs.settings import ConfigError
from envs.vr_edge_draws import DrawLayout
from envs.vr_edge_dynamics import episode_nominal, initial_state, synthetic_capacity
from tests.messages import raises
from tests.test_vr_edge_torch import assert_equivalent

RANGES = dict(outage_prob="0.02-0.3", capacity_scale="0.25-4")
LONG = dict(abandon_stall_s=1e9, max_steps=10_000)  # episodes that never end within a test


@pytest.mark.parametrize("key, value, rule", [
    ("outage_prob", "abc", "a probability"), ("outage_prob", "0.3-0.1", "a probability"),
    ("outage_prob", "0-1.5", "a probability"), ("outage_prob", -0.1, "a probability"),
    ("outage_prob", 1.5, "a probability"), ("outage_prob", "0.1-", "a probability"),
    ("capacity_scale", 0, "> 0"), ("capacity_scale", "0-4", "> 0"), ("capacity_scale", "4-0.25", "> 0"),
    ("capacity_scale", -2, "> 0"), ("capacity_scale", "inf", "> 0"), ("capacity_scale", "a-b", "> 0"),
])
def test_a_bad_range_is_one_line_naming_the_setting(key, value, rule):
    with raises(ConfigError, key, str(value), rule, "LOW-HIGH", key=key):
        envs.VREdgeConfig(**{key: value})


def test_ranges_and_single_values_parse():
    cfg = envs.VREdgeConfig(**RANGES)
    assert (cfg.outage_range, cfg.scale_range, cfg.outage_varies, cfg.scale_varies) == ((0.02, 0.3), (0.25, 4.0),
                                                                                          True, True)
    fixed = envs.VREdgeConfig(outage_prob="0.1", capacity_scale=2)
    assert (fixed.outage_range, fixed.scale_range, fixed.outage_varies, fixed.scale_varies) == ((0.1, 0.1),
                                                                                                (2.0, 2.0),
                                                                                                False, False)
    assert fixed.outages and fixed.scaled and not envs.VREdgeConfig().scaled


def _states(steps: int, num_envs: int = 64, **kwargs) -> list[dict[str, np.ndarray]]:
    env = envs.VREdgeVectorEnv(num_envs, num_users=2, **kwargs)
    env.reset(seed=list(range(num_envs)))
    states, zeros = [env.get_state()], np.zeros((num_envs, 2), dtype=np.int64)
    for _ in range(steps):
        env.step(zeros)
        states.append(env.get_state())
    return states


def test_drawn_values_fall_in_range_vary_across_episodes_and_hold_within_one():
    states = _states(40, **RANGES, max_steps=10, abandon_stall_s=1e9)
    for key, (low, high) in (("outage_prob", (0.02, 0.3)), ("capacity_scale", (0.25, 4.0))):
        drawn = np.array([s[key] for s in states])  # [steps + 1, envs]
        assert np.all((drawn >= low) & (drawn <= high)), key
        t = np.array([s["t"] for s in states])
        went_on = t[1:] > 0  # the same episode as the step before
        assert np.array_equal(drawn[1:][went_on], drawn[:-1][went_on]), key
        assert np.all(drawn[1:][~went_on] != drawn[:-1][~went_on]), key  # a new episode draws anew
        assert len(np.unique(drawn[0])) == drawn.shape[1], key


def test_the_scale_is_log_uniform_and_multiplies_the_capacity():
    """Half the episodes below the nominal cell and half above (uniform over 0.25-4 would put a fifth below), each
    round's capacity the cell's times its episode's scale and its outage factor."""
    env = envs.VREdgeVectorEnv(2000, num_users=2, capacity_scale="0.25-4", outage_prob=0.1, **LONG)
    env.reset(seed=1)
    scale = env.get_state()["capacity_scale"]
    assert abs(np.mean(scale < 1) - 0.5) < 0.04 and abs(np.mean(np.log2(scale) < -1) - 0.25) < 0.04
    cfg = env.config
    for _ in range(5):
        *_, info = env.step(np.zeros((2000, 2), dtype=np.int64))
        s = env.get_state()
        cell = synthetic_capacity(cfg, s["regime"], s["noise"], s["fade"], episode_nominal(cfg, s))
        want = cell * scale * np.where(s["outage"], cfg.outage_depth, 1.0)
        np.testing.assert_allclose(info["capacity_mbps"], want, rtol=1e-12)


def test_each_episode_has_outages_at_its_drawn_rate():
    states = _states(300, **LONG, outage_prob="0-0.4")
    drawn = states[0]["outage_prob"]
    flags = np.array([s["outage"] for s in states])
    starts = (~flags[:-1] & flags[1:]).sum(axis=0) / np.maximum((~flags[:-1]).sum(axis=0), 1)
    assert np.corrcoef(starts, drawn)[0, 1] > 0.9 and np.all(starts[drawn < 0.01] < 0.05)


def test_a_state_resumes_exactly_mid_episode_with_its_drawn_conditions():
    kwargs = dict(num_users=3, users="1-3", churn="0-0.2", max_steps=12, abandon_stall_s=3.0, **RANGES)
    env, twin = envs.VREdgeVectorEnv(8, **kwargs), envs.VREdgeVectorEnv(8, **kwargs)
    env.reset(seed=2)
    twin.reset(seed=99)  # other episodes, until the state arrives
    actions = np.random.default_rng(4).integers(0, 6, (40, 8, 3))
    for a in actions[:17]:
        env.step(a)
    assert np.sum(env.get_state()["t"] > 0) >= 4  # most envs mid-episode
    twin.set_state(env.get_state())
    for a in actions[17:]:  # across episode ends too: the next draws follow from the state's counters
        out, twin_out = env.step(a), twin.step(a)
        for x, y in zip(out[:4], twin_out[:4]):
            np.testing.assert_array_equal(x, y)
    assert all(np.array_equal(v, twin.get_state()[k]) for k, v in env.get_state().items())
    with raises(ValueError, "capacity_scale", "outage_prob"):
        envs.VREdgeVectorEnv(8, num_users=3, users="1-3", churn="0-0.2").set_state(env.get_state())


def test_torch_follows_numpy_with_drawn_conditions(tmp_path):
    from envs.make_traces import write_traces
    write_traces(tmp_path, files=3, seconds=25, seed=1)
    assert_equivalent(8, 120, max_steps=30, abandon_stall_s=3.0, **RANGES)
    assert_equivalent(8, 120, users="2-6", churn="0-0.2", max_steps=30, abandon_stall_s=3.0, **RANGES)
    assert_equivalent(8, 120, max_steps=30, abandon_stall_s=3.0, capacity_per_user_mbps=40.0,
                      capacity_trace=str(tmp_path), **RANGES)
    assert_equivalent(8, 120, max_steps=30, abandon_stall_s=3.0, capacity_scale=0.6)  # a fixed scale
    numpy_env, torch_env = envs.VREdgeVectorEnv(16, **RANGES), envs.VREdgeTorchEnv(16, **RANGES)
    numpy_env.reset(seed=5)
    torch_env.reset(seed=5)
    want, got = numpy_env.get_state(), torch_env.get_state()
    np.testing.assert_array_equal(got["outage_prob"].numpy(), want["outage_prob"])
    np.testing.assert_allclose(got["capacity_scale"].numpy(), want["capacity_scale"], rtol=1e-15)


def test_a_fixed_outage_prob_and_the_default_draw_as_before():
    """A fixed outage_prob draws one uniform per step, last in the block as before, and its chain moves on it
    alone (replayed here from the raw blocks); the default draws none. A range of one value, and a scale of 1,
    are the fixed env bit for bit: no draw or state leaf of their own."""
    cfg = envs.VREdgeConfig(num_users=2, outage_prob=0.1)
    assert cfg.block_size == DrawLayout.of(2, False).size + 1 == 5 + 2 * 2 + 1
    assert envs.VREdgeConfig().block_size == 5 + 2 * 8 and envs.VREdgeConfig(capacity_scale=0.5).block_size == 5 + 16
    states = _states(80, num_envs=16, outage_prob=0.1, **LONG)
    for before, after in zip(states, states[1:]):
        u = rng.uniform_block(before["key"], before["counter"], cfg.block_size)[:, -1]
        np.testing.assert_array_equal(after["outage"], np.where(before["outage"], u >= 0.3, u < 0.1))
    zero = np.zeros(1, np.uint64)
    assert {"outage_prob", "capacity_scale"}.isdisjoint(initial_state(cfg, zero, zero))
    for same, plain in ((dict(outage_prob="0.1-0.1", capacity_scale="1-1"), dict(outage_prob=0.1)),
                        (dict(capacity_scale=1.0), {})):
        got, want = _states(30, max_steps=8, **same), _states(30, max_steps=8, **plain)
        assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(got, want))


def test_the_belief_filter_refuses_a_scaled_cell_in_one_line():
    from envs.belief import filter_refusal
    assert "capacity_scale" in filter_refusal(envs.VREdgeConfig(capacity_scale="0.5-2"))
    assert filter_refusal(envs.VREdgeConfig(capacity_scale=1)) == ""


def test_torch_state_round_trip_keeps_the_drawn_conditions():
    env = envs.VREdgeTorchEnv(4, **RANGES)
    env.reset(seed=3)
    for _ in range(5):
        env.step(torch.zeros(4, 8, dtype=torch.int64))
    state = env.get_state()
    twin = envs.VREdgeTorchEnv(4, **RANGES)
    twin.reset(seed=8)
    twin.set_state(state)
    a = torch.ones(4, 8, dtype=torch.int64)
    assert torch.equal(env.step(a)[0], twin.step(a)[0])
    assert torch.equal(env.get_state()["capacity_scale"], twin.get_state()["capacity_scale"])


def test_the_trainer_takes_the_ranges_as_env_kwargs_and_answers_a_bad_one_in_one_line():
    from trainer.config import TrainConfig
    TrainConfig(env_kwargs="outage_prob=0.02-0.3,capacity_scale=0.25-4").validate()
    with raises(ConfigError, "--env-kwargs", "capacity_scale", "'0-4'"):
        TrainConfig(env_kwargs="capacity_scale=0-4").validate()
