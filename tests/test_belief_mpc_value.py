"""BeliefMPC's rollout ending on a terminal value (``envs.belief_mpc.TerminalValue``, ``trainer.evaluate
--belief-base policy_critic``): today's rollout where the value is 0 and nothing is discounted, the discounted
return of a known future by hand, no value past the episode's end or after an abandonment."""

import functools
import json

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.belief import Futures
from envs.belief_mpc import BeliefMPC, TerminalValue, state_from_observation
from envs.settings import ConfigError
from envs.vr_edge import step_state
from envs.vr_edge_dynamics import observe

BIG = 1e6  # a value no reward comes near: where it leaks in, the return shows it


def _walked(steps: int, max_steps: int = 50, seed: int = 2) -> tuple[envs.VREdgeVectorEnv, np.ndarray]:
    """A 3-user venv ``steps`` rounds into its episodes under fair_share, and its observations."""
    venv = envs.VREdgeVectorEnv(3, seed=seed, num_users=3, max_steps=max_steps)
    obs, _ = venv.reset()
    base = envs.make_baseline("fair_share", venv.config)
    for _ in range(steps):
        obs, *_ = venv.step(base(obs))
    return venv, obs


def _by_hand(cfg: envs.VREdgeConfig, state: dict[str, np.ndarray], first: np.ndarray, base, horizon: int,
             gamma: float) -> tuple[Futures, np.ndarray, np.ndarray, np.ndarray]:
    """The env's own next ``horizon`` rounds from ``state`` (``first``, then ``base``) as one scenario of weight 1;
    the discounted rewards they pay, ``sum_h gamma^h r_h`` counted while the episode runs and nobody abandoned;
    the observation after the last round; and whether it was reached with the episode going on."""
    rounds, paid, going_on = [], np.zeros(len(first)), np.ones(len(first), dtype=bool)
    for h in range(horizon):
        actions = first if h == 0 else base(observe(cfg, state))
        state, reward, terminated, truncated, parts = step_state(cfg, state, actions)
        paid += np.where(going_on, gamma ** h * reward, 0.0)
        going_on &= ~(terminated | truncated)
        rounds.append((parts["capacity_mbps"], state["channel_logit"], state["regime"], state["fade"]))
    capacity, logit, regime, fade = (np.stack(x, axis=1)[:, None] for x in zip(*rounds))
    futures = Futures(capacity, logit, regime, fade, np.ones((len(first), 1)))
    return futures, paid, observe(cfg, state), going_on


def _observation_sum(obs: np.ndarray) -> np.ndarray:
    """A value that reads the observation (the one after the horizon, not another, is what it is given)."""
    return obs.astype(np.float64).sum(axis=1)


def test_a_zero_value_undiscounted_is_todays_rollout_bit_for_bit():
    venv = envs.VREdgeVectorEnv(3, seed=2, num_users=3, max_steps=50)
    cfg = venv.config
    today = BeliefMPC(cfg, horizon=6, scenarios=8)
    zero = BeliefMPC(cfg, horizon=6, scenarios=8, terminal_value=TerminalValue(lambda o: np.zeros(len(o)), 1.0))
    obs, _ = venv.reset()
    for _ in range(5):  # the filter sees every step from the first
        today.filter.update(obs)
        obs, *_ = venv.step(today.base(obs))
    today.filter.update(obs)
    futures = today.filter.futures(obs, 8, 6)
    start = state_from_observation(cfg, obs)
    first = np.repeat(today.base(obs)[:, None], cfg.num_levels, axis=1)
    first[:, :, 0] = np.arange(cfg.num_levels)  # every level of user 0: plans that stall, plans that do not
    a, b = today.expected_return(start, futures, first), zero.expected_return(start, futures, first)
    assert np.array_equal(a, b)
    assert np.array_equal(today.planned(obs, futures), zero.planned(obs, futures))
    # and the value does enter where it is not zero (the comparison above is not of two things that ignore it)
    one = BeliefMPC(cfg, horizon=6, scenarios=8, terminal_value=TerminalValue(lambda o: np.ones(len(o)), 1.0))
    np.testing.assert_allclose(one.expected_return(start, futures, first), a + 1.0)


@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_the_discounted_return_of_a_known_future_is_the_hand_computed_one(gamma):
    venv, obs = _walked(7)
    cfg, base = venv.config, envs.make_baseline("fair_share", venv.config)
    horizon = 4
    futures, paid, after, going_on = _by_hand(cfg, venv.get_state(), base(obs), base, horizon, gamma)
    assert going_on.all()  # (mid-episode, nobody abandons: the value is added everywhere)
    mpc = BeliefMPC(cfg, horizon=horizon, terminal_value=TerminalValue(_observation_sum, gamma))
    value = mpc.expected_return(state_from_observation(cfg, obs), futures, base(obs)[:, None])[:, 0]
    np.testing.assert_allclose(value, paid + gamma ** horizon * _observation_sum(after), atol=1e-4)
    # the hand sum would be another with gamma^(h + 1) or the value undiscounted: the test tells them apart
    assert np.abs(paid + _observation_sum(after) - value).min() > 1e-2


