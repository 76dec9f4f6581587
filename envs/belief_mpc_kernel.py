""":class:`envs.belief_mpc_torch.TorchBeliefMPC`'s search as one compiled loop for a CPU (Numba): what labels
distillation's states where the learner is a CPU.

On a CPU the torch rollout is bound by memory and by its many small operations: each round reads and writes a few
``[B, S, K, U]`` float64 tensors a dozen times and sorts rows of 8-12 users with a general sort. Here each env's
whole search (every pass over the users, every candidate level, every scenario) runs in one call, each
(env, scenario, candidate) row played to the horizon in a few cache lines, the sums in NumPy's order. What makes a
row cheap is what the rows share:

* the base policy's segments in the rounds after the first do not depend on the candidate: a user plays its
  ``fair_share`` segment, or the one a level lower where its buffer is low. The ``2U`` works that can be played in a
  round are sorted once per (env, scenario, round) for every row, and a row picks its own from them in their order
  (the order a sort of its own works would give, equal works in slot order) instead of sorting;
* at the defaults no buffer is low after a round (a round leaves at least a segment, 1 s, and ``fair_share``'s mark is
  1 s): where no row of a pass has a low buffer (every round there), a round's works are the high segments', sorted
  once, and its downloads are the same for every row, so they are computed once, and the candidates' rows (which go
  round by round together) only stall, buffer and score, each operation done for every row in an inner loop the
  compiler vectorises;
* a row stops where every round after it would add nothing (its users abandoned, or the episode ends).

Its arithmetic is the torch rollout's operation for operation: every product, sum and comparison in the same order,
in float64, no fused multiply-add (Numba contracts none without ``fastmath``), so it gives the same expected returns
to the last bit and the same levels (``tests/test_belief_mpc_torch.py`` compares all three rollouts, a cell of short
segments playing the low buffers). The envs are split over torch's intra-op threads (the kernels release the GIL), so
a run's thread plan holds for it too. Compiled on first use (about 30 s on a 2-core CPU, once) and cached beside this
file (or in Numba's cache directory).
"""

from __future__ import annotations

import functools
import os
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np
import torch

from envs.belief_mpc import _TIE

# One env's tables (:func:`_load_env` fills them) and its candidates' scratch, allocated once per kernel call: the
# scenarios' rounds ``[S, 3, H, U]`` (capacity x channel, the base's qualities high and low); the ``2U`` works a round
# can play, sorted ``[S, H, 2U]``, with their users and variants (1: the segment a level lower); the high segments'
# works alone, sorted ``[S, H, U]``, with their users; the active flags ``[U]``; the candidates' rows ``[4, U, K]``
# (buffers, qualities before, stalls so far, users' rewards: a user's K rows side by side); a row's own round
# ``[4, U + 1]`` (works in ascending order, qualities, downloads, a low row's downloads) and ``[2U + 1]`` integers
# (the users of the sorted works, then whether each user's buffer is low); the rows' ``[2, K]`` totals and alive
# flags, and ``[K]`` rewards of a round.
EnvTables = namedtuple("EnvTables", "scen sorted_work sorted_user sorted_low high_work high_user on rows scratch ints "
                                     "totals rewards")


