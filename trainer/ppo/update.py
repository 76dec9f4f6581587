"""The PPO update on one ``[T, N]`` rollout that is already on the learner's device: the clipped-surrogate loss
and the epochs of minibatches over it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase

from trainer.algorithm import NonFiniteLossError
from trainer.common.world import ALONE, World
from trainer.ppo.model import ActorCritic


def minibatch_generator(seed: int, iteration: int, device: torch.device) -> torch.Generator:
    """The minibatch shuffles of one iteration: derived from (seed, iteration), so no device-specific
    generator state needs to be stored, and a run resumes on another device."""
    return torch.Generator(device=device).manual_seed(int(np.random.SeedSequence([seed, 2, iteration])
                                                          .generate_state(1)[0]))


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    var = target.var()
    return torch.where(var > 0, 1 - (target - pred).var() / var, torch.zeros_like(var))


STAT_NAMES = ("policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clip_fraction")


@dataclass(frozen=True)
class UpdateSettings:
    """The PPO update's hyperparameters (``TrainConfig`` fields of the same names; ``target_kl=None``: no
    early stop)."""

    epochs: int
    minibatch_size: int
    clip_coef: float
    clip_value: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    norm_adv: bool
    target_kl: float | None

    @classmethod
    def from_config(cls, cfg: Any, minibatch_size: int) -> UpdateSettings:
        """From a ``TrainConfig`` and the planned minibatch size (``trainer.ppo.minibatches.plan_minibatches``)."""
        ppo = cfg.algo_settings
        return cls(epochs=ppo.epochs, minibatch_size=minibatch_size, clip_coef=ppo.clip_coef,
                   clip_value=ppo.clip_value, ent_coef=ppo.ent_coef, vf_coef=ppo.vf_coef,
                   max_grad_norm=cfg.max_grad_norm, norm_adv=ppo.norm_adv, target_kl=ppo.target_kl or None)


class LearnerSamples(NamedTuple):
    """What the PPO loss reads, by name: a rollout's ``[T, N]`` samples (:meth:`from_rollout`), or a flat ``[B]``
    batch (a minibatch, whose advantages :func:`ppo_update` has normalised where ``norm_adv`` says so)."""

    observations: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    @classmethod
    def from_rollout(cls, batch: TensorDictBase, advantages: torch.Tensor, returns: torch.Tensor) -> LearnerSamples:
        """A ``[T, N]`` batch and its targets, as ``[T, N]`` samples (views, no copy)."""
        return cls(batch["observations"], batch["actions"], batch["log_probs"], batch["values"], advantages, returns)

    def flat(self) -> LearnerSamples:
        """``[T, N]`` samples as ``T x N`` (time-major; views): sample ``t * N + n`` is env ``n``'s step ``t``."""
        return LearnerSamples(*(x.flatten(0, 1) for x in self))

    def index(self, rows: torch.Tensor | slice) -> LearnerSamples:
        """The samples at ``rows`` (a permutation gathers copies; a slice gives views)."""
        return LearnerSamples(*(x[rows] for x in self))


class PPOLoss(NamedTuple):
    """One minibatch's loss and its parts, by name (scalars, and ``log_ratio [B]``)."""

    loss: torch.Tensor  # what is minimised: policy_loss - ent_coef * entropy + vf_coef * value_loss
    log_ratio: torch.Tensor  # log(pi_new / pi_old) per sample, for the epoch's KL and clip fraction
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor


def ppo_loss(model: ActorCritic, mb: LearnerSamples, s: UpdateSettings) -> PPOLoss:
    """The loss of one minibatch: clipped surrogate, (clipped) value loss, entropy bonus (its advantages as given:
    :func:`ppo_update` normalises them over the whole minibatch, which may span ranks)."""
    logp, entropy, value = model.evaluate(mb.observations, mb.actions)
    log_ratio = logp - mb.old_log_probs
    ratio = log_ratio.exp()
    adv = mb.advantages
    policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)).mean()
    if s.clip_value:
        v_clipped = mb.old_values + (value - mb.old_values).clamp(-s.clip_coef, s.clip_coef)
        value_loss = 0.5 * torch.max((value - mb.returns) ** 2, (v_clipped - mb.returns) ** 2).mean()
    else:
        value_loss = 0.5 * F.mse_loss(value, mb.returns)
    entropy_mean = entropy.mean()
    loss = policy_loss - s.ent_coef * entropy_mean + s.vf_coef * value_loss
    return PPOLoss(loss, log_ratio, policy_loss, value_loss, entropy_mean)


