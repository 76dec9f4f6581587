"""What the training loop asks of an algorithm. The loop (``trainer.train``) never asks which algorithm runs.

An algorithm is a subclass of :class:`Algorithm`, found by its ``--algo`` name in ``trainer.registry``. A run:

1. the config is checked, by :class:`~trainer.config.TrainConfig` and by the algorithm
   (:meth:`~Algorithm.check_config`), and laid out on the machine (``trainer.run_layout``, which asks
   :meth:`~Algorithm.keep_collecting`);
2. the algorithm is built (:meth:`~Algorithm.new`): networks, optimizer, its acting policy;
3. a collector is built around its acting policy (:attr:`~Algorithm.acting`, with
   :meth:`~Algorithm.collector_options`) and attached (:meth:`~Algorithm.attach`); when resuming, the
   checkpoint is restored (:meth:`~Algorithm.restore`);
4. the loop calls :meth:`~Algorithm.iterate` (a rollout in, a metrics row out) until the run is done, and
   takes a :meth:`~Algorithm.snapshot` after each completed iteration: the snapshot is what a checkpoint holds;
5. once a run has trained to its last iteration, :meth:`~Algorithm.after_training` (PPO: distillation rounds),
   then the quality line: ``trainer.run_end``, the same for a run, each of ``--seeds`` and a resume that trains.

A snapshot is a dict of CPU tensors and plain data (``torch.load(weights_only=True)`` reads it) with at least
``version``, ``config`` (``TrainConfig.to_dict()``), ``iteration``, ``env_steps`` and ``model`` (the state dict
of :meth:`~Algorithm.make_model`'s network, which evaluation and validation play).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch loads only once a run starts: --help and a bad command line answer before it
    from torch import nn

    from collectors import Collector
    from collectors.base import Policy
    from trainer.config import TrainConfig
    from trainer.run_layout import RunLayout

# the note a resume prints when the collector could not restore its envs (they offer no get_state())
ENVS_NOT_RESTORED = ("these envs offer no get_state(): their episodes restart from derived seeds, so the resumed "
                     "run is not identical to an uninterrupted one")


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or inf; the model keeps its last good weights (the loop saves the last completed
    iteration and re-raises it, saying where that checkpoint is)."""


@dataclass
class NoSettings:
    """The settings of an algorithm that has none of its own (it reads only the run's)."""


class AlgorithmSpec:
    """What the command line knows of an algorithm before torch loads: its help, the settings only it reads, its
    defaults (per env), its own rules for a config, and where its :class:`Algorithm` lives.

    Example (``trainer.registry`` maps ``--algo`` names to these):
        >>> from trainer.registry import algorithm_spec
        >>> apex = algorithm_spec("apex")
        >>> apex.defaults_for("CartPole-v1")["num_envs"], apex.defaults_for("VREdge-v0")["num_envs"]
        (8, 16)
        >>> apex.algorithm().__name__  # imports trainer.apex.algorithm (and torch) only now
        'ApeX'
    """

    description: ClassVar[str]  # one line for --algo's help
    model_name: ClassVar[str]  # what its model is, for messages ("an Ape-X Q-network")
    # the dataclass of its own settings (TrainConfig.algo_settings; envs.settings.setting fields), in a module
    # that imports no torch
    Settings: ClassVar[type] = NoSettings
    stochastic: ClassVar[bool] = True  # whether its model samples actions (trainer.evaluate --stochastic)
    # whether trainer.export ships its model: an actor-critic with probabilities and values, and an ``exported``
    # method (greedy action, probabilities, value in one pass)
    exportable: ClassVar[bool] = False
    # whether its model has a critic: ``model.value(obs [N, obs]) -> [N]``, the discounted return (``--gamma``) of the
    # env's rewards (trainer.evaluate --belief-base policy_critic ends BeliefMPC's rollouts on it)
    critic: ClassVar[bool] = False
    # the TrainConfig values it runs with where the user sets none, by env id ("*": every other env), over the
    # fields' own defaults: what learns on VR-edge is not what learns on CartPole
    defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    # ... and over those, by env, where the learner is on CUDA (--device cuda, or auto on a machine with a GPU)
    gpu_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    implementation: ClassVar[str] = ""  # "module:Class" of its Algorithm (imported when a run needs it)
    # --compile auto on a CPU backend: the run length (env steps) from which compiling its hot paths was measured
    # to pay for the compile time (None: not measured, so auto compiles only for --backend device)
    compile_pays_after: ClassVar[int | None] = None
    # whether it learns data-parallel under torchrun (each rank its share of the envs, the update averaged over
    # the ranks: trainer.common.world); one that does not is refused there in one line
    data_parallel: ClassVar[bool] = False

    @classmethod
    def defaults_for(cls, env: str, gpu: bool = False) -> dict[str, Any]:
        """Its defaults on ``env`` (see :attr:`defaults`), with a CUDA learner where ``gpu`` (:attr:`gpu_defaults`)."""
        mine = dict(cls.defaults.get(env, cls.defaults.get("*", {})))
        return {**mine, **cls.gpu_defaults.get(env, {})} if gpu else mine

    @classmethod
    def algorithm(cls) -> type[Algorithm]:
        """The :class:`Algorithm` that runs it (itself when it is one)."""
        if issubclass(cls, Algorithm):
            return cls
        module, _, name = cls.implementation.partition(":")
        return getattr(importlib.import_module(module), name)

    @classmethod  # not abstract: most algorithms have no rules of their own
    def check_config(cls, cfg: TrainConfig) -> None:
        """Raise ``ConfigError`` for settings this algorithm cannot run with, beyond their declared limits (a rule
        between settings)."""

    @classmethod
    def keep_collecting(cls, cfg: TrainConfig) -> bool:
        """Whether, on Ray, the actors keep collecting while it learns (``collect()`` then returns the first
        actor's rollout that is ready, one actor's slice of the envs)."""
        return False


