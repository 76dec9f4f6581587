"""The hindsight problem (envs.hindsight): the exact solver is every plan's best on tiny cells, it is at least the
clairvoyant's return, the Lagrangian bound is at least the exact optimum (equal to it for one user) and at least
every player's return episode by episode, and the benchmark prints both tables."""

import itertools

import numpy as np
import pytest

import envs
from benchmarks.hindsight import episode_return, main, players
from envs.hindsight import (
    episode_future,
    exact_hindsight,
    future_from_state,
    lagrangian_bound,
    replay_return,
    sharing_bound,
)
from envs.vr_edge_dynamics import download_round
from tests.messages import raises


def _brute_force(config: envs.VREdgeConfig, future) -> float:
    """The best true return over every plan of levels (abandonment forced), by enumeration: tiny cells only."""
    users, rounds = len(future.buffer), future.rounds
    joint = np.array(list(itertools.product(range(config.num_levels), repeat=users)))
    plans = np.array(list(itertools.product(range(len(joint)), repeat=rounds)))  # [K, T]: joint codes
    buffer = np.repeat(future.buffer[None], len(plans), axis=0)
    level = np.repeat(future.level[None], len(plans), axis=0)
    cum_stall, total, alive = np.zeros_like(buffer), np.zeros(len(plans)), np.ones(len(plans), dtype=bool)
    for t in range(rounds):
        act = joint[plans[:, t]]
        r = download_round(config, buffer, level, np.full(len(plans), future.capacity[t]),
                           np.repeat(future.channel[t][None], len(plans), axis=0), act)
        total += alive * r["user_reward"].mean(axis=-1)
        cum_stall = cum_stall + r["stall_s"]
        alive &= ~np.any(cum_stall > config.abandon_stall_s, axis=-1)
        buffer, level = r["buffer"], act
    return float(total.max())


@pytest.mark.parametrize("users, rounds, seed", [(2, 3, 0), (2, 3, 5), (1, 6, 2)])
def test_exact_is_the_best_plan_by_enumeration(users, rounds, seed):
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    future = episode_future(config, seed)
    best = exact_hindsight(config, future)
    assert best.exact
    assert best.value == pytest.approx(_brute_force(config, future), abs=1e-12)
    assert replay_return(config, future, best.actions) == pytest.approx(best.value, abs=1e-12)


def test_the_future_is_what_the_env_plays():
    config = envs.VREdgeConfig(num_users=3, max_steps=7)
    future = episode_future(config, 11)
    env = envs.SyntheticVREdgeEnv(seed=11, **config.to_dict())
    env.reset()
    plan = np.random.default_rng(0).integers(0, config.num_levels, size=(7, 3))
    total = 0.0
    for t, act in enumerate(plan):
        _, reward, terminated, _, info = env.step(act)
        assert info["capacity_mbps"] == pytest.approx(future.capacity[t], abs=0)
        total += reward
        if terminated:
            break
    assert replay_return(config, future, plan) == pytest.approx(total, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_optimum_is_at_least_the_clairvoyant_and_fair_share(seed):
    config = envs.VREdgeConfig(num_users=2, max_steps=5)
    best = exact_hindsight(config, episode_future(config, seed))
    for name, make in players(config).items():
        assert best.value >= episode_return(config, seed, make()) - 1e-12, name


@pytest.mark.parametrize("users, rounds, seed", [(1, 12, 0), (1, 12, 3), (2, 5, 0), (2, 5, 1),
                                                 pytest.param(3, 3, 2, marks=pytest.mark.slow)])
def test_bound_is_at_least_the_exact_optimum(users, rounds, seed):
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    future = episode_future(config, seed)
    best, bound = exact_hindsight(config, future), lagrangian_bound(config, future, grid_s=0.05, iterations=10)
    assert bound.value >= best.value - 1e-9
    assert all(v >= best.value - 1e-9 for v in bound.values)  # every iterate is a bound, not only the lowest


@pytest.mark.parametrize("users, rounds, seed", [(2, 5, 0), (2, 5, 1), (2, 6, 2)])
def test_sharing_bound_is_at_least_the_exact_optimum(users, rounds, seed):
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    future = episode_future(config, seed)
    best = exact_hindsight(config, future).value
    bound = sharing_bound(config, future, grid_s=0.05, delay_grid_s=0.01, iterations=10)
    assert min(bound.values) == bound.value >= best - 1e-9
    assert all(v >= best - 1e-9 for v in bound.values)


def test_keeping_processor_sharing_bounds_tighter_than_any_schedule():
    config = envs.VREdgeConfig(num_users=2, max_steps=6)
    future = episode_future(config, 2)  # two users who cannot both play high levels: any schedule nearly can
    best = exact_hindsight(config, future).value
    airtime = lagrangian_bound(config, future, grid_s=0.05, iterations=10).value
    sharing = sharing_bound(config, future, grid_s=0.05, delay_grid_s=0.01, iterations=10).value
    assert best <= sharing < airtime
    assert sharing - best < 0.5 * (airtime - best)


@pytest.mark.parametrize("seed", [0, 4])
def test_for_one_user_both_bounds_relax_only_the_grid(seed):
    config = envs.VREdgeConfig(num_users=1, max_steps=12)
    future = episode_future(config, seed)
    airtime = lagrangian_bound(config, future, grid_s=0.05, iterations=1).value
    assert sharing_bound(config, future, grid_s=0.05, iterations=1).value == pytest.approx(airtime, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 3, 4])