LossFn = Callable[[ActorCritic, LearnerSamples, UpdateSettings], PPOLoss]


def compiled_ppo_loss() -> LossFn:
    """:func:`ppo_loss` under ``torch.compile`` (forward and, through AOTAutograd, backward): minibatches all
    have the planned size (a remainder waits for the next shuffle), so one graph serves the whole run."""
    return torch.compile(ppo_loss, dynamic=False)


class MinibatchStep:
    """One optimiser step on one minibatch: gradients zeroed in place, the loss forward and backward, the
    gradients averaged over the ranks of a data-parallel run (``world``), the global gradient norm clipped, one
    optimiser step. Returns the minibatch's :class:`PPOLoss` (from before the step).

    ``loss_fn``: :func:`ppo_loss`, or :func:`compiled_ppo_loss`'s; ``trainer.ppo.cuda_graph.CapturedStep``
    replays the same step as one CUDA graph.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> model = ActorCritic(env.observation_space, env.action_space)
        >>> settings = UpdateSettings(epochs=1, minibatch_size=8, clip_coef=0.2, clip_value=False, ent_coef=0.0,
        ...                        vf_coef=0.5, max_grad_norm=0.5, norm_adv=True, target_kl=None)
        >>> step = MinibatchStep(model, torch.optim.Adam(model.parameters()), settings)
        >>> obs = torch.randn(8, 4)
        >>> out = model.act(obs)
        >>> mb = LearnerSamples(obs, out["action"], out["log_prob"], out["value"], torch.randn(8), torch.randn(8))
        >>> step(mb).log_ratio.abs().max().item()  # the stored log-probs are the model's own: ratio 1
        0.0
    """

    def __init__(self, model: ActorCritic, optimizer: torch.optim.Optimizer, settings: UpdateSettings,
                 loss_fn: LossFn = ppo_loss, world: World = ALONE) -> None:
        self.model, self.optimizer, self.settings, self.loss_fn = model, optimizer, settings, loss_fn
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.world = world

    def __call__(self, mb: LearnerSamples) -> PPOLoss:
        out = self.loss_fn(self.model, mb, self.settings)
        for p in self.params:  # zeroed in place (flat_parameters' gradient views stay attached, and a CUDA
            if p.grad is not None:  # graph keeps its addresses), without optimizer.zero_grad()'s bookkeeping
                p.grad.zero_()
        out.loss.backward()
        for p in self.params:  # data-parallel: the gradient of the whole minibatch, every rank's share averaged
            self.world.mean_(p.grad)  # (one flat parameter: one all-reduce per step; alone, nothing)
        torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm, foreach=True)
        self.optimizer.step()
        return out


class UpdateStep(Protocol):
    """What :func:`ppo_update` takes minibatches to: a :class:`MinibatchStep`, or ``CapturedStep``'s replay of one."""

    settings: UpdateSettings

    def __call__(self, mb: LearnerSamples) -> PPOLoss: ...


