"""All of a module's parameters (and their gradients) as views into one contiguous tensor."""

from __future__ import annotations

import torch
from torch import nn


def flat_parameters(module: nn.Module) -> nn.Parameter:
    """Re-home every parameter of ``module`` into one flat tensor and return it as a Parameter.

    Each parameter becomes a view of the returned tensor, and its ``.grad`` a view of the
    returned tensor's ``.grad``: backward accumulates into the views in place, so the flat
    gradient is complete without a copy. Optimise and clip the flat tensor instead of the
    module's parameters, and zero its gradient in place (``zero_grad(set_to_none=False)``),
    never by setting it to ``None``, which would cut the views loose.

    Why: PPO on small MLPs takes tens of optimiser steps per rollout, and for such
    networks Adam, the gradient-norm clip and zeroing are dominated by per-tensor overhead;
    on one tensor each is a single op. Call it after moving the module to its device.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        >>> flat = flat_parameters(net)
        >>> flat.shape
        torch.Size([21])
        >>> net(torch.ones(2, 3)).sum().backward()
        >>> bool(flat.grad[-1] == 2.0)  # the last bias's gradient, seen through the flat tensor
        True
    """
    params = list(module.parameters())
    if not params:
        raise ValueError(f"{type(module).__name__} has no parameters to flatten")
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat.data[offset:offset + n].view_as(p)
        p.grad = flat.grad[offset:offset + n].view_as(p)
        offset += n
    return flat
