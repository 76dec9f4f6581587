"""Heuristic bitrate controllers for VR-edge: the yardstick a trained policy must beat.

Defaults were tuned by grid search on training seeds (see ``docs/benchmarks.md``).

Every baseline maps a batch of observations ``[B, obs_dim]`` to actions ``[B, num_users]``
(int64 levels), reading only what the observation shows (no access to the env state).

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

from envs.vr_edge import VREdgeConfig, decode_observation

Baseline = Callable[[np.ndarray], np.ndarray]


def _highest_level_below(cfg: VREdgeConfig, rate_mbps: np.ndarray) -> np.ndarray:
    """Highest ladder level whose bitrate is at most ``rate_mbps`` (level 0 if none is)."""
    return np.maximum(np.searchsorted(cfg._ladder, rate_mbps, side="right") - 1, 0)


def random_policy(cfg: VREdgeConfig, seed: int = 0) -> Baseline:
    """Uniformly random levels (a floor, not a contender)."""
    gen = np.random.default_rng(seed)
    return lambda obs: gen.integers(0, cfg.num_levels, size=(len(obs), cfg.num_users))


def lowest_policy(cfg: VREdgeConfig) -> Baseline:
    """Always the lowest bitrate: never stalls unless the cell nearly vanishes."""
    return lambda obs: np.zeros((len(obs), cfg.num_users), dtype=np.int64)


def throughput_policy(cfg: VREdgeConfig, safety: float = 1.0) -> Baseline:
    """Rate-based ABR: highest bitrate under ``safety`` times the user's recent throughput."""
    def act(obs: np.ndarray) -> np.ndarray:
        return _highest_level_below(cfg, safety * decode_observation(cfg, obs)["throughput"])
    return act


def buffer_policy(cfg: VREdgeConfig, reservoir_s: float = 1.0, cushion_s: float = 2.5) -> Baseline:
    """Buffer-based ABR (BBA): lowest level below the reservoir, then linear in the buffer
    over the cushion, the top level above ``reservoir + cushion``."""
    def act(obs: np.ndarray) -> np.ndarray:
        buffer = decode_observation(cfg, obs)["buffer"]
        frac = np.clip((buffer - reservoir_s) / cushion_s, 0.0, 1.0)
        return np.floor(frac * (cfg.num_levels - 1) + 1e-9).astype(np.int64)
    return act


def fair_share_policy(cfg: VREdgeConfig, safety: float = 1.3, low_buffer_s: float = 1.0) -> Baseline:
    """Split the cell's recent capacity equally in airtime: user ``u`` may use
    ``safety * C_recent * channel_u / U`` Mbps, where ``C_recent`` is the smaller of the
    last two capacity readings; one level lower while the user's buffer is below ``low_buffer_s``.
    ``safety`` above 1 pays because airtime that light users leave is shared by the rest."""
    def act(obs: np.ndarray) -> np.ndarray:
        f = decode_observation(cfg, obs)
        recent = f["cap_history"][:, -2:].min(axis=1, keepdims=True)
        level = _highest_level_below(cfg, safety * recent * f["channel"] / cfg.num_users)
        return np.where(f["buffer"] < low_buffer_s, np.maximum(level - 1, 0), level)
    return act


BASELINES: dict[str, Callable[..., Baseline]] = {
    "random": random_policy,
    "lowest": lowest_policy,
    "throughput": throughput_policy,
    "buffer": buffer_policy,
    "fair_share": fair_share_policy,
}


def make_baseline(name: str, config: VREdgeConfig, **params: float) -> Baseline:
    """Return the baseline ``name`` (one of :data:`BASELINES`) for envs built with ``config``."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return BASELINES[name](config, **params)
