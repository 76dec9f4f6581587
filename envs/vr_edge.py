"""Synthetic multi-user VR edge-rendering workload: the Gymnasium env (one cell; ``B = 1`` of the batched
dynamics).

The workload is in three modules: its settings and rules (:mod:`envs.vr_edge_config`), its dynamics, pure NumPy
functions over a batch of envs (:mod:`envs.vr_edge_dynamics`, whose draws :mod:`envs.vr_edge_draws` lays out), and
this env; :class:`envs.vector.VREdgeVectorEnv` steps ``num_envs`` cells at once and :mod:`envs.vr_edge_torch` on
torch tensors. See ``envs/README.md`` for the model and the reward formula. The names code imported from this
module before the split are still here (and ``VREdge-v0``'s entry point, which stored runs name).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

import envs
from envs import rng
from envs.vr_edge_config import (  # noqa: F401 - the names imported from here before the split
    ACTIVE_FEATURE,
    MASK_CELL_FEATURES,
    MEAN_CHANNEL_QUALITY,
    MEMORY_ARGUMENTS,
    OBS_HIGH,
    QOE_LIN_REBUFFER_PENALTY,
    REGIMES,
    USER_FEATURES,
    VREdgeConfig,
    churn_range,
    head_observation_layout,
    torch_env_refusal,
    users_range,
)
from envs.vr_edge_dynamics import (  # noqa: F401 - the names imported from here before the split
    active_users,
    channel_of,
    checked_state,
    decode_observation,
    download_round,
    episode_churn,
    episode_metrics,
    episode_nominal,
    initial_state,
    kept_condition_weights,
    next_active,
    observe,
    processor_sharing_times,
    step_state,
    user_mean,
    validate_actions,
)


def observation_space(cfg: VREdgeConfig) -> gym.spaces.Box:
    return gym.spaces.Box(0.0, OBS_HIGH, shape=(cfg.obs_dim,), dtype=np.float32)


def action_space(cfg: VREdgeConfig) -> gym.spaces.MultiDiscrete:
    return gym.spaces.MultiDiscrete([cfg.num_levels] * cfg.num_users)


def burn_cpu(microseconds: float) -> None:
    """Busy-wait, standing in for the rendering/encoding cost of a heavy simulator."""
    if microseconds > 0:
        end = time.perf_counter_ns() + int(microseconds * 1000)
        while time.perf_counter_ns() < end:
            pass


class SyntheticVREdgeEnv(gym.Env):
    """Several VR users stream edge-rendered video over one shared, fluctuating cell.

    Each step every user picks a bitrate level; the reward is the mean over users of
    ``quality - stall_weight * stall_s - switch_weight * |quality change|``.

    Example:
        >>> import envs
        >>> env = envs.SyntheticVREdgeEnv(num_users=4, seed=0)
        >>> obs, info = env.reset()
        >>> obs.shape, env.action_space
        ((33,), MultiDiscrete([6 6 6 6]))
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> sorted(info)
        ['bitrate_mbps', 'capacity_mbps', 'qoe_lin', 'quality', 'stall_s', 'switches']

    Shapes: observation ``[7 * num_users + history + 1]`` float32 (see ``USER_FEATURES``),
    action ``[num_users]`` int levels, ``info`` components ``[num_users]``. When an
    episode ends, ``info["episode_metrics"]`` holds per-step means of the components.
    Keyword arguments are the fields of :class:`VREdgeConfig`.

    A cell whose users vary (``users`` below ``num_users`` or a range, ``churn``) is masked: each
    user's features end with its active flag (index ``active_user_feature``; ``None`` where every
    slot is always active), an inactive slot's features are 0, and the cell's end with ``1 / active
    users`` and ``active users / users drawn``:

        >>> env = envs.SyntheticVREdgeEnv(num_users=4, users="2-3", churn=0.05, seed=0)
        >>> obs, info = env.reset()
        >>> obs.shape, env.head_observation_layout, env.active_user_feature
        ((39,), (8, 7), 7)
        >>> obs[7:32:8]   # slots 0..3: the first 2 or 3 are active at reset
        array([1., 1., 1., 0.], dtype=float32)
    """

    metadata = {"render_modes": []}

    def __init__(self, num_users: int = 8, seed: int | None = None, **config: Any) -> None:
        self.config = VREdgeConfig(num_users=num_users, **config).read_traces()  # a bad trace: here
        if seed is not None:
            rng.key_from_seed(seed)  # validates early
        self._seed = seed
        self.observation_space = observation_space(self.config)
        self.action_space = action_space(self.config)
        self.head_observation_layout = head_observation_layout(self.config)
        self.active_user_feature = self.config.active_user_feature
        self._state: dict[str, np.ndarray] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None and self._state is None:
            seed = self._seed if self._seed is not None else int(self.np_random.integers(2**63))
        if seed is not None:
            key, counter = np.array([rng.key_from_seed(seed)]), np.zeros(1, dtype=np.uint64)
        else:  # next episode continues this env's random stream
            key, counter = self._state["key"], self._state["counter"]
        self._state = initial_state(self.config, key, counter, kept_condition_weights(self.config, self._state))
        return observe(self.config, self._state)[0], {}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = validate_actions(self.config, action, 1)
        burn_cpu(self.config.step_cost_us)
        self._state, reward, terminated, truncated, parts = step_state(self.config, self._state, actions)
        info: dict[str, Any] = {k: v[0] if v.ndim > 1 else float(v[0]) for k, v in parts.items()}
        if terminated[0] or truncated[0]:
            info["episode_metrics"] = {k: float(v[0]) for k, v in episode_metrics(self.config, self._state).items()}
        return observe(self.config, self._state)[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), info

    def get_state(self) -> dict[str, np.ndarray]:
        """Return a copy of the full env state (RNG position included) as NumPy arrays."""
        if self._state is None:
            raise RuntimeError("call reset() before get_state()")
        return {k: v.copy() for k, v in self._state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore a state from :meth:`get_state`; the next steps repeat exactly."""
        self._state = checked_state(self.config, state, 1)


envs.register()  # importing the env registers it with Gymnasium