@numba.njit(cache=True, inline="always")
def _numpy_order_sum(x: np.ndarray, n: int) -> float:  # pragma: no cover (compiled)
    """The sum of ``x[:n]`` in NumPy's order (:func:`envs.belief_mpc_torch.numpy_order_sum`, ``n`` <= 128: beyond,
    NumPy halves the sum, and the torch expert keeps such cells on tensors)."""
    if n < 8:
        total = x[0]
        for i in range(1, n):
            total = total + x[i]
        return total
    blocks = n - n % 8
    a0, a1, a2, a3, a4, a5, a6, a7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    for i in range(8, blocks, 8):
        a0 = a0 + x[i]
        a1 = a1 + x[i + 1]
        a2 = a2 + x[i + 2]
        a3 = a3 + x[i + 3]
        a4 = a4 + x[i + 4]
        a5 = a5 + x[i + 5]
        a6 = a6 + x[i + 6]
        a7 = a7 + x[i + 7]
    total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(blocks, n):
        total = total + x[i]
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy")
def expected_returns(first: np.ndarray, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray,
                     active: np.ndarray, masked: bool, remaining: np.ndarray, weight: np.ndarray,
                     capacity_channel: np.ndarray, bits: np.ndarray, quality: np.ndarray, bits_low: np.ndarray,
                     quality_low: np.ndarray, segment_bits: np.ndarray, level_quality: np.ndarray,
                     constants: np.ndarray, first_row: int, end_row: int, out: np.ndarray) -> None:  # pragma: no cover
    """Expected returns ``[B, K]`` of the candidates ``first`` ``[B, K, U]`` (int64 levels) then ``fair_share``
    (:meth:`envs.belief_mpc_torch.TorchBeliefMPC.expected_return`), written to ``out[b]`` for ``first_row <= b <
    end_row``: the state ``[B, U]`` (``active`` read only where ``masked``), ``remaining`` ``[B]`` int64, the
    scenarios' ``weight`` ``[B, S]`` and per-round tensors ``[B, S, H, U]``; ``constants``: :func:`constants`."""
    env = _tables(bits.shape[2], weight.shape[1], first.shape[2], first.shape[1])
    for b in range(first_row, end_row):
        _load_env(b, active, masked, capacity_channel, bits, quality, bits_low, quality_low, env)
        _values(first[b], first.shape[1], b, buffer0, level0, cum_stall0, masked, remaining, weight, segment_bits,
                level_quality, constants, env, out[b])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def planned_levels(plan: np.ndarray, sweeps: int, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray,
                   active: np.ndarray, masked: bool, remaining: np.ndarray, weight: np.ndarray,
                   capacity_channel: np.ndarray, bits: np.ndarray, quality: np.ndarray, bits_low: np.ndarray,
                   quality_low: np.ndarray, segment_bits: np.ndarray, level_quality: np.ndarray,
                   constants: np.ndarray, first_row: int, end_row: int) -> None:  # pragma: no cover
    """The plans ``plan[b]`` ``[B, U]`` of ``first_row <= b < end_row`` improved in place by ``sweeps`` passes over
    the users (:meth:`envs.belief_mpc_torch.TorchBeliefMPC._improved`): each active user given the level of the
    highest expected return with the others' fixed, its own kept unless another is higher by more than the tie;
    the inputs as :func:`expected_returns`'s. The level a user holds is not played again: the last candidate that
    played the plan as it stands gave its value (the same row, the same bits)."""
    n_users, n_levels, tie = plan.shape[1], len(level_quality), constants[7]
    env = _tables(bits.shape[2], weight.shape[1], n_users, n_levels)
    candidates, tried = np.empty((n_levels, n_users), np.int64), np.empty(n_levels, np.int64)
    value, found = np.empty(n_levels), np.empty(n_levels)
    for b in range(first_row, end_row):
        _load_env(b, active, masked, capacity_channel, bits, quality, bits_low, quality_low, env)
        for _ in range(sweeps):
            known = np.nan  # the plan's value, once a candidate played it
            for u in range(n_users):
                if env.on[u] == 0:
                    continue  # an inactive slot: it plays level 0
                own, n = plan[b, u], 0
                for k in range(n_levels):
                    if k == own and known == known:
                        value[k] = known
                        continue
                    candidates[n] = plan[b]
                    candidates[n, u] = k
                    tried[n] = k
                    n += 1
                _values(candidates, n, b, buffer0, level0, cum_stall0, masked, remaining, weight, segment_bits,
                        level_quality, constants, env, found)
                for i in range(n):
                    value[tried[i]] = found[i]
                best = 0
                for k in range(1, n_levels):  # the first of the highest (argmax)
                    if value[k] > value[best]:
                        best = k
                chosen = best if value[best] > value[own] + tie else own
                plan[b, u] = chosen
                known = value[chosen]


@numba.njit(cache=True, inline="always")
def _tables(horizon: int, n_scen: int, n_users: int, rows: int) -> EnvTables:  # pragma: no cover
    """:data:`EnvTables`, empty, for up to ``rows`` candidates."""
    return EnvTables(np.empty((n_scen, 3, horizon, n_users)), np.empty((n_scen, horizon, 2 * n_users)),
                     np.empty((n_scen, horizon, 2 * n_users), np.int64),
                     np.empty((n_scen, horizon, 2 * n_users), np.int64), np.empty((n_scen, horizon, n_users)),
                     np.empty((n_scen, horizon, n_users), np.int64), np.empty(n_users),
                     np.empty((4, n_users, rows)), np.empty((4, n_users + 1)), np.empty(2 * n_users + 1, np.int64),
                     np.empty((2, rows)), np.empty(rows))


