"""The natively batched VR-edge env: all envs stepped together with NumPy array operations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envs import rng
from envs.settings import ConfigError
from envs.vr_edge import action_space, burn_cpu, observation_space
from envs.vr_edge_config import VREdgeConfig, head_observation_layout
from envs.vr_edge_dynamics import (
    checked_state,
    episode_metrics,
    initial_state,
    kept_condition_weights,
    observe,
    step_state,
    validate_actions,
)


def init_batched(env: gym.vector.VectorEnv, num_envs: int, config: VREdgeConfig, seed: int | None) -> None:
    """Give a batched VR-edge env (NumPy's or torch's) what both set alike: config, size, seed and spaces."""
    if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
        raise ConfigError("num_envs", num_envs, "must be an integer >= 1", flag=False)
    env.config, env.num_envs, env._seed = config.read_traces(), int(num_envs), seed  # a bad trace: here
    env.single_observation_space = observation_space(config)
    env.single_action_space = action_space(config)
    env.head_observation_layout = head_observation_layout(config)
    env.active_user_feature = config.active_user_feature
    env.observation_space = batch_space(env.single_observation_space, env.num_envs)
    env.action_space = batch_space(env.single_action_space, env.num_envs)


def reset_keys(env: gym.vector.VectorEnv, seed: int | Sequence[int] | None) -> np.ndarray | None:
    """The per-env RNG keys (uint64 ``[N]``) a batched VR-edge env's ``reset(seed=seed)`` starts from, or
    ``None``: keep the current streams (no seed, and a state to continue)."""
    if seed is None and env._state is None:
        seed = env._seed if env._seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)):  # env i's seed: as a collector with run seed ``seed`` gives it
        seeds = [int(c.generate_state(1)[0]) for c in np.random.SeedSequence(int(seed)).spawn(env.num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != env.num_envs:
            raise ValueError(f"reset(seed=...) got {len(seeds)} seeds for {env.num_envs} envs; "
                             "pass one integer, or one seed per env")
    return np.array([rng.key_from_seed(s) for s in seeds], dtype=np.uint64)


class VREdgeVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` independent VR-edge envs stepped at once, with same-step autoreset.

    Env ``i`` reset with ``reset(seed=[s_0, ..., s_{n-1}])`` follows exactly the
    trajectory of ``SyntheticVREdgeEnv`` reset with ``seed=s_i`` (and later reset
    without a seed) under the same actions. An integer seed gives env ``i`` the i-th
    ``numpy.random.SeedSequence(seed).spawn`` seed, the seed a collector with that run
    seed gives it (``collectors.env_seeds``).

    Example:
        >>> import numpy as np, envs
        >>> venv = envs.VREdgeVectorEnv(3, num_users=2)
        >>> obs, info = venv.reset(seed=[1, 2, 3])
        >>> obs.shape
        (3, 19)
        >>> obs, rew, term, trunc, info = venv.step(np.zeros((3, 2), dtype=np.int64))
        >>> rew.shape, info["quality"].shape
        ((3,), (3, 2))

    Returns per step: observations ``[N, obs_dim]`` float32, rewards ``[N]`` float64,
    ``terminated`` / ``truncated`` ``[N]`` bool and infos with ``quality``, ``stall_s``,
    ``switches`` ``[N, U]`` and ``capacity_mbps`` ``[N]``. Where an episode ended
    (mask ``info["_final_obs"]``), ``info["final_obs"]`` holds its last observation
    and ``info["final_info"]["episode_metrics"]`` its QoE means; the returned
    observation is already the next episode's first.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, num_envs: int, num_users: int = 8, seed: int | None = None, **config: Any) -> None:
        init_batched(self, num_envs, VREdgeConfig(num_users=num_users, **config), seed)
        self._state: dict[str, np.ndarray] | None = None

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None):
        keys = reset_keys(self, seed)
        if keys is None:
            keys, counters = self._state["key"], self._state["counter"]
        else:
            counters = np.zeros(self.num_envs, dtype=np.uint64)
        self._state = initial_state(self.config, keys, counters, kept_condition_weights(self.config, self._state))
        return observe(self.config, self._state), {}

    def step(self, actions):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = validate_actions(self.config, actions, self.num_envs)
        burn_cpu(self.config.step_cost_us * self.num_envs)
        self._state, reward, terminated, truncated, parts = step_state(self.config, self._state, actions)
        obs = observe(self.config, self._state)
        infos: dict[str, Any] = dict(parts)
        done = terminated | truncated
        if done.any():
            s = self._state
            metrics = episode_metrics(self.config, s)
            infos["final_obs"] = np.where(done[:, None], obs, 0.0).astype(np.float32)
            infos["_final_obs"] = done
            infos["final_info"] = {"episode_metrics": metrics, "_episode_metrics": done}
            infos["_final_info"] = done
            fresh = initial_state(self.config, s["key"][done], s["counter"][done],
                                  kept_condition_weights(self.config, s, done))
            for k, v in fresh.items():
                s[k][done] = v
            obs[done] = observe(self.config, fresh)
        return obs, reward, terminated, truncated, infos

    def get_state(self) -> dict[str, np.ndarray]:
        """Return a copy of the state of all envs (RNG positions included)."""
        if self._state is None:
            raise RuntimeError("call reset() before get_state()")
        return {k: v.copy() for k, v in self._state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore a state from :meth:`get_state`."""
        self._state = checked_state(self.config, state, self.num_envs)