class Algorithm(AlgorithmSpec, ABC):
    """A learning algorithm as the loop drives it (see the module docstring for the order of the calls); what
    the command line needs of it before torch loads is its :class:`AlgorithmSpec`.

    Registered in ``trainer.registry`` (by its spec); ``trainer.ppo.PPO`` and ``trainer.apex.ApeX`` are the
    two the project ships, and ``tests/test_algorithm.py`` trains a third that acts at random.
    """

    # the run's state that the loop reads
    cfg: TrainConfig
    iteration: int  # completed iterations
    env_steps: int
    recent: deque  # returns of the latest finished episodes (the progress bar, the summary)
    model: nn.Module  # the learned network: a checkpoint's "model", validated with --eval-every
    acting: Policy  # the policy the collector runs

    # ------------------------------------------------------------------ before the run exists
    @classmethod
    @abstractmethod
    def make_model(cls, cfg: TrainConfig) -> nn.Module:
        """The network a snapshot's ``model`` holds, freshly built for ``cfg`` on the CPU."""

    @classmethod
    @abstractmethod
    def new(cls, cfg: TrainConfig, layout: RunLayout) -> Algorithm:
        """A fresh run of ``cfg`` laid out as ``layout``. Anything the env or the layout does not allow fails
        here, before the run directory is touched."""

    def start_notes(self) -> list[str]:
        """Lines for the user when the run starts (after the run layout's)."""
        return []

    # ------------------------------------------------------------------ the collector
    def collector_options(self) -> dict[str, Any]:
        """``make_collector`` options it needs besides the layout's (``device``, a Ray worker class, ...)."""
        return {}

    @abstractmethod
    def attach(self, collector: Collector) -> None:
        """The collector built around :attr:`acting`; weights go to it through ``update_policy`` only."""

    # ------------------------------------------------------------------ the loop
    @abstractmethod
    def iterate(self, start: tuple[int, float]) -> dict[str, Any] | None:
        """One iteration: take the next rollout from the collector, learn from it, send weights when due;
        returns the metrics row (``trainer.metrics.metrics_row``), or ``None`` for a rollout it chose not to
        learn from (the iteration is then not complete). ``start`` is ``(env_steps, time.perf_counter())`` when
        the loop began (for steps per second)."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The whole state after the last completed iteration, copied to the CPU (see the module docstring)."""

    @abstractmethod
    def restore(self, state: dict[str, Any]) -> list[str]:
        """Continue from a snapshot (after :meth:`attach`); returns notes on how the resumed run will differ
        from an uninterrupted one (``[]``: it will not)."""

    # ------------------------------------------------------------------ the end
    def summary(self) -> dict[str, Any]:
        """Entries it adds to ``trainer.loop.train``'s summary."""
        return {}

    def end_notes(self) -> list[str]:
        """Lines for the user when the run has finished."""
        return []

    @classmethod
    def after_training(cls, run_dir: Path, config: dict[str, Any], say: Callable[[str, str], None]) -> None:
        """What a run of ``config`` (``TrainConfig.to_dict()``) does once it has trained to its last iteration,
        before its quality line: more work on the policy saved in ``run_dir`` (PPO: distillation rounds), each change
        of weights a new checkpoint (``checkpoints.save_in_run_dir``), ``say(label, line)`` as it goes. A stop signal
        may skip it (``trainer.interrupts.skippable``). Nothing by default."""

    def longer_total_steps(self) -> int:
        """The ``--total-steps`` that the finished run's "train longer" command names: twice the steps so far."""
        return 2 * self.env_steps