@numba.njit(cache=True, inline="always")
def _load_env(b: int, active: np.ndarray, masked: bool, capacity_channel: np.ndarray, bits: np.ndarray,
              quality: np.ndarray, bits_low: np.ndarray, quality_low: np.ndarray,
              env: EnvTables) -> None:  # pragma: no cover
    """Fill ``env`` (:data:`EnvTables`) with env ``b``'s: its scenarios' rounds, each contiguous; and for each round
    after the first the ``2U`` works a user can have there (the base's segment, or the one a level lower where its
    buffer is low, over the download's denominator) sorted ascending, equal works in slot order and a user's high
    segment before its low one, so that whichever of each user's two a row plays, taken in this order they are
    sorted as a stable sort of the row's own works would sort them; and the high segments' alone, in that order."""
    scen, sorted_work, sorted_user, sorted_low = env.scen, env.sorted_work, env.sorted_user, env.sorted_low
    on, high_work, high_user = env.on, env.high_work, env.high_user
    n_scen, horizon, n_users = bits.shape[1], bits.shape[2], bits.shape[3]
    for u in range(n_users):
        on[u] = 1.0 if ((not masked) or active[b, u]) else 0.0
    for s in range(n_scen):
        for h in range(horizon):
            for u in range(n_users):
                scen[s, 0, h, u] = capacity_channel[b, s, h, u]
                scen[s, 1, h, u] = quality[b, s, h, u]
                scen[s, 2, h, u] = quality_low[b, s, h, u]
            if h == 0:
                continue
            n = 0
            for u in range(n_users):
                for low in range(2):
                    w = (bits_low[b, s, h, u] if low else bits[b, s, h, u]) / capacity_channel[b, s, h, u]
                    j = n  # insertion sort: ties stay in the order inserted
                    while j > 0 and sorted_work[s, h, j - 1] > w:
                        sorted_work[s, h, j] = sorted_work[s, h, j - 1]
                        sorted_user[s, h, j] = sorted_user[s, h, j - 1]
                        sorted_low[s, h, j] = sorted_low[s, h, j - 1]
                        j -= 1
                    sorted_work[s, h, j] = w
                    sorted_user[s, h, j] = u
                    sorted_low[s, h, j] = low
                    n += 1
            n = 0
            for e in range(2 * n_users):  # no buffer low: the high segments' works in their order
                if sorted_low[s, h, e] == 0:
                    high_work[s, h, n] = sorted_work[s, h, e]
                    high_user[s, h, n] = sorted_user[s, h, e]
                    n += 1


@numba.njit(cache=True, inline="always")
def _values(candidates: np.ndarray, n: int, b: int, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray,
            masked: bool, remaining: np.ndarray, weight: np.ndarray, segment_bits: np.ndarray,
            level_quality: np.ndarray, constants: np.ndarray, env: EnvTables,
            out: np.ndarray) -> None:  # pragma: no cover
    """``out[:n]``: the expected returns of env ``b`` playing ``candidates[:n]`` (levels ``[n, U]``) this round,
    each scenario's returns weighted and added one after the other (NumPy's order)."""
    for s in range(weight.shape[1]):
        _scenario_returns(candidates, n, buffer0[b], level0[b], cum_stall0[b], masked, remaining[b], s,
                          segment_bits, level_quality, constants, env)
        returns = env.totals[0]
        for k in range(n):
            out[k] = returns[k] * weight[b, s] if s == 0 else out[k] + returns[k] * weight[b, s]


