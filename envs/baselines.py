"""Heuristic bitrate controllers for VR-edge: the yardstick a trained policy must beat.

Defaults were tuned by grid search on training seeds (see ``docs/benchmarks.md``).

Every baseline maps a batch of observations ``[B, obs_dim]`` to actions ``[B, num_users]``
(int64 levels), reading only what the observation shows (no access to the env state). In a cell
whose users vary (``VREdgeConfig.masked``) they count the active users the observation flags:
a share of the cell is split among them, and an inactive slot gets level 0.

Example:
    >>> import envs
    >>> venv = envs.VREdgeVectorEnv(4, num_users=2, seed=0)
    >>> obs, _ = venv.reset()
    >>> policy = envs.make_baseline("fair_share", venv.config)
    >>> policy(obs).shape
    (4, 2)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_dynamics import decode_observation

Baseline = Callable[[np.ndarray], np.ndarray]
_TIE = 1e-9  # QoE differences below this are rounding: such plans tie
_PLANS_AT_ONCE = 1 << 16  # plans scored in one array: 512 KiB of float64, within a core's cache
_SEARCHED_AT_ONCE = 1024  # users searched at once by branch and bound (fewer: numpy's call overhead dominates)
_KEPT_AT_MOST = 1 << 19  # prefixes a search keeps at most (8 MiB an array) before it enumerates instead


def _highest_level_below(cfg: VREdgeConfig, rate_mbps: np.ndarray) -> np.ndarray:
    """Highest ladder level whose bitrate is at most ``rate_mbps`` (level 0 if none is)."""
    return np.maximum(np.searchsorted(cfg.ladder, rate_mbps, side="right") - 1, 0)


def active_count(cfg: VREdgeConfig, f: dict[str, np.ndarray]) -> int | np.ndarray:
    """The users sharing the cell in decoded observations ``f``: the active count ``[B, 1]`` where the observation
    is masked, else ``num_users`` (every slot)."""
    return f["active"].sum(axis=1, keepdims=True) if cfg.masked else cfg.num_users


def only_active(cfg: VREdgeConfig, obs: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """``levels`` ``[B, U]`` with every inactive slot's at 0, where the observation is masked (else as they are).

    >>> cfg = VREdgeConfig(num_users=2, users=1)
    >>> obs = np.zeros((1, cfg.obs_dim), np.float32); obs[0, cfg.active_user_feature] = 1.0  # slot 0 active
    >>> only_active(cfg, obs, np.array([[3, 4]]))
    array([[3, 0]])
    """
    if not cfg.masked:
        return levels
    per_user = cfg.num_user_features
    flags = np.asarray(obs)[:, :per_user * cfg.num_users][:, cfg.active_user_feature::per_user]
    return np.where(flags > 0.5, levels, 0)


def random_policy(cfg: VREdgeConfig, seed: int = 0) -> Baseline:
    """Uniformly random levels (a floor, not a contender)."""
    gen = np.random.default_rng(seed)
    return lambda obs: only_active(cfg, obs, gen.integers(0, cfg.num_levels, size=(len(obs), cfg.num_users)))


def lowest_policy(cfg: VREdgeConfig) -> Baseline:
    """Always the lowest bitrate: never stalls unless the cell nearly vanishes."""
    return lambda obs: np.zeros((len(obs), cfg.num_users), dtype=np.int64)


def throughput_policy(cfg: VREdgeConfig, safety: float = 1.0) -> Baseline:
    """Rate-based ABR: highest bitrate under ``safety`` times the user's recent throughput."""
    def act(obs: np.ndarray) -> np.ndarray:
        return only_active(cfg, obs, _highest_level_below(cfg, safety * decode_observation(cfg, obs)["throughput"]))
    return act


def buffer_policy(cfg: VREdgeConfig, reservoir_s: float = 1.0, cushion_s: float = 2.5) -> Baseline:
    """Buffer-based ABR (BBA): lowest level below the reservoir, then linear in the buffer
    over the cushion, the top level above ``reservoir + cushion``."""
    def act(obs: np.ndarray) -> np.ndarray:
        buffer = decode_observation(cfg, obs)["buffer"]
        frac = np.clip((buffer - reservoir_s) / cushion_s, 0.0, 1.0)
        return only_active(cfg, obs, np.floor(frac * (cfg.num_levels - 1) + 1e-9).astype(np.int64))
    return act