@pytest.mark.parametrize("left, valued", [(3, False), (4, False), (5, True)])
def test_no_value_past_the_episodes_end(left, valued):
    venv, obs = _walked(50 - left)  # `left` rounds of the episode to play; the rollout looks 4 ahead
    cfg, base, gamma, horizon = venv.config, envs.make_baseline("fair_share", venv.config), 0.9, 4
    futures, paid, _, _ = _by_hand(cfg, venv.get_state(), base(obs), base, horizon, gamma)
    mpc = BeliefMPC(cfg, horizon=horizon, terminal_value=TerminalValue(lambda o: np.full(len(o), BIG), gamma))
    value = mpc.expected_return(state_from_observation(cfg, obs), futures, base(obs)[:, None])[:, 0]
    np.testing.assert_allclose(value, paid + (gamma ** horizon * BIG if valued else 0.0), atol=1e-4)


def test_an_abandonment_keeps_the_rewards_before_it_and_no_value_nor_forfeit():
    venv, _ = _walked(6)
    cfg, base, gamma = venv.config, envs.make_baseline("fair_share", venv.config), 0.9
    state = venv.get_state()
    state["buffer"] = np.zeros_like(state["buffer"])  # any download stalls ...
    state["cum_stall"] = state["cum_stall"].copy()
    state["cum_stall"][:, 1] = cfg.abandon_stall_s  # ... and user 1's next stall makes it leave: round 0
    obs = observe(cfg, state)
    first = base(obs)
    futures, paid, _, going_on = _by_hand(cfg, dict(state), first, base, 4, gamma)
    _, r0, terminated, *_ = step_state(cfg, dict(state), first)
    assert terminated.all() and not going_on.any()
    start = state_from_observation(cfg, obs)
    valued = BeliefMPC(cfg, horizon=4, terminal_value=TerminalValue(lambda o: np.full(len(o), BIG), gamma))
    np.testing.assert_allclose(valued.expected_return(start, futures, first[:, None])[:, 0], r0, atol=1e-4)
    np.testing.assert_allclose(paid, r0)  # (the hand sum stops there too)
    today = BeliefMPC(cfg, horizon=4).expected_return(start, futures, first[:, None])[:, 0]
    remaining = cfg.max_steps - 6
    np.testing.assert_allclose(today, r0 - cfg.quality_weight * (remaining - 1), atol=1e-4)  # today's forfeit


@pytest.mark.parametrize("kwargs, key", [({"value": None, "gamma": 0.9}, "value"), ({"gamma": 0.0}, "gamma"),
                                         ({"gamma": 1.5}, "gamma"), ({"gamma": "0.9"}, "gamma"),
                                         ({"gamma": float("nan")}, "gamma")])
def test_a_bad_terminal_value_is_one_line(kwargs, key):
    with pytest.raises(ConfigError, match=f"^{key} ") as e:
        TerminalValue(**{"value": np.zeros, **kwargs})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^terminal_value"):
        BeliefMPC(envs.VREdgeConfig(num_users=3), terminal_value=0.9)


# ---------------------------------------------------------------- trainer.evaluate --belief-base policy_critic

