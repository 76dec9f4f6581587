"""Collecting experience in this process and its workers: :class:`RolloutCollector` (serial, sync, async)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase

from collectors.backend_names import BACKENDS, LOCAL_BACKENDS
from collectors.base import Collector, Policy, check_env_fns, explicit_seeds
from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S, Deadline
from collectors.env_group import EpisodeInfo, env_states_of, joined_env_states, per_env_states
from collectors.processes import start_method_of
from collectors.rollout import Rollout
from collectors.seeding import env_seeds, noise_keys
from collectors.storage import RolloutStorage, torch_dtype


def _make_stepper(backend: str, env_fns, num_workers: int | None, main_share: bool, num_splits: int,
                  worker_timeout: float, start_method: str | None):
    if num_splits != 1 and backend != "async":
        raise ValueError(f"num_splits={num_splits!r} needs backend='async' (got {backend!r}); leave it at 1")
    if backend in ("serial", "sync"):  # this process's envs, under worker_timeout all the same
        from collectors.backends.serial import SerialStepper
        from collectors.backends.sync import SyncStepper
        from collectors.backends.watched import Watched
        stepper = SerialStepper if backend == "serial" else SyncStepper
        return Watched(lambda: stepper(env_fns), len(env_fns), worker_timeout)
    from collectors.backends.async_ import AsyncStepper
    return AsyncStepper(env_fns, num_workers=num_workers, main_share=main_share, num_splits=num_splits,
                        worker_timeout=worker_timeout, start_method=start_method)


def call_policy(policy: Policy, obs: torch.Tensor, keys: tuple[torch.Tensor, torch.Tensor] | None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(actions, extras)`` of ``policy`` on ``obs``; ``keys``: ``(noise_keys, steps)`` for a keyed policy.

    ``extras`` maps ``log_probs`` / ``values`` to what a mapping output gave for ``log_prob`` / ``value``.
    """
    with torch.inference_mode():  # also when called outside collect()'s loop
        out = policy(obs) if keys is None else policy(obs, noise_keys=keys[0], steps=keys[1])
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


def check_policy_output(action: torch.Tensor, extras: dict[str, torch.Tensor], n: int, space: gym.Space) -> None:
    """Raise a clear error where a policy's output for ``n`` envs does not fit the action ``space``."""
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


