"""Ape-X as the command line knows it before torch loads: its help, its settings, its defaults per env, its
rules for a config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from envs.settings import ConfigError
from trainer.algorithm import AlgorithmSpec
from trainer.apex.settings import ApeXSettings

if TYPE_CHECKING:
    from trainer.config import TrainConfig


class ApeXSpec(AlgorithmSpec):
    """``--algo apex``; the run itself is :class:`trainer.apex.algorithm.ApeX`.

    Example (the bare ``--algo apex --env CartPole-v1`` runs the CartPole command of docs/apex.md):
        >>> d = ApeXSpec.defaults_for("CartPole-v1")
        >>> d["backend"], d["num_envs"], d["num_steps"], d["total_steps"], d["gamma"], d["n_step"]
        ('async', 8, 16, 400000, 0.99, 5)
    """

    description: ClassVar[str] = ("Ape-X: epsilon-greedy actors, prioritized replay, double DQN; Discrete and "
                                  "MultiDiscrete actions")
    Settings: ClassVar[type] = ApeXSettings
    model_name: ClassVar[str] = "an Ape-X Q-network"
    stochastic: ClassVar[bool] = False  # greedy: its exploration is the actors' epsilon
    # other envs: the CartPole command of docs/apex.md, 500 on 5 of 5 seeds (docs/benchmarks.md, "CartPole-v1 local
    # mode over seeds"); VR-edge: the settings `benchmarks.apex vr-edge` measured (docs/benchmarks.md, "Ape-X
    # (issue 16)"; no search was done), with VR-edge's discount and total from PPO's defaults
    defaults: ClassVar[dict[str, dict[str, Any]]] = {
        "VREdge-v0": {"num_envs": 16, "num_steps": 16, "lr": 5e-4, "anneal_lr": False, "max_grad_norm": 10.0,
                      "learning_starts": 5000, "replay_capacity": 200_000},
        "*": {"backend": "async", "num_envs": 8, "num_steps": 16, "total_steps": 400_000, "gamma": 0.99,
              "lr": 1e-3, "anneal_lr": True, "n_step": 5, "max_grad_norm": 10.0, "learning_starts": 1000},
    }
    implementation: ClassVar[str] = "trainer.apex.algorithm:ApeX"

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        mine: ApeXSettings = cfg.algo_settings
        rules = [  # (ok, key, its value, rule)
            (not cfg.overlap, "overlap", cfg.overlap, "is for --algo ppo: Ape-X's actors already act with stale "
             "weights"),
            (not cfg.keep_collecting, "keep_collecting", cfg.keep_collecting, "is for --algo ppo: --algo apex "
             "--backend ray collects from the actors as they finish by itself"),
            (mine.learning_starts <= mine.replay_capacity, "learning_starts", mine.learning_starts,
             f"must be <= --replay-capacity ({mine.replay_capacity}), or learning never starts"),
            (mine.minibatch_size <= mine.replay_capacity, "minibatch_size", mine.minibatch_size,
             f"must be <= --replay-capacity ({mine.replay_capacity}): a minibatch larger than the replay would hold "
             "the same transitions many times over"),
        ]
        for ok, key, value, rule in rules:
            if not ok:
                raise ConfigError(key, value, rule)

    @classmethod
    def keep_collecting(cls, cfg: TrainConfig) -> bool:
        return True  # Ape-X's Ray actors always keep collecting and pushing while the learner learns