@numba.njit(cache=True, inline="always")
def _scenario_returns(candidates: np.ndarray, n: int, buffer0: np.ndarray, level0: np.ndarray,
                      cum_stall0: np.ndarray, masked: bool, remaining: int, s: int, segment_bits: np.ndarray,
                      level_quality: np.ndarray, constants: np.ndarray, env: EnvTables) -> None:  # pragma: no cover
    """The returns ``env.totals[0][:n]`` of the rows of ``candidates[:n]`` on scenario ``s`` over the horizon: the
    candidate's levels this round, fair_share's after, the rest of the episode forfeit where a user abandons. The
    rows go round by round together: where no buffer is low (every row at the defaults), a round's downloads are
    the same for every row (the high segments' works, sorted once), so they are computed once and each row only
    stalls, buffers and scores; a row with a low buffer plays its own works (picked from the sorted ``2U``). A row
    stops where every round after it would add nothing (0 x a finite reward: its total as it is)."""
    scen, rows, scratch, ints = env.scen, env.rows, env.scratch, env.ints
    qw, abandon, low_buffer = constants[2], constants[5], constants[6]
    total, alive = env.totals[0], env.totals[1]
    n_users = rows.shape[1]
    work, order, q, download = scratch[0], ints[:n_users + 1], scratch[1], scratch[2]
    for k in range(n):  # the first round: each row's own works, sorted
        row = rows[:, :, k]
        for u in range(n_users):
            level = candidates[k, u] if env.on[u] > 0 else 0
            q[u] = level_quality[level]
            w = segment_bits[level] / scen[s, 0, 0, u]
            j = u  # insertion sort of the works so far (ties stay in slot order)
            while j > 0 and work[j - 1] > w:
                work[j] = work[j - 1]
                order[j] = order[j - 1]
                j -= 1
            work[j] = w
            order[j] = u
            row[0, u], row[1, u], row[2, u] = buffer0[u], level_quality[level0[u]], cum_stall0[u]
        _shared_downloads(work, order, n_users, download)
        reward = _played_round(download, q, row, constants, masked, env.on)
        total[k], alive[k] = 0.0, 1.0
        _scored(k, reward, row[2], 0, remaining, qw, abandon, env.totals)
    for h in range(1, scen.shape[2]):
        if h >= remaining:
            break  # the episode has ended: every row's total as it is
        _shared_downloads(env.high_work[s, h], env.high_user[s, h], n_users, download)
        any_low = False
        for u in range(n_users):
            for k in range(n):
                any_low |= rows[0, u, k] < low_buffer
        if not any_low:  # every row's round at once (a row that stopped plays on, its total as it is)
            _played_rounds(download, scen[s, 1, h], rows, n, constants, masked, env.on, env.rewards)
        for k in range(n):
            if alive[k] == 0.0:
                continue  # its users abandoned: nothing left to add
            if any_low:
                reward = _low_round(rows[:, :, k], s, h, low_buffer, constants, masked, env, work, order, q)
            else:
                reward = env.rewards[k]
            _scored(k, reward, rows[2, :, k], h, remaining, qw, abandon, env.totals)


@numba.njit(cache=True, inline="always")
def _low_round(row: np.ndarray, s: int, h: int, low_buffer: float, constants: np.ndarray, masked: bool,
               env: EnvTables, work: np.ndarray, order: np.ndarray, q: np.ndarray) -> float:  # pragma: no cover
    """Round ``h`` of a row with a low buffer: each user's works (a level lower where its buffer is low) picked from
    the ``2U`` sorted in their order, its downloads shared in turn; returns the mean reward of the users."""
    n_users = row.shape[1]
    low = env.ints[n_users + 1:]
    for u in range(n_users):  # (indices, not branches: which way a buffer goes is not predictable)
        is_low = np.int64(row[0, u] < low_buffer)
        low[u] = is_low
        q[u] = env.scen[s, 1 + is_low, h, u]
    kept = 0
    for e in range(2 * n_users):
        user = env.sorted_user[s, h, e]
        work[kept] = env.sorted_work[s, h, e]
        order[kept] = user
        kept += np.int64(low[user] == env.sorted_low[s, h, e])
    download = env.scratch[3]
    _shared_downloads(work, order, n_users, download)
    return _played_round(download, q, row, constants, masked, env.on)


@numba.njit(cache=True, inline="always")
def _shared_downloads(work: np.ndarray, order: np.ndarray, n_users: int,
                      download: np.ndarray) -> None:  # pragma: no cover
    """``download[u]``: when user ``u``'s segment is in, the works ``work`` (in ascending order, of the users
    ``order``) shared in turn (processor sharing: each finish is what the smaller works took, in ascending order)."""
    running = 0.0
    for i in range(n_users):
        w = work[i]
        running = running + w
        download[order[i]] = running + float(n_users - 1 - i) * w


