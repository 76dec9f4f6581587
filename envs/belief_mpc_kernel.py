""":class:`envs.belief_mpc_torch.TorchBeliefMPC`'s search as one compiled loop for a CPU (Numba): what labels
distillation's states where the learner is a CPU.

On a CPU the torch rollout is bound by memory and by its many small operations: each round reads and writes a few
``[B, S, K, U]`` float64 tensors a dozen times and sorts rows of 8-12 users with a general sort. Here each env's
whole search (every pass over the users, every candidate level, every scenario) runs in one call, each
(env, scenario, candidate) row played to the horizon in a few cache lines: one pass over the users per round and
the sums in NumPy's order. What makes a row cheap is what the rows share:

* the base policy's segments in the rounds after the first do not depend on the candidate: a user plays its
  ``fair_share`` segment, or the one a level lower where its buffer is low. The ``2U`` works that can be played in a
  round are sorted once per (env, scenario, round) for every row, and a row picks its own from them in their order
  (the order a sort of its own works would give, equal works in slot order) instead of sorting;
* at the defaults no buffer is low after a round (a round leaves at least a segment, 1 s, and ``fair_share``'s mark is
  1 s), so a row whose buffers are all above the mark (every row there) reads the works of the high segments, sorted
  once, and picks nothing;
* a row stops where every round after it would add nothing (its users abandoned, or the episode ends).

Its arithmetic is the torch rollout's operation for operation: every product, sum and comparison in the same order,
in float64, no fused multiply-add (Numba contracts none without ``fastmath``), so it gives the same expected returns
to the last bit and the same levels (``tests/test_belief_mpc_torch.py`` compares all three rollouts, a cell of short
segments playing the low buffers). The envs are split over torch's intra-op threads (the kernels release the GIL), so
a run's thread plan holds for it too. Compiled on first use (a few seconds) and cached beside this file (or in Numba's
cache directory).
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

# One env's tables (:func:`_load_env` fills them) and a row's scratch, allocated once per kernel call: the scenarios'
# rounds ``[S, 3, H, U]`` (capacity x channel, the base's qualities high and low); the ``2U`` works a round can play,
# sorted ``[S, H, 2U]``, with their users and variants (1: the segment a level lower); the high segments' works alone,
# sorted ``[S, H, U]``, with their users; the active flags ``[U]``; a row's state ``[6, U + 1]`` (buffers, qualities
# before, stalls so far, this round's qualities, works in ascending order, users' rewards); and ``[2U + 1]`` integers
# (the users of the sorted works, then whether each user's buffer is low).
EnvTables = namedtuple("EnvTables", "scen sorted_work sorted_user sorted_low high_work high_user on row ints")


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
    scenarios' ``weight`` ``[B, S]`` and per-round tensors ``[H, B, S, U]``; ``constants``: :func:`constants`."""
    env = _tables(bits.shape[2], weight.shape[1], first.shape[2])
    for b in range(first_row, end_row):
        _load_env(b, active, masked, capacity_channel, bits, quality, bits_low, quality_low, env)
        for k in range(first.shape[1]):
            out[b, k] = _expected(first[b, k], b, buffer0, level0, cum_stall0, masked, remaining, weight,
                                  segment_bits, level_quality, constants, env)


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
    env = _tables(bits.shape[2], weight.shape[1], n_users)
    candidate, value = np.empty(n_users, np.int64), np.empty(n_levels)
    for b in range(first_row, end_row):
        _load_env(b, active, masked, capacity_channel, bits, quality, bits_low, quality_low, env)
        for _ in range(sweeps):
            known = np.nan  # the plan's value, once a candidate played it
            for u in range(n_users):
                if env.on[u] == 0:
                    continue  # an inactive slot: it plays level 0
                own = plan[b, u]
                for k in range(n_levels):
                    if k == own and known == known:
                        value[k] = known
                        continue
                    for v in range(n_users):
                        candidate[v] = plan[b, v]
                    candidate[u] = k
                    value[k] = _expected(candidate, b, buffer0, level0, cum_stall0, masked, remaining, weight,
                                         segment_bits, level_quality, constants, env)
                best = 0
                for k in range(1, n_levels):  # the first of the highest (argmax)
                    if value[k] > value[best]:
                        best = k
                chosen = best if value[best] > value[own] + tie else own
                plan[b, u] = chosen
                known = value[chosen]


@numba.njit(cache=True, inline="always")
def _tables(horizon: int, n_scen: int, n_users: int) -> EnvTables:  # pragma: no cover
    """:data:`EnvTables`, empty."""
    return EnvTables(np.empty((n_scen, 3, horizon, n_users)), np.empty((n_scen, horizon, 2 * n_users)),
                     np.empty((n_scen, horizon, 2 * n_users), np.int64),
                     np.empty((n_scen, horizon, 2 * n_users), np.int64), np.empty((n_scen, horizon, n_users)),
                     np.empty((n_scen, horizon, n_users), np.int64), np.empty(n_users), np.empty((6, n_users + 1)),
                     np.empty(2 * n_users + 1, np.int64))


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
    on = env.on
    high_work, high_user = env.high_work, env.high_user
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
def _expected(levels: np.ndarray, b: int, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray,
              masked: bool, remaining: np.ndarray, weight: np.ndarray, segment_bits: np.ndarray,
              level_quality: np.ndarray, constants: np.ndarray, env: EnvTables) -> float:  # pragma: no cover
    """The expected return of env ``b`` playing ``levels`` this round: its scenarios' returns weighted and added
    one after the other (NumPy's order)."""
    value = 0.0
    for s in range(weight.shape[1]):
        ret = _row_return(levels, buffer0[b], level0[b], cum_stall0[b], masked, remaining[b], s, segment_bits,
                          level_quality, constants, env)
        value = ret * weight[b, s] if s == 0 else value + ret * weight[b, s]
    return value


