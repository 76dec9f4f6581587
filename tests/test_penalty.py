"""The information-relaxation penalty (envs.hindsight.information_penalty): its charges have mean zero under a causal
player (and a wrong law is caught), the penalised bound's grid still bounds the exact penalised optimum, a zero
charge gives today's bound, and on small cells the penalised bound stays above every causal player on average."""

import itertools

import numpy as np
import pytest

import envs
from benchmarks.hindsight import episode_return, main, players
from envs.hindsight import (
    Penalty,
    buffer_cell,
    episode_future,
    episode_penalty,
    lagrangian_bound,
    plan_penalty,
    sharing_bound,
)
from envs.vr_edge_dynamics import download_round
from tests.messages import raises
from trainer.evaluation import evaluation_seeds


def _played_penalty(config: envs.VREdgeConfig, seed: int, penalty: Penalty) -> float:
    """``fair_share`` plays the episode ``seed`` in the env; the penalty its levels pay, read at the env's own
    buffers (not a replay), round by round."""
    env = envs.SyntheticVREdgeEnv(seed=seed, **config.to_dict())
    obs, _ = env.reset()
    baseline = envs.baselines.make_baseline("fair_share", config)
    users, total, t, done = np.arange(config.num_users), 0.0, 0, False
    while not done:
        act = baseline(obs[None])[0]
        cell = buffer_cell(env.get_state()["buffer"][0], penalty.grid_s)
        total += float(penalty.charge[t, users, act, cell].sum())
        obs, _, terminated, truncated, _ = env.step(act)
        t, done = t + 1, terminated or truncated
    return total


def _mean_and_error(values: list[float]) -> tuple[float, float]:
    x = np.asarray(values)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))


CELL = {"num_users": 2, "max_steps": 30}


@pytest.mark.slow  # a minute or so: many episodes, for the sampling error
def test_a_causal_player_pays_nothing_on_average_and_a_wrong_law_is_caught(monkeypatch):
    config = envs.VREdgeConfig(**CELL)
    seeds = range(150)
    fair = [_played_penalty(config, s, episode_penalty(config, s, samples=32, scale=1.0)) for s in seeds]
    mean, error = _mean_and_error(fair)
    assert abs(mean) < 3 * error, (mean, error)
    assert error > 0.01  # the charges are not all zero: the check above has something to check
    # the expectation taken under a wrong law (the next round's capacity at half the cell's): caught
    from envs import hindsight

    def halved(cfg, state, u):
        cell, keys, capacity, channel = envs.vr_edge_dynamics.cell_round(cfg, state, u)
        return cell, keys, 0.5 * capacity, channel

    monkeypatch.setattr(hindsight, "cell_round", halved)
    biased = [_played_penalty(config, s, episode_penalty(config, s, samples=32, scale=1.0)) for s in seeds]
    mean, error = _mean_and_error(biased)
    assert mean > 5 * error, (mean, error)


def test_the_replayed_penalty_is_the_one_paid_in_the_env():
    config = envs.VREdgeConfig(**CELL)
    penalty = episode_penalty(config, 3, samples=8)
    env = envs.SyntheticVREdgeEnv(seed=3, **config.to_dict())
    obs, _ = env.reset()
    baseline, actions = envs.baselines.make_baseline("fair_share", config), []
    done = False
    while not done:
        actions.append(baseline(obs[None])[0])
        obs, _, terminated, truncated, _ = env.step(actions[-1])
        done = terminated or truncated
    assert plan_penalty(config, episode_future(config, 3), penalty, np.array(actions)) == pytest.approx(
        _played_penalty(config, 3, penalty), abs=1e-12)


