"""Running mean and variance: the parallel-variance merge (Chan et al.), one implementation for all users."""

from __future__ import annotations

import torch

from trainer.common.world import ALONE, World


def merged_moments(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, samples: torch.Tensor,
                   world: World = ALONE, weights: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, (population) variance and count of the data summarised by ``(mean, var, count)``
    together with ``samples`` (``[B, *mean.shape]``, reduced over its first axis; in a data-parallel run,
    every rank's ``samples``: ``world``). ``weights`` (``[B]``, 0 or 1): only the rows weighted 1 count (a set
    policy's active users), and the ranks may then count different numbers of rows.

    Example:
        >>> x = torch.arange(6.0, dtype=torch.float64)
        >>> m, v, c = merged_moments(x[:2].mean(), x[:2].var(unbiased=False), torch.tensor(2.0), x[2:])
        >>> (m.item(), v.item(), c.item()) == (x.mean().item(), x.var(unbiased=False).item(), 6.0)
        True
    """
    if weights is None:
        batch_mean, batch_var, n = world.batch_moments(samples)
    else:
        batch_mean, batch_var, n = weighted_batch_moments(samples, weights, world)
    delta, total = batch_mean - mean, count + n
    new_var = (var * count + batch_var * n + delta**2 * count * n / total) / total
    return mean + delta * n / total, new_var, total


def weighted_batch_moments(samples: torch.Tensor, weights: torch.Tensor, world: World = ALONE,
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, population variance and count (a tensor) of the rows of ``samples`` ``[B, *shape]`` weighted by
    ``weights`` ``[B]`` (0 or 1), over every rank's rows. Weights, not a boolean index: the shapes stay fixed
    (no host sync), and the ranks' counts, which may differ, are merged as counts (Chan et al.).

    Example:
        >>> x = torch.tensor([[1.0], [3.0], [100.0]], dtype=torch.float64)
        >>> m, v, n = weighted_batch_moments(x, torch.tensor([1.0, 1.0, 0.0]))
        >>> m.item(), v.item(), n.item()
        (2.0, 1.0, 2.0)
    """
    w = weights.to(samples.dtype).reshape(-1, *[1] * (samples.dim() - 1))
    n = w.sum()
    mean = (w * samples).sum(0) / n.clamp(min=1)
    var = (w * (samples - mean) ** 2).sum(0) / n.clamp(min=1)
    if world.size == 1:
        return mean, var, n
    k = mean.numel()
    parts = world.gather_envs(torch.cat([n.reshape(1), mean.reshape(-1), var.reshape(-1)])[None])  # [ranks, 1+2k]
    ns, means, variances = parts[:, :1], parts[:, 1:1 + k], parts[:, 1 + k:]
    n = ns.sum()
    total_mean = (ns * means).sum(0) / n.clamp(min=1)
    total_var = (ns * (variances + (means - total_mean) ** 2)).sum(0) / n.clamp(min=1)
    return total_mean.reshape(mean.shape), total_var.reshape(mean.shape), n
