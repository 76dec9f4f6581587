"""Q-learning for the Ape-X tier: a dueling Q-network (branching for ``MultiDiscrete``), double-DQN n-step
targets, the loss, and the epsilon-greedy acting policy.

Shapes: ``B`` transitions, ``K`` action heads (1 for ``Discrete``), ``A`` actions per head.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import nn

from trainer import noise


def _mlp(n_in: int, hidden: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    layers, size = [], n_in
    for h in hidden:
        layers += [nn.Linear(size, h), nn.ReLU()]
        size = h
    return nn.Sequential(*layers), size


class QNetwork(nn.Module):
    """Dueling Q-network: ``Q[b, k, a] = V(s) + A_k(s, a) - mean_a A_k(s, a)`` over a shared trunk.

    Example:
        >>> import gymnasium as gym
        >>> q = QNetwork(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
        >>> q(torch.zeros(5, 4)).shape, q.act_deterministic(torch.zeros(5, 4)).shape
        (torch.Size([5, 1, 2]), torch.Size([5]))

    For a ``MultiDiscrete`` space with equal heads (VR-edge: one bitrate per user) it is the action-branching
    architecture of Tavakoli et al. (AAAI 2018): one advantage branch per action dimension, one state value,
    all over the shared trunk. With ``per_head=(f, c)`` (the observation is ``f`` features per head, then
    ``c`` shared ones: VR-edge's ``head_observation_layout``), the branches are one advantage MLP shared by
    all heads, each fed the trunk's output plus its own head's features, so users are treated alike
    whatever their position; without it, one linear advantage layer per head.
    """

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: tuple[int, ...] = (64, 64),
                 per_head: tuple[int, int] | None = None) -> None:
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise TypeError(f"the Q-network needs a flat Box observation space, got {obs_space}")
        if isinstance(act_space, gym.spaces.Discrete):
            self.heads, self.actions, self.multi = 1, int(act_space.n), False
        elif isinstance(act_space, gym.spaces.MultiDiscrete) and act_space.nvec.ndim == 1 \
                and len(set(act_space.nvec.tolist())) == 1:
            self.heads, self.actions, self.multi = len(act_space.nvec), int(act_space.nvec[0]), True
        else:
            raise TypeError(f"--algo apex needs a Discrete or a 1-D MultiDiscrete action space with equal heads, "
                            f"got {act_space}; use --algo ppo")
        self.obs_dim = n_obs = obs_space.shape[0]
        if per_head is not None and (not self.multi or self.heads * per_head[0] + per_head[1] != n_obs):
            raise ValueError(f"per-head layout {per_head} does not fit {self.heads} heads and {n_obs} observations")
        self.per_head = per_head
        self.trunk, width = _mlp(n_obs, hidden)
        self.value = nn.Linear(width, 1)
        if per_head:
            branch, size = _mlp(width + per_head[0], hidden[-1:])
            self.advantage = nn.Sequential(branch, nn.Linear(size, self.actions))
        else:
            self.advantage = nn.Linear(width, self.heads * self.actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``Q [B, K, A]`` for observations ``[B, obs]``."""
        obs = obs.float()
        h = self.trunk(obs)
        b = h.shape[0]
        if self.per_head:
            f = self.per_head[0]
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


def q_taken(q: QNetwork, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``Q(s, a)`` per head, ``[B, K]``, for env-shaped actions (``[B]`` or ``[B, K]``)."""
    return q(observations).gather(-1, actions.reshape(len(actions), -1, 1).long()).squeeze(-1)


@torch.no_grad()
def double_dqn_targets(online: QNetwork, target: QNetwork, batch: TensorDictBase) -> torch.Tensor:
    """n-step double-DQN targets ``[B]``: ``R + discount * (1 - done) * mean_k Q_target_k(s', argmax Q_online_k(s'))``.

    ``batch`` holds ``rewards`` (the n-step discounted sums), ``next_observations``, ``done`` and ``discounts``
    (``trainer.nstep``). The online network picks, the target network evaluates (van Hasselt et al., 2016).
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
