"""envs.guard: the volatility guard's statistic, its hedge, its trip for good, its rows' fresh starts."""

import math

import numpy as np
import pytest

import envs
from envs.guard import HEDGE_ROUNDS, JUMP, MEMORY, VolatilityGuard, jumped, running_share

CFG = envs.VREdgeConfig(num_users=2, history=3, max_steps=100)
TOP = 5  # the policy below always asks for the top level


def observation(rounds: int, capacities: list[float]) -> np.ndarray:
    """One row's observation at ``rounds`` with the cell's capacity history ``capacities`` (the rest moot)."""
    obs = np.zeros(CFG.obs_dim, dtype=np.float32)
    start = CFG.num_user_features * CFG.num_users
    obs[start:start + CFG.history] = capacities
    obs[start + CFG.history] = rounds / CFG.max_steps
    return obs


def top(obs: np.ndarray) -> np.ndarray:
    return np.full((len(obs), CFG.num_users), TOP)


def played(guard: VolatilityGuard, capacity: list[float], rows: int = 1) -> list[bool]:
    """Whether the guard played each round of an episode whose capacity goes as ``capacity`` (every row alike)."""
    out = []
    for t in range(len(capacity)):
        past = [capacity[max(t - k, 0)] for k in reversed(range(CFG.history))]  # the history, oldest first
        actions = guard(np.stack([observation(t, past)] * rows))
        assert set(actions[0].tolist()) <= {0, TOP}
        out.append(bool(actions[0, 0] == 0))
    return out


def test_a_round_jumps_where_its_capacity_moves_more_than_jump_in_log():
    history = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, math.exp(JUMP * 1.01)], [1.0, 2.0, 2.0 * math.exp(-JUMP * 0.99)],
                        [1.0, 0.5, 0.0]])
    assert jumped(history).tolist() == [0.0, 1.0, 0.0, 1.0]  # (a capacity of 0 still reads as a jump, not NaN)


def test_the_share_is_the_running_mean_of_jumps_shrunk_by_the_hedges_rounds():
    jumps = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1]  # round 0's is moot: there is no last round to differ from
    mean = np.zeros(1)
    for t, j in enumerate(jumps):
        mean, share = running_share(mean, np.array([float(t)]), np.array([float(j)]))
    weights = [MEMORY ** (len(jumps) - 1 - t) * (1 - MEMORY) for t in range(1, len(jumps))]
    expected = sum(w * j for w, j in zip(weights, jumps[1:])) / (sum(weights) + HEDGE_ROUNDS * (1 - MEMORY))
    assert share[0] == pytest.approx(expected, rel=1e-12)
    mean, share = running_share(mean, np.array([0.0]), np.array([1.0]))  # a fresh episode starts from nothing
    assert mean[0] == 0 and share[0] == 0


def test_the_first_rounds_are_hedged_then_a_calm_cell_plays_the_policy():
    guard = VolatilityGuard(top, CFG, threshold=0.2)
    assert played(guard, [1.0] * 30) == [True] * HEDGE_ROUNDS + [False] * (30 - HEDGE_ROUNDS)
    assert guard.peak == 0.0


def test_a_jumpy_cell_trips_the_guard_for_good_and_the_next_episode_starts_afresh():
    guard = VolatilityGuard(top, CFG, threshold=0.2)
    jumpy = [1.0, 3.0] * 10 + [1.0] * 30  # a jump every round for 20 rounds, then calm to the episode's end
    assert played(guard, jumpy) == [True] * len(jumpy)  # (it stays tripped through the calm)
    assert played(guard, [1.0] * 20) == [True] * HEDGE_ROUNDS + [False] * (20 - HEDGE_ROUNDS)  # round 0: afresh


def test_rows_are_their_own():
    guard = VolatilityGuard(top, CFG, threshold=0.2)
    for t in range(12):
        calm, jumpy = observation(t, [1.0] * 3), observation(t, [1.0, 3.0, 1.0] if t % 2 else [3.0, 1.0, 3.0])
        actions = guard(np.stack([calm, jumpy]))
    assert actions[:, 0].tolist() == [TOP, 0] and guard.guarded.tolist() == [False, True]


