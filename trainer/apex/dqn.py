"""Double DQN for the Ape-X tier: ``Q(s, a)`` of taken actions, n-step double-DQN targets, the loss, and replay
priorities from TD errors.

Shapes: ``B`` transitions, ``K`` action heads (1 for ``Discrete``), ``A`` actions per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase

from trainer.apex.q_network import QNetwork


def q_taken(q: QNetwork, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``Q(s, a)`` per head, ``[B, K]``, for env-shaped actions (``[B]`` or ``[B, K]``)."""
    return q(observations).gather(-1, actions.reshape(len(actions), -1, 1).long()).squeeze(-1)


@torch.no_grad()
def double_dqn_targets(online: QNetwork, target: QNetwork, batch: TensorDictBase) -> torch.Tensor:
    """n-step double-DQN targets ``[B]``: ``R + discount * (1 - done) * mean_k Q_target_k(s', argmax Q_online_k(s'))``.

    ``batch`` holds ``rewards`` (the n-step discounted sums), ``next_observations``, ``done`` and ``discounts``
    (``trainer.apex.nstep``). The online network picks, the target network evaluates (van Hasselt et al., 2016).
    With several heads, the next-state value is the mean over the heads (Tavakoli et al.'s shared target),
    so every branch learns towards one return.
    """
    nxt = batch["next_observations"]
    best = online(nxt).argmax(-1, keepdim=True)
    bootstrap = target(nxt).gather(-1, best).squeeze(-1).mean(-1)
    return batch["rewards"] + batch["discounts"] * (~batch["done"]).float() * bootstrap


def dqn_loss(q_values: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, td_errors [B, K])``: Huber loss of ``targets [B] - q_values [B, K]``, averaged over the heads,
    weighted by the importance weights ``[B]`` and averaged over the batch."""
    td = targets.unsqueeze(-1) - q_values
    per_sample = F.smooth_l1_loss(q_values, targets.unsqueeze(-1).expand_as(q_values), reduction="none").mean(-1)
    return (weights * per_sample).mean(), td.detach()


def priorities(td_errors: torch.Tensor) -> torch.Tensor:
    """Replay priorities ``[B]`` from TD errors ``[B, K]``: the mean absolute error over the heads."""
    return td_errors.abs().mean(-1)


@torch.no_grad()
def initial_priorities(q: QNetwork, transitions: TensorDictBase) -> torch.Tensor:
    """Priorities ``[B]`` of new transitions from the actor's own copy of the network (as online and target)."""
    targets = double_dqn_targets(q, q, transitions)
    return priorities(targets.unsqueeze(-1) - q_taken(q, transitions["observations"], transitions["actions"]))
