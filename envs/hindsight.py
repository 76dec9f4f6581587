"""The hindsight (perfect-information) problem of a VR-edge episode: solved exactly on small cells, bounded from
above on large ones.

An episode's future is exogenous: the env's randomness is counter-based and the cell's capacity and the users'
channels do not depend on the actions (:func:`envs.planner.true_rounds`), so in a cell whose users do not vary an
episode is, in hindsight, a deterministic control problem. Its data (:class:`Future`): the capacity ``[T]`` and the
channel qualities ``[T, U]`` of each round, and the users' start (buffers, levels). Its decision each round: one
bitrate level per user. Its state: each user's buffer (continuous), last level and cumulative stall (an episode ends
when one user's passes ``abandon_stall_s``). The reward is separable per user *given each user's download time*;
the users are coupled only by the cell's processor sharing, which sets the download times from all users' works.

Two solvers, each an upper bound by construction on the best return any player can reach on the episode (the
argument: ``docs/ceiling.md``, "How far from optimal"):

* :func:`exact_hindsight` enumerates the reachable states exactly (no grid) with dominance pruning, in the
  *free-stopping relaxation* (the player may end the episode at any round; abandonment is not forced), whose optimum
  is at least the true one; it replays the optimal plan on the true dynamics and says whether the two agree
  (``exact``): then the value is the hindsight optimum itself. Small cells only (2-3 users, 10-30 rounds).
* :func:`lagrangian_bound` relaxes the shared airtime of each round with prices per slice of the round's time
  (a Lagrangian relaxation): the cell splits into one problem per user, each solved by dynamic programming on a
  buffer grid rounded in the user's favour; every price vector gives an upper bound, and a subgradient method lowers
  it. Any cell size (the default 8-user, 300-round cell in seconds).

Both bounds take a ``penalty`` (:func:`information_penalty`, Brown, Smith & Sun's information relaxation): each plan
then pays, per user and round, a charge whose mean is zero for any causal player, and the bound is one on every
causal player's *expected* return (over episodes), no longer on every player's return episode by episode.

Example:
    >>> from envs.vr_edge_config import VREdgeConfig
    >>> cfg = VREdgeConfig(num_users=2, max_steps=6)
    >>> future = episode_future(cfg, seed=3)
    >>> future.capacity.shape, future.channel.shape
    ((6,), (6, 2))
    >>> best = exact_hindsight(cfg, future)
    >>> best.actions.shape, best.exact, round(replay_return(cfg, future, best.actions), 9) == round(best.value, 9)
    ((6, 2), True, True)
    >>> lagrangian_bound(cfg, future, iterations=5).value >= best.value
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs import rng
from envs.planner import true_rounds
from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_dynamics import cell_round, channel_of, download_round, initial_state, processor_sharing_times


@dataclass(frozen=True)
class Future:
    """An episode in hindsight: ``capacity`` ``[T]`` (Mbit/s) and ``channel`` ``[T, U]`` of each round, and the
    users' start: ``buffer``, ``level`` and ``cum_stall`` ``[U]``.

    Example:
        >>> future = episode_future(VREdgeConfig(num_users=3, max_steps=4), seed=0)
        >>> future.rounds, future.channel.shape, future.buffer.tolist()
        (4, (4, 3), [2.0, 2.0, 2.0])
    """

    capacity: np.ndarray
    channel: np.ndarray
    buffer: np.ndarray
    level: np.ndarray
    cum_stall: np.ndarray

    @property
    def rounds(self) -> int:
        return len(self.capacity)


def episode_future(config: VREdgeConfig, seed: int) -> Future:
    """The whole future of the episode that ``SyntheticVREdgeEnv(seed=seed)`` plays after ``reset()``."""
    key = np.array([rng.key_from_seed(seed)])
    return future_from_state(config, initial_state(config, key, np.zeros(1, dtype=np.uint64)))


def episode_bound(config: VREdgeConfig, seed: int, iterations: int) -> tuple[float, int]:
    """:func:`lagrangian_bound` (``iterations`` steps) on the episode ``SyntheticVREdgeEnv(seed=seed)`` plays after
    ``reset()``, and the episode's rounds: what an evaluation's worker computes (this module needs no torch)."""
    future = episode_future(config, seed)
    return lagrangian_bound(config, future, iterations=iterations).value, future.rounds


def bound_refusal(config: VREdgeConfig) -> str:
    """Why the hindsight solvers cannot take cells built with ``config``; ``""`` when they can. Traces (capacity
    and user links), outages and a capacity scale, fixed or drawn per episode, are all an exogenous future the
    solvers read (:func:`envs.planner.true_rounds`); users that join and leave are not (the slots' activity would be
    part of the problem's state).

    >>> bound_refusal(VREdgeConfig(capacity_trace="pensieve", outage_prob=0.05)), bool(bound_refusal(
    ...     VREdgeConfig(num_users=4, users="2-4")))
    ('', True)
    """
    if config.varies:
        return ("the hindsight solvers take a cell whose users do not vary: leave users and churn at their defaults "
                "(every slot active, churn 0)")
    return ""


def future_from_state(config: VREdgeConfig, state: dict[str, np.ndarray]) -> Future:
    """The future of one env's state ``state`` (``B = 1``, as ``get_state()`` returns) up to its episode's end."""
    if refused := bound_refusal(config):
        raise ValueError(refused)
    rounds = true_rounds(config, state, int(config.max_steps - state["t"][0]))
    return Future(capacity=np.array([c[0] for _, c in rounds]),
                  channel=np.stack([channel_of(config, after)[0] for after, _ in rounds]),
                  buffer=state["buffer"][0].copy(), level=state["level"][0].copy(),
                  cum_stall=state["cum_stall"][0].copy())


def works(config: VREdgeConfig, future: Future) -> np.ndarray:
    """Seconds ``[T, U, L]`` each user would need, with the whole cell, to fetch a segment at each level."""
    rate = future.capacity[:, None, None] * future.channel[:, :, None]
    return config.ladder[None, None, :] * config.segment_s / rate


def replay_return(config: VREdgeConfig, future: Future, actions: np.ndarray) -> float:
    """The true return of playing ``actions`` ``[T', U]`` from the episode's start (rounds after an abandonment
    earn nothing): the env's own reward, round by round."""
    buffer, level, cum_stall, total = future.buffer, future.level, future.cum_stall, 0.0
    for t, act in enumerate(np.asarray(actions, dtype=np.int64)):
        r = download_round(config, buffer, level, future.capacity[t], future.channel[t], act)
        total += float(r["user_reward"].mean())
        cum_stall = cum_stall + r["stall_s"]
        if np.any(cum_stall > config.abandon_stall_s):
            break
        buffer, level = r["buffer"], act
    return total


@dataclass(frozen=True)
class Penalty:
    """An information-relaxation penalty for :func:`lagrangian_bound` and :func:`sharing_bound`
    (:func:`information_penalty`): what user ``u``
    pays at round ``t`` for playing level ``a`` from a buffer in grid cell ``i``, ``charge`` ``[T, U, L, G + 1]``
    (reward units: already the user's share of the cell's mean), on a buffer grid of ``grid_s`` seconds (cell
    ``i`` holds the buffers ``b`` with :func:`buffer_cell` ``(b, grid_s) == i``: ``((i - 1) grid_s, i grid_s]``).

    Each charge is ``g(rate drawn) - E[g(rate) | the cell's true state before the round]``: its mean given
    everything up to the round is zero whatever the level and the buffer, so a causal player pays nothing on
    average.

    Example:
        >>> cfg = VREdgeConfig(num_users=2, max_steps=5)
        >>> penalty = episode_penalty(cfg, seed=0, samples=8)
        >>> penalty.charge.shape, penalty.grid_s
        ((5, 2, 6, 41), 0.1)
    """

    charge: np.ndarray
    grid_s: float


# The penalty's defaults, chosen on raw seeds 1000-1001 of the default cell (never the evaluation's seeds), 20
# iterations of lagrangian_bound: slowdown 3-8 at scales 0.025-0.3 tried; slowdown = users at 0.1 was the best on
# both (-0.014 and -0.021 a round against no penalty); larger scales loosen the bound (8 at 1.0: +0.31 at 10
# iterations), and 256 samples were no better than 64 (docs/ceiling.md, "The penalty").
PENALTY_SCALE = 0.1
PENALTY_SAMPLES = 64  # draws of the next round per round for the penalty's expectation
_SAMPLES_KEY = 0x5EED_0F_9E4A17  # mixed into an episode's key: the penalty's draws are not the episode's own


def buffer_cell(buffer: np.ndarray, grid_s: float) -> np.ndarray:
    """The grid cell of each buffer (seconds): ``ceil(b / grid_s)``, with a tolerance of 1e-12 steps so that a
    buffer on a grid point (within float error) is in the cell it ends.

    >>> buffer_cell(np.array([0.0, 0.05, 0.1, 0.30000000000000004, 4.0]), 0.1).tolist()
    [0, 1, 1, 3, 40]
    """
    return np.maximum(np.ceil(np.asarray(buffer) / grid_s - 1e-12), 0).astype(np.int64)


def episode_penalty(config: VREdgeConfig, seed: int, **kwargs: float) -> Penalty:
    """:func:`information_penalty` of the episode ``SyntheticVREdgeEnv(seed=seed)`` plays after ``reset()``."""
    key = np.array([rng.key_from_seed(seed)])
    return information_penalty(config, initial_state(config, key, np.zeros(1, dtype=np.uint64)), **kwargs)


def information_penalty(config: VREdgeConfig, state: dict[str, np.ndarray], grid_s: float = 0.1,
                        samples: int = PENALTY_SAMPLES, scale: float = PENALTY_SCALE, slowdown: float | None = None,
                        samples_seed: int = 0) -> Penalty:
    """A penalty (Brown, Smith & Sun 2010) charging a hindsight player for knowing each round's draw, per user.

    For user ``u``, level ``a`` and buffer ``b`` (its cell's top, ``i * grid_s``), ``g(a, b, y)`` is
    ``scale`` times the user's share of the stall the round would cost if its segment took ``slowdown`` (default:
    the users; their fair share of the cell) times its work alone at the rate ``y`` (the round's capacity times the
    user's channel): ``-stall_weight * max(slowdown * w_a(y) - b, 0) / users``. The charge at round ``t`` is
    ``g(a, b, y_t)`` at the episode's true draw less its mean under the cell's own law given the cell's true state
    before the round (the env's :func:`envs.vr_edge_dynamics.cell_round` on ``samples`` draws of its own, from a
    stream independent of the episode's). The level and buffer a causal player has at round ``t`` are fixed by
    what happened before it, and the round's draw is independent of that given the cell's state, so the charge's
    mean given the past is zero for the level and buffer it plays: its penalties sum to zero in expectation (the
    sampled mean is unbiased, its draws independent of everything else). ``state``: one env's state (``B = 1``,
    as ``get_state()`` returns) before the episode's remaining rounds."""
    if refused := bound_refusal(config):
        raise ValueError(refused)
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"information_penalty samples={samples!r} is invalid: must be an integer >= 1")
    if slowdown is not None and not slowdown > 0:
        raise ValueError(f"information_penalty slowdown={slowdown!r} is invalid: must be > 0")
    if not np.isfinite(scale):
        raise ValueError(f"information_penalty scale={scale!r} is invalid: must be a finite number")
    grid = _Grid.of(config, grid_s, config.max_buffer_s)  # (its slices are not used: the buffers only)
    rounds = int(config.max_steps - state["t"][0])
    after = true_rounds(config, state, rounds)
    before = [state] + [s for s, _ in after[:-1]]
    prior = {k: np.concatenate([s[k] for s in before]) for k in state}  # [T]: the cell's true state before
    rate = np.stack([c[0] * channel_of(config, s)[0] for s, c in after])  # [T, U]: the true draws
    keys = np.repeat(prior["key"] ^ np.uint64(_SAMPLES_KEY ^ samples_seed), samples)
    counters = np.arange(rounds * samples, dtype=np.uint64)
    repeated = {k: np.repeat(v, samples, axis=0) for k, v in prior.items()}
    _, _, capacity, channel = cell_round(config, repeated, rng.uniform_block(keys, counters, config.block_size))
    drawn = (capacity[:, None] * channel).reshape(rounds, samples, -1)  # [T, K, U]
    users = rate.shape[1]
    slowdown = float(users if slowdown is None else slowdown)
    buffers = grid.step * np.arange(grid.top + 1)
    charge = np.empty((rounds, users, config.num_levels, grid.top + 1))
    for u in range(users):  # one user at a time: [T, K, L, G + 1] at once is large
        expected = _one_round(config, drawn[:, :, u], buffers, slowdown).mean(axis=1)
        charge[:, u] = _one_round(config, rate[:, u, None], buffers, slowdown)[:, 0] - expected
    return Penalty(charge=scale / users * charge, grid_s=grid_s)


def _one_round(config: VREdgeConfig, rate: np.ndarray, buffers: np.ndarray, slowdown: float) -> np.ndarray:
    """``g`` ``[..., L, G + 1]`` (before the user's share and the scale) at rates ``rate`` ``[...]``: minus the
    stall's cost when a segment of each level takes ``slowdown`` times its work alone, from each buffer. (A value of
    the buffer after, linear in it, was tried beside it and did not tighten the bound: docs/ceiling.md.)"""
    download = slowdown * config.ladder[:, None] * config.segment_s / rate[..., None, None]  # [..., L, 1]
    return -config.stall_weight * np.maximum(download - buffers, 0.0)


def plan_penalty(config: VREdgeConfig, future: Future, penalty: Penalty, actions: np.ndarray) -> float:
    """The penalty ``actions`` ``[T', U]`` pay on ``future`` played from its start (the true dynamics; rounds after
    an abandonment pay nothing): the sum over rounds and users of the charge at each user's level and buffer."""
    buffer, level, cum_stall, total = future.buffer, future.level, future.cum_stall, 0.0
    users = np.arange(len(buffer))
    for t, act in enumerate(np.asarray(actions, dtype=np.int64)):
        total += float(penalty.charge[t, users, act, buffer_cell(buffer, penalty.grid_s)].sum())
        r = download_round(config, buffer, level, future.capacity[t], future.channel[t], act)
        cum_stall = cum_stall + r["stall_s"]
        if np.any(cum_stall > config.abandon_stall_s):
            break
        buffer, level = r["buffer"], act
    return total


@dataclass(frozen=True)
class HindsightOptimum:
    """The free-stopping relaxation's optimum (:func:`exact_hindsight`): its return ``value`` (an upper bound on
    every player's return on the episode), a plan reaching it ``actions`` ``[T', U]`` (``T' < T``: it stops after
    ``T'`` rounds), ``exact`` (the plan's true return is ``value``: the hindsight optimum itself) and the most
    states kept at one round (``states``, its cost).

    Example:
        >>> best = exact_hindsight(VREdgeConfig(num_users=2, max_steps=3), episode_future(
        ...     VREdgeConfig(num_users=2, max_steps=3), seed=0))
        >>> best.actions.shape, best.exact
        ((3, 2), True)
    """

    value: float
    actions: np.ndarray
    exact: bool
    states: int


def exact_hindsight(config: VREdgeConfig, future: Future, max_states: int = 200_000) -> HindsightOptimum:
    """The best return on ``future`` when the player may stop at any round (not forced to by abandonment), over
    the exact reachable states (no grid), pruned by dominance; refused past ``max_states`` states at one round.

    A state (after ``t`` rounds: levels ``l``, buffers ``b``, return so far ``g``) dominates another (``l'``, ``b'``,
    ``g'``) where ``b >= b'`` for every user and ``g - switch_weight * mean_u |q(l_u) - q(l'_u)| >= g'``: playing
    the other's future levels and stopping when it stops, the download times are the same (they depend on the levels
    and the future only), so every stall is no longer and every buffer no lower, and the first round's switching
    differs by at most that penalty; the dominated state is dropped. Without forced abandonment, the cumulative
    stall is not part of the state."""
    ladder_levels, users = config.num_levels, len(future.buffer)
    joint = np.stack(np.unravel_index(np.arange(ladder_levels**users), (ladder_levels,) * users), axis=1)  # [A, U]
    quality = config.quality
    penalty = config.switch_weight * np.abs(quality[joint][:, None] - quality[joint][None]).mean(axis=-1)  # [A, A]
    code = np.array([np.ravel_multi_index(tuple(future.level), (ladder_levels,) * users)])
    buffer, gain = future.buffer[None].astype(np.float64), np.zeros(1)
    parents, moves = [], []
    best, best_at = 0.0, (0, 0)  # stopping before the first round earns 0
    most = 1
    all_works = works(config, future)
    for t in range(future.rounds):
        download = processor_sharing_times(all_works[t][np.arange(users), joint])  # [A, U]
        stall = np.maximum(download[None] - buffer[:, None], 0.0)  # [N, A, U]
        after = np.minimum(np.maximum(buffer[:, None] - download[None], 0.0) + config.segment_s, config.max_buffer_s)
        reward = (config.quality_weight * quality[joint][None] - config.stall_weight * stall
                  - config.switch_weight * np.abs(quality[joint][None] - quality[joint][code][:, None])).mean(axis=-1)
        child_gain = (gain[:, None] + reward).reshape(-1)
        child_code = np.broadcast_to(np.arange(len(joint)), reward.shape).reshape(-1)
        child_parent = np.broadcast_to(np.arange(len(code))[:, None], reward.shape).reshape(-1)
        keep = _pruned(after.reshape(-1, users), child_gain, child_code, penalty)
        buffer, gain, code = after.reshape(-1, users)[keep], child_gain[keep], child_code[keep]
        parents.append(child_parent[keep])
        moves.append(code)
        most = max(most, len(code))
        if len(code) > max_states:
            raise ValueError(f"exact_hindsight kept {len(code)} states at round {t + 1}, over max_states={max_states}: "
                             "take fewer users or rounds (it is for small cells), or raise max_states")
        if gain.max() > best:
            best, best_at = float(gain.max()), (t + 1, int(np.argmax(gain)))
    actions = _plan(parents, moves, joint, *best_at)
    exact = len(actions) == future.rounds and abs(replay_return(config, future, actions) - best) <= 1e-9
    return HindsightOptimum(value=best, actions=actions, exact=exact, states=most)


def _plan(parents: list[np.ndarray], moves: list[np.ndarray], joint: np.ndarray, rounds: int, index: int
          ) -> np.ndarray:
    """The levels ``[rounds, U]`` that lead to state ``index`` after ``rounds`` rounds, followed back."""
    codes = []
    for t in range(rounds - 1, -1, -1):
        codes.append(moves[t][index])
        index = parents[t][index]
    return joint[np.array(codes[::-1], dtype=np.int64)].reshape(rounds, joint.shape[1])


def _pruned(buffer: np.ndarray, gain: np.ndarray, code: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """Indices of the states to keep: first among the states of each level (cheap: few states each), then
    across levels among those kept."""
    groups = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[groups], np.arange(len(penalty) + 1))
    kept = np.concatenate([g[_undominated(buffer[g], gain[g], code[g], penalty)]
                           for g in (groups[a:b] for a, b in zip(bounds[:-1], bounds[1:])) if len(g)])
    return kept[_undominated(buffer[kept], gain[kept], code[kept], penalty)]


def _undominated(buffer: np.ndarray, gain: np.ndarray, code: np.ndarray, penalty: np.ndarray,
                 block: int = 512) -> np.ndarray:
    """Indices of the states to keep: each dropped one is dominated (see :func:`exact_hindsight`) by one before it
    in the order of falling ``gain`` (so by a kept one, the relation being transitive: ``penalty`` obeys the
    triangle inequality)."""
    order = np.lexsort((np.arange(len(gain)), -gain))
    kept: list[np.ndarray] = []
    kept_buffer, kept_gain, kept_code = np.empty((0, buffer.shape[1])), np.empty(0), np.empty(0, dtype=np.int64)
    for start in range(0, len(order), block):
        idx = order[start:start + block]
        b, g, c = buffer[idx], gain[idx], code[idx]
        dropped = np.zeros(len(idx), dtype=bool)
        if len(kept_gain):
            covers = (kept_buffer[:, None] >= b[None]).all(axis=-1)
            covers &= kept_gain[:, None] - penalty[kept_code[:, None], c[None]] >= g[None]
            dropped |= covers.any(axis=0)
        # within the block, an earlier state drops a later one it dominates
        inner = (b[:, None] >= b[None]).all(axis=-1) & (g[:, None] - penalty[c[:, None], c[None]] >= g[None])
        dropped |= np.triu(inner, k=1).any(axis=0)
        survivors = idx[~dropped]
        kept.append(survivors)
        kept_buffer = np.concatenate([kept_buffer, buffer[survivors]])
        kept_gain = np.concatenate([kept_gain, gain[survivors]])
        kept_code = np.concatenate([kept_code, code[survivors]])
    return np.concatenate(kept)


@dataclass(frozen=True)
class HindsightBound:
    """An upper bound on every player's return on an episode (:func:`lagrangian_bound`): ``value``, the lowest of
    the dual values tried (each one a bound), the prices ``prices`` ``[T, J]`` that gave it (per round and slice of
    the round's airtime, ``grid_s`` seconds each; :func:`sharing_bound`'s: ``[T, U, U, L]``, per copy) and ``values``,
    the dual value at each iterate.

    Example:
        >>> cfg = VREdgeConfig(num_users=2, max_steps=5)
        >>> bound = lagrangian_bound(cfg, episode_future(cfg, seed=0), iterations=3)
        >>> bound.prices.shape, len(bound.values), bound.value == min(bound.values)
        ((5, 60), 3, True)
    """

    value: float
    prices: np.ndarray
    grid_s: float
    values: list[float]


def lagrangian_bound(config: VREdgeConfig, future: Future, grid_s: float = 0.1, airtime_s: float = 6.0,
                     iterations: int = 40, step: float = 1.0, prices: np.ndarray | None = None,
                     penalty: Penalty | None = None) -> HindsightBound:
    """An upper bound on the best return on ``future``: the Lagrangian relaxation of each round's shared airtime.

    Each round, the users' downloads share the cell's airtime: user ``u``'s rate ``x_u(s)`` (a share of the cell at
    time ``s`` of the round, ``sum_u x_u(s) <= 1``) must carry its work ``w_u`` (its seconds alone in the cell) by
    its finish time ``d_u``. Processor sharing is one such schedule; any schedule is allowed here (a relaxation).
    Pricing that constraint at ``p(s) >= 0`` (piecewise constant on slices of ``grid_s`` seconds up to
    ``airtime_s``, free after; searched among prices that do not rise within the round, a sum of steps
    ``p(s) = sum_k m_k [s < s_k]``, each ``m_k >= 0`` pricing "the work done by ``s_k`` is at most ``s_k``")
    adds ``integral p (1 - sum_u x_u) >= 0`` to the return, so for every feasible plan
    its return is at most ``integral p`` plus the sum over users of what each user alone can earn when it pays
    ``p`` for its airtime (weak duality). Each user's problem is solved by dynamic programming on a buffer grid of
    ``grid_s`` steps, rounded in its favour (buffers up, finish times and their cost each at the best end of their
    slice), and may stop at any round (abandonment is not forced): every value is at least the exact one. Prices
    start at ``prices`` (``[T, J]``; zero: every user alone in the cell) and move by projected subgradient steps
    (Polyak's, ``step`` times the gap between the dual value and the best return the users' plans reach when
    played together, halved when five steps bring no lower value) for ``iterations`` rounds; the lowest value is
    returned (each is a bound, so how the prices are found does not matter to its validity).

    With ``penalty`` (:func:`information_penalty` of the same episode, on the same ``grid_s``) each user's problem
    also pays the penalty's charge for its level and buffer each round it plays, and the value is a bound on the
    best return *less the penalty* on the episode: an upper bound on every causal player's expected return *in
    expectation over episodes* (not episode by episode; ``docs/ceiling.md``, "The penalty"). The grid value then
    bounds the exact value over its buffer cell (the charge need not fall with the buffer): a buffer after the
    round one cell below the rounded-up one is also reached by finishing one slice later, at no stall and no more
    cost. Without it the result is today's, bit for bit."""
    grid = _Grid.of(config, grid_s, airtime_s)
    charge = _checked_charge(penalty, future, grid)
    lam = np.zeros((future.rounds, grid.slices)) if prices is None else _refined(prices, future.rounds, grid.slices)
    steps = np.maximum(lam - np.concatenate([lam[:, 1:], np.zeros((future.rounds, 1))], axis=1), 0.0)
    deadlines = grid_s * np.arange(1, grid.slices + 1)
    best, best_prices, values, reached, scale = np.inf, lam, [], -np.inf, step
    for k in range(max(iterations, 1)):
        lam = np.cumsum(steps[:, ::-1], axis=1)[:, ::-1]  # non-increasing in the round's time
        value, used, plan = _dual(config, future, grid, lam, charge)
        values.append(value)
        reached = max(reached, _reached(config, future, penalty, plan))
        if value < best:
            best, best_prices = value, lam.copy()
        elif k % 5 == 4:
            scale /= 2  # no progress: a shorter step
        gradient = deadlines - np.cumsum(used, axis=1)  # the dual's slope in each step's height
        norm = float((gradient**2).sum())
        if norm == 0 or k + 1 == iterations:
            break
        steps = np.maximum(steps - scale * (value - reached) / norm * gradient, 0.0)  # Polyak's step to the target
    return HindsightBound(value=best, prices=best_prices, grid_s=grid_s, values=values)


def _reached(config: VREdgeConfig, future: Future, penalty: Penalty | None, plan: np.ndarray) -> float:
    """What ``plan`` ``[T, U]`` reaches on ``future``, less its penalty where there is one: the subgradient's target."""
    charged = 0.0 if penalty is None else plan_penalty(config, future, penalty, plan)
    return replay_return(config, future, plan) - charged


def _checked_charge(penalty: Penalty | None, future: Future, grid: _Grid) -> np.ndarray | None:
    """The penalty's charges ``[T, U, L, G + 1]`` where it fits the episode and the grid (``None``: no penalty)."""
    if penalty is None:
        return None
    rounds, users, _, cells = penalty.charge.shape
    if (rounds, users, cells) != (future.rounds, len(future.buffer), grid.top + 1) or abs(
            penalty.grid_s - grid.step) > 1e-12:
        raise ValueError(f"the penalty (rounds {rounds}, users {users}, grid_s {penalty.grid_s}) does not fit this "
                         f"bound (rounds {future.rounds}, users {len(future.buffer)}, grid_s {grid.step}): build it "
                         "for the same episode and grid")
    return penalty.charge


def _window_max(value: np.ndarray, below: int) -> np.ndarray:
    """``value`` ``[..., G + 1]`` where each entry is the best of itself and the ``below`` entries before it."""
    out = value.copy()
    for k in range(1, below + 1):
        np.maximum(out[..., k:], value[..., :-k], out=out[..., k:])
    return out


def _refined(prices: np.ndarray, rounds: int, slices: int) -> np.ndarray:
    """Prices ``[T, J']`` given on coarser slices (``J'`` a multiple of ``J``) repeated onto ``slices`` finer ones:
    the same price function of time, so a bound still."""
    prices = np.asarray(prices, dtype=np.float64)
    if prices.shape[0] != rounds or slices % prices.shape[1]:
        raise ValueError(f"prices of shape {prices.shape} do not fit {rounds} rounds of {slices} slices: give one "
                         "row per round and a number of slices that divides the grid's")
    return np.repeat(prices, slices // prices.shape[1], axis=1)


@dataclass(frozen=True)
class _Grid:
    """The per-user problems' grid: buffers ``0..G`` steps of ``step`` seconds, a segment ``segment`` steps,
    finish-time slices ``0..slices`` (the last one open: past ``airtime_s``)."""

    step: float
    top: int
    segment: int
    slices: int

    @classmethod
    def of(cls, config: VREdgeConfig, step: float, airtime_s: float) -> _Grid:
        counts = {name: value / step for name, value in (("max_buffer_s", config.max_buffer_s),
                                                          ("segment_s", config.segment_s), ("airtime_s", airtime_s))}
        for name, count in counts.items():
            if step <= 0 or abs(count - round(count)) > 1e-9:
                raise ValueError(f"grid_s={step} must be > 0 and divide {name} ({count * step}) into whole steps")
        if airtime_s < config.max_buffer_s:
            raise ValueError(f"airtime_s={airtime_s} must be at least max_buffer_s ({config.max_buffer_s})")
        return cls(step, round(counts["max_buffer_s"]), round(counts["segment_s"]), round(counts["airtime_s"]))


def _fill_costs(lam: np.ndarray, work: np.ndarray, grid: _Grid) -> tuple[np.ndarray, np.ndarray]:
    """The least cost ``[T, U, L, J + 1]`` of ``work`` ``[T, U, L]`` seconds of airtime within slices ``0..j`` (the
    cheapest first; ``inf`` where they cannot hold it; the open slice ``J``: free), and the fill's cheapest-slice
    order and counts for the subgradient: ``(cost, order [T, J, J])``."""
    rounds, slices = lam.shape
    prefix = np.where(np.arange(slices)[None, None, :] <= np.arange(slices)[None, :, None], lam[:, None, :], np.inf)
    order = np.argsort(prefix, axis=-1, kind="stable")  # [T, j, J]: slices 0..j cheapest first, then the rest
    sorted_prices = np.take_along_axis(prefix, order, axis=-1)
    cum = np.concatenate([np.zeros((rounds, slices, 1)), np.cumsum(np.where(np.isinf(sorted_prices), 0.0,
                                                                          sorted_prices), axis=-1)], axis=-1)
    full = np.minimum(np.floor(work / grid.step).astype(np.int64), slices)  # whole slices the work fills
    frac = work / grid.step - full
    t_idx = np.arange(rounds)[:, None, None, None]
    j_idx = np.arange(slices)[None, None, None, :]
    m = np.minimum(full[..., None], j_idx + 1)  # [T, U, L, J]
    part = np.where(full[..., None] <= j_idx, frac[..., None], 0.0)
    next_price = sorted_prices[t_idx, j_idx, np.minimum(m, slices - 1)]
    with np.errstate(invalid="ignore"):  # inf * 0 where the slices cannot hold the work: set to inf below
        cost = grid.step * (cum[t_idx, j_idx, m] + np.where(part > 0, part * next_price, 0.0))
    cost = np.where(work[..., None] <= grid.step * (j_idx + 1) + 1e-12, cost, np.inf)
    return np.concatenate([cost, np.zeros(cost.shape[:-1] + (1,))], axis=-1), order


def _dual(config: VREdgeConfig, future: Future, grid: _Grid, lam: np.ndarray, charge: np.ndarray | None = None
          ) -> tuple[float, np.ndarray, np.ndarray]:
    """The dual value at prices ``lam`` ``[T, J]``, the airtime ``[T, J]`` the users' best plans buy per slice, and
    their levels ``[T, U]`` (a plan of the whole cell; level 0 once a user stops). With ``charge`` ``[T, U, L, G + 1]``
    (a :class:`Penalty`'s) each user pays it for its level and buffer cell each round it plays."""
    rounds, users = future.rounds, len(future.buffer)
    levels = config.num_levels
    work = works(config, future)  # [T, U, L]
    cost, order = _fill_costs(lam, work, grid)  # [T, U, L, J + 1]
    i = np.arange(grid.top + 1)[:, None]
    j = np.arange(grid.slices + 1)[None, :]
    after = np.minimum(np.maximum(i - j, 0) + grid.segment, grid.top)  # [G + 1, J + 1]: buffer after, rounded up
    finish = grid.step * j  # the slice's earliest finish
    q = config.quality
    share = 1.0 / users
    own = share * (config.quality_weight * q[None, :] - config.switch_weight * np.abs(q[None, :] - q[:, None]))
    value = np.zeros((users, levels, grid.top + 1))  # V_T: nothing after the last round
    choices = []
    for t in range(rounds - 1, -1, -1):
        stall = np.maximum(np.maximum(finish[None, None], work[t][..., None, None]) - grid.step * i[None, None],
                           0.0)  # [U, L, G + 1, J + 1]
        later = value[:, :, after]  # [U, L(a), G + 1, J + 1]
        total = later - share * config.stall_weight * stall - cost[t][:, :, None, :]
        best_j = np.argmax(total, axis=-1)  # [U, L, G + 1]
        h = np.take_along_axis(total, best_j[..., None], axis=-1)[..., 0]
        if charge is not None:
            h = h - charge[t]
        cont = own[None, :, :, None] + h[:, None, :, :]  # [U, l, a, G + 1]
        best_a = np.argmax(cont, axis=2)
        value = np.maximum(np.take_along_axis(cont, best_a[:, :, None], axis=2)[:, :, 0], 0.0)
        choices.append((best_a, best_j, value > 0))
    choices.reverse()
    start = np.ceil(future.buffer / grid.step).astype(np.int64)
    start = np.minimum(start, grid.top)
    dual = float(grid.step * lam.sum() + value[np.arange(users), future.level, start].sum())
    return (dual, *_airtime_bought(work, choices, order, after, future, grid, start))


def _airtime_bought(work: np.ndarray, choices: list, order: np.ndarray, after: np.ndarray, future: Future,
                    grid: _Grid, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The airtime ``[T, J]`` the users' best plans (followed forward from their start) buy in each priced slice
    (each round's work in the cheapest slices up to its finish slice), and their levels ``[T, U]``."""
    rounds, slices = order.shape[0], order.shape[1]
    used = np.zeros((rounds, slices))
    plan = np.zeros((rounds, len(future.buffer)), dtype=np.int64)
    users = np.arange(len(future.buffer))
    level, idx, playing = future.level.copy(), start.copy(), np.ones(len(users), dtype=bool)
    for t, (best_a, best_j, go) in enumerate(choices):
        playing &= go[users, level, idx]
        a = best_a[users, level, idx]
        jj = best_j[users, a, idx]
        for u in users[playing & (jj < slices)]:
            remaining = work[t, u, a[u]]
            for k in order[t, jj[u], :jj[u] + 1]:
                take = min(grid.step, remaining)
                used[t, k] += take
                remaining -= take
                if remaining <= 0:
                    break
        plan[t] = np.where(playing, a, 0)
        level, idx = np.where(playing, a, level), np.where(playing, after[idx, jj], idx)
    return used, plan


def sharing_bound(config: VREdgeConfig, future: Future, grid_s: float = 0.1, delay_grid_s: float = 0.02,
                  airtime_s: float = 6.0, iterations: int = 20, step: float = 1.0, final_grid_s: float | None = None,
                  target: float = -np.inf, penalty: Penalty | None = None) -> HindsightBound:
    """An upper bound on the best return on ``future`` that keeps processor sharing: a Lagrangian relaxation of
    "each user's copy of the others' levels is their levels".

    Under processor sharing user ``u``'s download time is ``w_u + sum_{v != u} min(w_v, w_u)`` (``w``: the works),
    so it depends on the others only through their levels that round. Give each user its own copy of the others'
    levels, and relax "copy = level" with a price ``m[t, u, v, k]`` per round, user, other user and level (either
    sign): user ``u`` pays ``m[t, u, v, k]`` when its copy of ``v`` plays ``k`` and is paid ``m[t, v, u, k]`` when it
    plays ``k`` itself. For a real plan (copies = levels) the prices cancel, so its return is at most the sum over
    users of what each can earn alone, choosing its level and its copies freely each round (weak duality). Each
    user's problem is a dynamic programme over its buffer and level, on a buffer grid of ``grid_s`` seconds
    (buffers rounded up), each other's delay rounded down to ``delay_grid_s`` and their sum down to ``grid_s``, and
    may stop at any round: every value is at least the exact one. The prices start at zero (every user sees the
    others at the lowest level) and move by subgradient steps as :func:`lagrangian_bound`'s, aimed at the higher of
    ``target`` (a return some player reaches: the clairvoyant's) and what the users' plans reach played together;
    the lowest value is returned, computed again on ``final_grid_s`` (finer; default ``grid_s``) at the best
    prices (tighter than :func:`lagrangian_bound`'s any schedule: ``docs/ceiling.md``).

    With ``penalty`` (:func:`information_penalty` on ``grid_s``; no ``final_grid_s``) each user pays its charges as
    in :func:`lagrangian_bound` (a bound in expectation over episodes); a user here cannot finish later at will, so
    the best value over the ``2 + ceil((users - 1) delay_grid_s / grid_s)`` buffer cells a round may land in is
    taken (no penalty: the same result; ``docs/ceiling.md``, "The penalty")."""
    grid = _Grid.of(config, grid_s, airtime_s)
    charge = _checked_charge(penalty, future, grid)
    if charge is not None and final_grid_s not in (None, grid_s):
        raise ValueError(f"final_grid_s={final_grid_s} with a penalty on grid_s={grid_s}: leave final_grid_s out")
    users, levels = len(future.buffer), config.num_levels
    prices = np.zeros((future.rounds, users, users, levels))
    best, best_prices, values, reached, scale = np.inf, prices, [], target, step
    for k in range(max(iterations, 1)):
        value, plan, copies, playing = _sharing_dual(config, future, grid, delay_grid_s, prices, charge)
        values.append(value)
        reached = max(reached, _reached(config, future, penalty, plan))
        if value < best:
            best, best_prices = value, prices.copy()
        elif k % 5 == 4:
            scale /= 2
        own = (plan[:, None, :, None] == np.arange(levels)) & playing[:, None, :, None]  # [T, u, v, k]: v plays k
        copied = (copies[..., None] == np.arange(levels)) & playing[:, :, None, None]  # u's copy of v plays k
        gradient = (own.astype(np.float64) - copied) * (1 - np.eye(users))[None, :, :, None]
        norm = float((gradient**2).sum())
        if norm == 0 or k + 1 == iterations:
            break
        prices = prices - scale * (value - reached) / norm * gradient
    if final_grid_s is not None and final_grid_s != grid_s:
        best = min(best, _sharing_dual(config, future, _Grid.of(config, final_grid_s, airtime_s), delay_grid_s,
                                       best_prices)[0])
    return HindsightBound(value=best, prices=best_prices, grid_s=final_grid_s or grid_s, values=values)


def _sharing_dual(config: VREdgeConfig, future: Future, grid: _Grid, delay_step: float, prices: np.ndarray,
                  charge: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sharing_bound`'s dual value at ``prices`` ``[T, U, U, L]``, and the users' best plans followed from
    their start: levels ``[T, U]``, copies ``[T, U, U]`` (of each other user's level) and whether each still
    plays ``[T, U]``."""
    work = works(config, future)  # [T, U, L]
    copies = _Copies.of(work, grid, delay_step, prices)
    below = None if charge is None else 2 + int(np.ceil((work.shape[1] - 1) * delay_step / grid.step - 1e-9))
    value, choices = _sharing_values(config, work, grid, copies, charge, below)
    start = np.minimum(np.ceil(future.buffer / grid.step).astype(np.int64), grid.top)
    dual = float(value[np.arange(len(start)), future.level, start].sum())
    return (dual, *_sharing_path(future, choices, copies, start))


@dataclass(frozen=True)
class _Copies:
    """What each user's copies of the others cost, per round ``t``, user ``u``, own level ``a`` and delay bucket
    ``j`` (``grid.step`` each): ``fee`` ``[T, U, L, J]`` (minus the cheapest copies whose delay, rounded down, falls
    in the bucket), ``income`` ``[T, U, L]`` (what the others' copies pay ``u`` for playing ``a``), and for
    following a plan back: the finest delay ``fine`` ``[T, U, L, J]`` of each bucket's best, each convolution
    stage's ``chosen`` level ``[V, T, U, L, M + 1]``, the steps ``shift`` ``[T, U, V, L, L]`` and the ``cap``."""

    fee: np.ndarray
    income: np.ndarray
    fine: np.ndarray
    chosen: np.ndarray
    shift: np.ndarray
    cap: int

    @classmethod
    def of(cls, work: np.ndarray, grid: _Grid, delay_step: float, prices: np.ndarray) -> _Copies:
        rounds, users, levels = work.shape
        cap = int(round(grid.slices * grid.step / delay_step))
        # the other user's delay to u at u's level a, per level k it is copied at: min(w_v(k), w_u(a)), rounded
        # down (and buffers below rounded up) with no tolerance: a rounding error may only favour the user
        delay = np.minimum(work[:, None, :, None, :], work[:, :, None, :, None])  # [T, u, v, a, k]
        shift = np.minimum(np.floor(delay / delay_step).astype(np.int64), cap)
        shift[:, np.arange(users), np.arange(users)] = 0  # no copy of oneself: no delay, no price
        pay = prices.copy()
        pay[:, np.arange(users), np.arange(users)] = 0.0
        total = np.full((rounds, users, levels, cap + 1), -np.inf)
        total[..., 0] = 0.0
        chosen = np.zeros((users, rounds, users, levels, cap + 1), dtype=np.int8)
        for v in range(users):  # max-plus convolution over the other users, one at a time
            best_k = np.full(total.shape, -np.inf)
            for k in range(levels):
                candidate = _land(total, shift[:, :, v, :, k], cap) - pay[:, :, v, k][:, :, None, None]
                better = candidate > best_k
                chosen[v][better] = k
                best_k = np.where(better, candidate, best_k)
            total = best_k
        # the coarse delay buckets the dynamic programme sees: the best of each, at its earliest delay
        per = int(round(grid.step / delay_step))
        buckets = (cap + per - 1) // per + 1
        padded = np.full((rounds, users, levels, buckets * per), -np.inf)
        padded[..., :cap + 1] = total
        coarse = padded.reshape(rounds, users, levels, buckets, per)
        return cls(fee=np.max(coarse, axis=-1), income=np.einsum("tvua->tua", pay),
                   fine=np.argmax(coarse, axis=-1) + per * np.arange(buckets), chosen=chosen, shift=shift, cap=cap)


def _sharing_values(config: VREdgeConfig, work: np.ndarray, grid: _Grid, copies: _Copies,
                    charge: np.ndarray | None = None, below: int | None = None
                    ) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
    """Each user's dynamic programme, backward: its value ``[U, L, G + 1]`` at the start, and per round its best
    level ``[U, L, G + 1]``, delay bucket ``[U, L, G + 1]``, whether it plays on, and its buffer after
    ``[U, L, G + 1, J]`` (rounded up)."""
    users, levels, buckets = work.shape[1], work.shape[2], copies.fee.shape[-1]
    q = config.quality
    share = 1.0 / users
    own = share * (config.quality_weight * q[None, :] - config.switch_weight * np.abs(q[None, :] - q[:, None]))
    i = np.arange(grid.top + 1)
    value = np.zeros((users, levels, grid.top + 1))
    choices = []
    for t in range(work.shape[0] - 1, -1, -1):
        finish = work[t][:, :, None, None] + grid.step * np.arange(buckets)[None, None, None, :]  # [u, a, 1, J]
        left = grid.step * i[None, None, :, None] - finish  # [u, a, G + 1, J]
        after = np.minimum(np.ceil((np.maximum(left, 0.0) + config.segment_s) / grid.step),
                           grid.top).astype(np.int64)
        reach = value if below is None else _window_max(value, below)  # the best of the cells the buffer may be in
        later = np.take_along_axis(reach, after.reshape(users, levels, -1), axis=2).reshape(after.shape)
        total_j = later - share * config.stall_weight * np.maximum(-left, 0.0) + copies.fee[t][:, :, None, :]
        best_j = np.argmax(total_j, axis=-1)  # [u, a, G + 1]
        h = np.take_along_axis(total_j, best_j[..., None], axis=-1)[..., 0] + copies.income[t][:, :, None]
        if charge is not None:
            h = h - charge[t]
        cont = own[None, :, :, None] + h[:, None, :, :]  # [u, l, a, G + 1]
        best_a = np.argmax(cont, axis=2)
        value = np.maximum(np.take_along_axis(cont, best_a[:, :, None], axis=2)[:, :, 0], 0.0)
        choices.append((best_a, best_j, value > 0, after))
    return value, choices[::-1]


def _sharing_path(future: Future, choices: list[tuple[np.ndarray, ...]], copies: _Copies, start: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The users' best plans followed forward from their start: levels ``[T, U]``, copies ``[T, U, U]`` and whether
    each still plays ``[T, U]`` (level 0 once it stops)."""
    rounds, users = len(choices), len(start)
    plan = np.zeros((rounds, users), dtype=np.int64)
    copied = np.zeros((rounds, users, users), dtype=np.int64)
    playing = np.zeros((rounds, users), dtype=bool)
    us = np.arange(users)
    level, idx, going = future.level.copy(), start.copy(), np.ones(users, dtype=bool)
    for t, (best_a, best_j, go, after) in enumerate(choices):
        going &= go[us, level, idx]
        a = best_a[us, level, idx]
        j = best_j[us, a, idx]
        fine = copies.fine[t, us, a, j]
        for v in range(users - 1, -1, -1):  # back through the convolution: each other user's copied level
            k = copies.chosen[v, t, us, a, np.minimum(fine, copies.cap)]
            copied[t, :, v] = k
            fine = np.maximum(fine - copies.shift[t, us, v, a, k], 0)
        plan[t], playing[t] = np.where(going, a, 0), going
        level, idx = np.where(going, a, level), np.where(going, after[us, a, idx, j], idx)
    return plan, copied, playing


def _land(total: np.ndarray, shift: np.ndarray, cap: int) -> np.ndarray:
    """``total`` ``[T, U, L, M + 1]`` moved up by ``shift`` ``[T, U, L]`` steps, what lands past the cap kept at the
    cap (the best of it: a shorter delay than the true one, in the user's favour)."""
    m = np.arange(cap + 1)
    src = m - shift[..., None]  # where the entry at m comes from
    out = np.where(src >= 0, np.take_along_axis(total, np.maximum(src, 0), axis=-1), -np.inf)
    tail_start = cap + 1 - shift  # entries from here on land past the cap
    suffix_best = np.maximum.accumulate(total[..., ::-1], axis=-1)[..., ::-1]  # the best from m' on
    tail = np.take_along_axis(suffix_best, np.clip(tail_start, 0, cap)[..., None], axis=-1)[..., 0]
    out[..., cap] = np.maximum(out[..., cap], np.where(tail_start <= cap, tail, -np.inf))
    return out
