"""An env of the tests' own, with a profile (one baseline, one expert), registered as ``Guess-v0`` on import:
``--env tests.profiled_env:Guess-v0``. The trainer must serve it as it serves VR-edge, through the profile alone."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envs.profiles import EnvProfile, Expert, register_profile


class GuessEnv(gym.Env):
    """Each step shows one of 3 targets, one-hot; acting it earns 1, anything else 0; ``steps`` steps an episode."""

    def __init__(self, steps: int = 16) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.steps = steps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.target = 0, int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.target)
        self.t, self.target = self.t + 1, int(self.np_random.integers(3))
        return self._obs(), reward, False, self.t >= self.steps, {}

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, np.float32)
        obs[self.target] = 1.0
        return obs


if "Guess-v0" not in gym.registry:
    gym.register(id="Guess-v0", entry_point=GuessEnv)
register_profile("Guess-v0", EnvProfile(
    baselines={"first": lambda kwargs: lambda obs: np.zeros(len(obs), np.int64)},  # a third of the steps
    expert=Expert("oracle", lambda kwargs, seed, device: lambda obs: obs.argmax(axis=-1)),  # every step
    episode_steps=lambda kwargs: kwargs.get("steps", 16)))
