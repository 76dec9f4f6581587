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
        descend(out.loss, self.optimizer, self.params, self.settings.max_grad_norm, self.world)
        return out


def descend(loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_grad_norm: float,
            world: World) -> None:
    """One optimiser step on ``loss``: the gradients of ``params`` (the optimiser's) zeroed in place, ``loss``
    backward, averaged over the ranks, the global norm clipped to ``max_grad_norm``, then the step."""
    for p in params:  # zeroed in place (flat_parameters' gradient views stay attached, and a CUDA
        if p.grad is not None:  # graph keeps its addresses), without optimizer.zero_grad()'s bookkeeping
            p.grad.zero_()
    loss.backward()
    for p in params:  # data-parallel: the gradient of the whole minibatch, every rank's share averaged
        world.mean_(p.grad)  # (one flat parameter: one all-reduce per step; alone, nothing)
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
    optimizer.step()


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


def usable_samples(total: int, minibatch_size: int) -> int:
    """How many of ``total`` samples an epoch's minibatches take: all but the remainder smaller than a minibatch
    (it waits for the next epoch's shuffle, so that every minibatch has the planned size)."""
    used = total - total % minibatch_size
    if not used:  # not one step to take: the statistics would be 0/0
        raise ValueError(f"ppo_update: {total} samples make no minibatch of {minibatch_size}; collect at least "
                         f"{minibatch_size} (num_envs x num_steps) or lower minibatch_size")
    return used


class RunTargets(NamedTuple):
    """The advantages, values and returns ``[T, N]`` of the run's envs: every rank's (:meth:`gathered`), which
    normalise each whole minibatch and give the explained variance. Alone, this process's own."""

    advantages: torch.Tensor
    values: torch.Tensor
    returns: torch.Tensor

    @classmethod
    def gathered(cls, samples: LearnerSamples, world: World) -> RunTargets:
        """Every rank's targets, in one gather (alone: ``samples``' own, no copy)."""
        if world.size == 1:
            return cls(samples.advantages, samples.old_values, samples.returns)
        stacked = torch.stack([samples.advantages, samples.old_values, samples.returns])
        return cls(*world.gather_envs(stacked, dim=2).unbind(0))


def shuffled_advantages(advantages: torch.Tensor, run: RunTargets, everyone: torch.Tensor, used: int,
                        minibatch_size: int, ranks: int) -> torch.Tensor:
    """This rank's ``used`` shuffled ``advantages``, each normalised over its whole minibatch: this rank's
    ``minibatch_size`` and every other rank's share, taken from ``run`` in the epoch's order ``everyone``."""
    whole = run.advantages.flatten()[everyone[:used * ranks]].view(-1, minibatch_size * ranks)
    return minibatch_normalised(advantages[:used].view(-1, minibatch_size), whole).flatten()


class UpdateDiagnostics:
    """What an update reports, kept on the device until the end: the losses summed over minibatches, the
    log-ratios of the epoch under way, and each epoch's approximate KL and clip fraction summed; data-parallel,
    averaged over the ranks (``world``)."""

    def __init__(self, used: int, device: torch.device, world: World) -> None:
        self.losses = torch.zeros(4, device=device)  # policy, value, entropy, total: summed over minibatches
        self.log_ratios = torch.empty(used, device=device)  # this epoch's, minibatch by minibatch
        self.kl_and_clip = torch.zeros(2, device=device)  # the epochs' KL and clip fraction, summed
        self.world, self.minibatches, self.epochs = world, 0, 0

    def add_minibatch(self, start: int, out: PPOLoss) -> None:
        """Record the minibatch of samples ``start:`` (read before the next step: a CUDA graph's outputs are
        overwritten)."""
        with torch.no_grad():
            self.log_ratios[start:start + out.log_ratio.shape[0]] = out.log_ratio
            self.losses += torch.stack([out.policy_loss, out.value_loss, out.entropy, out.loss])
        self.minibatches += 1

    def end_epoch(self, clip_coef: float) -> torch.Tensor:
        """The epoch's approximate KL (the low-variance k3 estimator; a device scalar), recorded with its clip
        fraction: over the whole epoch, every rank's."""
        self.epochs += 1
        with torch.no_grad():
            ratio_m1 = self.log_ratios.exp() - 1
            epoch = self.world.mean_(torch.stack([(ratio_m1 - self.log_ratios).mean(),
                                                  (ratio_m1.abs() > clip_coef).float().mean()]))
            self.kl_and_clip += epoch
        return epoch[0]

    def means(self) -> dict[str, float]:
        """Each of :data:`STAT_NAMES`: the mean over minibatches, or epochs; raises :class:`NonFiniteLossError`
        where one is not finite."""
        figures = self.world.mean_(torch.cat([self.losses / self.minibatches, self.kl_and_clip / self.epochs]))
        out = dict(zip(STAT_NAMES, figures.tolist()))
        if not all(math.isfinite(v) for v in out.values()):
            raise NonFiniteLossError(f"non-finite loss ({out})")
        return out


def ppo_update(step: UpdateStep, samples: LearnerSamples, generator: torch.Generator,
               world: World = ALONE) -> dict[str, float]:
    """Clipped-surrogate PPO over ``step.settings.epochs`` shuffles of ``samples`` (``[T, n]``: this rank's
    envs of the run's ``n x world.size``; ``[B]``: one env's ``B`` steps).

    Each epoch shuffles every per-sample tensor once on the device (:func:`epoch_order`); its minibatches are
    then contiguous slices (views, no copy), each taken by ``step``; every minibatch has the planned size
    (:func:`usable_samples`: one compiled graph, one captured CUDA graph). With ``norm_adv``, advantages are
    normalised per minibatch; with ``target_kl``, the epochs stop after the first whose approximate KL exceeds
    it. Diagnostics stay on the device until the end (plus one KL read per epoch when ``target_kl`` is set).

    Data-parallel (``world``), ``minibatch_size`` is this rank's share of each minibatch: the advantages are
    normalised over the whole minibatch (:class:`RunTargets`, :func:`shuffled_advantages`), and gradients, KL and
    figures are averaged over the ranks (:class:`MinibatchStep`, :class:`UpdateDiagnostics`).
    """
    s, mbs = step.settings, step.settings.minibatch_size
    if samples.advantages.dim() == 1:  # one env's steps: a rollout of one env
        samples = LearnerSamples(*(x.unsqueeze(1) for x in samples))
    num_steps, num_envs = samples.advantages.shape
    run_envs, device = num_envs * world.size, samples.advantages.device
    used = usable_samples(num_steps * num_envs, mbs)
    run = RunTargets.gathered(samples, world)
    flat, diagnostics = samples.flat(), UpdateDiagnostics(used, device, world)
    for _ in range(s.epochs):
        mine, everyone = epoch_order(generator, num_steps, run_envs, world.envs(run_envs), device)
        shuffled = flat.index(mine)
        if s.norm_adv:
            shuffled = shuffled._replace(advantages=shuffled_advantages(shuffled.advantages, run, everyone, used,
                                                                        mbs, world.size))
        for start in range(0, used, mbs):
            diagnostics.add_minibatch(start, step(shuffled.index(slice(start, start + mbs))))
        kl = diagnostics.end_epoch(s.clip_coef)
        if s.target_kl is not None and kl.item() > s.target_kl:
            break
    out = diagnostics.means()
    with torch.no_grad():
        out["explained_variance"] = explained_variance(run.values.flatten(), run.returns.flatten()).item()
    out["epochs"] = diagnostics.epochs
    return out
