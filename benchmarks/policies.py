"""The one acting policy every benchmark uses: a small random-init MLP that samples actions."""

from __future__ import annotations

import gymnasium as gym
import torch


class MLPPolicy(torch.nn.Module):
    """64-64 tanh MLP with categorical sampling per action dimension (seeded generator)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.nvec = [int(act_space.n)] if isinstance(act_space, gym.spaces.Discrete) else list(act_space.nvec)
        self.multi = not isinstance(act_space, gym.spaces.Discrete)
        self.net = torch.nn.Sequential(torch.nn.Linear(obs_space.shape[0], 64), torch.nn.Tanh(),
                                       torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                       torch.nn.Linear(64, sum(self.nvec)))
        self.gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        logits = self.net(obs.float())
        parts = [torch.multinomial(torch.softmax(lg, -1), 1, generator=self.gen)
                 for lg in torch.split(logits, self.nvec, dim=-1)]
        action = torch.cat(parts, dim=-1)
        return action if self.multi else action[:, 0]
