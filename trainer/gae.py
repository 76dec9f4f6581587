"""Generalised advantage estimation over the time axis, vectorised over envs."""

from __future__ import annotations

import torch


def next_values(values: torch.Tensor, last_value: torch.Tensor, final_values: torch.Tensor,
                terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Value of the state after each step ``[T, N]``.

    Bootstraps from the next observation's value; on a truncated step from the value
    of the episode's true final observation (``final_values``); 0 on a terminated step.
    """
    following = torch.cat([values[1:], last_value[None]], dim=0)
    following = torch.where(truncated, final_values, following)
    return torch.where(terminated, torch.zeros_like(following), following)


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_vals: torch.Tensor, done: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)``, both ``[T, N]``.

    ``done`` (terminated or truncated) stops the recursion: the next step belongs to
    another episode. ``next_vals`` already encodes how each step bootstraps.
    """
    deltas = rewards + gamma * next_vals - values
    carry = (gamma * lam) * (~done).to(values.dtype)
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values
