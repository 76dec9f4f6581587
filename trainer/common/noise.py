"""Keyed sampling noise: a pure function of (env key, step, element), computed with torch integer ops.

Why: noise drawn from a stateful ``torch.Generator`` depends on how many numbers were drawn
before it, that is on how envs are batched into policy calls. Keyed noise depends only on
the env's key (``collectors.seeding.noise_keys``: from the run seed and the env index), the
env's step counter and the element's position in the env's row, so each env's actions depend
only on its own observations, however envs are grouped (``RolloutCollector(num_splits=2)``
calls the policy on half of the envs at a time).

The bits come from the SplitMix64 finalizer (less its last xorshift) of a two-dimensional
Weyl sequence, ``key + step * G1 + element * G2 (mod 2**64)``. torch has no unsigned 64-bit
multiply, so the arithmetic is done on ``int64``, whose multiplication wraps modulo
2**64 like an unsigned one (two's complement; ``tests/test_noise.py`` checks it against
NumPy's ``uint64``); right shifts are masked to make them logical.

    >>> keys, steps = torch.tensor([11, 12]), torch.tensor([0, 0])
    >>> g = gumbel(keys, steps, (2, 3))           # [n, *shape]: 3 noise values per env
    >>> torch.equal(g[1:], gumbel(keys[1:], steps[1:], (1, 3)))  # env 1 alone: same noise
    True
"""

from __future__ import annotations

import functools
import math

import torch


def _int64(c: int) -> int:
    """The int64 with the bit pattern of the uint64 ``c`` (what a wrapping multiply needs)."""
    return c - (1 << 64) if c >= 1 << 63 else c


_G1 = _int64(0x9E3779B97F4A7C15)  # odd Weyl increments (golden ratio, and R2's first constant)
_G2 = _int64(0xD1B54A32D192ED03)
_M1 = _int64(0xBF58476D1CE4E5B9)  # SplitMix64 finalizer multipliers
_M2 = _int64(0x94D049BB133111EB)


_G2_CHUNKS = tuple((_G2 >> shift) & 0xFFFF for shift in (0, 16, 32, 48))  # G2's four 16-bit parts, low first
_MOST_ELEMENTS = 1 << 15  # a part times an element below this stays below 2**31


def _weyl_offsets(width: int, device: torch.device) -> torch.Tensor:
    """``element * G2`` (mod 2**64) for the elements of a row, as the sum of ``element * part << shift`` over G2's
    16-bit parts.

    Why not ``arange(width) * G2``: inductor folds a product of ``arange`` and a constant into its index
    arithmetic, which Triton runs in int32 (and whose printer rejects a constant over 2**63): each part's product
    is below 2**31 for rows of fewer than 2**15 elements, and the shifts wrap as the whole product would.
    """
    if width >= _MOST_ELEMENTS:
        raise ValueError(f"keyed noise for {width} elements per row: at most {_MOST_ELEMENTS - 1} are supported")
    element = torch.arange(width, dtype=torch.int64, device=device)
    offsets = element * _G2_CHUNKS[0]
    for i, part in enumerate(_G2_CHUNKS[1:], start=1):
        offsets = offsets + ((element * part) << (16 * i))
    return offsets


_cached_offsets = functools.lru_cache(maxsize=64)(_weyl_offsets)  # eager: the same width every step


def _offsets(width: int, device: torch.device) -> torch.Tensor:
    # compiled code computes them in its graph (dynamo would trace through the cache anyway, with a warning)
    return _weyl_offsets(width, device) if torch.compiler.is_compiling() else _cached_offsets(width, device)


def _xorshift_(x: torch.Tensor, s: int) -> torch.Tensor:
    # arithmetic shift, masked to a logical one: the sign bit must not smear into the top bits
    return x.bitwise_xor_((x >> s).bitwise_and_((1 << (64 - s)) - 1))


def hash_bits(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """64 random bits (as ``int64``) per element: ``[n, *shape[1:]]`` for ``n = len(keys)``.

    ``keys`` and ``steps`` are ``int64`` tensors of shape ``[n]``; ``shape[0]`` must be ``n``.
    Element ``(i, j...)`` depends only on ``keys[i]``, ``steps[i]`` and the flat index of ``j...``
    within the row.
    """
    n, rest = shape[0], tuple(shape[1:])
    if keys.shape != (n,) or steps.shape != (n,) or keys.dtype != torch.int64 or steps.dtype != torch.int64:
        raise ValueError(f"keys ({tuple(keys.shape)}, {keys.dtype}) and steps ({tuple(steps.shape)}, {steps.dtype}) "
                         f"must both be int64 of shape ({n},) for noise of shape {tuple(shape)}")
    row = torch.add(keys, steps, alpha=_G1)
    x = (row[:, None] + _offsets(math.prod(rest), keys.device)).reshape(n, *rest)
    _xorshift_(x, 30).mul_(_M1)
    # SplitMix64's closing xorshift by 31 is left out: the noise reads bits 18-63, and it would
    # change only bits 18-32 of them, at three more ops per call (ops, not bits, cost here)
    return _xorshift_(x, 27).mul_(_M2)


def _open_unit(bits: torch.Tensor) -> torch.Tensor:
    """float32 in the open interval (0, 1) from the top 23 bits: ``(2k + 1) / 2**24``, every value exact.

    23 bits, not 24: float32 spaces its values 2**-24 apart in [0.5, 1), so ``(k + 0.5) / 2**24``
    would round there (and to 1.0 at the top, where ``log`` gives an infinite Gumbel value).
    """
    return (bits >> 41).to(torch.float32).mul_(2.0 ** -23).add_(0.5 + 2.0 ** -24)


def uniform(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 uniforms in the open interval (0, 1), ``[n, *shape[1:]]``."""
    return _open_unit(hash_bits(keys, steps, shape))


def gumbel(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))``, ``[n, *shape[1:]]`` float32 (for Gumbel-max sampling)."""
    return uniform(keys, steps, shape).log_().neg_().log_().neg_()


def normal(keys: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal noise, ``[n, *shape[1:]]`` float32: Box-Muller on two 23-bit parts of one hash."""
    bits = hash_bits(keys, steps, shape)
    radius = _open_unit(bits).log_().mul_(-2.0).sqrt_()
    angle = ((bits >> 18) & ((1 << 23) - 1)).to(torch.float32).mul_(2 * math.pi * 2.0 ** -23)
    return radius.mul_(torch.cos(angle))