@numba.njit(cache=True, inline="always")
def _played_round(download: np.ndarray, q: np.ndarray, row: np.ndarray, constants: np.ndarray, masked: bool,
                  on: np.ndarray) -> float:  # pragma: no cover
    """A row's round whose users' segments (qualities ``q``) are in after ``download``: stalls and buffers
    (``row``: buffers, qualities before, stalls so far, rewards) updated; returns the mean reward of the users."""
    segment_s, max_buffer, qw, sw, cw = constants[0], constants[1], constants[2], constants[3], constants[4]
    buffer, q_before, cum_stall, user_reward = row[0], row[1], row[2], row[3]
    n_users = len(buffer)
    for u in range(n_users):
        d = download[u]
        stall = max(d - buffer[u], 0.0)
        buffer[u] = min(max(buffer[u] - d, 0.0) + segment_s, max_buffer)
        r = qw * q[u] - sw * stall - cw * abs(q[u] - q_before[u])
        user_reward[u] = r * on[u] if masked else r
        q_before[u] = q[u]
        cum_stall[u] = cum_stall[u] + stall
    if masked:
        return _numpy_order_sum(user_reward, n_users) / _numpy_order_sum(on, n_users)
    return _numpy_order_sum(user_reward, n_users) * (1.0 / n_users)


@numba.njit(cache=True, inline="always")
def _played_rounds(download: np.ndarray, q: np.ndarray, rows: np.ndarray, n: int, constants: np.ndarray,
                   masked: bool, on: np.ndarray, rewards: np.ndarray) -> None:  # pragma: no cover
    """:func:`_played_round` of the rows ``rows[:, :, :n]`` at once, their mean rewards in ``rewards``: each
    operation the same, done for every row in turn (an inner loop a compiler can vectorise)."""
    segment_s, max_buffer, qw, sw, cw = constants[0], constants[1], constants[2], constants[3], constants[4]
    buffer, q_before, cum_stall, user_reward = rows[0], rows[1], rows[2], rows[3]
    n_users = buffer.shape[0]
    for u in range(n_users):
        d, qu, weight = download[u], q[u], on[u] if masked else 1.0
        for k in range(n):
            stall = max(d - buffer[u, k], 0.0)
            buffer[u, k] = min(max(buffer[u, k] - d, 0.0) + segment_s, max_buffer)
            r = qw * qu - sw * stall - cw * abs(qu - q_before[u, k])
            user_reward[u, k] = r * weight if masked else r
            q_before[u, k] = qu
            cum_stall[u, k] = cum_stall[u, k] + stall
    _numpy_order_sums(user_reward, n, rewards)
    if masked:
        count = _numpy_order_sum(on, n_users)
        for k in range(n):
            rewards[k] = rewards[k] / count
    else:
        for k in range(n):
            rewards[k] = rewards[k] * (1.0 / n_users)


@numba.njit(cache=True, inline="always")
def _numpy_order_sums(x: np.ndarray, n: int, out: np.ndarray) -> None:  # pragma: no cover
    """``out[k]``: the sum of ``x[:, k]`` in NumPy's order (:func:`_numpy_order_sum`) for each ``k < n``."""
    users = x.shape[0]
    if users < 8:
        for k in range(n):
            out[k] = x[0, k]
        for i in range(1, users):
            for k in range(n):
                out[k] = out[k] + x[i, k]
        return
    blocks = users - users % 8
    for k in range(n):
        a0, a1, a2, a3, a4, a5, a6, a7 = x[0, k], x[1, k], x[2, k], x[3, k], x[4, k], x[5, k], x[6, k], x[7, k]
        for i in range(8, blocks, 8):
            a0 = a0 + x[i, k]
            a1 = a1 + x[i + 1, k]
            a2 = a2 + x[i + 2, k]
            a3 = a3 + x[i + 3, k]
            a4 = a4 + x[i + 4, k]
            a5 = a5 + x[i + 5, k]
            a6 = a6 + x[i + 6, k]
            a7 = a7 + x[i + 7, k]
        total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        for i in range(blocks, users):
            total = total + x[i, k]
        out[k] = total


