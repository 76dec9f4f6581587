"""All envs in this process, written straight into the rollout storage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectors.env_group import EnvGroup, EpisodeInfo, StepViews


class SyncStepper:
    """One :class:`EnvGroup` holding every env; no copies beyond the envs' own outputs."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.group = EnvGroup(env_fns)
        self.observation_space, self.action_space, _ = self.group.spaces[0]
        self.num_envs = self.group.num_envs

    def reset(self, seeds: Sequence[int], obs_out: np.ndarray) -> None:
        self.group.reset(seeds, obs_out)

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        return self.group.step(actions, out)

    def get_env_states(self) -> list[Any]:
        return self.group.get_states()

    def set_env_states(self, states: Sequence[Any]) -> None:
        self.group.set_states(states)

    def close(self) -> None:
        self.group.close()
