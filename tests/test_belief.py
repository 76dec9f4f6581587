"""The filter over the VR-edge cell's hidden state (envs.belief): exact against every hidden path enumerated,
its transition law the env's, calibrated against the true hidden state, and futures drawn by the env's own step."""

import itertools
import math

import numpy as np
import pytest

import envs
from envs import belief, rng
from envs.belief import (
    HIDDEN,
    RegimeFilter,
    cell_seen,
    channel_logit,
    fade_draw,
    fade_transition,
    hidden_transition,
    regime_transition,
    stratified_hidden,
)
from envs.settings import ConfigError
from envs.vr_edge_dynamics import cell_round, channel_quality, synthetic_capacity

TRACE = "0 50\n1 60\n2 40\n3 70\n4 55\n"


def _played(n_envs: int, steps: int, seed: int = 0, **kwargs) -> tuple[envs.VREdgeVectorEnv, list[np.ndarray]]:
    """Observations ``steps + 1`` of ``n_envs`` envs under random levels (the cell does not depend on them)."""
    venv = envs.VREdgeVectorEnv(n_envs, seed=seed, **kwargs)
    obs, _ = venv.reset()
    seen, gen = [obs], np.random.default_rng(seed)
    for _ in range(steps):
        obs, *_ = venv.step(gen.integers(0, venv.config.num_levels, size=(n_envs, venv.config.num_users)))
        seen.append(obs)
    return venv, seen


def _brute_force_posterior(cfg: envs.VREdgeConfig, log_ratios: np.ndarray) -> np.ndarray:
    """P(h_T | capacities 0..T) ``[6]`` by summing the joint density of every hidden path (6^(T+1) of them),
    written out from the env's model: regime uniform and no fade at reset, N(0, std^2) noise then AR(1)."""
    stay, move = cfg.regime_stay_prob, (1 - cfg.regime_stay_prob) / 2
    fade_step = [[1 - cfg.fade_prob, cfg.fade_prob], [cfg.fade_end_prob, 1 - cfg.fade_end_prob]]
    innovation = math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std

    def noise(t: int, h: int) -> float:
        regime, fade = divmod(h, 2)
        return log_ratios[t] - math.log(cfg.regime_multipliers[regime] * (cfg.fade_depth if fade else 1.0)) \
            + 0.5 * cfg.noise_std**2

    def density(x: float, std: float) -> float:
        return math.exp(-0.5 * (x / std) ** 2) / (std * math.sqrt(2 * math.pi))

    total = np.zeros(HIDDEN)
    for path in itertools.product(range(HIDDEN), repeat=len(log_ratios)):
        if path[0] % 2:
            continue  # no fade at reset
        p = density(noise(0, path[0]), cfg.noise_std) / 3
        for t in range(1, len(path)):
            (r0, f0), (r1, f1) = divmod(path[t - 1], 2), divmod(path[t], 2)
            p *= (stay if r0 == r1 else move) * fade_step[f0][f1]
            p *= density(noise(t, path[t]) - cfg.noise_corr * noise(t - 1, path[t - 1]), innovation)
        total[path[-1]] += p
    return total / total.sum()


@pytest.mark.parametrize("kwargs", [{}, {"fade_prob": 0.3, "noise_std": 0.3, "regime_stay_prob": 0.7},
                                    {"users": "2-4", "churn": 0.1, "num_users": 4}])
def test_the_filter_is_every_hidden_path_summed(kwargs):
    venv, seen = _played(3, 5, seed=7, max_steps=40, **{"num_users": 3, **kwargs})
    belief = RegimeFilter(venv.config)
    for t, obs in enumerate(seen):
        posterior = belief.update(obs).reshape(-1, HIDDEN)
        cells = [cell_seen(venv.config, o) for o in seen[:t + 1]]
        for i in range(len(obs)):  # the episode's capacities so far (an abandoned episode starts again at 0)
            start = max(j for j, c in enumerate(cells) if c.t[i] == 0)
            log_ratios = np.array([c.log_ratio[i] for c in cells[start:]])
            np.testing.assert_allclose(posterior[i], _brute_force_posterior(venv.config, log_ratios), atol=1e-10)


