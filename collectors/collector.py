"""Collecting experience in this process and its workers: :class:`RolloutCollector` (serial, sync, async)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from collectors.base import Collector, Policy, check_env_fns, check_seeds
from collectors.resources import torch_threads
from collectors.rollout import Rollout
from collectors.seeding import env_seeds
from collectors.storage import RolloutStorage, torch_dtype

LOCAL_BACKENDS = ("serial", "sync", "async")


def _make_backend(backend: str, env_fns, num_workers: int | None, main_share: bool):
    if backend == "serial":
        from collectors.backends.serial import SerialBackend
        return SerialBackend(env_fns)
    if backend == "sync":
        from collectors.backends.sync import SyncBackend
        return SyncBackend(env_fns)
    from collectors.backends.async_ import AsyncBackend
    return AsyncBackend(env_fns, num_workers=num_workers, main_share=main_share)


class RolloutCollector(Collector):
    """Collects fixed-shape ``[horizon, num_envs]`` rollouts from Gymnasium envs, in this process
    (``serial``, ``sync``) or in spawned worker processes (``async``).

    Example:
        >>> import functools, gymnasium as gym, torch
        >>> from collectors import RolloutCollector
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 4
        >>> policy = lambda obs: torch.zeros(len(obs), dtype=torch.int64)
        >>> with RolloutCollector(env_fns, policy, backend="sync", horizon=16, seed=0) as collector:
        ...     rollout = collector.collect()
        >>> rollout.batch.batch_size, rollout.batch["observations"].shape, rollout.next_observations.shape
        (torch.Size([16, 4]), torch.Size([16, 4, 4]), torch.Size([4, 4]))

    ``collect()`` returns a :class:`~collectors.rollout.Rollout`: the ``[T, N]`` batch
    (``observations``, ``actions``, ``rewards``, ``terminated``, ``truncated``,
    ``final_observations``, ``final_observation_mask`` and, when the policy returns them,
    ``log_probs`` and ``values``), the ``[N, ...]`` observations that follow it, the
    episodes finished during it and the policy version that collected it. Consecutive
    calls continue the same episodes. Weights come in through ``update_policy``.

    Args:
        env_fns: zero-argument callables, each building a ``gymnasium.Env`` or a
            ``gymnasium.vector.VectorEnv`` with same-step autoreset (N counts all envs).
        policy: ``policy(obs[N, *obs]) -> actions[N, *act]``, or a mapping with
            ``"action"`` and optionally ``"log_prob"`` and ``"value"`` (``[N]``).
            It is called once per step, in this process, under ``torch.inference_mode()``.
        backend: ``"serial"``, ``"sync"`` or ``"async"`` (``"ray"``: :class:`collectors.RayCollector`,
            or :func:`collectors.make_collector`, which picks the class).
        horizon: steps per rollout (``T``).
        seed: run seed; env ``i`` is reset with the i-th ``SeedSequence(seed).spawn`` seed.
            A sequence gives each env its seed explicitly (one per env).
        device: where ``collect()`` puts the rollout (one transfer per rollout).
        num_workers: async only; worker processes (default: one busy process per usable core,
            the collecting process included when ``main_share``; see ``collectors.resources``).
        main_share: async only; whether the collecting process steps a share of the envs.
        num_threads: torch intra-op threads of this process while ``collect()`` runs (restored
            afterwards, so a learner in this process keeps its own count); ``None``: unchanged.
            Workers always use one thread each.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Policy, backend: str = "sync",
                 horizon: int = 128, seed: int | Sequence[int] = 0, device: str | torch.device = "cpu",
                 num_workers: int | None = None, main_share: bool = True, num_threads: int | None = None) -> None:
        if backend == "ray":
            raise ValueError("backend='ray' has its own collector: collectors.make_collector(env_fns, policy, "
                             "backend='ray', ...) or collectors.RayCollector(env_fns, policy, ...)")
        if backend not in LOCAL_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join((*LOCAL_BACKENDS, 'ray'))}")
        env_fns = check_env_fns(env_fns)
        super().__init__(policy, horizon, device, num_threads)
        explicit = check_seeds(seed)
        if explicit is None:
            env_seeds(seed, 0)  # validates the seed before any worker starts
        self.backend_name = backend
        self.backend = _make_backend(backend, env_fns, num_workers, main_share)
        self._closed = False
        try:
            self.num_envs = self.backend.num_envs
            self.observation_space = self.backend.observation_space
            self.action_space = self.backend.action_space
            if explicit is not None and len(explicit) != self.num_envs:
                raise ValueError(f"seed has {len(explicit)} entries for {self.num_envs} envs; pass one integer "
                                 "or one seed per env")
            self.seeds = explicit if explicit is not None else env_seeds(seed, self.num_envs)
            self._obs = np.zeros((self.num_envs, *self.observation_space.shape), dtype=self.observation_space.dtype)
            self.backend.reset(self.seeds, self._obs)
        except BaseException:
            self.backend.close()
            raise
        self.storage: RolloutStorage | None = None
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)

    # ------------------------------------------------------------------ policy
    def _call_policy(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.inference_mode():  # also when called outside collect()'s loop
            out = self.policy(obs)
        if isinstance(out, (Mapping, TensorDictBase)):
            if "action" not in out.keys():
                raise ValueError(f"policy returned a mapping without 'action' (keys: {list(out.keys())})")
            extras = {name: out[key] for key, name in (("log_prob", "log_probs"), ("value", "values"))
                      if key in out.keys() and out[key] is not None}
            out = out["action"]
        else:
            extras = {}
        if not isinstance(out, torch.Tensor):
            out = torch.as_tensor(np.asarray(out))
        return out, extras

    def _check_policy_output(self, action: torch.Tensor, extras: dict[str, torch.Tensor]) -> None:
        n, space = self.num_envs, self.action_space
        want = (n, *space.shape)
        if tuple(action.shape) != want:
            raise ValueError(f"policy returned actions of shape {tuple(action.shape)}; expected {want} "
                             f"({n} envs x action space {space})")
        discrete = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        if discrete and (action.dtype.is_floating_point or action.dtype == torch.bool):
            raise TypeError(f"policy returned {action.dtype} actions for the discrete space {space}; "
                            "return an integer tensor (e.g. torch.int64)")
        if isinstance(space, gym.spaces.Box) and not action.dtype.is_floating_point:
            raise TypeError(f"policy returned {action.dtype} actions for the continuous space {space}; "
                            "return a floating-point tensor")
        for name, v in extras.items():
            if tuple(v.shape) != (n,):
                raise ValueError(f"policy returned {name[:-1]} of shape {tuple(v.shape)}; expected ({n},)")

    def _allocate(self, action: torch.Tensor, extras: dict[str, torch.Tensor]) -> RolloutStorage:
        obs_dtype = torch_dtype(self._obs.dtype)
        return RolloutStorage(self.horizon, self.num_envs, self.observation_space.shape, obs_dtype,
                              tuple(action.shape[1:]), action.dtype, tuple(extras), self.device)

    # ------------------------------------------------------------------ collect
    def collect(self) -> Rollout:
        """Run the policy for ``horizon`` steps in every env; return the rollout on ``device``."""
        self._check_open()
        try:
            with torch_threads(self.num_threads):
                rollout = self._collect()
        except BaseException:
            self.close()  # a failed rollout leaves no workers behind
            raise
        self._last = rollout
        return rollout

    def _collect(self) -> Rollout:
        s, first = self.storage, None
        if s is None:  # the first step's output fixes the storage layout (actions dtype, extras)
            obs0 = torch.from_numpy(self._obs)
            first = self._call_policy(obs0)
            self._check_policy_output(*first)
            s = self.storage = self._allocate(*first)
            s.obs[0].copy_(obs0)
        else:
            s.start_rollout()
        episodes: list[dict[str, Any]] = []
        with torch.inference_mode():  # cheaper per op than no_grad; outputs are copied into storage
            for t in range(self.horizon):
                action, extras = first if t == 0 and first is not None else self._call_policy(s.obs_steps[t])
                if action.shape != s.actions.shape[1:] or action.dtype != s.actions.dtype \
                        or extras.keys() != s.extras.keys():
                    self._check_policy_output(action, extras)
                    raise TypeError(f"policy output changed between steps: got {action.dtype} actions with "
                                    f"{sorted(extras)}, first step gave {s.actions.dtype} with {sorted(s.extras)}")
                s.action_steps[t].copy_(action)
                for name, v in extras.items():
                    s.extras[name][t].copy_(v)
                views = s.views[t]
                infos = self.backend.step(s.action_steps_np[t], views)
                self._record_episodes(views, infos, episodes)
        batch, next_obs = s.to_device()
        return Rollout(batch, next_obs, episodes, self.policy_version, slice(0, self.num_envs))

    def _record_episodes(self, views, infos, episodes: list[dict[str, Any]]) -> None:
        self._episode_return += views.rewards
        self._episode_length += 1
        done = views.final_mask
        if not done.any():
            return
        metrics = dict(infos)
        for i in np.flatnonzero(done):
            episodes.append({"env": int(i), "return": float(self._episode_return[i]),
                             "length": int(self._episode_length[i]), **metrics.get(int(i), {})})
        self._episode_return[done] = 0.0
        self._episode_length[done] = 0

    # ------------------------------------------------------------------ state for exact resume
    def get_state(self) -> dict[str, Any]:
        """What the next ``collect()`` continues from, one entry per env: current observations
        (``[N, *obs]``), running episode returns and lengths (``[N]``), and each env's
        ``get_state()`` (``None`` where the env has none; a ``VectorEnv``'s state is split per env).

        Per env, not per worker, so a state restores into any grouping of the same envs
        (another ``num_workers``, or a Ray collector).
        """
        obs = self.storage.last_obs.numpy() if self.storage is not None else self._obs
        return {"observations": obs.copy(), "episode_return": self._episode_return.copy(),
                "episode_length": self._episode_length.copy(), "env_states": self.backend.get_env_states()}

    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """Continue from :meth:`get_state`. Returns ``True`` when every env was restored exactly.

        Where some env offers no ``get_state()``, all envs restart their episodes instead,
        seeded from ``SeedSequence([seed, reseed])`` (pass e.g. the iteration), and ``False``
        is returned so that the caller can say so.
        """
        obs = np.asarray(state["observations"])
        if obs.shape != self._obs.shape or obs.dtype != self._obs.dtype:
            raise ValueError(f"collector state has observations {obs.shape} {obs.dtype}; this collector has "
                             f"{self._obs.shape} {self._obs.dtype} (different envs or num_envs?)")
        env_states = list(state["env_states"])
        if len(env_states) != self.num_envs:
            raise ValueError(f"collector state has {len(env_states)} env states for {self.num_envs} envs")
        exact = all(s is not None for s in env_states)
        if exact:
            self.backend.set_env_states(env_states)
            self._episode_return[:] = state["episode_return"]
            self._episode_length[:] = state["episode_length"]
        else:
            derived = int(np.random.SeedSequence([*self.seeds[:1], reseed or 0]).generate_state(1)[0])
            self.backend.reset(env_seeds(derived, self.num_envs), obs := self._obs.copy())
            self._episode_return[:] = 0.0
            self._episode_length[:] = 0
        if self.storage is not None:
            self.storage.last_obs.copy_(torch.from_numpy(obs))
        else:
            self._obs[:] = obs
        return exact

    def _close(self) -> None:
        self.backend.close()


def merge_states(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate per-env collector states of consecutive env slices (e.g. one per Ray actor)."""
    return {"observations": np.concatenate([p["observations"] for p in parts]),
            "episode_return": np.concatenate([p["episode_return"] for p in parts]),
            "episode_length": np.concatenate([p["episode_length"] for p in parts]),
            "env_states": [s for p in parts for s in p["env_states"]]}


def split_state(state: dict[str, Any], envs: slice) -> dict[str, Any]:
    """The part of a per-env collector state that belongs to ``envs``."""
    return {"observations": np.asarray(state["observations"])[envs],
            "episode_return": np.asarray(state["episode_return"])[envs],
            "episode_length": np.asarray(state["episode_length"])[envs],
            "env_states": list(state["env_states"])[envs]}
