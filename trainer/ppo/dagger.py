"""DAgger inside the loop: while PPO trains, the env's expert (its profile's: VR-edge's ``BeliefMPC``) labels some of
each rollout's states, and the actor takes a cross-entropy step toward its levels after PPO's epochs.

Which states: every ``every``-th step of the first ``columns`` envs of the rollout (:func:`label_plan`, from
``dagger_labels`` per iteration). A stateful expert (a filter that follows an env's every observation) is shown every
step of those envs, in order across iterations, and plans only where it labels; its state goes into each checkpoint
(``state()``/``load_state()``), so a resumed run labels what an uninterrupted one would. The states are the learner's
own, sampled as it acts (DAgger's distribution), not the greedy policy's that distillation after training labels.

One step per iteration: the mean cross-entropy of the expert's levels under the actor over the iteration's labels,
through the run's own optimizer (its learning rate, its clipping), so imitation fades with PPO's annealed rate.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from envs.profiles import profile_of
from trainer.common.world import World
from trainer.ppo.distillation import Labels, agreement
from trainer.ppo.update import descend

MOST_COLUMNS = 8  # envs labelled side by side: an expert's call costs about as much for 1 env as for 8


class LabelPlan(NamedTuple):
    """Where an iteration's labels come from: every ``every``-th step of the first ``columns`` envs."""

    columns: int
    every: int


def label_plan(labels: int, num_envs: int, num_steps: int) -> LabelPlan:
    """The plan for about ``labels`` labels per iteration of ``num_envs x num_steps`` states: up to
    :data:`MOST_COLUMNS` envs, the steps spread evenly (every one where the budget allows).

    >>> label_plan(128, 64, 128)  # 8 envs, every 8th step: 16 x 8 = 128 labels
    LabelPlan(columns=8, every=8)
    >>> label_plan(10_000, 4, 128)  # more than there are: every step of all 4 envs
    LabelPlan(columns=4, every=1)
    """
    columns = min(num_envs, MOST_COLUMNS)
    return LabelPlan(columns, max(1, (columns * num_steps) // max(labels, 1)))


class InLoopLabels:
    """The expert that labels during training, and the states it has labelled this iteration.

    Example (VR-edge's BeliefMPC following 2 of 4 envs; a rollout's observations ``[T, N, obs]``):
        >>> import envs
        >>> venv = envs.VREdgeVectorEnv(4, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> observations = torch.as_tensor(np.stack([obs] * 1))  # one step of a rollout
        >>> labeller = InLoopLabels("VREdge-v0", {"max_steps": 20}, LabelPlan(2, 1), seed=0, device="cpu")
        >>> labels = labeller.labelled(observations)
        >>> labels.observations.shape, labels.levels.shape
        (torch.Size([2, 61]), torch.Size([2, 8]))
    """

    def __init__(self, env: str, env_kwargs: dict[str, Any], plan: LabelPlan, seed: int, device: str) -> None:
        self.plan = plan
        expert = profile_of(env).expert
        self.expert, self.stateful = expert.make(env_kwargs, seed, device), expert.stateful
        self.step = 0  # steps of the envs shown so far (labels on every plan.every-th)

    def labelled(self, observations: torch.Tensor) -> Labels:
        """The expert's levels on the planned states of a rollout's ``observations`` ``[T, N, obs]`` (every one of
        the planned envs' steps shown to it, in order)."""
        seen = observations[:, :self.plan.columns].detach().cpu().numpy()
        states, levels = [], []
        for obs in seen:
            if self.step % self.plan.every == 0:
                states.append(obs)
                levels.append(np.asarray(self.expert(obs), dtype=np.int64))
            elif self.stateful:
                self.expert.observe(obs)  # (it follows every step; it plans only where it labels)
            self.step += 1
        return Labels(torch.as_tensor(np.concatenate(states), dtype=torch.float32),
                      torch.as_tensor(np.concatenate(levels)))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the expert's state and the steps shown."""
        return {"expert": self.expert.state() if self.stateful else None, "step": self.step}

    def load_state(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`'s ``state``."""
        if self.stateful:
            self.expert.load_state(state["expert"])
        self.step = int(state["step"])


def imitation_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, labels: Labels, max_grad_norm: float,
                   world: World) -> dict[str, float]:
    """One optimizer step of the mean cross-entropy of ``labels``' levels under ``model``'s actor (:meth:`evaluate`'s
    log-probability, over the active users), gradients zeroed in place, averaged over the ranks and clipped as PPO's
    own step does; returns the loss and the share of levels the greedy actor already plays (both before the step)."""
    device = next(model.parameters()).device
    labels = Labels(labels.observations.to(device), labels.levels.to(device))
    before = agreement(model, labels)
    loss = -model.evaluate(labels.observations, labels.levels)[0].mean()
    descend(loss, optimizer, [p for group in optimizer.param_groups for p in group["params"]], max_grad_norm, world)
    return {"imitation_loss": float(loss.detach()), "imitation_agreement": before}