def _tiny(tmp_path_factory, name: str, *extra: str):
    from trainer.flags import parse_args
    from trainer.train import train

    run = tmp_path_factory.mktemp(name) / "run"
    train(parse_args([*extra, "--env", "VREdge-v0", "--env-kwargs", "num_users=3,max_steps=20", "--num-envs", "2",
                      "--num-steps", "8", "--total-steps", "16", "--threads", "1", "--run-dir", str(run)]).config,
          progress=False)
    return run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny PPO VR-edge run: 3 users, episodes of 20 steps."""
    return _tiny(tmp_path_factory, "critic")


def test_evaluate_plays_the_rollout_on_the_policy_ending_on_its_critic(tiny_run, capsys):
    from trainer import evaluate as evaluate_cli
    from trainer.evaluation import filter_episodes, policy_actions, summarize
    from trainer.evaluation.policies import critic_value, trained_model

    evaluate_cli.main(["--checkpoint", str(tiny_run), "--episodes", "2", "--baselines", "none", "--reference",
                       "belief", "--belief-base", "policy_critic", "--json"])
    payload = json.loads(capsys.readouterr().out)
    cfg = envs.VREdgeConfig(num_users=3, max_steps=20)
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=3, max_steps=20)
    model, train_cfg, _ = trained_model(tiny_run, "best")
    tail = critic_value(model, train_cfg)
    assert tail.gamma == train_cfg.gamma == 0.9
    direct = filter_episodes(BeliefMPC(cfg, base=policy_actions(model, True), terminal_value=tail, horizon=4,
                                       margin=1.0), env_fn, 2, 0, num_envs=64)  # (ON_CRITIC's: the docs' numbers)
    assert payload["belief_base"] == "policy_critic" and payload["reference"]["belief"] == summarize(direct)
    assert payload["belief_settings"] == {"horizon": 4, "margin": 1.0}  # (what was played, said)
    width = envs.VREdgeVectorEnv(1, num_users=3).single_observation_space.shape[0]
    obs = np.random.default_rng(0).uniform(0, 1, (5, width)).astype(np.float32)
    import torch
    expected = model.value(torch.from_numpy(obs)).detach().double().numpy()  # (float32: another thread count's bits)
    np.testing.assert_allclose(tail.value(obs), expected, rtol=1e-5)
    assert tail.value(obs).dtype == np.float64 and np.ptp(expected) > 0  # (observations it tells apart)


def test_a_run_without_a_critic_is_refused_in_one_line(tmp_path_factory, capsys):
    from tests.messages import exits
    from trainer import evaluate as evaluate_cli

    apex = _tiny(tmp_path_factory, "apex", "--algo", "apex", "--learning-starts", "4", "--minibatch-size", "4",
                 "--hidden", "8")
    with exits(2, "--belief-base policy_critic", "no critic", "--belief-base policy", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(apex), "--episodes", "1", "--baselines", "none", "--reference",
                           "belief", "--belief-base", "policy_critic"])


# ------------------------------------------------------------------ the margin: keep the base's level unless clear

def test_with_no_margin_the_rule_is_the_plain_argmax_and_with_a_huge_one_the_kept_level():
    from envs.belief_mpc import _TIE, kept_unless_clear

    gen = np.random.default_rng(3)
    returns = gen.normal(size=(200, 8, 6))
    weight = gen.dirichlet(np.ones(8), size=200)
    kept = gen.integers(0, 6, size=200)
    value = (returns * weight[:, :, None]).sum(axis=1)
    rows = np.arange(200)
    plain = np.where(value.max(axis=1) > value[rows, kept] + _TIE, value.argmax(axis=1), kept)
    assert np.array_equal(kept_unless_clear(returns, weight, kept, 0.0), plain)
    assert np.array_equal(kept_unless_clear(returns, weight, kept, 1e9), kept)
    # a level ahead of the kept one in every scenario by the same amount has no spread: any margin takes it
    returns[:, :, 5] = returns[:, :, 0] + 1.0
    assert np.array_equal(kept_unless_clear(returns, weight, np.zeros(200, dtype=np.int64), 1e9), np.full(200, 5))


def test_a_margin_changes_only_which_leads_count_and_a_huge_one_plays_the_base():
    venv = envs.VREdgeVectorEnv(3, seed=2, num_users=3, max_steps=50)
    cfg, base = venv.config, envs.make_baseline("buffer", venv.config)
    plain = BeliefMPC(cfg, base="buffer", horizon=3, scenarios=6)
    huge = BeliefMPC(cfg, base="buffer", horizon=3, scenarios=6, margin=1e9)
    obs, _ = venv.reset()
    for _ in range(5):  # the filter sees every step from the first
        plain.filter.update(obs)
        obs, *_ = venv.step(base(obs))
    plain.filter.update(obs)
    futures = plain.filter.futures(obs, 6, 3)
    assert np.array_equal(huge.planned(obs, futures), base(obs))  # nothing is ever clear: the base's levels
    assert not np.array_equal(plain.planned(obs, futures), base(obs))  # (the plain rollout does move them here)
    start = state_from_observation(cfg, obs)
    first = np.repeat(base(obs)[:, None], cfg.num_levels, axis=1)
    first[:, :, 1] = np.arange(cfg.num_levels)
    per_scenario = plain.scenario_returns(start, futures, first)
    assert np.array_equal((per_scenario * futures.weight[:, :, None]).sum(axis=1),
                          plain.expected_return(start, futures, first))


@pytest.mark.parametrize("margin", [-1.0, float("inf"), float("nan"), True, "1"])
def test_a_bad_margin_is_one_line(margin):
    with pytest.raises(ConfigError, match="margin") as refused:
        BeliefMPC(envs.VREdgeConfig(num_users=2), margin=margin)
    assert "\n" not in str(refused.value)