def _exact_penalised(config: envs.VREdgeConfig, future, charge: np.ndarray, grid_s: float) -> float:
    """The best return less the penalty over every plan of one user, stopping at any round, by enumeration."""
    plans = np.array(list(itertools.product(range(config.num_levels), repeat=future.rounds)))  # [K, T]
    buffer = np.full((len(plans), 1), future.buffer[0])
    level = np.full((len(plans), 1), future.level[0])
    total, best = np.zeros(len(plans)), 0.0
    for t in range(future.rounds):
        act = plans[:, t:t + 1]
        total -= charge[t, 0, act[:, 0], buffer_cell(buffer[:, 0], grid_s)]
        r = download_round(config, buffer, level, np.full(len(plans), future.capacity[t]),
                           np.repeat(future.channel[t][None], len(plans), axis=0), act)
        total += r["user_reward"][:, 0]
        best = max(best, float(total.max()))
        buffer, level = r["buffer"], act
    return best


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_the_grid_bounds_the_exact_penalised_optimum_for_any_charge(seed):
    # one user: the relaxation drops nothing but the grid, so the penalised bound must be at least the exact best of
    # return less penalty; the charges are random in level and buffer (no monotony to lean on), as large as a reward
    config = envs.VREdgeConfig(num_users=1, max_steps=5)
    future = episode_future(config, seed)
    grid_s = 0.1
    charge = np.random.default_rng(seed).uniform(-0.5, 0.3, size=(5, 1, config.num_levels, 41))
    exact = _exact_penalised(config, future, charge, grid_s)
    bound = lagrangian_bound(config, future, grid_s=grid_s, iterations=1, penalty=Penalty(charge, grid_s)).value
    assert bound >= exact - 1e-9
    # not a check that holds anyway: these charges pay out on average, so the bound that ignores them is below
    assert lagrangian_bound(config, future, grid_s=grid_s, iterations=1).value < exact


def _exact_joint_penalised(config: envs.VREdgeConfig, future, charge: np.ndarray, grid_s: float) -> float:
    """The best return less the penalty over every joint plan of the cell, stopping at any round (all users at
    once), by enumeration: tiny cells only."""
    users = len(future.buffer)
    joint = np.array(list(itertools.product(range(config.num_levels), repeat=users)))
    plans = np.array(list(itertools.product(range(len(joint)), repeat=future.rounds)))  # [K, T]: joint codes
    buffer = np.repeat(future.buffer[None], len(plans), axis=0)
    level = np.repeat(future.level[None], len(plans), axis=0)
    total, best, us = np.zeros(len(plans)), 0.0, np.arange(users)
    for t in range(future.rounds):
        act = joint[plans[:, t]]
        total -= charge[t, us, act, buffer_cell(buffer, grid_s)].sum(axis=-1)
        r = download_round(config, buffer, level, np.full(len(plans), future.capacity[t]),
                           np.repeat(future.channel[t][None], len(plans), axis=0), act)
        total += r["user_reward"].mean(axis=-1)
        best = max(best, float(total.max()))
        buffer, level = r["buffer"], act
    return best


