"""Running mean and variance: the parallel-variance merge (Chan et al.), one implementation for all users."""

from __future__ import annotations

import torch

from trainer.common.world import ALONE, World


def merged_moments(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, samples: torch.Tensor,
                   world: World = ALONE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, (population) variance and count of the data summarised by ``(mean, var, count)``
    together with ``samples`` (``[B, *mean.shape]``, reduced over its first axis; in a data-parallel run,
    every rank's ``samples``: ``world``).

    Example:
        >>> x = torch.arange(6.0, dtype=torch.float64)
        >>> m, v, c = merged_moments(x[:2].mean(), x[:2].var(unbiased=False), torch.tensor(2.0), x[2:])
        >>> (m.item(), v.item(), c.item()) == (x.mean().item(), x.var(unbiased=False).item(), 6.0)
        True
    """
    batch_mean, batch_var, n = world.batch_moments(samples)
    delta, total = batch_mean - mean, count + n
    new_var = (var * count + batch_var * n + delta**2 * count * n / total) / total
    return mean + delta * n / total, new_var, total
