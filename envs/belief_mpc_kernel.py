""":class:`envs.belief_mpc_torch.TorchBeliefMPC`'s rollout as one compiled loop for a CPU (Numba): what labels
distillation's states where the learner is a CPU.

On a CPU the torch rollout is bound by memory and by its many small operations: each round reads and writes a few
``[B, S, K, U]`` float64 tensors a dozen times and sorts rows of 8-12 users with a general sort. This kernel plays
each (env, scenario, candidate) row to the horizon in a few cache lines instead: one pass over the users per round,
an insertion sort of the row's works (measured faster here than a sorting network or ranks by counting), the sums in
NumPy's order. Its arithmetic is the torch rollout's operation for operation: every product, sum and comparison in
the same order, in float64, no fused multiply-add (Numba contracts none without ``fastmath``), so it gives the same
expected returns to the last bit (``tests/test_belief_mpc_torch.py`` compares all three rollouts). The envs are split
over torch's intra-op threads (the kernel releases the GIL), so a run's thread plan holds for it too.

Equal works keep slot order; the works that tie in practice are 0 (inactive slots), whose finish times are 0 in any
order. Compiled on first use (a few seconds) and cached beside this file (or in Numba's cache directory).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np
import torch


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
    scenarios' ``weight`` ``[B, S]`` and per-round tensors ``[H, B, S, U]``; ``constants``: the config's
    ``segment_s, max_buffer_s, quality_weight, stall_weight, switch_weight, abandon_stall_s`` and fair_share's
    low-buffer bound."""
    n_cand, n_users = first.shape[1], first.shape[2]
    horizon, n_scen = bits.shape[0], weight.shape[1]
    scratch = np.empty((8, n_users))  # a row's state and this round's numbers, reused by every row
    order = np.empty(n_users, np.int64)
    scen = np.empty((5, horizon, n_users))  # one scenario's rounds, contiguous
    totals = np.empty((n_scen, n_cand))
    for b in range(first_row, end_row):
        on = scratch[7]
        for u in range(n_users):
            on[u] = 1.0 if ((not masked) or active[b, u]) else 0.0
        for s in range(n_scen):
            for h in range(horizon):
                for u in range(n_users):
                    scen[0, h, u] = capacity_channel[h, b, s, u]
                    scen[1, h, u] = bits[h, b, s, u]
                    scen[2, h, u] = quality[h, b, s, u]
                    scen[3, h, u] = bits_low[h, b, s, u]
                    scen[4, h, u] = quality_low[h, b, s, u]
            for k in range(n_cand):
                totals[s, k] = _row_return(first[b, k], buffer0[b], level0[b], cum_stall0[b], masked, remaining[b],
                                           scen, segment_bits, level_quality, constants, scratch, order)
        for k in range(n_cand):  # the scenarios' weighted sum, one after the other (NumPy's order)
            value = totals[0, k] * weight[b, 0]
            for s in range(1, n_scen):
                value = value + totals[s, k] * weight[b, s]
            out[b, k] = value


@numba.njit(cache=True, inline="always")
def _row_return(first: np.ndarray, buffer0: np.ndarray, level0: np.ndarray, cum_stall0: np.ndarray, masked: bool,
                remaining: int, scen: np.ndarray, segment_bits: np.ndarray, level_quality: np.ndarray,
                constants: np.ndarray, scratch: np.ndarray, order: np.ndarray) -> float:  # pragma: no cover
    """The return of one (env, scenario, candidate) row over the horizon: ``first``'s levels this round, fair_share's
    after, the rest of the episode forfeit where a user abandons. ``scratch`` rows: the buffers, the qualities
    before, the stalls so far, the segments' bits and qualities, the works, the users' rewards, the active flags."""
    qw, abandon = constants[2], constants[5]
    buffer, q_before, cum_stall, seg, q, on = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4], scratch[7]
    for u in range(len(first)):
        buffer[u] = buffer0[u]
        q_before[u] = level_quality[level0[u]]
        cum_stall[u] = cum_stall0[u]
        level = first[u] if on[u] > 0 else 0
        seg[u] = segment_bits[level]
        q[u] = level_quality[level]
    total, alive = 0.0, 1.0
    for h in range(scen.shape[1]):
        reward = _round_reward(h, scen, constants, masked, scratch, order)
        most = cum_stall[0]
        for u in range(1, len(first)):
            most = max(most, cum_stall[u])
        weight_h = alive * (1.0 if h < remaining else 0.0)
        total = total + weight_h * reward
        if most > abandon and weight_h > 0:
            total = total - qw * float(max(remaining - h - 1, 0))
            alive = 0.0
    return total


