"""Distilling the causal ceiling into a trained policy (issue 51): one round of DAgger with ``BeliefMPC`` as the
expert.

The trained policy plays ``episodes`` episodes of its own cell (seeds of their own branch, disjoint from training,
validation and test: :func:`trainer.evaluation.episodes.distillation_seeds`); at every state it visits,
:class:`envs.belief_mpc.BeliefMPC` (on ``fair_share``, its defaults; observations only) says which levels it would
play. The policy's actor is then fine-tuned toward those levels by cross-entropy (``epochs`` passes, Adam at ``lr``,
the critic and the observation statistics untouched), and the result is kept only where it scores no lower than
before on the run's validation episodes (paired; selection, never the test episodes).

Why it pays: PPO's policy reaches 0.75-0.88 of the ceiling's lead over ``fair_share`` and the seeds differ
(``docs/ceiling.md``); the rollout's levels are a better target than the noisy policy gradient for the same states,
and the policy averages the rollout's scenario noise over many states.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import envs
from envs.belief import filter_refusal
from envs.belief_mpc import BeliefMPC
from envs.settings import ConfigError, check_limits, setting
from trainer.evaluation.episodes import distillation_seeds, policy_actions, run_episodes, validation_seeds
from trainer.evaluation.statistics import paired_difference
from trainer.ppo.settings import PPOSettings

_BATCH = 64  # episodes labelled side by side: one batched env, one filter row each


@dataclass(frozen=True)
class DistillSettings:
    """How a run's policy is distilled (``python -m trainer.distill``); defaults measured on validation episodes
    (``docs/ceiling.md``).

    >>> DistillSettings().episodes
    64
    >>> DistillSettings(lr=0)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --lr must be > 0 and <= 1, got 0
    """

    episodes: int = setting(PPOSettings.distill_episodes, "episodes the policy plays and BeliefMPC labels (300 "
                            "states each on the default cell; about 2 s each on a 2-core CPU)", at_least=1,
                            at_most=100_000)
    epochs: int = setting(3, "passes of the cross-entropy over the labelled states", at_least=1, at_most=100)
    lr: float = setting(1e-4, "Adam learning rate of the fine-tuning", above=0, at_most=1)
    minibatch_size: int = setting(256, "labelled states per step", at_least=1)
    validation_episodes: int = setting(64, "validation episodes the policy is scored on before and after (the run's "
                                       "own validation seeds)", at_least=2, at_most=10_000)
    seed: int = setting(0, "seed of the labelled episodes, the shuffles and the expert's scenarios", at_least=0)

    def __post_init__(self) -> None:
        for f in fields(self):
            value, number = getattr(self, f.name), f.type == "float"
            if isinstance(value, bool) or not isinstance(value, (int, float) if number else int):
                raise ConfigError(f.name, value, "must be a number" if number else "must be an integer")
        check_limits(self)  # named as python -m trainer.distill's flags


class Labels(NamedTuple):
    """States the policy visited and the expert's levels there: ``observations [S, obs]``, ``levels [S, U]``."""

    observations: torch.Tensor
    levels: torch.Tensor


def expert_labels(model: nn.Module, env_kwargs: dict[str, Any], episodes: int, seed: int) -> Labels:
    """Every state of ``episodes`` episodes the greedy ``model`` plays (:func:`distillation_seeds`), each with the
    levels :class:`BeliefMPC` (on ``fair_share``; it follows the same observations) would play there.

    Played ``_BATCH`` episodes at a time in one batched env, each batch with a fresh expert (one filter row per
    env)."""
    config = envs.VREdgeConfig(**env_kwargs)
    make = functools.partial(gym.make, "VREdge-v0", **env_kwargs)
    act, seeds = policy_actions(model.eval(), deterministic=True), distillation_seeds(seed, episodes)
    observations: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    for start in range(0, episodes, _BATCH):
        expert, chunk = BeliefMPC(config, seed=seed), seeds[start:start + _BATCH]
        seen: list[np.ndarray] = []
        said: list[np.ndarray] = []

        def labelled(obs: np.ndarray, expert: BeliefMPC = expert, seen: list = seen, said: list = said
                     ) -> np.ndarray:
            seen.append(obs.copy())
            said.append(expert(obs))
            return act(obs)

        records = run_episodes(labelled, make, len(chunk), 0, num_envs=len(chunk), seeds=chunk, whole_batch=True)
        # row i plays episode i alone (as many envs as episodes): its states are the first `length` (one that ended
        # early, all its users gone, plays on idle, unrecorded)
        live = np.arange(len(seen))[:, None] < np.array([int(r["length"]) for r in records])[None, :]  # [T, n]
        observations.append(np.stack(seen)[live])
        levels.append(np.stack(said)[live])
    return Labels(torch.as_tensor(np.concatenate(observations), dtype=torch.float32),
                  torch.as_tensor(np.concatenate(levels), dtype=torch.int64))


