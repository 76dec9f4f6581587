"""Fixed-shape rollout storage: allocated once, one consolidated (pinned) buffer, one transfer."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from collectors.env_group import StepViews


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class RolloutStorage:
    """Host buffers for a ``[T, N]`` rollout plus the ``[N]`` observations that follow it.

    All leaves are views into one consolidated storage (pinned when the target is CUDA),
    so :meth:`to_device` moves the whole rollout with a single host-to-device copy.
    """

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, obs_dtype: torch.dtype,
                 action_shape: tuple, action_dtype: torch.dtype, extras: tuple[str, ...], device: torch.device):
        t, n = num_steps, num_envs
        rollout = {
            "observations": torch.zeros((t, n, *obs_shape), dtype=obs_dtype),
            "actions": torch.zeros((t, n, *action_shape), dtype=action_dtype),
            "rewards": torch.zeros((t, n), dtype=torch.float32),
            "terminated": torch.zeros((t, n), dtype=torch.bool),
            "truncated": torch.zeros((t, n), dtype=torch.bool),
            "final_observations": torch.zeros((t, n, *obs_shape), dtype=obs_dtype),
            "final_observation_mask": torch.zeros((t, n), dtype=torch.bool),
        }
        rollout.update({k: torch.zeros((t, n), dtype=torch.float32) for k in extras})
        host = TensorDict({"rollout": TensorDict(rollout, batch_size=[t, n]),
                           "next_observations": torch.zeros((n, *obs_shape), dtype=obs_dtype)}, batch_size=[])
        self.device = torch.device(device)
        self.host = host.consolidate(pin_memory=self.device.type == "cuda")
        self.num_steps = num_steps
        r = self.host["rollout"]
        self.obs = r["observations"]
        self.final_obs = r["final_observations"]
        self.actions = r["actions"]
        self.extras = {k: r[k] for k in extras}
        self.last_obs = self.host["next_observations"]
        self._np = {k: v.numpy() for k, v in r.items()}
        self._last_obs_np = self.last_obs.numpy()
        self._transfer_done: torch.cuda.Event | None = None
        # per-step views, built once: the hot loop only indexes these lists
        self.views = [self._step_views(t) for t in range(num_steps)]
        self.obs_steps = [self.obs[t] for t in range(num_steps)]
        self.action_steps = [self.actions[t] for t in range(num_steps)]
        self.action_steps_np = [a.numpy() for a in self.action_steps]

    def start_rollout(self) -> None:
        """Wait until the host buffers are free, carry the last observations over, clear final observations."""
        self.wait_for_transfer()
        self.obs[0].copy_(self.last_obs)
        self.final_obs.zero_()  # rows without an episode end stay zero, identically on every backend

    def _step_views(self, t: int) -> StepViews:
        """Where the results of step ``t`` go; the next observation is ``obs[t + 1]`` or ``last_obs``."""
        a = self._np
        next_obs = a["observations"][t + 1] if t + 1 < self.num_steps else self._last_obs_np
        return StepViews(next_obs, a["rewards"][t], a["terminated"][t], a["truncated"][t],
                         a["final_observations"][t], a["final_observation_mask"][t])

    def fill_envs(self, envs: slice, rollout: dict[str, np.ndarray], last_obs: np.ndarray) -> None:
        """Copy a ``[T, K]`` slice collected elsewhere (a Ray worker) into envs ``envs`` of this storage."""
        for k, arr in rollout.items():
            self._np[k][:, envs] = arr
        self._last_obs_np[envs] = last_obs

    def wait_for_transfer(self) -> None:
        """Block until the last asynchronous copy has read the host buffers (before overwriting them)."""
        if self._transfer_done is not None:
            self._transfer_done.synchronize()
            self._transfer_done = None

    def to_device(self) -> tuple[TensorDict, torch.Tensor]:
        """Return ``(rollout [T, N], last observations [N])`` on the target device.

        On CUDA: one non-blocking copy of the consolidated pinned buffer. On the CPU: a
        copy, so that the next ``collect()`` does not overwrite a batch still in use.
        """
        if self.device.type == "cpu":
            moved = self.host.clone()
        else:
            moved = self.host.to(self.device, non_blocking=True)
            if self.device.type == "cuda":
                self._transfer_done = torch.cuda.Event()
                self._transfer_done.record()
        return moved["rollout"], moved["next_observations"]