def test_an_infinite_threshold_only_hedges_and_its_peak_is_the_highest_share_past_the_hedge():
    guard = VolatilityGuard(top, CFG, threshold=math.inf)
    rounds = played(guard, [1.0, 3.0] * 15)
    assert rounds == [True] * HEDGE_ROUNDS + [False] * (30 - HEDGE_ROUNDS)
    mean, shares = np.zeros(1), []
    for t in range(30):
        mean, share = running_share(mean, np.array([float(t)]), np.array([float(t > 0)]))
        shares.append(share[0])
    assert guard.peak == pytest.approx(max(shares[HEDGE_ROUNDS:]))
    assert VolatilityGuard(top, CFG, threshold=guard.peak).peak == 0.0  # (a fresh guard has seen nothing)


def test_on_the_synthetic_cell_the_guard_plays_the_policy_past_the_hedge_and_is_deterministic():
    from envs.vector import VREdgeVectorEnv

    def actions_over(threshold: float) -> list[list[int]]:
        env = VREdgeVectorEnv(num_envs=4, num_users=3, max_steps=40)
        guard, seen = VolatilityGuard(lambda o: np.full((len(o), 3), 4), env.config, threshold), []
        obs, _ = env.reset(seed=[1, 2, 3, 4])
        for _ in range(40):
            a = guard(obs)
            seen.append(a[:, 0].tolist())
            obs, *_ = env.step(a)
        return seen, guard.peak

    never, peak = actions_over(math.inf)
    assert never[:HEDGE_ROUNDS] == [[0] * 4] * HEDGE_ROUNDS and never[HEDGE_ROUNDS] == [4] * 4 and 0 < peak < 1
    assert actions_over(peak) == (never, peak)  # at its own peak the guard does not act: the same play
    assert actions_over(peak / 2)[0] != never  # below it, it does


@pytest.mark.parametrize("hedge", [0, 3, np.int64(20)])
def test_the_hedge_lasts_the_rounds_asked_and_the_peak_is_taken_past_it(hedge):
    guard = VolatilityGuard(top, CFG, threshold=math.inf, hedge_rounds=hedge)
    assert played(guard, [1.0, 3.0] * 15) == [True] * hedge + [False] * (30 - hedge)
    mean, shares = np.zeros(1), []
    for t in range(30):  # the share's prior is the default hedge's whatever the hedge: the same shares
        mean, share = running_share(mean, np.array([float(t)]), np.array([float(t > 0)]))
        shares.append(share[0])
    assert guard.peak == pytest.approx(max(shares[hedge:]))
    tripped = VolatilityGuard(top, CFG, threshold=0.2, hedge_rounds=hedge)  # from the round past the hedge its
    # share passes the threshold, for good
    expected = [t < hedge or any(share > 0.2 for share in shares[hedge:t + 1]) for t in range(30)]
    assert played(tripped, [1.0, 3.0] * 15) == expected and expected[-1]


@pytest.mark.parametrize("hedge", [-1, 2.5, True, "8", CFG.max_steps])  # (the last: the policy would never play)
def test_a_hedge_that_is_not_a_count_of_rounds_the_policy_plays_after_is_refused(hedge):
    with pytest.raises(ValueError, match="hedge_rounds") as refused:
        VolatilityGuard(top, CFG, 0.2, hedge_rounds=hedge)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("threshold", [-0.1, float("nan")])
def test_a_threshold_that_is_not_a_share_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        VolatilityGuard(top, CFG, threshold)


@pytest.mark.parametrize("shape", [(CFG.obs_dim,), (2, CFG.obs_dim + 7)])
def test_observations_not_of_its_config_are_refused(shape):
    with pytest.raises(ValueError, match=str(CFG.obs_dim)) as refused:
        VolatilityGuard(top, CFG, 0.2)(np.zeros(shape, dtype=np.float32))
    assert "\n" not in str(refused.value)