class RolloutCollector(Collector):
    """Fixed-shape ``[num_steps, num_envs]`` rollouts from Gymnasium envs, stepped in this process (``serial``,
    ``sync``) or in worker processes (``async``); ``collect()`` returns a :class:`~collectors.rollout.Rollout`.

    Example:
        >>> import functools, gymnasium as gym, torch
        >>> from collectors import RolloutCollector
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 4
        >>> policy = lambda obs: torch.zeros(len(obs), dtype=torch.int64)
        >>> with RolloutCollector(env_fns, policy, backend="sync", num_steps=16, seed=0) as collector:
        ...     rollout = collector.collect()
        >>> rollout.batch.batch_size, rollout.batch["observations"].shape, rollout.next_observations.shape
        (torch.Size([16, 4]), torch.Size([16, 4, 4]), torch.Size([4, 4]))

    Args:
        env_fns: zero-argument callables, each building a ``gymnasium.Env`` or a same-step autoreset ``VectorEnv``.
        policy: ``policy(obs[N, *obs]) -> actions[N, *act]``, or a mapping with ``"action"`` (and ``"log_prob"``,
            ``"value"``); a policy with ``noise_keys`` and ``steps`` parameters is called keyed.
        backend: ``"serial"``, ``"sync"`` or ``"async"`` (Ray and device: :func:`collectors.make_collector`).
        num_steps: steps per rollout (``T``).
        seed: run seed (env ``i`` gets the i-th ``SeedSequence(seed).spawn`` seed), or one seed per env.
        device: where ``collect()`` puts the rollout (one transfer per rollout).
        num_workers: async only; worker processes (default: one busy process per usable core).
        main_share: async only; whether this process steps a share of the envs too.
        num_threads: torch threads of this process while ``collect()`` runs (``None``: unchanged).
        num_splits: async only; env groups stepped double-buffered (``1``: lockstep).
        worker_timeout: seconds a worker (async), or a call of the envs stepped in this process (serial, sync, the
            async backend's own share), may stay silent before a ``WorkerTimeoutError``.
        start_method: async only; ``"forkserver"``, ``"spawn"`` or ``None`` (the forkserver where there is one).
        compile_policy: ``True`` (or a ``torch.compile`` mode) calls the policy compiled; ``False``: as it is.

    Each argument in detail, the batch's keys, keyed sampling: docs/collectors.md#rolloutcollectors-arguments.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Policy, backend: str = "sync",
                 num_steps: int = 128, seed: int | Sequence[int] = 0, device: str | torch.device = "cpu",
                 num_workers: int | None = None, main_share: bool = True, num_threads: int | None = None,
                 num_splits: int = 1, worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S,
                 start_method: str | None = None, compile_policy: bool | str = False) -> None:
        if backend == "ray":
            raise ValueError("backend='ray' has its own collector: collectors.make_collector(env_fns, policy, "
                             "backend='ray', ...) or collectors.RayCollector(env_fns, policy, ...)")
        if backend == "device":
            raise ValueError("backend='device' has its own collector: collectors.make_collector(env_fns, policy, "
                             "backend='device', ...) or collectors.DeviceCollector(env_fns, policy, ...)")
        if backend not in LOCAL_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        env_fns = check_env_fns(env_fns)
        super().__init__(policy, num_steps, device, num_threads, compile_policy)
        explicit = explicit_seeds(seed)
        self.backend = backend
        Deadline(worker_timeout)  # validated here for every backend, so a bad value never waits for async
        start_method_of(start_method)  # ... and so is this
        self.stepper = _make_stepper(backend, env_fns, num_workers, main_share, num_splits, worker_timeout,
                                     start_method)
        self._closed = False
        try:
            self.num_envs = self.stepper.num_envs
            self.observation_space = self.stepper.observation_space
            self.action_space = self.stepper.action_space
            if explicit is not None and len(explicit) != self.num_envs:
                raise ValueError(f"seed has {len(explicit)} entries for {self.num_envs} envs; pass one integer "
                                 "or one seed per env")
            self.seeds = explicit if explicit is not None else env_seeds(seed, self.num_envs)
            self._noise_keys = torch.tensor(noise_keys(self.seeds), dtype=torch.int64)
            self._steps = torch.zeros(self.num_envs, dtype=torch.int64)  # steps each env has taken here
            self._obs = np.zeros((self.num_envs, *self.observation_space.shape), dtype=self.observation_space.dtype)
            self.stepper.reset(self.seeds, self._obs)
        except BaseException:
            self.stepper.close()
            raise
        self.storage: RolloutStorage | None = None
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)

    # ------------------------------------------------------------------ policy
    def _call_policy(self, obs: torch.Tensor, rows: slice, t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy on ``obs`` = envs ``rows`` at step ``t`` of the rollout: ``(actions, extras)``."""
        with torch.inference_mode():  # every call's step keys alike (a compiled policy would recompile for it)
            keys = (self._noise_keys[rows], self._steps[rows] + t) if self._keyed else None
        return call_policy(self._acting_policy(), obs, keys)

    def _allocate(self, action: torch.Tensor, extras: dict[str, torch.Tensor]) -> RolloutStorage:
        obs_dtype = torch_dtype(self._obs.dtype)
        return RolloutStorage(self.num_steps, self.num_envs, self.observation_space.shape, obs_dtype,
                              tuple(action.shape[1:]), action.dtype, tuple(extras), self.device)

    # ------------------------------------------------------------------ collect
    def _collect(self) -> Rollout:
        s, first = self.storage, None
        everything = slice(0, self.num_envs)
        if s is None:  # the first call's output fixes the storage layout (actions dtype, extras)
            obs0 = torch.from_numpy(self._obs)
            # the policy sees the same rows as in every later rollout (async: the first group), so that
            # its outputs round the same way after a resume as in a run that went straight through
            rows = self.stepper.groups[0] if self.backend == "async" else everything
            first = self._call_policy(obs0[rows], rows, 0)
            check_policy_output(*first, rows.stop - rows.start, self.action_space)
            s = self.storage = self._allocate(*first)
            s.obs[0].copy_(obs0)
        else:
            s.start_rollout()
        episodes: list[dict[str, Any]] = []
        with torch.inference_mode():  # cheaper per op than no_grad; outputs are copied into storage
            if self.backend == "async":
                self._async_steps(s, first, episodes)
            else:
                for t in range(self.num_steps):
                    self._act(s, t, everything, first)
                    views = s.views[t]
                    infos = self.stepper.step(s.action_steps_np[t], views)
                    self._record_episodes(views, infos, episodes)
        self._steps += self.num_steps
        batch, next_obs = s.to_device()
        return Rollout(batch, next_obs, episodes, self.policy_version, everything)

    def _act(self, s: RolloutStorage, t: int, rows: slice, first) -> None:
        """Run the policy on envs ``rows`` at step ``t`` and write actions and extras into the storage.

        ``first``: the output for the first rows (starting at env 0) at step 0, where already computed.
        """
        if t == 0 and first is not None and rows.start == 0:
            action, extras = first
        else:
            action, extras = self._call_policy(s.obs_steps[t][rows], rows, t)
        n = rows.stop - rows.start
        if action.shape[1:] != s.actions.shape[2:] or len(action) != n or action.dtype != s.actions.dtype \
                or extras.keys() != s.extras.keys():
            check_policy_output(action, extras, n, self.action_space)
            raise TypeError(f"policy output changed between steps: got {action.dtype} actions with "
                            f"{sorted(extras)}, first step gave {s.actions.dtype} with {sorted(s.extras)}")
        s.action_steps[t][rows].copy_(action)
        for name, v in extras.items():
            s.extras[name][t][rows].copy_(v)

    def _async_steps(self, s: RolloutStorage, first, episodes: list[dict[str, Any]]) -> None:
        """One rollout on the async backend, its env groups pipelined (double-buffered with two groups).

        While the workers step group ``g``, this process runs the policy on group ``g + 1`` and
        steps its own part of it; group ``g``'s results are awaited only when the policy needs
        its next observations. The policy is called in a fixed order (group by group, step by
        step), so the batch does not depend on timing. With one group this is lockstep.
        Episodes of step ``t`` are recorded once every group has finished it, in env order.
        """
        stepper, groups = self.stepper, self.stepper.groups
        last = len(groups) - 1
        finishing: list[EpisodeInfo] = []  # episode infos of step t - 1
        started: list[EpisodeInfo] = []  # ... and of step t
        for t in range(self.num_steps):
            for g, rows in enumerate(groups):
                if t:  # group g must have finished step t - 1 before the policy reads its observations
                    finishing += stepper.finish_group(g, s.views[t - 1])
                    if g == last:
                        self._record_episodes(s.views[t - 1], finishing, episodes)
                self._act(s, t, rows, first)
                started += stepper.start_group(g, s.action_steps_np[t], s.views[t])
            finishing, started = started, []
        for g in range(len(groups)):
            finishing += stepper.finish_group(g, s.views[-1])
        self._record_episodes(s.views[-1], finishing, episodes)

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
        (``[N, *obs]``), running episode returns and lengths and the keyed-sampling step counters
        (``steps``; ``[N]``), and each env's ``get_state()`` (``None`` where the env has none; a
        ``VectorEnv``'s state is split per env).

        Per env, not per worker, so a state restores into any grouping of the same envs
        (another ``num_workers``, or a Ray collector).
        """
        obs = self.storage.last_obs.numpy() if self.storage is not None else self._obs
        return {"observations": obs.copy(), "episode_return": self._episode_return.copy(),
                "episode_length": self._episode_length.copy(), "steps": self._steps.numpy().copy(),
                "env_states": self.stepper.get_env_states()}

    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """Continue from :meth:`get_state`. Returns ``True`` when every env was restored exactly.

        The step counters of keyed sampling continue from the state's ``steps`` (a state without
        them, e.g. from an older checkpoint, starts them at 0).

        Where some env offers no ``get_state()``, all envs restart their episodes instead,
        seeded from ``SeedSequence([seed, reseed])`` (pass e.g. the iteration), and ``False``
        is returned so that the caller can say so.
        """
        obs = np.asarray(state["observations"])
        if obs.shape != self._obs.shape or obs.dtype != self._obs.dtype:
            raise ValueError(f"collector state has observations {obs.shape} {obs.dtype}; this collector has "
                             f"{self._obs.shape} {self._obs.dtype} (different envs or num_envs?)")
        env_states = per_env_states(state["env_states"])  # (a device backend's are batched)
        if len(env_states) != self.num_envs:
            raise ValueError(f"collector state has {len(env_states)} env states for {self.num_envs} envs")
        steps = np.asarray(state.get("steps", np.zeros(self.num_envs, dtype=np.int64)))
        if steps.shape != (self.num_envs,):
            raise ValueError(f"collector state has step counters of shape {steps.shape} for {self.num_envs} envs")
        self._steps.copy_(torch.from_numpy(steps.astype(np.int64)))
        exact = all(s is not None for s in env_states)
        if exact:
            self.stepper.set_env_states(env_states)
            self._episode_return[:] = state["episode_return"]
            self._episode_length[:] = state["episode_length"]
        else:
            derived = int(np.random.SeedSequence([*self.seeds[:1], reseed or 0]).generate_state(1)[0])
            self.stepper.reset(env_seeds(derived, self.num_envs), obs := self._obs.copy())
            self._episode_return[:] = 0.0
            self._episode_length[:] = 0
        if self.storage is not None:
            self.storage.last_obs.copy_(torch.from_numpy(obs))
        else:
            self._obs[:] = obs
        return exact

    def _close(self) -> None:
        self.stepper.close()


def merge_states(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate collector states of consecutive env slices (e.g. one per Ray actor or torchrun rank)."""
    return {"observations": np.concatenate([p["observations"] for p in parts]),
            "episode_return": np.concatenate([p["episode_return"] for p in parts]),
            "episode_length": np.concatenate([p["episode_length"] for p in parts]),
            **({"steps": np.concatenate([p["steps"] for p in parts])} if all("steps" in p for p in parts) else {}),
            "env_states": joined_env_states([p["env_states"] for p in parts])}


def split_state(state: dict[str, Any], envs: slice) -> dict[str, Any]:
    """The part of a collector state that belongs to ``envs``."""
    return {"observations": np.asarray(state["observations"])[envs],
            "episode_return": np.asarray(state["episode_return"])[envs],
            "episode_length": np.asarray(state["episode_length"])[envs],
            **({"steps": np.asarray(state["steps"])[envs]} if "steps" in state else {}),
            "env_states": env_states_of(state["env_states"], envs)}