def epoch_order(generator: torch.Generator, num_steps: int, num_envs: int, envs: slice,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch's shuffle of a ``[num_steps, num_envs]`` rollout: each env's steps in an order of their own, the
    samples then taken one slot at a time (slot 0 of every env, slot 1 of every env, ...). Returns the order of
    the envs ``envs`` (indices into their ``[T, n]`` samples, flattened) and of all envs (into ``[T, N]``).

    Why by env: the shuffle is drawn for the run's envs, so a rank that steps ``envs`` finds its share of every
    minibatch in its own samples (a minibatch of whole slots holds ``minibatch / N`` steps of each env), and
    ranks together take exactly the minibatches one process takes, whatever the world size.

    Example:
        >>> mine, everyone = epoch_order(torch.Generator().manual_seed(0), 3, 4, slice(2, 4), torch.device("cpu"))
        >>> sorted(mine.tolist()) == list(range(6)), sorted(everyone.tolist()) == list(range(12))
        (True, True)
        >>> bool(((everyone[:4] % 4) == torch.arange(4)).all())  # the first slot: one step of every env
        True
    """
    slots = torch.rand(num_envs, num_steps, generator=generator, device=device).argsort(dim=1, stable=True)
    everyone = (slots * num_envs + torch.arange(num_envs, device=device)[:, None]).T.reshape(-1)
    mine = slots[envs]
    n = mine.shape[0]
    return (mine * n + torch.arange(n, device=device)[:, None]).T.reshape(-1), everyone


def minibatch_normalised(advantages: torch.Tensor, everyone: torch.Tensor) -> torch.Tensor:
    """Advantages ``[K, m]`` (this rank's share of K minibatches) normalised by the mean and standard deviation
    of their whole minibatches, ``everyone`` ``[K, M]`` (every rank's share; alone, the same tensor).

    Example:
        >>> adv = torch.tensor([[1.0, 3.0], [0.0, 4.0]])
        >>> minibatch_normalised(adv[:, :1], adv).tolist()  # the first of each minibatch, normalised by both
        [[-0.7071067690849304], [-0.7071067690849304]]
    """
    return (advantages - everyone.mean(1, keepdim=True)) / (everyone.std(1, keepdim=True) + 1e-8)


def ppo_update(step: UpdateStep, samples: LearnerSamples, generator: torch.Generator,
               world: World = ALONE) -> dict[str, float]:
    """Clipped-surrogate PPO over ``step.settings.epochs`` shuffles of ``samples`` (``[T, n]``: this rank's
    envs of the run's ``n x world.size``; ``[B]``: one env's ``B`` steps).

    Each epoch shuffles every per-sample tensor once on the device (:func:`epoch_order`); its
    minibatches are then contiguous slices (views, no copy), each taken by ``step``. A remainder
    smaller than a minibatch waits for the next epoch's shuffle, so every minibatch has the planned
    size (one compiled graph, one captured CUDA graph). With ``norm_adv``, advantages are normalised
    per minibatch (the whole one: every rank's share). Each minibatch stores its log-ratios, and the
    approximate KL (k3 estimator) and clip fraction are computed from them once per epoch; with
    ``target_kl``, the epochs stop after the first whose KL exceeds it. Diagnostics stay on the device
    until the end (plus one KL read per epoch when ``target_kl`` is set). Data-parallel, ``minibatch_size``
    is this rank's share, and gradients, KL and figures are averaged over the ranks (``world``).
    """
    s, mbs = step.settings, step.settings.minibatch_size
    if samples.advantages.dim() == 1:
        samples = LearnerSamples(*(x.unsqueeze(1) for x in samples))
    num_steps, n = samples.advantages.shape
    total, device, envs = num_steps * n, samples.advantages.device, world.envs(n * world.size)
    used = total - total % mbs
    if not used:  # not one step to take: the statistics below would be 0/0
        raise ValueError(f"ppo_update: {total} samples make no minibatch of {mbs}; collect at least "
                         f"{mbs} (num_envs x num_steps) or lower minibatch_size")
    targets = world.gather_envs(torch.stack([samples.advantages, samples.old_values, samples.returns]), dim=2)
    flat = samples.flat()
    losses = torch.zeros(4, device=device)  # policy, value, entropy, total: summed over minibatches
    log_ratios = torch.empty(used, device=device)
    kl_and_clip = torch.zeros(2, device=device)  # the epochs' KL and clip fraction, summed
    updates = epochs_run = 0
    for _ in range(s.epochs):
        mine, everyone = epoch_order(generator, num_steps, n * world.size, envs, device)
        shuffled = flat.index(mine)
        if s.norm_adv:  # over each whole minibatch: every rank's advantages are in targets[0]
            whole = targets[0].flatten()[everyone[:used * world.size]].view(-1, mbs * world.size)
            shuffled = shuffled._replace(advantages=minibatch_normalised(shuffled.advantages[:used].view(-1, mbs),
                                                                         whole).flatten())
        for start in range(0, used, mbs):
            out = step(shuffled.index(slice(start, start + mbs)))
            with torch.no_grad():  # read before the next step (a CUDA graph's outputs are overwritten)
                log_ratios[start:start + mbs] = out.log_ratio
                losses += torch.stack([out.policy_loss, out.value_loss, out.entropy, out.loss])
            updates += 1
        epochs_run += 1
        with torch.no_grad():
            ratio_m1 = log_ratios.exp() - 1
            # low-variance KL estimator, k3, and the clip fraction: over the whole epoch, every rank's
            epoch = world.mean_(torch.stack([(ratio_m1 - log_ratios).mean(),
                                             (ratio_m1.abs() > s.clip_coef).float().mean()]))
            kl_and_clip += epoch
        if s.target_kl is not None and epoch[0].item() > s.target_kl:
            break
    figures = world.mean_(torch.cat([losses / updates, kl_and_clip / epochs_run]))
    out = dict(zip(STAT_NAMES, figures.tolist()))
    if not all(math.isfinite(v) for v in out.values()):
        raise NonFiniteLossError(f"non-finite loss ({out})")
    with torch.no_grad():
        out["explained_variance"] = explained_variance(targets[1].flatten(), targets[2].flatten()).item()
    out["epochs"] = epochs_run
    return out
