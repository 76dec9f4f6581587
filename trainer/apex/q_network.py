"""The Ape-X tier's Q-network: dueling, and branching for ``MultiDiscrete`` actions.

Shapes: ``B`` transitions, ``K`` action heads (1 for ``Discrete``), ``A`` actions per head.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from trainer.common.policy_layout import FLAT, PolicyLayout
from trainer.common.spaces import action_heads


def _relu_mlp(n_in: int, hidden: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    """``ReLU`` hidden layers with torch's default init (the DQN convention), and the output width."""
    layers, size = [], n_in
    for h in hidden:
        layers += [nn.Linear(size, h), nn.ReLU()]
        size = h
    return nn.Sequential(*layers), size


def actions_refused(act_space: gym.Space) -> str | None:
    """Why a :class:`QNetwork` cannot act in ``act_space`` (a sentence naming the way out), or ``None``."""
    heads = action_heads(act_space)
    if heads is None or heads.kind == "box" or len(set(heads.sizes)) != 1:
        return (f"--algo apex needs a Discrete or a 1-D MultiDiscrete action space with equal heads, got "
                f"{act_space}; use --algo ppo")
    return None


class QNetwork(nn.Module):
    """Dueling Q-network: ``Q[b, k, a] = V(s) + A_k(s, a) - mean_a A_k(s, a)`` over a shared trunk.

    Example:
        >>> import gymnasium as gym
        >>> q = QNetwork(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
        >>> q(torch.zeros(5, 4)).shape, q.act_deterministic(torch.zeros(5, 4)).shape
        (torch.Size([5, 1, 2]), torch.Size([5]))

    For a ``MultiDiscrete`` space with equal heads (VR-edge: one bitrate per user) it is the action-branching
    architecture of Tavakoli et al. (AAAI 2018): one advantage branch per action dimension, one state value,
    all over the shared trunk. With a ``per_head`` ``layout`` (the observation is ``features`` per head, then
    ``shared`` ones: VR-edge's ``head_observation_layout``), the branches are one advantage MLP shared by
    all heads, each fed the trunk's output plus its own head's features, so users are treated alike
    whatever their position; without it, one linear advantage layer per head.
    """

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: tuple[int, ...] = (64, 64),
                 layout: PolicyLayout = FLAT) -> None:
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise TypeError(f"the Q-network needs a flat Box observation space, got {obs_space}")
        refusal = actions_refused(act_space)
        if refusal:
            raise TypeError(refusal)
        heads = action_heads(act_space)
        self.heads, self.actions, self.multi = len(heads.sizes), heads.sizes[0], heads.kind == "multi"
        self.obs_dim = n_obs = obs_space.shape[0]
        if layout.kind == "set":  # its branches are per head: their count is fixed
            raise ValueError("a set layout is PPO's SetActorCritic's; the Q-network reads flat and per-head ones")
        if layout.kind == "per_head" and (not self.multi or self.heads * layout.features + layout.shared != n_obs):
            raise ValueError(f"per-head layout ({layout.features} per head x {self.heads} heads + {layout.shared} "
                             f"shared) does not fit {n_obs} observations")
        self.layout = layout
        self.trunk, width = _relu_mlp(n_obs, hidden)
        self.value = nn.Linear(width, 1)
        if layout.kind == "per_head":
            branch, size = _relu_mlp(width + layout.features, hidden[-1:])
            self.advantage = nn.Sequential(branch, nn.Linear(size, self.actions))
        else:
            self.advantage = nn.Linear(width, self.heads * self.actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``Q [B, K, A]`` for observations ``[B, obs]``."""
        obs = obs.float()
        h = self.trunk(obs)
        b = h.shape[0]
        if self.layout.kind == "per_head":
            f = self.layout.features
            own = obs[:, :self.heads * f].reshape(b, self.heads, f)
            adv = self.advantage(torch.cat([h.unsqueeze(1).expand(b, self.heads, h.shape[1]), own], -1))
        else:
            adv = self.advantage(h).reshape(b, self.heads, self.actions)
        return self.value(h).unsqueeze(-1) + adv - adv.mean(-1, keepdim=True)

    def _shape(self, action: torch.Tensor) -> torch.Tensor:
        return action if self.multi else action[:, 0]

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions in the env's shape (``[B]``, or ``[B, K]`` for ``MultiDiscrete``)."""
        return self._shape(self(obs).argmax(-1))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The greedy policy as a sampling one (a Q-policy's behaviour noise belongs to the actors)."""
        return {"action": self.act_deterministic(obs)}