@numba.njit(cache=True, inline="always")
def _row_return(levels: np.ndarray, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray, masked: bool,
                remaining: int, s: int, segment_bits: np.ndarray, level_quality: np.ndarray, constants: np.ndarray,
                env: EnvTables) -> float:  # pragma: no cover
    """The return of one (env, scenario, candidate) row over the horizon: ``levels`` this round, fair_share's
    after, the rest of the episode forfeit where a user abandons. A row's scratch: the buffers, the qualities
    before, the stalls so far, this round's qualities, the works in ascending order, the users' rewards, whether
    each user's buffer is low; ``order``: the users of the sorted works."""
    scen, sorted_work, sorted_user, sorted_low, on, scratch, order = (env.scen, env.sorted_work, env.sorted_user,
                                                                      env.sorted_low, env.on, env.row, env.ints)
    high_work, high_user = env.high_work, env.high_user
    qw, abandon, low_buffer = constants[2], constants[5], constants[6]
    buffer, q_before, cum_stall, q, work = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    n_users = len(levels)
    low = order[n_users + 1:]  # (whether each user's buffer is low, 0 or 1)
    for u in range(n_users):
        buffer[u] = buffer0[u]
        q_before[u] = level_quality[level0[u]]
        cum_stall[u] = cum_stall0[u]
        level = levels[u] if on[u] > 0 else 0
        q[u] = level_quality[level]
        w = segment_bits[level] / scen[s, 0, 0, u]
        j = u  # insertion sort of the works so far (ties stay in slot order)
        while j > 0 and work[j - 1] > w:
            work[j] = work[j - 1]
            order[j] = order[j - 1]
            j -= 1
        work[j] = w
        order[j] = u
    total, alive = 0.0, 1.0
    for h in range(scen.shape[2]):
        any_low = False
        if h:
            for u in range(n_users):
                any_low |= buffer[u] < low_buffer
        if not h:
            reward = _round_reward(work, order, q, constants, masked, scratch, on, n_users)
        elif not any_low:  # fair_share's segments: the works sorted once for every row (a low buffer is rare)
            reward = _round_reward(high_work[s, h], high_user[s, h], scen[s, 1, h], constants, masked, scratch, on,
                                   n_users)
        else:  # a level lower where the buffer is low: its works picked from both in their order
            for u in range(n_users):  # (indices, not branches: which way a buffer goes is not predictable)
                is_low = np.int64(buffer[u] < low_buffer)
                low[u] = is_low
                q[u] = scen[s, 1 + is_low, h, u]
            kept = 0
            for e in range(2 * n_users):
                user = sorted_user[s, h, e]
                work[kept] = sorted_work[s, h, e]
                order[kept] = user
                kept += np.int64(low[user] == sorted_low[s, h, e])
            reward = _round_reward(work, order, q, constants, masked, scratch, on, n_users)
        most = cum_stall[0]
        for u in range(1, n_users):
            most = max(most, cum_stall[u])
        weight_h = alive * (1.0 if h < remaining else 0.0)
        total = total + weight_h * reward
        if most > abandon and weight_h > 0:
            total = total - qw * float(max(remaining - h - 1, 0))
            alive = 0.0
        if alive == 0.0 or h + 1 >= remaining:
            break  # every round after adds 0 x a finite reward: the total as it is
    return total


@numba.njit(cache=True, inline="always")
def _round_reward(work: np.ndarray, order: np.ndarray, q: np.ndarray, constants: np.ndarray, masked: bool,
                  scratch: np.ndarray, on: np.ndarray, n_users: int) -> float:  # pragma: no cover
    """A round of a row whose works are ``work`` in ascending order, of the users ``order``, who play segments of
    qualities ``q``: downloads shared in turn (processor sharing: each finish is what the smaller works took, in
    ascending order), stalls and buffers updated; returns the mean reward of the users."""
    segment_s, max_buffer, qw, sw, cw = constants[0], constants[1], constants[2], constants[3], constants[4]
    buffer, q_before, cum_stall, user_reward = scratch[0], scratch[1], scratch[2], scratch[5]
    running = 0.0
    for i in range(n_users):
        w = work[i]
        running = running + w
        download = running + float(n_users - 1 - i) * w
        u = order[i]
        stall = max(download - buffer[u], 0.0)
        buffer[u] = min(max(buffer[u] - download, 0.0) + segment_s, max_buffer)
        r = qw * q[u] - sw * stall - cw * abs(q[u] - q_before[u])
        user_reward[u] = r * on[u] if masked else r
        q_before[u] = q[u]
        cum_stall[u] = cum_stall[u] + stall
    if masked:
        return _numpy_order_sum(user_reward, n_users) / _numpy_order_sum(on, n_users)
    return _numpy_order_sum(user_reward, n_users) * (1.0 / n_users)


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
