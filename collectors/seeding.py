"""Per-env seeds derived from one run seed."""

from __future__ import annotations

import numpy as np


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Return one 32-bit seed per env, spawned from ``SeedSequence(seed)``.

    Spawned children are independent streams, so runs with neighbouring seeds share
    no env seeds (unlike ``seed + i``).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(int(seed)).spawn(num_envs)]


def noise_keys(seeds: list[int]) -> list[int]:
    """One 63-bit sampling-noise key per env, derived from its env seed.

    A keyed policy (``policy(obs, noise_keys=..., steps=...)``) draws env ``i``'s noise from
    ``(noise_keys[i], step)``; deriving the key through ``SeedSequence([seed, 1])`` keeps it
    unrelated to the env's own random stream, which ``SeedSequence(seed)`` seeds.
    """
    return [int(np.random.SeedSequence([int(s), 1]).generate_state(1, np.uint64)[0] >> np.uint64(1)) for s in seeds]
