"""Actor-critic MLP for Discrete, MultiDiscrete and Box action spaces, with observation normalisation."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from collectors.resources import torch_threads
from trainer.common import noise
from trainer.common.moments import merged_moments
from trainer.common.policy_layout import FLAT, PolicyLayout
from trainer.common.spaces import action_heads
from trainer.common.world import ALONE, World


class RunningNorm(nn.Module):
    """Running mean / variance of observations (parallel-variance merge), stored as buffers.

    Statistics are kept in float64; the float32 shift and scale used by ``forward`` are
    derived from them after every update and every ``load_state_dict`` (the acting copy's
    weight sync), so normalising costs three ops per call.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("_shift", torch.zeros(shape), persistent=False)
        self.register_buffer("_scale", torch.ones(shape), persistent=False)
        self.register_load_state_dict_post_hook(_derive_after_load)
        self.clip = clip
        self._derive()

    @torch.no_grad()
    def _derive(self) -> None:
        self._shift.copy_(self.mean)
        self._scale.copy_(torch.rsqrt(self.var + 1e-8))

    @torch.no_grad()
    def update(self, x: torch.Tensor, world: World = ALONE, weights: torch.Tensor | None = None) -> None:
        """Add observations ``[..., *shape]`` to the statistics (every rank's, in a data-parallel run); with
        ``weights`` (one 0 or 1 per observation), only those weighted 1."""
        mean, var, count = merged_moments(self.mean, self.var, self.count,
                                          x.reshape(-1, *self.mean.shape).to(torch.float64), world, weights)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)
        self._derive()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self._shift) * self._scale).clamp(-self.clip, self.clip)


def _derive_after_load(module: RunningNorm, incompatible_keys) -> None:
    module._derive()  # a module-level function, not a lambda: the model stays picklable


def orthogonal(n_out: int, n_in: int, gain: float) -> torch.Tensor:
    """``[n_out, n_in]``: a random orthogonal matrix times ``gain``, from torch's generator.

    Drawn on one thread: its QR (LAPACK) rounds differently with other thread counts, and a run's first
    weights must be the same whichever machine, process or ``--threads`` it starts under.
    """
    with torch_threads(1):
        return nn.init.orthogonal_(torch.empty(n_out, n_in), gain)


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(orthogonal(n_out, n_in, gain))
    nn.init.zeros_(layer.bias)
    return layer