def fair_share_policy(cfg: VREdgeConfig, safety: float = 1.3, low_buffer_s: float = 1.0) -> Baseline:
    """Split the cell's recent capacity equally in airtime: user ``u`` may use
    ``safety * C_recent * channel_u / U`` Mbps (``U``: the active users, :func:`active_count`), where
    ``C_recent`` is the smaller of the last two capacity readings; one level lower while the user's buffer
    is below ``low_buffer_s``. ``safety`` above 1 pays because airtime that light users leave is shared by
    the rest."""
    def act(obs: np.ndarray) -> np.ndarray:
        f = decode_observation(cfg, obs)
        recent = f["cap_history"][:, -2:].min(axis=1, keepdims=True)
        level = _highest_level_below(cfg, safety * recent * f["channel"] / active_count(cfg, f))
        return only_active(cfg, obs, np.where(f["buffer"] < low_buffer_s, np.maximum(level - 1, 0), level))
    return act


def robust_capacity(cap_history: np.ndarray) -> np.ndarray:
    """robustMPC's throughput prediction ``[B]`` from capacity samples ``[B, n]`` (oldest first).

    The harmonic mean of the samples, divided by ``1 +`` the largest relative error the same
    predictor made on the window's own samples: sample ``j >= 1`` predicted by the harmonic mean
    of the samples before it, error ``|prediction - sample| / sample``.
    """
    h = np.asarray(cap_history, dtype=np.float64)
    inv_cumsum = np.cumsum(1.0 / h, axis=1)
    harmonic = np.arange(1, h.shape[1] + 1) / inv_cumsum  # [B, n]: harmonic mean of samples 0..j
    errors = np.abs(harmonic[:, :-1] - h[:, 1:]) / h[:, 1:]
    worst = errors.max(axis=1) if h.shape[1] > 1 else np.zeros(len(h))
    return harmonic[:, -1] / (1.0 + worst)


def mpc_levels(cfg: VREdgeConfig, buffer: np.ndarray, last_level: np.ndarray, rate_mbps: np.ndarray,
               horizon: int) -> np.ndarray:
    """First level of the best plan ``[...]`` for each user, given their buffers, last levels and a
    predicted download rate held for ``horizon`` segments.

    Every plan of ``horizon`` levels is scored with the env's QoE (quality, stall, quality
    change) on the env's buffer model, and the first level of the lowest plan within ``_TIE`` of
    the best is played. The plans are searched by branch and bound (:func:`_searched_first_levels`):
    on the cells an evaluation plays over ten times faster than scoring every plan
    (:func:`_enumerated_first_levels`), and what it returns is the same to the last bit.
    """
    shape = np.shape(buffer)
    buffer = np.reshape(buffer, -1).astype(np.float64)
    last = np.reshape(last_level, -1)
    rate = np.broadcast_to(np.reshape(rate_mbps, -1), buffer.shape)
    q = cfg.quality
    gain = cfg.quality_weight * q - cfg.switch_weight * np.abs(q - q[:, None])  # [last level, level]: the env's
    first = np.empty(len(buffer), dtype=np.int64)
    for s in range(0, len(buffer), _SEARCHED_AT_ONCE):
        users = slice(s, s + _SEARCHED_AT_ONCE)
        found = _searched_first_levels(cfg, buffer[users], last[users], rate[users], horizon, gain)
        first[users] = found if found is not None else _enumerated_first_levels(
            cfg, buffer[users], last[users], rate[users], horizon, gain)
    return first.reshape(shape)