def test_for_one_user_the_bound_is_the_exact_optimum_as_the_grid_shrinks(seed):
    config = envs.VREdgeConfig(num_users=1, max_steps=12)
    future = episode_future(config, seed)
    best = exact_hindsight(config, future).value
    gaps = [lagrangian_bound(config, future, grid_s=g, iterations=1).value - best for g in (0.1, 0.02, 0.01)]
    assert min(gaps) >= -1e-9  # no airtime to share: only the grid's rounding separates the two
    assert gaps[2] <= gaps[1] <= gaps[0] and gaps[2] <= 1e-2  # within 0.01 of it over 12 rounds


def test_bound_is_above_every_player_episode_by_episode():
    config = envs.VREdgeConfig(num_users=4, max_steps=40)
    for seed in (0, 1):
        bound = lagrangian_bound(config, episode_future(config, seed), iterations=8)
        for name, make in players(config).items():
            assert bound.value >= episode_return(config, seed, make()), (seed, name)


@pytest.mark.slow
def test_bound_on_the_default_cell_is_above_belief_mpc_and_the_baselines():
    config = envs.VREdgeConfig()
    for seed in (0, 1):
        future = episode_future(config, seed)
        bound = min(lagrangian_bound(config, future, iterations=15).value,
                    sharing_bound(config, future, iterations=3).value)
        for name, make in players(config, belief=True).items():
            assert bound >= episode_return(config, seed, make()), (seed, name)
        for name in envs.baselines.BASELINES:
            baseline = envs.baselines.make_baseline(name, config)
            assert bound >= episode_return(config, seed, lambda obs, env, b=baseline: b(obs)), (seed, name)


def test_bad_input_is_one_clear_line():
    config = envs.VREdgeConfig(num_users=2, max_steps=4)
    future = episode_future(config, 0)
    with raises(ValueError, "grid_s=0.3", "max_buffer_s"):
        lagrangian_bound(config, future, grid_s=0.3)
    with raises(ValueError, "airtime_s=2.0", "max_buffer_s"):
        lagrangian_bound(config, future, airtime_s=2.0)
    with raises(ValueError, "max_states=3"):
        exact_hindsight(config, future, max_states=3)
    varied = envs.VREdgeConfig(num_users=3, users="1-3")
    env = envs.SyntheticVREdgeEnv(seed=0, **varied.to_dict())
    env.reset()
    with raises(ValueError, "users", "churn"):
        future_from_state(varied, env.get_state())


@pytest.mark.slow
def test_the_benchmark_prints_both_tables(capsys):
    main(["small", "--users", "2", "--rounds", "3", "--episodes", "2"])
    main(["default", "--episodes", "1", "--iterations", "1", "--sharing", "1"])
    out = capsys.readouterr().out
    assert "exact certified in 2/2" in out and "bound above every player in 1/1 episodes" in out