@numba.njit(cache=True, inline="always")
def _scored(k: int, reward: float, cum_stall: np.ndarray, h: int, remaining: int, qw: float, abandon: float,
            totals: np.ndarray) -> None:  # pragma: no cover
    """Row ``k``'s round ``h`` added to its total (``totals``: totals, alive); the rest of the episode forfeit
    where a user's stalls pass the abandonment mark, after which the row is no longer alive (nothing left to add)."""
    most = cum_stall[0]
    for u in range(1, len(cum_stall)):
        most = max(most, cum_stall[u])
    weight_h = totals[1, k] * (1.0 if h < remaining else 0.0)
    totals[0, k] = totals[0, k] + weight_h * reward
    if most > abandon and weight_h > 0:
        totals[0, k] = totals[0, k] - qw * float(max(remaining - h - 1, 0))
        totals[1, k] = 0.0


def constants(mpc: Any) -> np.ndarray:
    """The kernel's constants of ``mpc`` (a :class:`envs.belief_mpc_torch.TorchBeliefMPC`): its config's
    ``segment_s, max_buffer_s, quality_weight, stall_weight, switch_weight, abandon_stall_s``, fair_share's
    low-buffer bound and the tie below which a level's lead is rounding."""
    cfg = mpc.config
    return np.array([cfg.segment_s, cfg.max_buffer_s, cfg.quality_weight, cfg.stall_weight, cfg.switch_weight,
                     cfg.abandon_stall_s, mpc._low_buffer, _TIE], dtype=np.float64)


def fused_expected_return(mpc: Any, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor],
                          first: torch.Tensor) -> torch.Tensor:
    """:meth:`envs.belief_mpc_torch.TorchBeliefMPC.expected_return` of ``mpc`` on CPU tensors by
    :func:`expected_returns`, the envs split over torch's intra-op threads."""
    out = np.empty(first.shape[:2])
    _over_threads(lambda rows: expected_returns(first.numpy(), *_inputs(mpc, start, cell), *rows, out), len(out))
    return torch.from_numpy(out)


def fused_planned(mpc: Any, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor], plan: torch.Tensor
                  ) -> torch.Tensor:
    """``plan`` ``[B, U]`` (CPU, int64) after ``mpc.settings.sweeps`` passes over the users by
    :func:`planned_levels` (:meth:`envs.belief_mpc_torch.TorchBeliefMPC._improved`'s, each), the envs split over
    torch's intra-op threads."""
    levels = plan.numpy().copy()
    inputs = _inputs(mpc, start, cell)
    _over_threads(lambda rows: planned_levels(levels, mpc.settings.sweeps, *inputs, *rows), len(levels))
    return torch.from_numpy(levels)


def _inputs(mpc: Any, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor]) -> tuple:
    """The kernels' inputs after the candidates (or the plan): the start state, the scenarios, ``mpc``'s
    tables and :func:`constants`."""
    masked = "active" in start
    active = start["active"] if masked else torch.ones_like(start["buffer"], dtype=torch.bool)
    per_round = [cell[k].numpy() for k in ("capacity_channel", "bits", "quality", "bits_low", "quality_low")]
    return (start["buffer"].numpy(), start["level"].numpy(), start["cum_stall"].numpy(), active.numpy(), masked,
            start["remaining"].numpy(), cell["weight"].numpy(), *per_round, mpc._segment_bits.numpy(),
            mpc._quality.numpy(), constants(mpc))


def _over_threads(run: Any, envs: int) -> None:
    """``run((first, end))`` on parts of ``envs`` envs, one per torch intra-op thread (the kernels release the
    GIL; each part writes its own envs' rows)."""
    bounds = np.linspace(0, envs, min(torch.get_num_threads(), envs) + 1).astype(int)
    parts = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    if len(parts) == 1:
        run(parts[0])
    else:
        list(_pool(len(parts)).map(run, parts))


def _pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` threads that run the kernel on parts of the envs, kept for this process (a forked child, which
    has none of its parent's threads, starts its own)."""
    return _pools(threads, os.getpid())


@functools.cache
def _pools(threads: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="belief-mpc")
