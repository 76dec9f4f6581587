"""Keyed sampling noise: a pure function of (env key, step, element), computed with torch integer ops.

Why: noise drawn from a stateful ``torch.Generator`` depends on how many numbers were drawn
before it, that is on how envs are batched into policy calls. Keyed noise depends only on
the env's key (``collectors.seeding.noise_keys``: from the run seed and the env index), the
env's step counter and the element's position in the env's row, so each env's actions depend
only on its own observations, however envs are grouped (``RolloutCollector(num_splits=2)``
calls the policy on half of the envs at a time).

The bits come from the SplitMix64 finalizer of a two-dimensional Weyl sequence,
``key + step * G1 + element * G2 (mod 2**64)``. torch has no unsigned 64-bit
multiply, so the arithmetic is done on ``int64``, whose multiplication wraps modulo
2**64 like an unsigned one (two's complement; ``tests/test_noise.py`` checks it against
NumPy's ``uint64``); right shifts are masked to make them logical.

    >>> keys, steps = torch.tensor([11, 12]), torch.tensor([0, 0])
    >>> g = gumbel(keys, steps, (2, 3))           # [n, *shape]: 3 noise values per env
    >>> torch.equal(g[1:], gumbel(keys[1:], steps[1:], (1, 3)))  # env 1 alone: same noise
    True
"""

from __future__ import annotations

import math

import torch

_G1 = 0x9E3779B97F4A7C15  # odd Weyl increments (golden ratio, and R2's first constant)
_G2 = 0xD1B54A32D192ED03
_M1 = 0xBF58476D1CE4E5B9  # SplitMix64 finalizer multipliers
_M2 = 0x94D049BB133111EB


def _int64(c: int) -> int:
    """The int64 with the bit pattern of the uint64 ``c`` (what a wrapping multiply needs)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _xorshift(x: torch.Tensor, s: int) -> torch.Tensor:
    # arithmetic shift, masked to a logical one: the sign bit must not smear into the top bits
    return x ^ ((x >> s) & ((1 << (64 - s)) - 1))


def hash_bits(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """64 random bits (as ``int64``) per element: ``[n, *shape[1:]]`` for ``n = len(keys)``.

    ``keys`` and ``steps`` are ``int64`` tensors of shape ``[n]``; ``shape[0]`` must be ``n``.
    Element ``(i, j...)`` depends only on ``keys[i]``, ``steps[i]`` and the flat index of ``j...``
    within the row.
    """
    n, rest = shape[0], tuple(shape[1:])
    if keys.shape != (n,) or steps.shape != (n,):
        raise ValueError(f"keys {tuple(keys.shape)} and steps {tuple(steps.shape)} must both be ({n},) for noise "
                         f"of shape {tuple(shape)}")
    width = math.prod(rest)
    row = keys.to(torch.int64) + steps.to(torch.int64) * _int64(_G1)
    offsets = torch.arange(width, dtype=torch.int64, device=keys.device) * _int64(_G2)
    x = (row[:, None] + offsets).reshape(n, *rest)
    x = _xorshift(x, 30) * _int64(_M1)
    x = _xorshift(x, 27) * _int64(_M2)
    return _xorshift(x, 31)


def uniform(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 uniforms in the open interval (0, 1), ``[n, *shape[1:]]``: the top 24 bits, centred."""
    top = (hash_bits(keys, steps, shape) >> 40) & 0xFFFFFF
    return top.to(torch.float32).mul_(2.0 ** -24).add_(2.0 ** -25)


def gumbel(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))``, ``[n, *shape[1:]]`` float32 (for Gumbel-max sampling)."""
    return uniform(keys, steps, shape).log_().neg_().log_().neg_()


def normal(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal noise, ``[n, *shape[1:]]`` float32, by Box-Muller on two 24-bit halves of one hash."""
    bits = hash_bits(keys, steps, shape)
    u1 = ((bits >> 40) & 0xFFFFFF).to(torch.float32).mul_(2.0 ** -24).add_(2.0 ** -25)
    u2 = ((bits >> 16) & 0xFFFFFF).to(torch.float32).mul_(2.0 ** -24)
    return u1.log_().mul_(-2.0).sqrt_().mul_(torch.cos(u2.mul_(2 * math.pi)))
