"""PPO as the loop runs it: the run's state from one iteration to the next (and into a checkpoint), and one
iteration (a rollout in, the model updated, a metrics row out)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from collectors.collector import merge_states, split_state
from trainer import __version__
from trainer.algorithm import ENVS_NOT_RESTORED, Algorithm, NonFiniteLossError
from trainer.common.devices import resolve_device
from trainer.common.flat_params import flat_parameters
from trainer.common.spaces import model_spaces
from trainer.common.state import capture_rng, cpu_copy, restore_rng
from trainer.common.world import World
from trainer.config import TrainConfig
from trainer.metrics import metrics_row, run_episodes_and_reward, steps_per_second
from trainer.ppo.cuda_graph import CapturedStep
from trainer.ppo.dagger import InLoopLabels, imitation_step, label_plan
from trainer.ppo.distillation import distilled_record, expert_device, rounds_after_training
from trainer.ppo.minibatches import MinibatchPlan, plan_minibatches, rank_minibatch_size
from trainer.ppo.model import ActorCritic
from trainer.ppo.optimizer import fused_adam, load_optimizer_state, set_learning_rate
from trainer.ppo.pipeline import Pipeline, make_pipeline
from trainer.ppo.reward_scaling import ReturnScaler
from trainer.ppo.set_model import SetActorCritic
from trainer.ppo.settings import PPOSettings
from trainer.ppo.spec import PPOSpec
from trainer.ppo.targets import advantages_and_returns, vtrace_targets
from trainer.ppo.update import (
    LearnerSamples,
    MinibatchStep,
    UpdateSettings,
    UpdateStep,
    compiled_ppo_loss,
    minibatch_generator,
    ppo_loss,
    ppo_update,
)

if TYPE_CHECKING:
    from collectors import Collector, Rollout
    from trainer.run_layout import RunLayout


@dataclass
class PPO(PPOSpec, Algorithm):
    """Everything a PPO run carries from one iteration to the next (and into a checkpoint).

    ``model`` learns on ``device``; ``acting`` is the copy the collector acts with, on the CPU (on ``device``
    with ``--backend device``); its weights arrive through ``collector.update_policy``, and its sampling
    generator is run state.
    ``pipeline`` (from :meth:`attach`) says where each iteration's rollout comes from.

    Example (one iteration on CartPole, as ``trainer.train`` runs it):
        >>> from collectors import make_collector
        >>> from trainer.run_layout import Machine, run_layout
        >>> cfg = TrainConfig(env="CartPole-v1", num_envs=2, num_steps=32, total_steps=64, device="cpu")
        >>> layout = run_layout(cfg, Machine(cores=1))
        >>> ppo = PPO.new(cfg, layout)
        >>> with make_collector(layout.env_factories(), ppo.acting, num_steps=cfg.num_steps, seed=cfg.seed,
        ...                     **ppo.collector_options()) as collector:
        ...     ppo.attach(collector)
        ...     row = ppo.iterate(start=(0, 0.0))
        >>> row["iteration"], row["env_steps"], ppo.pipeline.collector.policy_version
        (1, 64, 1)
    """

    cfg: TrainConfig
    device: torch.device
    model: ActorCritic
    acting: ActorCritic
    optimizer: torch.optim.Optimizer
    scaler: ReturnScaler | None
    plan: MinibatchPlan
    iterations: int  # of the whole run: the learning rate anneals over them
    step: UpdateStep  # one minibatch's update: the loss compiled with --compile, captured with --cuda-graphs
    world: World  # torchrun's ranks (alone: World()): this one learns on its share of the envs, in step
    keep_collecting: bool  # the layout's: Ray actors collect while it learns (IMPALA-style), so batches lag
    iteration: int = 0
    env_steps: int = 0
    dropped: int = 0
    lags: dict = field(default_factory=dict)  # policy lag -> number of rollouts
    recent: deque = field(default_factory=lambda: deque(maxlen=100))
    pipeline: Pipeline | None = None
    # the distillation rounds kept on the weights (trainer.ppo.distillation), carried into every later checkpoint
    distilled: list = field(default_factory=list)
    labeller: InLoopLabels | None = None  # dagger_labels: the expert that labels while the run trains

    @classmethod
    def make_model(cls, cfg: TrainConfig) -> ActorCritic | SetActorCritic:
        """The actor-critic for ``cfg.env`` (a per-head actor where the env declares the split and
        ``policy_arch`` allows; a set actor-critic for ``policy_arch = "set"``, or ``auto`` on a cell whose user
        count varies)."""
        obs_space, act_space, layout = model_spaces(cfg)
        ppo = cfg.algo_settings
        if layout.kind == "set":
            return SetActorCritic(obs_space, act_space, layout, cfg.hidden_sizes, ppo.normalize_obs, seed=cfg.seed,
                                  shared_trunk=ppo.shared_trunk)
        return ActorCritic(obs_space, act_space, cfg.hidden_sizes, ppo.shared_trunk, ppo.normalize_obs,
                           seed=cfg.seed, layout=layout)

    @classmethod
    def new(cls, cfg: TrainConfig, layout: RunLayout) -> PPO:
        """A fresh run: model and its acting copy from ``cfg.seed``, fused Adam over one flat parameter, the
        minibatch plan for the layout's batch (a batch size that cannot work fails here), and the minibatch
        step as the layout runs it (the loss compiled; the whole step captured as a CUDA graph). Under torchrun
        every rank makes the same model and takes its share of every minibatch (``layout.world``)."""
        ppo: PPOSettings = cfg.algo_settings
        world = layout.world
        plan = plan_minibatches(layout.batch_envs, cfg.num_steps, ppo.minibatch_size or None)  # ConfigError
        share = rank_minibatch_size(plan, layout.batch_envs, cfg.num_steps, world.size)  # ConfigError
        device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        model = cls.make_model(cfg).to(device)
        # the collector acts on the CPU, except the device backend's, which acts next to its env on the device
        acting = cls.make_model(cfg).to(device if layout.backend == "device" else "cpu")
        acting.load_state_dict(model.state_dict())
        # one flat tensor and a fused kernel: Adam is a single op per minibatch, not ~10 per parameter
        optimizer = fused_adam(flat_parameters(model), cfg.lr, capturable=layout.cuda_graphs)
        step = MinibatchStep(model, optimizer, UpdateSettings.from_config(cfg, share),
                             compiled_ppo_loss() if layout.compile else ppo_loss, world)
        if layout.cuda_graphs:
            step = CapturedStep(step)
        labeller = (InLoopLabels(cfg.env, cfg.env_options, label_plan(ppo.dagger_labels, cfg.num_envs, cfg.num_steps),
                                 cfg.seed, str(expert_device(cfg.device))) if ppo.dagger_labels else None)
        return cls(cfg, device, model, acting, optimizer,
                   ReturnScaler(cfg.num_envs, cfg.gamma, device, world) if ppo.scale_rewards else None, plan,
                   layout.iterations(cfg), step, world, layout.keep_collecting, labeller=labeller)

    @property
    def settings(self) -> UpdateSettings:
        """The update's hyperparameters, with the planned minibatch size (the step's)."""
        return self.step.settings

    @property
    def ppo(self) -> PPOSettings:
        """PPO's own settings, as the user gave them (``TrainConfig.algo_settings``)."""
        return self.cfg.algo_settings

    def start_notes(self) -> list[str]:
        step = self.step.step if isinstance(self.step, CapturedStep) else self.step
        notes = ["compiled too (--compile): the PPO loss, forward and backward"] if step.loss_fn is not ppo_loss \
            else []
        if isinstance(self.step, CapturedStep):
            notes.append("captured (--cuda-graphs): each PPO minibatch step (loss, backward, clip, Adam) as one CUDA "
                         "graph")
        if self.labeller is not None:
            plan = self.labeller.plan
            notes.append(f"labelling (dagger_labels = {self.ppo.dagger_labels}): the env's expert labels every "
                         f"{plan.every} steps of {plan.columns} envs while the run trains, the actor stepping toward "
                         "its actions after each update (the first iteration also starts the expert)")
        return notes + [f"warning: {w}" for w in self.plan.warnings]

    def collector_options(self) -> dict[str, Any]:
        return {"device": self.device}  # the rollout lands where the learner learns

    def attach(self, collector: Collector) -> None:
        self._same_weights_on_every_rank()
        self.pipeline = make_pipeline(collector, self.acting.state_dict(), self.cfg.overlap)

    def _same_weights_on_every_rank(self) -> None:
        """Rank 0's weights and normaliser on every rank (torchrun; alone, nothing): from here the ranks take the
        same steps, and stay identical."""
        if self.world.size > 1:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            self.world.broadcast_([*params, *self.model.buffers()])
            self.acting.load_state_dict(self.model.state_dict())

    # ------------------------------------------------------------------ learning
    def iterate(self, start: tuple[int, float]) -> dict[str, Any] | None:
        """Take the next rollout, learn from it, hand the new weights over; returns the metrics row (``None``
        for a rollout too stale to learn from)."""
        cfg, it = self.cfg, self.iteration + 1
        rollout = self.pipeline.next_rollout()
        lag = self.pipeline.collector.policy_version - rollout.policy_version
        self.lags[lag] = self.lags.get(lag, 0) + 1
        if self.keep_collecting and lag > self.ppo.max_lag:  # too stale to correct well: the next one is fresher
            self.dropped += 1
            return None
        episodes, reward_per_step = run_episodes_and_reward(rollout, self.world)  # every rank's
        self.recent.extend(e["return"] for e in episodes)
        lr = cfg.lr * (1 - (it - 1) / self.iterations) if cfg.anneal_lr else cfg.lr
        stats = self.learn(rollout, it, lr)
        self.pipeline.learned(self.model.state_dict())
        self.iteration, self.env_steps = it, self.env_steps + rollout.numel() * self.world.size
        return metrics_row(it, self.env_steps, steps_per_second(start, self.env_steps), lr, stats, episodes,
                           reward_per_step, lag)

    def learn(self, rollout: Rollout, iteration: int, lr: float) -> dict[str, float]:
        """Update ``model`` on one rollout (on the learner's device) as iteration ``iteration``; returns the
        update's statistics.

        The observation normaliser takes the rollout's observations before the targets are
        computed, so the bootstrap values and the PPO epochs see the statistics the next
        rollout will act with (the stored values and log-probs used the previous ones). Measured
        against updating it after the PPO epochs (the first ratio then exactly 1): VR-edge, 1M
        steps, paired over 50 held-out episodes, this order scores +0.012 +- 0.010 reward per
        step more (better in 33/50); CartPole 150k steps, 3 seeds: 133 vs 127 mean greedy return,
        within noise. Hence this order (docs/benchmarks.md).
        """
        cfg, ppo, model, batch = self.cfg, self.ppo, self.model, rollout.batch
        set_learning_rate(self.optimizer, lr)
        if ppo.normalize_obs:
            model.norm.update(batch["observations"], self.world)
        scale = (self.scaler.scale(batch["rewards"], batch["final_observation_mask"], rollout.envs)
                 if self.scaler else 1.0)
        if self.keep_collecting or (cfg.overlap and ppo.overlap_targets == "vtrace"):  # collected by older weights
            adv, ret = vtrace_targets(model, batch, rollout.next_observations, cfg.gamma, ppo.rho_bar, ppo.c_bar, scale)
        else:
            adv, ret = advantages_and_returns(model, batch, rollout.next_observations, cfg.gamma, ppo.gae_lambda, scale)
        try:
            stats = ppo_update(self.step, LearnerSamples.from_rollout(batch, adv, ret),
                               minibatch_generator(cfg.seed, iteration, self.device), self.world)
            if self.labeller is not None:  # DAgger inside the loop: after PPO's epochs, one step toward the expert
                began = time.perf_counter()
                stats.update(imitation_step(model, self.optimizer, self.labeller.labelled(batch["observations"]),
                                            cfg.max_grad_norm, self.world))
                stats["imitation_s"] = time.perf_counter() - began  # (what labelling costs an iteration)
            return stats
        except NonFiniteLossError as e:
            raise NonFiniteLossError(f"iteration {iteration}: {e}; training stopped (try a lower --lr)") from None

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> dict[str, Any]:
        """A copy of the whole state, on the CPU, with nothing tied to a device: what a checkpoint holds."""
        return cpu_copy({
            "version": __version__,
            "config": self.cfg.to_dict(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reward_scaler": self.scaler.state_dict() if self.scaler else None,
            "recent_returns": list(self.recent),
            "distilled": self.distilled,
            **({"labeller": self.labeller.state()} if self.labeller is not None else {}),
            "rng": {**capture_rng(), "acting": self.acting.generator.get_state()},
            **self._pipeline_state(),  # "collector" (and, with --overlap, "acting_model")
        })

    def _pipeline_state(self) -> dict[str, Any]:
        """The pipeline's state, its collector's for the run's envs (under torchrun, every rank's share, by global
        env index: a checkpoint resumes at any world size)."""
        state = self.pipeline.state()
        if self.world.size > 1:
            state["collector"] = merge_states(self.world.gather_objects(state["collector"]))
        return state

    def restore(self, state: dict[str, Any]) -> list[str]:
        """Load a checkpoint's state; a note when the envs could not be restored exactly."""
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        if self.scaler is not None and state["reward_scaler"] is not None:
            self.scaler.load_state_dict(state["reward_scaler"])
        self.recent.extend(state["recent_returns"])
        self.distilled = distilled_record(state, "the checkpoint resumed from")
        if self.labeller is not None:
            self.labeller.load_state(state["labeller"])
        restore_rng(state["rng"])
        self.acting.generator.set_state(state["rng"]["acting"])
        if self.world.size > 1:  # this rank's envs of the run's
            state = {**state, "collector": split_state(state["collector"], self.world.envs(self.cfg.num_envs))}
        self._same_weights_on_every_rank()
        exact = self.pipeline.restore(state, self.model.state_dict(), reseed=self.iteration)
        return [] if exact else [ENVS_NOT_RESTORED]

    # ------------------------------------------------------------------ the end
    def summary(self) -> dict[str, Any]:
        return {"lags": dict(self.lags), "dropped": self.dropped}

    @classmethod
    def after_training(cls, run_dir: Path, config: dict[str, Any], say: Callable[[str, str], None]) -> None:
        """The distillation rounds the run asks for (``distill_episodes``, ``distill_rounds``; a VR-edge cell of
        1M+ steps: :func:`trainer.ppo.distillation.rounds_asked`), each kept one a new checkpoint."""
        rounds_after_training(run_dir, config, say)

    def end_notes(self) -> list[str]:
        if not self.keep_collecting:
            return []
        return [f"policy lag (versions behind: batches): {dict(sorted(self.lags.items()))}; dropped {self.dropped} "
                f"batches older than max_lag = {self.ppo.max_lag}"]