def _tanh_mlp(n_in: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """``tanh`` hidden layers, orthogonally initialised with gain sqrt(2) (the PPO convention)."""
    layers, size = [], n_in
    for h in hidden:
        layers += [_layer(size, h, math.sqrt(2)), nn.Tanh()]
        size = h
    return nn.Sequential(*layers)


class StackedMLP(nn.Module):
    """Independent MLPs of the same hidden sizes on the same input, run as batched matmuls.

    MLP ``i`` has ``tanh`` hidden layers ``hidden`` and a linear output layer of size
    ``outputs[i][0]`` (orthogonal init with gain ``outputs[i][1]``). Narrower outputs are
    padded to the widest with zero weights that no loss reads, so they stay zero.

    Why: the actor and the critic are two small MLPs; stacked, each layer is one
    ``baddbmm`` for both, which halves the ops (and autograd nodes) per forward and
    backward, and those fixed per-op costs dominate small networks on a CPU.

    Example:
        >>> nets = StackedMLP(4, (64, 64), outputs=((2, 0.01), (1, 1.0)))  # actor logits, critic value
        >>> out = nets(torch.zeros(5, 4))  # [MLPs, B, widest output]
        >>> out.shape, out[1, :, 0].shape
        (torch.Size([2, 5, 2]), torch.Size([5]))
    """

    def __init__(self, n_in: int, hidden: tuple[int, ...], outputs: tuple[tuple[int, float], ...]) -> None:
        super().__init__()
        sizes, width = (n_in, *hidden), max(n for n, _ in outputs)

        def padded(n_out: int, n_in_: int, gain: float, pad_to: int) -> torch.Tensor:
            w = torch.zeros(n_in_, pad_to)
            w[:, :n_out] = orthogonal(n_out, n_in_, gain).T
            return w

        layers = [torch.stack([padded(o, i, math.sqrt(2), o) for _ in outputs]) for i, o in zip(sizes, sizes[1:])]
        layers.append(torch.stack([padded(n, sizes[-1], gain, width) for n, gain in outputs]))
        self.weights = nn.ParameterList(layers)
        self.biases = nn.ParameterList(torch.zeros(len(outputs), 1, w.shape[-1]) for w in layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.expand(self.weights[0].shape[0], *x.shape)  # the same input for every MLP, without a copy
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = torch.tanh(h)
        return h


class ActorCritic(nn.Module):
    """Policy and value MLPs (orthogonal init) over normalised observations.

    Example:
        >>> import gymnasium as gym, torch
        >>> env = gym.make("CartPole-v1")
        >>> ac = ActorCritic(env.observation_space, env.action_space, seed=0)
        >>> out = ac.act(torch.zeros(5, 4))
        >>> out["action"].shape, out["log_prob"].shape, out["value"].shape
        (torch.Size([5]), torch.Size([5]), torch.Size([5]))

    ``act`` samples with the module's own ``torch.Generator`` and never builds a
    ``torch.distributions`` object (no per-step validation); ``evaluate`` returns
    log-probs, entropies and values for PPO's loss. By default the actor and critic
    are separate MLPs, run together as one ``StackedMLP``; ``shared_trunk`` selects
    one trunk for both heads instead. A ``per_head`` ``layout``
    (:class:`~trainer.common.policy_layout.PolicyLayout`: ``features`` per action head
    followed by ``shared`` ones; VR-edge: one head per user) makes the actor one MLP shared
    by all heads, each seeing its own features and the shared ones. ``layout`` is kept as
    the model's: what export and evaluation read to know which policy this is.
    """

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: tuple[int, ...] = (64, 64),
                 shared_trunk: bool = False, normalize_obs: bool = True, seed: int = 0,
                 layout: PolicyLayout = FLAT) -> None:
        super().__init__()
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise TypeError(f"ActorCritic needs a flat Box observation space, got {obs_space}")
        heads = action_heads(act_space)
        if heads is None:
            raise TypeError(f"unsupported action space {act_space}: use Discrete, 1-D MultiDiscrete or 1-D Box")
        self.kind = heads.kind
        if self.kind == "box":
            self.act_dim = heads.sizes[0]
        else:
            self.nvec = heads.sizes
        torch.manual_seed(seed)
        n_obs = obs_space.shape[0]
        self.layout = _check_layout(layout, self, n_obs, shared_trunk)
        per_head = layout.kind == "per_head"
        self.norm = RunningNorm((n_obs,)) if normalize_obs else nn.Identity()
        n_out = self.nvec[0] if per_head else sum(self.nvec) if self.kind != "box" else self.act_dim
        self.nets = None if per_head or shared_trunk else StackedMLP(n_obs, hidden, outputs=((n_out, 0.01), (1, 1.0)))
        if self.nets is None:
            if per_head:  # the actor reads per-head rows, the critic the whole observation
                self.actor_trunk = _tanh_mlp(layout.features + layout.shared, hidden)
                self.critic_trunk = _tanh_mlp(n_obs, hidden)
            else:
                self.actor_trunk = self.critic_trunk = _tanh_mlp(n_obs, hidden)
            self.actor_head = _layer(hidden[-1], n_out, 0.01)
            self.critic_head = _layer(hidden[-1], 1, 1.0)
        if self.kind == "box":
            self.log_std = nn.Parameter(torch.zeros(self.act_dim))
        self._ragged = self.kind != "box" and len(set(self.nvec)) > 1
        if self._ragged:  # ragged heads as one [B, K, max_n] tensor, padded with probability 0
            width = max(self.nvec)
            offsets = torch.tensor([0, *self.nvec[:-1]]).cumsum(0)
            cols = torch.arange(width)
            pad = cols[None, :] >= torch.tensor(self.nvec)[:, None]
            self.register_buffer("_gather", torch.where(pad, 0, offsets[:, None] + cols[None, :]), persistent=False)
            self.register_buffer("_pad", pad, persistent=False)
        self.generator = torch.Generator().manual_seed(seed + 1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self._heads(obs)[1]

    def _heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actor output [B, n_out], value [B])``."""
        z = self.norm(obs.float())
        if self.layout.kind == "per_head":  # one actor shared by all heads: [its own features, the shared ones]
            f, c = self.layout.features, self.layout.shared
            b, k = z.shape[0], len(self.nvec)
            rows = torch.cat([z[:, :k * f].reshape(b, k, f), z[:, k * f:].unsqueeze(1).expand(b, k, c)], dim=-1)
            logits = self.actor_head(self.actor_trunk(rows)).reshape(b, -1)
            return logits, self.critic_head(self.critic_trunk(z)).squeeze(-1)
        if self.nets is not None:  # separate actor and critic MLPs, run as one
            out = self.nets(z)
            return out[0], out[1, :, 0]
        actor = self.actor_trunk(z)
        critic = actor if self.critic_trunk is self.actor_trunk else self.critic_trunk(z)
        return self.actor_head(actor), self.critic_head(critic).squeeze(-1)

    def _grouped_log_probs(self, out: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, K, max_n]`` of the K categorical heads.

        Equal heads are a free reshape (the common case: Discrete, VR-edge). Ragged heads
        are gathered into the padded layout, with padding at the most negative finite
        logit, so that it has probability 0 and ``p * log p`` stays 0 rather than NaN.
        """
        if not self._ragged:
            # out.shape[0], not len(out): a traced export then keeps the batch size dynamic
            return torch.log_softmax(out.view(out.shape[0], len(self.nvec), -1), -1)
        return torch.log_softmax(out[:, self._gather].masked_fill(self._pad, torch.finfo(out.dtype).min), -1)

    def _shape_action(self, action: torch.Tensor) -> torch.Tensor:
        return action if self.kind == "multi" else action[:, 0]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, noise_keys: torch.Tensor | None = None,
            steps: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample actions for ``[N, obs]``: ``action``, ``log_prob`` and ``value`` (``[N]``).

        With ``noise_keys`` and ``steps`` (``int64 [N]``, what ``RolloutCollector`` passes), the
        noise of row ``i`` is a function of ``(noise_keys[i], steps[i])`` only (``trainer.common.noise``),
        so a row's action does not depend on the other rows; without them, the module's own
        ``generator`` is used (evaluation, callers without keys).
        """
        if (noise_keys is None) != (steps is None):
            raise ValueError("act() takes noise_keys and steps together, or neither")
        out, value = self._heads(obs)
        if self.kind == "box":
            if noise_keys is None:
                eps = torch.randn(out.shape, generator=self.generator, device=out.device)
            else:
                eps = noise.normal(noise_keys, steps, tuple(out.shape))
            action = out + self.log_std.exp() * eps
            return {"action": action, "log_prob": _normal_log_prob(action, out, self.log_std), "value": value}
        logp = self._grouped_log_probs(out)
        # Gumbel-max: argmax(log p + Gumbel noise) is a sample of p, in a few cheap ops for every head at once
        if noise_keys is None:
            gumbel = torch.rand(logp.shape, generator=self.generator, device=logp.device).log_().neg_().log_().neg_()
        else:
            gumbel = noise.gumbel(noise_keys, steps, tuple(logp.shape))
        action = (logp + gumbel).argmax(-1)
        log_prob = logp.gather(-1, action[..., None]).sum((-1, -2))
        return {"action": self._shape_action(action), "log_prob": log_prob, "value": value}

    def forward(self, obs: torch.Tensor, noise_keys: torch.Tensor | None = None,
                steps: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return self.act(obs, noise_keys, steps)

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions (mode of the policy), for evaluation."""
        out, _ = self._heads(obs)
        if self.kind == "box":
            return out
        return self._shape_action(self._grouped_log_probs(out).argmax(-1))

    @torch.no_grad()
    def action_probs(self, obs: torch.Tensor) -> torch.Tensor:
        """Probabilities ``[B, heads, max n]`` of the categorical heads (padding has probability 0)."""
        return self._grouped_log_probs(self._heads(obs)[0]).exp()

    def exported(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(greedy action, probs [B, heads, max n], value [B])`` in one pass: what an exported file runs
        (categorical heads only: ``trainer.ppo.export`` refuses a Box policy before it asks)."""
        out, value = self._heads(obs)
        logp = self._grouped_log_probs(out)
        return self._shape_action(logp.argmax(-1)), logp.exp(), value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)`` of given actions, each ``[B]``, differentiable."""
        out, value = self._heads(obs)
        if self.kind == "box":
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(len(out))
            return _normal_log_prob(action, out, self.log_std), entropy, value
        logp = self._grouped_log_probs(out)
        action = action.reshape(len(out), -1, 1).long()
        log_prob = logp.gather(-1, action).sum((-1, -2))
        entropy = -(logp.exp() * logp).sum((-1, -2))
        return log_prob, entropy, value


def _check_layout(layout: PolicyLayout, model: ActorCritic, n_obs: int, shared_trunk: bool) -> PolicyLayout:
    """``layout``, where this actor-critic can read it: flat, or per head (a set layout is
    :class:`~trainer.ppo.set_model.SetActorCritic`'s)."""
    if layout.kind == "set":
        raise ValueError("a set layout is SetActorCritic's (trainer.ppo.set_model): ActorCritic's parameters fix "
                         "the slot count")
    if layout.kind == "flat":
        return layout
    if model.kind != "multi" or len(set(model.nvec)) != 1:
        raise ValueError("a per-head actor needs a MultiDiscrete action space with equal heads")
    if len(model.nvec) * layout.features + layout.shared != n_obs:
        raise ValueError(f"per-head layout ({layout.features} per head x {len(model.nvec)} heads + {layout.shared} "
                         f"shared) does not match the observation size {n_obs}")
    if shared_trunk:
        raise ValueError("shared_trunk is not available with a per-head actor (its critic reads the whole "
                         "observation)")
    return layout


def _normal_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return (-0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
