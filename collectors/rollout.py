"""What ``collect()`` returns: one :class:`Rollout` holding the batch and everything that belongs to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase


@dataclass(frozen=True)
class Rollout:
    """One rollout: the ``[T, N]`` batch and what belongs to it, on the collector's device.

    Example:
        >>> import functools, gymnasium as gym, torch
        >>> from collectors import make_collector
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 4
        >>> policy = lambda obs: torch.zeros(len(obs), dtype=torch.int64)
        >>> with make_collector(env_fns, policy, backend="sync", num_steps=16, seed=0) as collector:
        ...     rollout = collector.collect()
        >>> rollout.batch.batch_size, rollout.next_observations.shape, rollout.policy_version
        (torch.Size([16, 4]), torch.Size([4, 4]), 0)

    Attributes:
        batch: ``observations``, ``actions``, ``rewards``, ``terminated``, ``truncated``,
            ``final_observations``, ``final_observation_mask`` (``[T, N, ...]``) and, when
            the policy returns them, ``log_probs`` and ``values`` (``[T, N]``).
        next_observations: ``[N, *obs]``, the observations that follow the rollout (to
            bootstrap the value of its last step).
        episodes: the episodes finished during the rollout, each a dict with ``env``
            (index among all the collector's envs), ``return``, ``length`` and the env's
            ``episode_metrics``, in the order they finished.
        policy_version: how many ``update_policy`` calls the weights that collected it had seen.
        envs: which of the collector's envs the batch covers (all of them, except for a Ray
            collector with ``keep_collecting=True``, which returns one actor's slice).
    """

    batch: TensorDictBase
    next_observations: torch.Tensor
    episodes: list[dict[str, Any]]
    policy_version: int
    envs: slice

    def numel(self) -> int:
        """Transitions in the rollout (``T x N``)."""
        return self.batch.numel()