def _enumerated_first_levels(cfg: VREdgeConfig, buffer: np.ndarray, last: np.ndarray, rate: np.ndarray,
                             horizon: int, gain: np.ndarray) -> np.ndarray:
    """:func:`mpc_levels` for users ``[n]`` (flat) by scoring every plan, ``gain[last level, level]`` the QoE of a
    segment before its stall: the plans are grown one segment at a time, so that a prefix's buffer is computed once
    for all its continuations; a few users at a time, so that their plans' arrays stay in the CPU's cache."""
    first = np.empty(len(buffer), dtype=np.int64)
    per = max(1, _PLANS_AT_ONCE // cfg.num_levels ** horizon)
    for s in range(0, len(buffer), per):
        users = slice(s, s + per)
        first[users] = _first_levels(cfg, buffer[users], last[users], rate[users], horizon, gain)
    return first


def _first_levels(cfg: VREdgeConfig, buffer: np.ndarray, last: np.ndarray, rate: np.ndarray, horizon: int,
                  gain: np.ndarray) -> np.ndarray:
    """:func:`_enumerated_first_levels` for a few users."""
    levels, n = cfg.num_levels, len(buffer)
    buf = buffer[:, None]  # [n, prefixes]
    download = cfg.ladder * cfg.segment_s / rate[:, None, None]  # [n, 1, L]
    value, step_gain = np.zeros(buf.shape), gain[last][:, None, :]
    for h in range(horizon):
        stall = np.maximum(download - buf[..., None], 0.0)  # [n, prefixes, L]
        total = value[..., None] + step_gain
        stall *= cfg.stall_weight
        total -= stall
        if h + 1 == horizon:
            break
        grown = buf[..., None] - download
        np.maximum(grown, 0.0, out=grown)
        grown += cfg.segment_s
        np.minimum(grown, cfg.max_buffer_s, out=grown)
        buf, value = grown.reshape(n, -1), total.reshape(n, -1)
        step_gain = gain[np.arange(levels ** (h + 1)) % levels]  # [prefixes, L]: plans are numbered first level
        # first, so a prefix's last level is its number modulo L
    # ties (equal QoE up to rounding) go to the lowest plan; its first level is its prefix's
    if horizon == 1:
        return np.argmax(total[:, 0] >= total[:, 0].max(axis=1, keepdims=True) - _TIE, axis=1)
    best = total.max(axis=2)  # [n, prefixes]: each prefix's best last segment
    return np.argmax(best >= best.max(axis=1, keepdims=True) - _TIE, axis=1) // levels ** (horizon - 2)


def _searched_first_levels(cfg: VREdgeConfig, buffer: np.ndarray, last: np.ndarray, rate: np.ndarray,
                           horizon: int, gain: np.ndarray) -> np.ndarray | None:
    """:func:`_enumerated_first_levels` by branch and bound: the plans grown one segment at a time, a prefix dropped
    where even the best gain in every segment left cannot bring it within ``_TIE`` of the best plan of one level
    held (a plan the enumeration scores too); the rest scored with the enumeration's own operations, in its order.

    Why it is the same to the last bit: floating-point rounding is monotone, so a plan's score is at most its
    prefix's score plus the best gains left (a stall, weighed at least 0, only lowers it), and a dropped prefix's
    plans all score below ``floor - _TIE`` <= ``best - _TIE``: none of them is the best plan nor within ``_TIE`` of
    it. Why: on the cells an evaluation plays, about one prefix of four segments in 200 is within reach of the best
    (measured at 16 users with churn); scoring the others was most of a cell evaluation's time. ``None`` where the
    bound drops too few prefixes (more than ``_KEPT_AT_MOST``: plans that tie, e.g. where quality weighs nothing)
    or a score is not a number (a rate of 0 where stalls weigh nothing): enumerate them.
    """
    levels, n = cfg.num_levels, len(buffer)
    download = cfg.ladder * cfg.segment_s / rate[:, None]  # [n, L]
    floor = _held_plan_scores(cfg, buffer, last, download, horizon, gain).max(axis=1)  # a plan's score: <= the best
    reach = floor - _TIE  # a plan below it is neither the best nor tied with it
    best_gain, top_gain = gain.max(axis=1), gain.max()  # a segment's best gain after each level, after any
    user, first, prev = np.arange(n), np.full(n, -1), last  # the prefixes (none yet), one per user
    buf, value = buffer, np.zeros(n)
    for h in range(horizon):
        if len(user) * levels > _KEPT_AT_MOST:
            return None
        user, first, prev, buf, value = (np.repeat(a, levels) for a in (user, first, prev, buf, value))
        level = np.tile(np.arange(levels), len(user) // levels)
        first = np.where(first < 0, level, first)
        d = download[user, level]
        stall = np.maximum(d - buf, 0.0)  # the enumeration's operations, in its order: the same scores
        total = value + gain[prev, level]
        stall *= cfg.stall_weight
        total -= stall
        if h + 1 == horizon:
            break
        grown = buf - d
        np.maximum(grown, 0.0, out=grown)
        grown += cfg.segment_s
        np.minimum(grown, cfg.max_buffer_s, out=grown)
        bound = total + best_gain[level]
        for _ in range(horizon - h - 2):
            bound += top_gain
        kept = bound >= reach[user]
        user, first, prev, buf, value = user[kept], first[kept], level[kept], grown[kept], total[kept]
    starts = np.flatnonzero(np.r_[True, user[1:] != user[:-1]]) if len(user) else np.empty(0, np.int64)
    best = np.maximum.reduceat(total, starts) if len(starts) == n else None  # (else: a NaN dropped a user's plans)
    if best is None or np.isnan(best).any():  # a score that is not a number: enumerate
        return None
    tied = total >= (best - _TIE)[user]
    return np.minimum.reduceat(np.where(tied, first, levels), starts)


def _held_plan_scores(cfg: VREdgeConfig, buffer: np.ndarray, last: np.ndarray, download: np.ndarray, horizon: int,
                      gain: np.ndarray) -> np.ndarray:
    """The scores ``[n, L]`` of the plans that hold one level for ``horizon`` segments, with the enumeration's
    operations in its order (the same numbers, to the last bit)."""
    levels = np.arange(cfg.num_levels)
    buf, value, step_gain = np.repeat(buffer[:, None], len(levels), axis=1), np.zeros(download.shape), gain[last]
    for _ in range(horizon):
        stall = np.maximum(download - buf, 0.0)
        total = value + step_gain
        stall *= cfg.stall_weight
        total -= stall
        grown = buf - download
        np.maximum(grown, 0.0, out=grown)
        grown += cfg.segment_s
        np.minimum(grown, cfg.max_buffer_s, out=grown)
        buf, value, step_gain = grown, total, gain[levels, levels]
    return value


def robust_mpc_policy(cfg: VREdgeConfig, share: float = 0.85, horizon: int = 5) -> Baseline:
    """robustMPC (Yin et al., SIGCOMM 2015), one controller per user over a shared cell.

    The cell's capacity is predicted robustly (:func:`robust_capacity` over the capacity
    history the observation holds); each user expects ``share`` times its equal airtime share
    of it, ``share * C_pred * channel_u / U`` Mbit/s (``U``: the active users), for the next ``horizon``
    segments and plays the first level of the plan that maximises the env's QoE (:func:`mpc_levels`).
    ``share`` (tuned on training seeds) scales that expectation.
    """
    def act(obs: np.ndarray) -> np.ndarray:
        f = decode_observation(cfg, obs)
        rate = share * robust_capacity(f["cap_history"])[:, None] * f["channel"] / active_count(cfg, f)
        if not cfg.masked:
            return mpc_levels(cfg, f["buffer"], f["last_level"], rate, horizon)
        # an inactive slot's level is 0: only the active users plan (2 of 16 slots: an eighth of the work)
        active = f["active"]
        levels = np.zeros(active.shape, dtype=np.int64)
        levels[active] = mpc_levels(cfg, f["buffer"][active], f["last_level"][active], rate[active], horizon)
        return levels
    return act


def bola_parameters(cfg: VREdgeConfig, low_s: float, high_s: float) -> tuple[float, float]:
    """BOLA's ``(V, gamma_p)`` from the ladder and two buffer levels: the lowest level is left above
    ``low_s`` seconds of buffer and the top level reached at ``high_s``.

    With utilities ``v_m = ln(S_m / S_0)`` and segment sizes ``S_m``, BOLA prefers level ``b``
    over ``a < b`` once the buffer exceeds ``V * (gamma_p + c_ab)``, where
    ``c_ab = (v_a S_b - v_b S_a) / (S_b - S_a)``; pinning the first and the last of these
    thresholds to ``low_s`` and ``high_s`` gives ``V`` and ``gamma_p``.
    """
    if cfg.num_levels < 2:
        raise ValueError("BOLA needs a ladder of at least 2 bitrates")
    if not 0 <= low_s < high_s:
        raise ValueError(f"BOLA buffer levels low_s={low_s} and high_s={high_s} are invalid: need 0 <= low_s < high_s")
    size = cfg.ladder * cfg.segment_s
    utility = np.log(size / size[0])

    def c(a: int, b: int) -> float:
        return float((utility[a] * size[b] - utility[b] * size[a]) / (size[b] - size[a]))

    first, last = c(0, 1), c(cfg.num_levels - 2, cfg.num_levels - 1)
    v = (high_s - low_s) / (last - first)
    return v, low_s / v - first


def bola_policy(cfg: VREdgeConfig, low_s: float = 1.0, high_s: float = 3.5) -> Baseline:
    """BOLA-BASIC (Spiteri et al., INFOCOM 2016), one controller per user.

    Each user picks the level maximising ``(V (v_m + gamma_p) - Q) / S_m`` for its own buffer
    ``Q`` (seconds), with ``V`` and ``gamma_p`` from :func:`bola_parameters`. Buffer-based, it
    needs no throughput estimate: the cell's sharing reaches each user only through its
    buffer. ``low_s`` and ``high_s`` were tuned on training seeds.
    """
    v, gamma = bola_parameters(cfg, low_s, high_s)
    size = cfg.ladder * cfg.segment_s
    utility = np.log(size / size[0])

    def act(obs: np.ndarray) -> np.ndarray:
        buffer = decode_observation(cfg, obs)["buffer"]
        score = (v * (utility + gamma) - buffer[..., None]) / size  # [B, U, L]
        return only_active(cfg, obs, np.argmax(score, axis=-1))
    return act


BASELINES: dict[str, Callable[..., Baseline]] = {
    "random": random_policy,
    "lowest": lowest_policy,
    "throughput": throughput_policy,
    "buffer": buffer_policy,
    "fair_share": fair_share_policy,
    "robust_mpc": robust_mpc_policy,
    "bola": bola_policy,
}


def make_baseline(name: str, config: VREdgeConfig, **params: float) -> Baseline:
    """Return the baseline ``name`` (one of :data:`BASELINES`) for envs built with ``config``."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return BASELINES[name](config, **params)