def fine_tuned(model: nn.Module, labels: Labels, settings: DistillSettings, max_grad_norm: float) -> list[float]:
    """Fine-tune ``model``'s actor in place toward ``labels`` by cross-entropy (minus the log-probability of the
    expert's levels, :meth:`evaluate`'s, over the active users); returns each epoch's mean cross-entropy.

    Only the actor's parameters move: the loss does not reach the critic, and the observation statistics are
    buffers, not parameters. Deterministic: the shuffles come from ``settings.seed``."""
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=settings.lr)
    generator = torch.Generator().manual_seed(settings.seed)
    n, size = len(labels.observations), settings.minibatch_size
    losses = []
    for _ in range(settings.epochs):
        order, total, steps = torch.randperm(n, generator=generator), 0.0, 0
        for first in range(0, max(n - size, 0) + 1, size):
            rows = order[first:first + size]
            log_prob = model.evaluate(labels.observations[rows], labels.levels[rows])[0]
            loss = -log_prob.mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        losses.append(total / steps)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return losses


def validation_score(model: nn.Module, env_kwargs: dict[str, Any], run_seed: int, episodes: int
                     ) -> list[dict[str, float]]:
    """The greedy ``model``'s records on the run's first ``episodes`` validation episodes (the quality line's)."""
    make = functools.partial(gym.make, "VREdge-v0", **env_kwargs)
    seeds = validation_seeds(run_seed, episodes)
    return run_episodes(policy_actions(model.eval(), deterministic=True), make, episodes, 0, seeds=seeds)


def distillation_refusal(env: str, env_kwargs: dict[str, Any]) -> str:
    """Why a run of ``env`` with ``env_kwargs`` cannot be distilled; ``""`` when it can."""
    if env != "VREdge-v0":
        return f"trained on {env}: the expert (BeliefMPC) plays VR-edge's synthetic cell only"
    return filter_refusal(envs.VREdgeConfig(**env_kwargs))


def distilled(model: nn.Module, env_kwargs: dict[str, Any], run_seed: int, settings: DistillSettings,
              max_grad_norm: float) -> dict[str, Any]:
    """Distil into ``model`` in place (module docstring); returns what happened: ``states`` labelled, the
    ``agreement`` with the expert's levels before and after, each epoch's ``cross_entropy``, the validation
    ``difference`` (after - before, paired) and whether the distilled weights were ``kept`` (else ``model`` is as
    it was)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    labels = expert_labels(model, env_kwargs, settings.episodes, settings.seed)
    scored = validation_score(model, env_kwargs, run_seed, settings.validation_episodes)
    agreement = [_agreement(model, labels)]
    losses = fine_tuned(model, labels, settings, max_grad_norm)
    agreement.append(_agreement(model, labels))
    difference = paired_difference(validation_score(model, env_kwargs, run_seed, settings.validation_episodes),
                                   scored)
    kept = difference["mean"] >= 0
    if not kept:
        model.load_state_dict(before)
    return {"states": len(labels.observations), "episodes": settings.episodes, "agreement": agreement,
            "cross_entropy": losses, "difference": difference, "kept": kept,
            "settings": {f.name: getattr(settings, f.name) for f in fields(settings)}}


@torch.no_grad()
def _agreement(model: nn.Module, labels: Labels) -> float:
    """The share of the slots' levels where the greedy ``model`` plays the expert's (an inactive slot: both 0)."""
    return float((model.act_deterministic(labels.observations) == labels.levels).double().mean())
