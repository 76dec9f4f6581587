"""The Ape-X tier (Horgan et al., ICLR 2018): epsilon-greedy actors feed a prioritized replay; one learner
trains a double-DQN on prioritized minibatches and sends weights to the actors now and then.

One iteration (``python -m trainer.train --algo apex``):

1. the actors collect a ``[T, N]`` rollout with their (stale) copy of the Q-network, env ``i`` acting with
   Ape-X's ``epsilon_i`` (``trainer.apex.exploration.apex_epsilons`` over all envs);
2. they turn it into n-step transitions (``trainer.apex.nstep``) and compute initial priorities with that
   copy (``trainer.apex.dqn``), and the transitions enter the replay (``trainer.apex.replay``);
3. the learner takes ``replay_ratio x new transitions / batch_size`` prioritized minibatches (once the replay
   holds ``--learning-starts``), updates their priorities, and syncs the target network every
   ``target_update`` learner steps;
4. every ``weights_every`` steps per env, the actors get the learner's weights (``update_policy``).

The actors are the run's collector: ``sync``/``async`` in local mode (``async``: envs in worker processes,
the acting network in this process), ``ray`` for Ray actors (``trainer.apex.ray_worker.ApexWorker``: each acts with
its CPU copy of the network, builds its transitions and their priorities, and is replaced and reseeded when it
dies, as the ``ray`` backend does).
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import torch
from tensordict import TensorDict

from collectors.seeding import env_seeds, noise_keys
from envs.settings import ConfigError
from trainer import __version__
from trainer.algorithm import ENVS_NOT_RESTORED, Algorithm, NonFiniteLossError
from trainer.apex.dqn import double_dqn_targets, dqn_loss, initial_priorities, priorities, q_taken
from trainer.apex.exploration import EpsilonGreedy, apex_epsilons
from trainer.apex.nstep import NStepBuilder
from trainer.apex.q_network import QNetwork, actions_refused
from trainer.apex.replay import PrioritizedReplay, replay_bytes
from trainer.apex.settings import ApeXSettings
from trainer.apex.spec import ApeXSpec
from trainer.common.devices import resolve_device
from trainer.common.flat_params import flat_parameters
from trainer.common.policy_layout import PolicyLayout
from trainer.common.spaces import model_spaces
from trainer.common.state import capture_rng, cpu_copy, restore_rng
from trainer.config import TrainConfig
from trainer.metrics import metrics_row, run_episodes_and_reward, steps_per_second

if TYPE_CHECKING:
    from collectors import Collector
    from trainer.run_layout import RunLayout


def transition_example(q: QNetwork) -> TensorDict:
    """One transition as the replay stores it (``batch_size=[]``)."""
    obs = torch.zeros(q.obs_dim, dtype=torch.float32)
    action = torch.zeros((q.heads,) if q.multi else (), dtype=torch.int64)
    return TensorDict({"observations": obs, "actions": action, "rewards": torch.zeros(()),
                       "next_observations": obs.clone(), "done": torch.zeros((), dtype=torch.bool),
                       "discounts": torch.zeros(())}, batch_size=[])


# save_replay holds the replay 4 times at its peak: itself, the last completed iteration's snapshot, and
# either the next snapshot or the two buffers of the checkpoint's bytes (measured: docs/benchmarks.md)
SAVED_REPLAY_COPIES = 4


def check_replay_fits(capacity: int, example: TensorDict, save_replay: bool) -> None:
    """Raise ``ConfigError`` on ``--replay-capacity`` when the replay would not fit in the memory available now:
    refused in one line before it is allocated, not a ``MemoryError`` traceback, or swapping, or the OOM killer
    at the first checkpoint (``save_replay``: its copies count too)."""
    copies = SAVED_REPLAY_COPIES if save_replay else 1
    each, available = replay_bytes(capacity, example), psutil.virtual_memory().available
    if copies * each > available:
        held = (f"{copies} x {each / 2**30:,.1f} GiB = {copies * each / 2**30:,.1f} GiB with save_replay (the "
                "replay, its copy in the last snapshot, and the next snapshot or the checkpoint's bytes)"
                if save_replay else f"{each / 2**30:,.1f} GiB")
        raise ConfigError("replay_capacity", capacity,
                          f"the replay would take {held} ({each // capacity} bytes per transition), more than the "
                          f"{available / 2**30:,.1f} GiB of memory available here; lower it"
                          + (" or set save_replay = false" if save_replay else ""))


@dataclass
class ApeX(ApeXSpec, Algorithm):
    """Everything an Ape-X run carries from one iteration to the next (and into a checkpoint).

    ``model`` (online) and ``target`` learn on ``device``; ``acting`` is the actors' epsilon-greedy CPU
    copy (on Ray: each actor's), whose weights are the learner's after ``version_steps[version]`` learner steps.

    Example (three iterations on CartPole: the replay fills, then the learner starts):
        >>> from collectors import make_collector
        >>> from trainer.run_layout import Machine, run_layout
        >>> cfg = TrainConfig.from_dict(dict(algo="apex", env="CartPole-v1", num_envs=2, num_steps=16,
        ...                                  learning_starts=64, minibatch_size=16, device="cpu"))
        >>> layout = run_layout(cfg, Machine(cores=1))
        >>> apex = ApeX.new(cfg, layout)
        >>> with make_collector(layout.env_factories(), apex.acting, num_steps=cfg.num_steps, seed=cfg.seed,
        ...                     **apex.collector_options()) as collector:
        ...     apex.attach(collector)
        ...     rows = [apex.iterate(start=(0, 0.0)) for _ in range(3)]
        >>> [r["replay_size"] for r in rows], [r["updates"] for r in rows]  # 3-step transitions; ratio 8
        ([28, 60, 92], [0, 0, 16])
    """

    cfg: TrainConfig
    device: torch.device
    model: QNetwork
    target: QNetwork
    acting: EpsilonGreedy
    optimizer: torch.optim.Optimizer
    replay: PrioritizedReplay
    builder: NStepBuilder
    iteration: int = 0
    env_steps: int = 0
    learner_steps: int = 0
    sampled: int = 0  # transitions sampled by the learner
    version_steps: dict = field(default_factory=lambda: {0: 0})  # policy version -> its learner steps (the lag)
    pulled_at: int = 0  # env steps when the actors last got weights
    credit: float = 0.0  # learner updates owed to the replay ratio, not yet taken
    recent: deque = field(default_factory=lambda: deque(maxlen=100))
    collector: Collector | None = None

    @property
    def apex(self) -> ApeXSettings:
        """Ape-X's own settings (``TrainConfig.algo_settings``)."""
        return self.cfg.algo_settings

    @classmethod
    def make_model(cls, cfg: TrainConfig) -> QNetwork:
        """The Q-network for ``cfg.env``: branching with the env's per-head split where it declares one."""
        obs_space, act_space, layout = model_spaces(cfg)
        refusal = actions_refused(act_space)
        if refusal:  # the env the user chose: a usage error, as a bad flag's
            raise ConfigError("algo", cfg.algo, message=refusal)
        if layout.kind == "set":  # a set policy is PPO's; auto branches per head, at the env's slots
            if cfg.policy_arch == "set":
                raise ConfigError("policy_arch", cfg.policy_arch, "is PPO's (--algo ppo); Ape-X takes per_head, flat "
                                  "or auto", flag=False)
            layout = PolicyLayout("per_head", layout.features, layout.shared)
        torch.manual_seed(cfg.seed)
        return QNetwork(obs_space, act_space, cfg.hidden_sizes, layout=layout)

    @classmethod
    def new(cls, cfg: TrainConfig, layout: RunLayout) -> ApeX:
        """A fresh run: online, target and acting networks from ``cfg.seed``, an empty replay, Adam.

        Raises ``ConfigError`` for an action space DQN cannot take (before anything is written)."""
        device, apex = resolve_device(cfg.device), cfg.algo_settings
        acting = cls.make_model(cfg)  # the actors' copy stays on the CPU
        model, target = copy.deepcopy(acting).to(device), copy.deepcopy(acting).to(device)
        keys = torch.tensor(noise_keys(env_seeds(cfg.seed, cfg.num_envs)), dtype=torch.int64)
        policy = EpsilonGreedy(acting, keys, apex_epsilons(cfg.num_envs, apex.eps_base, apex.eps_alpha))
        seed = int(np.random.SeedSequence([cfg.seed, 3]).generate_state(1)[0])  # the replay's own sampling stream
        example = transition_example(acting)
        check_replay_fits(apex.replay_capacity, example, apex.save_replay)
        replay = PrioritizedReplay(apex.replay_capacity, example, apex.replay_alpha, seed=seed)
        # one flat parameter and a fused kernel, as for PPO: Adam and the clip are one op each per learner step;
        # eps 1.5e-4 as in Rainbow and Ape-X: Adam's 1e-8 lets tiny second moments blow up noisy TD gradients
        optimizer = torch.optim.Adam([flat_parameters(model)], lr=cfg.lr, eps=1.5e-4, fused=True)
        return cls(cfg, device, model, target, policy, optimizer, replay, NStepBuilder(apex.n_step, cfg.gamma))

    def _refill_note(self) -> str:
        """What a resume without the replay means: the learner waits for ``--learning-starts`` new transitions."""
        starts, left = self.apex.learning_starts, self.cfg.total_steps - self.env_steps
        note = ("the checkpoint holds no replay (save_replay = false): it refills from new experience, so the "
                "resumed run is not identical to an uninterrupted one")
        if self.cfg.total_steps < starts:  # the start's note said the run will not learn
            return note
        wait = (f"this resumed run's {left:,} env steps are fewer: it will not learn; raise --total-steps"
                if left < starts else "the learner waits until it holds them")
        return f"{note}; --learning-starts is {starts:,} transitions, and {wait}"

    def longer_total_steps(self) -> int:
        """At least twice the steps so far, and enough for the learner to wait for ``--learning-starts`` transitions
        (from scratch: a resume without the replay refills it) and then learn for as many steps again."""
        refill_from = self.env_steps if not self.apex.save_replay else 0
        return max(super().longer_total_steps(), refill_from + 2 * self.apex.learning_starts)

    def start_notes(self) -> list[str]:
        notes = [self.replay.describe()]
        if self.cfg.total_steps < self.apex.learning_starts:  # a transition per env step, at most
            notes.append(f"note: the learner starts once the replay holds --learning-starts "
                         f"{self.apex.learning_starts:,} transitions, and --total-steps {self.cfg.total_steps:,} "
                         "collects fewer: this run will not learn; raise --total-steps (or, for a new run, lower "
                         "--learning-starts)")
        return notes

    def collector_options(self) -> dict[str, Any]:
        # the transitions go to the replay, on the CPU: the learner samples from there
        options: dict[str, Any] = {"device": "cpu"}
        if self.cfg.backend == "ray":  # the actors build transitions and priorities themselves
            from trainer.apex.ray_worker import ApexWorker  # only here: nothing else loads Ray's plumbing
            options.update(worker_cls=ApexWorker, worker_kwargs={"n_step": self.apex.n_step,
                                                                 "gamma": self.cfg.gamma})
        return options

    def attach(self, collector: Collector) -> None:
        self.collector = collector

    # ------------------------------------------------------------------ learning
    def replay_beta(self) -> float:
        """The importance-sampling exponent: annealed linearly from the setting ``replay_beta`` to 1 over the run."""
        frac = min(1.0, self.env_steps / self.cfg.total_steps)
        return self.apex.replay_beta + (1.0 - self.apex.replay_beta) * frac

    def learning_rate(self) -> float:
        """``--lr``, annealed linearly to 0 over the run with ``--anneal-lr``: DQN's greedy policy keeps
        oscillating at a constant rate after it first solves a task, and a shrinking step lets the final network
        settle (docs/benchmarks.md, "Ape-X": CartPole seeds with and without)."""
        return self.cfg.lr * max(0.0, 1 - self.env_steps / self.cfg.total_steps) if self.cfg.anneal_lr else self.cfg.lr

    def learner_step(self) -> dict[str, float]:
        """One prioritized minibatch: double-DQN update, new priorities, the target network when due."""
        cfg = self.cfg
        batch, slots, ids, weights = self.replay.sample(self.apex.minibatch_size, self.replay_beta())
        batch.set("weights", weights)
        if self.device.type != "cpu":  # one host-to-device transfer per sampled batch
            batch = batch.consolidate().to(self.device, non_blocking=True)
        targets = double_dqn_targets(self.model, self.target, batch)
        q = q_taken(self.model, batch["observations"], batch["actions"])
        loss, td = dqn_loss(q, targets, batch["weights"])
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], cfg.max_grad_norm)
        # the step's numbers in one device-to-host copy (one sync on a GPU), checked before the weights change
        loss_, q_mean, td_abs, grad_norm_ = torch.stack([loss.detach(), q.detach().mean(), td.abs().mean(),
                                                         grad_norm]).tolist()
        if not math.isfinite(loss_):
            raise NonFiniteLossError(f"learner step {self.learner_steps + 1}: loss is {loss_}; training stopped "
                                     "(try a lower --lr)")
        self.optimizer.step()
        self.replay.update_priorities(slots, ids, priorities(td).cpu())
        self.learner_steps += 1
        self.sampled += len(slots)
        if self.learner_steps % self.apex.target_update == 0:
            self.target.load_state_dict(self.model.state_dict())
        return {"loss": loss_, "q_mean": q_mean, "td_abs": td_abs, "grad_norm": grad_norm_}

    def iterate(self, start: tuple[int, float]) -> dict[str, Any]:
        """Collect one rollout into the replay, learn what the replay ratio owes, send weights when due;
        returns the metrics row."""
        cfg, it, collector = self.cfg, self.iteration + 1, self.collector
        t0 = time.perf_counter()
        rollout = collector.collect()
        if "priorities" in rollout.batch.keys():  # Ray actors (ApexWorker) built the transitions and priorities
            transitions, prios = rollout.batch.exclude("priorities"), rollout.batch["priorities"]
        else:
            transitions = self.builder.add(rollout)  # none yet while fewer than n steps arrived (n > num_steps)
            prios = initial_priorities(self.acting.q, transitions) if len(transitions) else torch.zeros(0)
        self.replay.add(transitions, prios)
        collected = time.perf_counter() - t0
        lag = self.learner_steps - self.version_steps[rollout.policy_version]
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stats: list[dict[str, float]] = []
        t1 = time.perf_counter()
        if self.replay.size >= self.apex.learning_starts:
            self.credit += len(transitions) * self.apex.replay_ratio / self.apex.minibatch_size
            while self.credit >= 1.0:
                stats.append(self.learner_step())
                self.credit -= 1.0
        learned = time.perf_counter() - t1
        envs = rollout.envs.stop - rollout.envs.start
        self.iteration, self.env_steps = it, self.env_steps + cfg.num_steps * envs
        if self.env_steps - self.pulled_at >= self.apex.weights_every * cfg.num_envs:
            collector.update_policy(self.model.state_dict())  # the one way in for weights
            self.pulled_at = self.env_steps
            self.version_steps[collector.policy_version] = self.learner_steps
            for old in [v for v in self.version_steps if v < collector.policy_version - 64]:  # long out of flight
                del self.version_steps[old]
        self.recent.extend(e["return"] for e in rollout.episodes)
        means = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]} if stats else {}
        sps = steps_per_second(start, self.env_steps)
        return metrics_row(it, self.env_steps, sps, lr, {  # policy_lag: in learner steps
            **means, "learner_steps": self.learner_steps, "updates": len(stats), "replay_size": self.replay.size,
            "replay_beta": self.replay_beta(), "inserted_per_s": len(transitions) / max(collected, 1e-9),
            "updates_per_s": len(stats) / learned if stats else None,
            "sampled_per_s": len(stats) * self.apex.minibatch_size / learned if stats else None,
        }, *run_episodes_and_reward(rollout), lag)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> dict[str, Any]:
        """The whole state, on the CPU (the replay's storage only with ``save_replay``)."""
        collector = self.collector
        return cpu_copy({
            "version": __version__, "algo": self.cfg.algo, "config": self.cfg.to_dict(),
            "iteration": self.iteration, "env_steps": self.env_steps,
            "counters": {"learner_steps": self.learner_steps, "sampled": self.sampled,
                         "acting_steps": self.version_steps[collector.policy_version], "pulled_at": self.pulled_at,
                         "credit": self.credit},
            "model": self.model.state_dict(), "target_model": self.target.state_dict(),
            "acting_model": self.acting.state_dict(), "optimizer": self.optimizer.state_dict(),
            "nstep": self.builder.state_dict(), "recent_returns": list(self.recent),
            "replay": self.replay.state_dict() if self.apex.save_replay else None,
            "rng": {**capture_rng(), "replay": self.replay.generator_state()},
            "collector": collector.get_state(),
        })

    def restore(self, state: dict[str, Any]) -> list[str]:
        """Load a checkpoint; notes when the envs could not be restored exactly, or the checkpoint holds no
        replay (``save_replay = false``)."""
        collector = self.collector
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        c = state["counters"]
        self.learner_steps, self.sampled = c["learner_steps"], c["sampled"]
        self.pulled_at, self.credit = c["pulled_at"], c["credit"]
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target_model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.builder.load_state_dict(state["nstep"])
        self.recent.extend(state["recent_returns"])
        if state["replay"] is not None:
            self.replay.load_state_dict(state["replay"])
        restore_rng(state["rng"])
        self.replay.generator.set_state(state["rng"]["replay"])
        collector.update_policy(state["acting_model"])  # the stale copy the actors had, not the learner's
        self.version_steps = {collector.policy_version: c["acting_steps"]}
        notes = [] if state["replay"] is not None else [self._refill_note()]
        exact = collector.set_state(state["collector"], reseed=self.iteration)
        return notes + ([] if exact else [ENVS_NOT_RESTORED])

