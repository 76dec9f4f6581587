"""A set actor-critic (``policy_arch = "set"``): one network for any number of user slots, acting for the active
users only; no parameter or buffer depends on the slot count."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from trainer.common import noise
from trainer.common.policy_layout import PolicyLayout
from trainer.common.spaces import action_heads
from trainer.common.world import ALONE, World
from trainer.ppo.model import RunningNorm, _layer, _tanh_mlp, orthogonal


def split_observations(x: torch.Tensor, layout: PolicyLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """``(users [B, U, F], cell [B, C])`` of flat observations ``[B, U * F + C]``; ``U`` is read from the width.

    Slices from the end and a ``-1`` reshape, not ``(width - C) // F``: a trace (TorchScript, ONNX) then keeps the
    slot count dynamic.

    >>> users, cell = split_observations(torch.zeros(2, 3 * 7 + 4), PolicyLayout("set", 7, 4))
    >>> users.shape, cell.shape
    (torch.Size([2, 3, 7]), torch.Size([2, 4]))
    """
    f, c = layout.features, layout.shared
    users = x[:, :-c] if c else x
    return users.reshape(x.shape[0], -1, f), x[:, x.shape[1] - c:] if c else x[:, :0]


def active_users(users: torch.Tensor, layout: PolicyLayout) -> torch.Tensor:
    """``bool [B, U]``: which slots of raw user features ``[B, U, F]`` hold an active user (all, without a flag)."""
    if layout.active is None:
        return torch.ones(users.shape[:2], dtype=torch.bool, device=users.device)
    return users[..., layout.active] > 0.5


class SetNorm(nn.Module):
    """Running observation statistics per feature of a set observation: the ``F`` user features (shared by every
    slot, from active users only) and the ``C`` cell features, each a :class:`~trainer.ppo.model.RunningNorm`
    (float64 moments, merged across data-parallel ranks).

    Example (2 slots of 3 features, then 1 cell feature; slot 1 inactive, its flag at index 2):
        >>> norm = SetNorm(PolicyLayout("set", 3, 1, active=2))
        >>> obs = torch.tensor([[4.0, 5.0, 1.0, 0.0, 0.0, 0.0, 9.0]])  # [B, U * F + C]
        >>> norm.update(obs)
        >>> round(norm.users.mean[0].item(), 3), norm(obs).shape  # slot 1's zeros are not counted
        (4.0, torch.Size([1, 7]))
    """

    def __init__(self, layout: PolicyLayout, clip: float = 10.0) -> None:
        super().__init__()
        self.layout = layout
        self.users = RunningNorm((layout.features,), clip)
        self.cell = RunningNorm((layout.shared,), clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor, world: World = ALONE) -> None:
        """Add observations ``[..., U * F + C]`` to the statistics (every rank's, in a data-parallel run)."""
        users, cell = split_observations(x.reshape(-1, x.shape[-1]), self.layout)
        active = active_users(users, self.layout)
        self.users.update(users.reshape(-1, self.layout.features), world, weights=active.reshape(-1))
        self.cell.update(cell, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised observations, the same shape ``[B, U * F + C]``."""
        users, cell = split_observations(x, self.layout)
        return torch.cat([self.users(users).reshape(x.shape[0], -1), self.cell(cell)], dim=-1)


def _orthogonal(n_in: int, n_out: int, gain: float) -> torch.Tensor:
    """``[n_in, n_out]``: an orthogonally initialised weight, as ``x @ w`` takes it."""
    return orthogonal(n_out, n_in, gain).T.contiguous()


class SetEncoders(nn.Module):
    """``count`` user encoders (``tanh`` MLPs of sizes ``hidden``, orthogonal init) on each user's features and the
    cell's, run together as batched matmuls: two, the actor's and the critic's, or one that both read.

    The first layer's weight is split into its user rows and its cell rows: ``W [u; c] = W_u u + W_c c``, where
    ``W_c c`` is computed once per observation rather than once per user, and no ``[B, U, F + C]`` copy is made.

    Example:
        >>> enc = SetEncoders(3, 2, (16, 8))  # the actor's and the critic's
        >>> enc(torch.zeros(5, 4, 3), torch.zeros(5, 2)).shape  # users [B, U, F], cell [B, C]
        torch.Size([2, 5, 4, 8])
        >>> SetEncoders(3, 2, (16, 8), count=1)(torch.zeros(5, 4, 3), torch.zeros(5, 2)).shape  # one, shared
        torch.Size([1, 5, 4, 8])
    """

    def __init__(self, f: int, c: int, hidden: tuple[int, ...], count: int = 2) -> None:
        super().__init__()
        first = torch.stack([_orthogonal(f + c, hidden[0], math.sqrt(2)) for _ in range(count)])  # [E, F + C, h1]
        self.user_weight, self.cell_weight = nn.Parameter(first[:, :f]), nn.Parameter(first[:, f:])
        self.weights = nn.ParameterList(torch.stack([_orthogonal(i, o, math.sqrt(2)) for _ in range(count)])
                                        for i, o in zip(hidden, hidden[1:]))
        self.biases = nn.ParameterList(torch.zeros(count, 1, h) for h in hidden)

    def forward(self, users: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        """``[E, B, U, H]`` (``E``: the encoders, actor then critic) of ``users [B, U, F]`` and ``cell [B, C]``."""
        b, u, f = users.shape
        e = self.user_weight.shape[0]
        h = torch.bmm(users.reshape(1, b * u, f).expand(e, b * u, f), self.user_weight).view(e, b, u, -1)
        h = torch.tanh(h + (torch.matmul(cell, self.cell_weight) + self.biases[0])[:, :, None, :])
        h = h.view(e, b * u, -1)
        for i, w in enumerate(self.weights):  # biases[i + 1], not a slice: slicing builds a ParameterList
            h = torch.tanh(torch.baddbmm(self.biases[i + 1], h, w))
        return h.view(e, b, u, -1)


class SetActorCritic(nn.Module):
    """Actor-critic for a set of user slots: ``obs [B, U * F + C]`` -> one categorical head per slot.

    Each user's features, with the cell's, go through an encoder shared by all users (two, stacked: the actor's
    and the critic's; or, with ``shared_trunk``, one whose output both read); a masked summary pools the ACTIVE
    users' encodings (mean and max); each user's head reads its own encoding and the summary (logits
    ``[B, U, levels]``); the critic reads the summary and the cell's features. Inactive slots (the ``layout.active``
    flag is 0) are left out of the summary, the log-probability and the entropy, and act 0. ``U`` is read from the
    observation's width at each call, so the same weights act at any slot count. Same interface as
    :class:`~trainer.ppo.model.ActorCritic` (``act`` with keyed noise, ``evaluate``, ``value``,
    ``act_deterministic``, ``action_probs``, ``norm``, ``generator``).

    Sizes, for ``hidden = (h1, ..., H)``: encoders ``F + C -> h1 ... -> H`` (tanh); summary ``2H`` (mean, max);
    actor head ``3H -> H -> levels``; critic ``2H + C -> H -> 1``.

    Example (4 slots, 2 of them active; the same weights act on 6 slots):
        >>> layout = PolicyLayout("set", features=3, shared=2, active=2)
        >>> obs_space = gym.spaces.Box(0, 1, (4 * 3 + 2,))
        >>> ac = SetActorCritic(obs_space, gym.spaces.MultiDiscrete([5] * 4), layout, seed=0)
        >>> obs = torch.zeros(8, 4 * 3 + 2); obs[:, [2, 5]] = 1.0  # users 0 and 1 active
        >>> out = ac.act(obs)
        >>> out["action"].shape, out["log_prob"].shape, out["value"].shape, bool((out["action"][:, 2:] == 0).all())
        (torch.Size([8, 4]), torch.Size([8]), torch.Size([8]), True)
        >>> ac.act_deterministic(torch.zeros(8, 6 * 3 + 2)).shape
        torch.Size([8, 6])
        >>> shared = SetActorCritic(obs_space, gym.spaces.MultiDiscrete([5] * 4), layout, shared_trunk=True)
        >>> shared.encoders.user_weight.shape  # [encoders, F, h1]: one, which the actor and the critic read
        torch.Size([1, 3, 64])
    """

    kind = "multi"  # what ExportedPolicy and the trainer ask of an actor-critic

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, layout: PolicyLayout,
                 hidden: tuple[int, ...] = (64, 64), normalize_obs: bool = True, seed: int = 0,
                 shared_trunk: bool = False) -> None:
        super().__init__()
        self.levels = _check_set_spaces(obs_space, act_space, layout)
        self.layout = layout
        f, c, h = layout.features, layout.shared, hidden[-1]
        torch.manual_seed(seed)
        self.norm = SetNorm(self.layout) if normalize_obs else nn.Identity()
        # separate: the actor's and the critic's encoders stacked, half the ops of two (see StackedMLP); shared: one
        # pass, which both read (PPO's shared_trunk)
        self.encoders = SetEncoders(f, c, hidden, count=1 if shared_trunk else 2)
        # the actor's hidden layer on [own encoding; summary], split as the encoders' first layer is: the summary's
        # part once per observation
        actor = _orthogonal(3 * h, h, math.sqrt(2))
        self.actor_own, self.actor_summary = _layer(h, h, math.sqrt(2)), nn.Linear(2 * h, h, bias=False)
        with torch.no_grad():
            self.actor_own.weight.copy_(actor[:h].T)
            self.actor_summary.weight.copy_(actor[h:].T)
        self.actor_head = _layer(h, self.levels, 0.01)
        self.critic_trunk, self.critic_head = _tanh_mlp(2 * h + c, (h,)), _layer(h, 1, 1.0)
        self.generator = torch.Generator().manual_seed(seed + 1)

    def _heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log-probabilities [B, U, levels], value [B], active [B, U])``."""
        users, cell = split_observations(obs.float(), self.layout)
        active = active_users(users, self.layout)  # of the raw flag, once
        if isinstance(self.norm, SetNorm):  # each part normalised as it is read: no [B, U * F + C] copy to split
            users, cell = self.norm.users(users), self.norm.cell(cell)
        enc = self.encoders(users, cell)  # [actor | critic, B, U, H], or [both, B, U, H]
        summary = self._pooled(enc, active)  # [actor | critic, B, 2H], or [both, B, 2H]
        actor = torch.tanh(self.actor_own(enc[0]) + self.actor_summary(summary[0])[:, None, :])
        logp = torch.log_softmax(self.actor_head(actor), dim=-1)
        value = self.critic_head(self.critic_trunk(torch.cat([summary[-1], cell], dim=-1))).squeeze(-1)
        return logp, value, active

    def _pooled(self, enc: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """``[E, B, 2H]``: the mean and the max of the active users' encodings ``enc [E, B, U, H]``, in float32.

        Permuting the users permutes the terms of the mean's sum, which float32 rounds at most a few ulps
        differently (tested to 1e-5); the max is exact. An inactive slot is weighed 0 in the mean and pushed below
        every active one in the max (encodings are tanh's, in [-1, 1]), so that its features, whatever they are,
        reach neither (nor their gradients); the max of no active user is -1. Products and sums, not ``where``,
        and ``max`` (whose backward scatters to one slot) rather than ``amax`` (which compares every slot with the
        max): measured faster for the update on a CPU; no shape depends on the data (a CUDA graph captures it).
        """
        if self.layout.active is None:  # every slot active
            return torch.cat([enc.mean(2), enc.max(2).values], -1)
        weight = active.to(enc.dtype)[None, :, :, None]  # [1, B, U, 1]
        mean = (enc * (weight / weight.sum(2, keepdim=True).clamp(min=1))).sum(2)  # [E, B, H]
        top = (enc - (3.0 - 3.0 * weight)).max(2).values  # inactive: enc - 3 <= -2 < -1 <= any active
        return torch.cat([mean, top.clamp(min=-1.0)], -1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self._heads(obs)[1]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, noise_keys: torch.Tensor | None = None,
            steps: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample actions ``[N, U]`` for ``[N, obs]`` with ``log_prob`` and ``value`` (``[N]``); keyed noise as
        :meth:`ActorCritic.act <trainer.ppo.model.ActorCritic.act>` draws it. Inactive slots act 0."""
        if (noise_keys is None) != (steps is None):
            raise ValueError("act() takes noise_keys and steps together, or neither")
        logp, value, active = self._heads(obs)
        if noise_keys is None:
            gumbel = torch.rand(logp.shape, generator=self.generator, device=logp.device).log_().neg_().log_().neg_()
        else:
            gumbel = noise.gumbel(noise_keys, steps, tuple(logp.shape))
        action = torch.where(active, (logp + gumbel).argmax(-1), 0)  # Gumbel-max: a sample of each head
        return {"action": action, "log_prob": _masked_log_prob(logp, action, active), "value": value}

    def forward(self, obs: torch.Tensor, noise_keys: torch.Tensor | None = None,
                steps: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return self.act(obs, noise_keys, steps)

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions ``[B, U]`` (inactive slots: 0), for evaluation."""
        logp, _, active = self._heads(obs)
        return torch.where(active, logp.argmax(-1), 0)

    @torch.no_grad()
    def action_probs(self, obs: torch.Tensor) -> torch.Tensor:
        """Probabilities ``[B, U, levels]`` of every slot's head (an inactive slot's are not acted on)."""
        return self._heads(obs)[0].exp()

    def exported(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(greedy action [B, U], probs [B, U, levels], value [B])`` in one pass: what an exported file runs."""
        logp, value, active = self._heads(obs)
        return torch.where(active, logp.argmax(-1), 0), logp.exp(), value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)`` of given actions ``[B, U]``, each ``[B]``, differentiable; inactive slots
        add nothing to the log-probability or the entropy."""
        logp, value, active = self._heads(obs)
        entropy = torch.where(active, -(logp.exp() * logp).sum(-1), 0.0).sum(-1)
        return _masked_log_prob(logp, action.reshape(active.shape).long(), active), entropy, value


def _masked_log_prob(logp: torch.Tensor, action: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``[B]``: the log-probability of ``action`` ``[B, U]`` summed over the active slots only."""
    return torch.where(active, logp.gather(-1, action[..., None])[..., 0], 0.0).sum(-1)


def _check_set_spaces(obs_space: gym.Space, act_space: gym.Space, layout: PolicyLayout) -> int:
    """The levels of each user's head; ``ValueError`` where the spaces do not fit a set policy with ``layout``."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise TypeError(f"SetActorCritic needs a flat Box observation space, got {obs_space}")
    heads = action_heads(act_space)
    if heads is None or heads.kind != "multi" or len(set(heads.sizes)) != 1:
        raise ValueError(f"a set policy needs a MultiDiscrete action space with equal heads, got {act_space}")
    if layout.kind != "set":
        raise ValueError(f"SetActorCritic reads a set layout, got {layout} (ActorCritic reads flat and per-head ones)")
    f, c = layout.features, layout.shared
    if len(heads.sizes) * f + c != obs_space.shape[0]:
        raise ValueError(f"set layout ({f} per user x {len(heads.sizes)} users + {c} cell) does not match the "
                         f"observation size {obs_space.shape[0]}")
    return heads.sizes[0]