@pytest.mark.parametrize("users, rounds", [(1, 5), (2, 3)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_sharing_bound_bounds_the_exact_penalised_optimum_for_any_charge(users, rounds, seed):
    # a user's download time here is its work plus the others' delays, not a time it chooses: a buffer after the
    # round may fall a cell or more below the rounded-up one, and the bound must take the best of them (without
    # that, one user alone falls below the exact optimum for most of these seeds)
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    future = episode_future(config, seed)
    charge = np.random.default_rng(seed).uniform(-0.5, 0.3, size=(rounds, users, config.num_levels, 41))
    exact = (_exact_penalised if users == 1 else _exact_joint_penalised)(config, future, charge, 0.1)
    bound = sharing_bound(config, future, grid_s=0.1, delay_grid_s=0.02, iterations=1,
                          penalty=Penalty(charge, 0.1)).value
    assert bound >= exact - 1e-9
    assert sharing_bound(config, future, grid_s=0.1, delay_grid_s=0.02, iterations=1).value < exact


@pytest.mark.parametrize("users, rounds, seed", [(2, 6, 0), (3, 20, 1), (8, 30, 2)])
def test_a_zero_charge_gives_todays_bound(users, rounds, seed):
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    future = episode_future(config, seed)
    zero = Penalty(np.zeros((rounds, users, config.num_levels, 41)), 0.1)
    today = lagrangian_bound(config, future, iterations=6)
    again = lagrangian_bound(config, future, iterations=6, penalty=zero)
    assert again.values == today.values
    if users <= 3:  # the sharing bound's window over buffer cells changes nothing where values rise with buffers
        today = sharing_bound(config, future, iterations=3)
        assert sharing_bound(config, future, iterations=3, penalty=zero).values == today.values


def _baseline(name: str, config: envs.VREdgeConfig):
    """A fresh baseline as a benchmark player ``(obs [1, obs_dim], env) -> levels [1, U]``."""
    baseline = envs.baselines.make_baseline(name, config)
    return lambda obs, env: baseline(obs)


def _holds(bounds: np.ndarray, returns: np.ndarray) -> bool:
    """Whether the mean of the bounds is at least the mean of a player's returns within the sampling error
    (paired, 2 standard errors)."""
    gap = bounds - returns
    return bool(gap.mean() >= -2 * gap.std(ddof=1) / np.sqrt(len(gap)))


@pytest.mark.slow  # a minute or so: many episodes, for the sampling error
def test_the_penalised_bounds_are_above_every_causal_player_on_average():
    config = envs.VREdgeConfig(num_users=2, max_steps=8)
    seeds = range(24)
    futures = [episode_future(config, s) for s in seeds]
    bounds = {
        "any schedule": np.array([lagrangian_bound(config, f, grid_s=0.05, iterations=10, penalty=episode_penalty(
            config, s, grid_s=0.05)).value for s, f in zip(seeds, futures)]),
        "sharing, scale 0.2": np.array([sharing_bound(config, f, grid_s=0.05, delay_grid_s=0.01, iterations=10,
                                                      penalty=episode_penalty(config, s, grid_s=0.05, scale=0.2)).value
                                        for s, f in zip(seeds, futures)])}
    causal = {name: lambda name=name: _baseline(name, config) for name in envs.baselines.BASELINES}
    causal["belief_mpc"] = players(config, belief=True)["belief_mpc"]  # each a fresh player per episode
    for name, make in causal.items():
        returns = np.array([episode_return(config, s, make()) for s in seeds])
        for bound_name, values in bounds.items():
            assert _holds(values, returns), (bound_name, name)
    # the check can fail: a penalty that charges every round a quarter of a reward (its mean is not zero) sinks the
    # bound below fair_share
    fair = np.array([episode_return(config, s, _baseline("fair_share", config)) for s in seeds])
    constant = Penalty(np.full((8, 2, config.num_levels, 81), 0.25), 0.05)
    sunk = np.array([lagrangian_bound(config, f, grid_s=0.05, iterations=10, penalty=constant).value
                     for f in futures])
    assert not _holds(sunk, fair)


def test_bad_input_is_one_clear_line():
    config = envs.VREdgeConfig(num_users=2, max_steps=4)
    future = episode_future(config, 0)
    with raises(ValueError, "penalty", "grid_s"):
        lagrangian_bound(config, future, grid_s=0.05, penalty=episode_penalty(config, 0, samples=2))
    with raises(ValueError, "samples=0"):
        episode_penalty(config, 0, samples=0)
    with raises(ValueError, "slowdown=0"):
        episode_penalty(config, 0, slowdown=0)
    with raises(ValueError, "users", "churn"):
        episode_penalty(envs.VREdgeConfig(num_users=3, users="1-3"), 0)


def test_the_benchmark_reports_the_penalised_bounds(capsys):
    main(["small", "--users", "2", "--rounds", "3", "--episodes", "2", "--penalty", "--penalty-scale", "0.2"])
    rows = {line.split()[0] + (" " + line.split()[1] if line.split()[1] == "sharing" else ""): line.split()
            for line in capsys.readouterr().out.splitlines() if line.strip().startswith("penalised")}
    config = envs.VREdgeConfig(num_users=2, max_steps=3)
    expected = np.mean([lagrangian_bound(config, episode_future(config, s), grid_s=0.05, penalty=episode_penalty(
        config, s, grid_s=0.05, scale=0.2)).value for s in evaluation_seeds(0, 2)]) / 3
    assert float(rows["penalised"][1]) == pytest.approx(expected, abs=1e-4)
    assert "penalised sharing" in rows