def test_the_transition_law_is_the_env_step():
    cfg = envs.VREdgeConfig(num_users=1, fade_prob=0.1, fade_end_prob=0.4, regime_stay_prob=0.8)
    n = 200_000
    u = rng.uniform_block(np.full(n, 11, dtype=np.uint64), np.arange(n, dtype=np.uint64), cfg.block_size)
    for regime, fade in itertools.product(range(3), (False, True)):
        state = {"regime": np.full(n, regime), "noise": np.zeros(n), "fade": np.full(n, fade),
                 "channel_logit": np.zeros((n, 1))}
        cell, *_ = cell_round(cfg, state, u)
        freq = np.bincount(2 * cell["regime"] + cell["fade"], minlength=HIDDEN) / n
        np.testing.assert_allclose(freq, hidden_transition(cfg)[2 * regime + fade], atol=4e-3)
    assert regime_transition(cfg).sum(axis=1) == pytest.approx(1) and fade_transition(cfg).sum(axis=1) == \
        pytest.approx(1)


def test_the_fade_draw_makes_the_env_step_go_where_asked():
    cfg = envs.VREdgeConfig(num_users=1)
    v = np.linspace(0.001, 0.999, 50)
    for fade, fade_next in itertools.product((False, True), repeat=2):
        u = np.full((50, cfg.block_size), 0.5)
        u[:, 4] = fade_draw(cfg, np.full(50, fade), np.full(50, fade_next), v)
        state = {"regime": np.zeros(50, dtype=np.int64), "noise": np.zeros(50), "fade": np.full(50, fade),
                 "channel_logit": np.zeros((50, 1))}
        assert (cell_round(cfg, state, u)[0]["fade"] == fade_next).all()


def test_the_posterior_is_calibrated_against_the_revealed_hidden_state():
    cfg_kwargs = {"num_users": 2, "reveal_hidden_state": True, "max_steps": 300}
    venv, seen = _played(48, 400, seed=3, **cfg_kwargs)
    belief, predicted, truth = RegimeFilter(venv.config), [], []
    at = venv.config.num_user_features * 2 + venv.config.history + 1  # the revealed regime one-hot, then fade
    for obs in seen:
        predicted.append(belief.update(obs).reshape(-1, HIDDEN))
        truth.append(2 * np.argmax(obs[:, at:at + 3], axis=1) + (obs[:, at + 3] > 0.5))
    p, h = np.concatenate(predicted), np.concatenate(truth)
    hit = np.arange(HIDDEN) == h[:, None]  # [n, 6]
    assert p[hit].mean() > 0.7  # informative: far above 1/6
    for lo in np.arange(0, 1, 0.2):  # reliability: states given probability in a bin happen that often
        inside = (p >= lo) & (p < lo + 0.2)
        assert abs(p[inside].mean() - hit[inside].mean()) < 0.04, (lo, p[inside].mean(), hit[inside].mean())
    np.testing.assert_allclose(p.mean(axis=0), hit.mean(axis=0), atol=0.02)  # each state as often as predicted


def test_a_wrong_model_would_be_miscalibrated():
    # the calibration check can fail: a filter believing fades start 10x more often is off on the fade states
    venv, seen = _played(48, 300, seed=3, num_users=2, reveal_hidden_state=True)
    wrong = RegimeFilter(envs.VREdgeConfig(num_users=2, reveal_hidden_state=True, fade_prob=0.2, noise_std=0.3))
    at = venv.config.num_user_features * 2 + venv.config.history + 4
    fade_p = np.concatenate([wrong.update(o)[:, :, 1].sum(axis=1) for o in seen])
    fade = np.concatenate([o[:, at] > 0.5 for o in seen])
    assert abs(fade_p.mean() - fade.mean()) > 0.04


def test_a_trace_driven_cell_is_refused_in_one_line(tmp_path):
    (tmp_path / "t.log").write_text(TRACE)
    with pytest.raises(ConfigError) as e:
        RegimeFilter(envs.VREdgeConfig(num_users=2, capacity_trace=str(tmp_path / "t.log")))
    assert "\n" not in str(e.value) and e.value.key == "capacity_trace"
    with pytest.raises(ConfigError) as e:  # users on recorded links: no channel model to draw their futures from
        RegimeFilter(envs.VREdgeConfig(num_users=2, user_traces="pensieve"))
    assert "\n" not in str(e.value) and e.value.key == "user_traces"
    for key, value in (("noise_std", 0.0), ("noise_corr", 1.0)):  # noise without a density: no likelihood
        with pytest.raises(ConfigError) as e:
            RegimeFilter(envs.VREdgeConfig(num_users=2, **{key: value}))
        assert e.value.key == key


