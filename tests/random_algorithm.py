"""A third algorithm, from outside the package: uniformly random actions, learning nothing.

It exists to show (``tests/test_algorithm.py``) that the loop trains, checkpoints and resumes any
``trainer.algorithm.Algorithm`` it finds in ``trainer.registry``, without a line of its own for it: its one
setting, ``hold``, gets a flag, a TOML key, a place in the stored config and a resume from its declaration alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import nn

from collectors import Collector
from envs.settings import setting
from trainer import __version__
from trainer.algorithm import ENVS_NOT_RESTORED, Algorithm
from trainer.common import noise
from trainer.common.spaces import action_heads
from trainer.common.state import cpu_copy
from trainer.config import TrainConfig
from trainer.metrics import metrics_row, run_episodes_and_reward, steps_per_second
from trainer.run_layout import RunLayout


@dataclass
class RandomSettings:
    hold: int = setting(1, "each random action is held for this many steps", at_least=1)


class UniformPolicy(nn.Module):
    """Uniform actions of a ``Discrete`` or ``MultiDiscrete`` space, keyed: env ``i``'s action depends only on its
    noise key and step."""

    def __init__(self, space: gym.Space, hold: int = 1) -> None:
        super().__init__()
        heads = action_heads(space)
        self.multi, self.sizes, self.hold = heads.kind == "multi", torch.tensor(heads.sizes), hold

    def forward(self, obs: torch.Tensor, noise_keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        u = noise.uniform(noise_keys, steps // self.hold, (len(obs), len(self.sizes)))
        actions = torch.minimum((u * self.sizes).long(), self.sizes - 1)
        return actions if self.multi else actions[:, 0]

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        actions = torch.zeros(len(obs), len(self.sizes), dtype=torch.int64)
        return actions if self.multi else actions[:, 0]


@dataclass
class RandomActions(Algorithm):
    description: ClassVar[str] = "uniformly random actions; learns nothing (a test)"
    model_name: ClassVar[str] = "a uniformly random policy"
    stochastic: ClassVar[bool] = False
    Settings: ClassVar[type] = RandomSettings

    cfg: TrainConfig
    model: UniformPolicy
    acting: UniformPolicy
    iteration: int = 0
    env_steps: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=100))
    collector: Collector | None = None

    @classmethod
    def make_model(cls, cfg: TrainConfig) -> UniformPolicy:
        env = gym.make(cfg.env, **cfg.env_options)
        try:
            return UniformPolicy(env.action_space, cfg.algo_settings.hold)
        finally:
            env.close()

    @classmethod
    def new(cls, cfg: TrainConfig, layout: RunLayout) -> RandomActions:
        policy = cls.make_model(cfg)
        return cls(cfg, policy, policy)

    def attach(self, collector: Collector) -> None:
        self.collector = collector

    def iterate(self, start: tuple[int, float]) -> dict[str, Any]:
        rollout = self.collector.collect()
        self.iteration, self.env_steps = self.iteration + 1, self.env_steps + rollout.numel()
        self.recent.extend(e["return"] for e in rollout.episodes)
        return metrics_row(self.iteration, self.env_steps, steps_per_second(start, self.env_steps), 0.0, {},
                           *run_episodes_and_reward(rollout), 0)

    def snapshot(self) -> dict[str, Any]:
        return cpu_copy({"version": __version__, "config": self.cfg.to_dict(), "iteration": self.iteration,
                         "env_steps": self.env_steps, "model": self.model.state_dict(),
                         "recent_returns": list(self.recent), "collector": self.collector.get_state()})

    def restore(self, state: dict[str, Any]) -> list[str]:
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.recent.extend(state["recent_returns"])
        exact = self.collector.set_state(state["collector"], reseed=self.iteration)
        return [] if exact else [ENVS_NOT_RESTORED]
