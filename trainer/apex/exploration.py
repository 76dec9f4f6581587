"""How Ape-X's actors explore: each env with its own epsilon, greedy in the actors' copy of the Q-network
otherwise."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from trainer.apex.q_network import QNetwork
from trainer.common import noise


def apex_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """Ape-X's exploration rates ``eps_i = base^(1 + alpha * i / (N - 1))`` (Horgan et al., 2018), ``[N]``.

    >>> [round(e, 6) for e in apex_epsilons(3).tolist()]  # 0.4, 0.4^4.5, 0.4^8
    [0.4, 0.016191, 0.000655]
    """
    if num_actors < 1:
        raise ValueError(f"num_actors={num_actors} is invalid: must be >= 1")
    if num_actors == 1:
        return torch.tensor([base])
    i = torch.arange(num_actors, dtype=torch.float64)
    return (base ** (1 + alpha * i / (num_actors - 1))).float()


class EpsilonGreedy(nn.Module):
    """The actors' policy: greedy in a local copy of the Q-network, uniformly random with each env's epsilon.

    Example:
        >>> import gymnasium as gym
        >>> q = QNetwork(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
        >>> keys = torch.tensor([11, 12, 13])
        >>> policy = EpsilonGreedy(q, keys, apex_epsilons(3))
        >>> policy(torch.zeros(2, 4), noise_keys=keys[1:], steps=torch.zeros(2, dtype=torch.int64))["action"].shape
        torch.Size([2])

    A keyed policy (``collectors``' ``noise_keys`` / ``steps`` protocol): env ``i``'s draws depend only on its
    key and step, so the actions do not depend on how envs are grouped into calls or actors. ``keys [N]``
    and ``epsilons [N]`` give each env (by its noise key) its exploration rate. The state dict is the
    Q-network's, so the learner's weights go in through ``collector.update_policy(q.state_dict())``.
    """

    def __init__(self, q: QNetwork, keys: torch.Tensor, epsilons: torch.Tensor) -> None:
        super().__init__()
        if keys.shape != epsilons.shape:
            raise ValueError(f"{len(keys)} env keys for {len(epsilons)} epsilons")
        self.q = q
        self.keys, self.epsilons = keys, epsilons.float()

    @property
    def keys(self) -> torch.Tensor:
        """Each env's noise key, ``[N]`` (env ``i`` explores with ``epsilons[i]``)."""
        return self._keys

    @keys.setter
    def keys(self, keys: torch.Tensor) -> None:
        # sorted once here, so that each step finds its rows' envs by binary search, not an [n, N] comparison
        self._keys = keys.to(torch.int64)
        self._order = self._keys.argsort(stable=True)
        self._sorted = self._keys[self._order]

    def forward(self, obs: torch.Tensor, noise_keys: torch.Tensor, steps: torch.Tensor) -> dict[str, torch.Tensor]:
        env = self._order[torch.searchsorted(self._sorted, noise_keys)]  # which env each row is
        greedy = self.q(obs).argmax(-1)  # [n, K]
        # per row: one uniform for "explore?", then one per head for the random action
        u = noise.uniform(noise_keys, steps, (len(obs), 1 + self.q.heads))
        explore = u[:, :1] < self.epsilons[env, None]
        random = (u[:, 1:] * self.q.actions).long().clamp_(max=self.q.actions - 1)
        return {"action": self.q._shape(torch.where(explore, random, greedy))}

    def state_dict(self, *args, **kwargs):  # the Q-network's: what the learner sends
        return self.q.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False):
        return self.q.load_state_dict(state_dict, strict=strict, assign=assign)
