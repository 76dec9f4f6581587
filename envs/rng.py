"""Counter-based random numbers, so that one env and a batch of envs draw identically.

Each env owns a 64-bit ``key`` and a ``counter``. Draw ``j`` of block ``counter`` is
the SplitMix64 output at index ``counter * block_size + j`` of the stream started
at ``key``. A block is a pure function of ``(key, counter)``, so a batch of envs
draws all its blocks in one vectorised call, and an env's whole RNG state is two
integers (trivial to checkpoint).
"""

from __future__ import annotations

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_53 = float(2**53)


def key_from_seed(seed: int) -> np.uint64:
    """Return the stream key of an integer seed (hashed through ``SeedSequence``)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.SeedSequence(int(seed)).generate_state(1, dtype=np.uint64)[0]


def uniform_block(keys: np.ndarray, counters: np.ndarray, block_size: int) -> np.ndarray:
    """Return ``[B, block_size]`` float64 uniforms in the open interval (0, 1).

    ``keys`` and ``counters`` are ``[B]`` uint64 arrays; row ``b`` depends only on
    ``keys[b]`` and ``counters[b]``.
    """
    index = counters[:, None] * np.uint64(block_size) + np.arange(1, block_size + 1, dtype=np.uint64)
    z = keys[:, None] + index * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    # top 53 bits, shifted by half a step so that 0 and 1 never occur (log() below)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / _TWO_POW_53


def normals(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Return standard normals from two equally shaped arrays of uniforms (Box-Muller)."""
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