@numba.njit(cache=True, inline="always")
def _round_reward(h: int, scen: np.ndarray, constants: np.ndarray, masked: bool, scratch: np.ndarray,
                  order: np.ndarray) -> float:  # pragma: no cover
    """Round ``h`` of a row (``scratch`` as :func:`_row_return`'s, updated): fair_share's segments after the first
    round (one level lower where the buffer is low), downloads shared in turn (processor sharing: each finish is
    what the smaller works took, in ascending order), stalls and buffers; returns the mean reward of the users."""
    segment_s, max_buffer, qw, sw, cw, low_buffer = (constants[0], constants[1], constants[2], constants[3],
                                                     constants[4], constants[6])
    buffer, q_before, cum_stall, seg, q = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    work, user_reward, on = scratch[5], scratch[6], scratch[7]
    n_users = len(buffer)
    for u in range(n_users):
        if h:
            low = buffer[u] < low_buffer
            seg[u] = scen[3, h, u] if low else scen[1, h, u]
            q[u] = scen[4, h, u] if low else scen[2, h, u]
        w = seg[u] / scen[0, h, u]
        j = u  # insertion sort of the works so far (ties stay in slot order)
        while j > 0 and work[j - 1] > w:
            work[j] = work[j - 1]
            order[j] = order[j - 1]
            j -= 1
        work[j] = w
        order[j] = u
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


def fused_expected_return(mpc: Any, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor],
                          first: torch.Tensor) -> torch.Tensor:
    """:meth:`envs.belief_mpc_torch.TorchBeliefMPC.expected_return` of ``mpc`` on CPU tensors by
    :func:`expected_returns`, the envs split over torch's intra-op threads."""
    cfg = mpc.config
    masked = "active" in start
    active = start["active"] if masked else torch.ones_like(start["buffer"], dtype=torch.bool)
    constants = np.array([cfg.segment_s, cfg.max_buffer_s, cfg.quality_weight, cfg.stall_weight, cfg.switch_weight,
                          cfg.abandon_stall_s, mpc._low_buffer], dtype=np.float64)
    per_round = [cell[k][:, :, :, 0].numpy() for k in ("capacity_channel", "bits", "quality", "bits_low",
                                                         "quality_low")]
    arrays = (first.numpy(), start["buffer"].numpy(), start["level"].numpy(), start["cum_stall"].numpy(),
              active.numpy(), masked, start["remaining"].numpy(), cell["weight"].numpy(), *per_round,
              mpc._segment_bits.numpy(), mpc._quality.numpy(), constants)
    out = np.empty(first.shape[:2])
    bounds = np.linspace(0, len(out), min(torch.get_num_threads(), len(out)) + 1).astype(int)
    parts = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    if len(parts) == 1:
        expected_returns(*arrays, *parts[0], out)
    else:
        list(_pool(len(parts)).map(lambda part: expected_returns(*arrays, *part, out), parts))
    return torch.from_numpy(out)


def _pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` threads that run the kernel on parts of the envs, kept for this process (a forked child, which
    has none of its parent's threads, starts its own)."""
    return _pools(threads, os.getpid())


@functools.cache
def _pools(threads: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="belief-mpc")