def test_skipping_a_step_or_joining_mid_episode_is_refused():
    venv, seen = _played(2, 3, num_users=2)
    belief = RegimeFilter(venv.config)
    with pytest.raises(ValueError, match="step 0|first"):
        belief.update(seen[1])
    belief.update(seen[0])
    with pytest.raises(ValueError):
        belief.update(seen[2])
    belief.update(seen[1])
    with pytest.raises(ValueError):
        belief.update(seen[2][:1])


def test_channel_logits_invert_the_observed_quality():
    logit = np.linspace(-4, 4, 41)
    np.testing.assert_allclose(channel_logit(channel_quality(logit).astype(np.float32)), logit, atol=1e-4)


def test_futures_are_the_env_cell_from_the_posterior():
    venv, seen = _played(1, 6, num_users=2, seed=4)
    cfg = venv.config
    belief = RegimeFilter(cfg, seed=5)
    for obs in seen:
        belief.update(obs)
    f = belief.futures(seen[-1], scenarios=20_000, horizon=2)
    assert f.weight.sum() == pytest.approx(1.0) and f.fade[0, :, 0].sum() >= 1  # a fade in the scenarios
    p_fade = belief.posterior[0].ravel() @ hidden_transition(cfg)[:, 1::2].sum(axis=1)
    assert (f.weight[0] * f.fade[0, :, 0]).sum() == pytest.approx(p_fade, rel=1e-9)  # exact: stratified
    # E[capacity next round] in closed form: sum_h P(h) sum_h' T(h, h') nominal x level(h') x E exp(noise' - s^2/2),
    # noise' ~ N(corr noise(h), innovation^2)
    level = synthetic_capacity(cfg, np.repeat(np.arange(3), 2), np.zeros(HIDDEN), np.tile([False, True], 3), 1.0)
    innovation2 = (1 - cfg.noise_corr**2) * cfg.noise_std**2
    lognormal = np.exp(cfg.noise_corr * belief.noise[0] + 0.5 * innovation2)  # [h]: E exp(noise') given h
    expected = cfg.nominal_capacity_mbps * np.sum(belief.posterior[0].ravel()[:, None] * hidden_transition(cfg)
                                                  * level[None, :] * lognormal[:, None])
    assert (f.weight[0] * f.capacity[0, :, 0]).sum() == pytest.approx(expected, rel=0.01)
    # channels go on from the observed ones
    np.testing.assert_allclose(cell_seen(cfg, seen[-1]).channel_logit, venv.get_state()["channel_logit"],
                               atol=1e-4)


def test_stratified_draws_are_the_posterior_given_the_fade_next():
    posterior = np.array([[0.3, 0.0, 0.5, 0.05, 0.15, 0.0]])
    fade_next = np.array([0.02, 0.65, 0.02, 0.65, 0.02, 0.65])
    v = rng.uniform_block(np.full(1, 3, dtype=np.uint64), np.zeros(1, dtype=np.uint64), 20_000)
    hidden, on, weight = stratified_hidden(posterior, fade_next, 20_000, v)
    joint = np.zeros((HIDDEN, 2))
    np.add.at(joint, (hidden[0], on[0].astype(int)), weight[0])
    expected = posterior[0][:, None] * np.stack([1 - fade_next, fade_next], axis=1)
    np.testing.assert_allclose(joint, expected, atol=0.01)


@pytest.mark.parametrize("kwargs", [{}, {"num_users": 12, "users": "2-12", "churn": "0-0.05"}])
def test_futures_drawn_in_parts_side_by_side_are_the_whole_batchs(kwargs, monkeypatch):
    monkeypatch.setattr(belief, "ENVS_PER_PART", 1)  # (parts as small as they come)
    venv = envs.VREdgeVectorEnv(16, seed=2, **kwargs)
    obs, _ = venv.reset()
    whole, parts = RegimeFilter(venv.config, seed=3), RegimeFilter(venv.config, seed=3)
    for step in range(4):
        whole.update(obs)
        parts.update(obs)
        for threads in (2, 3, 16):  # (16: an env a part; each draw goes on from the last, in both filters)
            want, got = whole.futures(obs, 16, 6), parts.futures(obs, 16, 6, threads=threads)
            for name, a, b in zip(want._fields, want, got):
                assert np.array_equal(a, b), f"{name} differs with {threads} parts at step {step}"
        obs, *_ = venv.step(np.full((16, venv.config.num_users), step % venv.config.num_levels))
