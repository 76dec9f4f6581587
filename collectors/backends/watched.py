"""The ``serial`` and ``sync`` backends' envs, stepped in this process, under ``worker_timeout``: :class:`Watched`.

An async worker that hangs is noticed by the process waiting for it; envs stepped here have nobody waiting for them
but :class:`~collectors.watchdog.Watchdog`, which interrupts a call of theirs (building, reset, step, state) once it
has run past the deadline (:class:`~collectors.deadlines.Deadline`: ``worker_timeout``, stretched to 20 times the
slowest call measured), as it does for the async backend's own share. A call past it raises
:class:`~collectors.processes.WorkerTimeoutError` naming the envs; the envs that hung are dropped, not closed (a
close would hang as well). What the watchdog cannot reach (C code that never comes back, Windows) is in its module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectors.deadlines import Deadline
from collectors.env_group import EpisodeInfo, StepViews
from collectors.processes import WorkerTimeoutError
from collectors.watchdog import Watchdog


class Watched:
    """The stepper that ``make`` builds (``SerialStepper``, ``SyncStepper``), each call of it under ``worker_timeout``.

    Example:
        >>> import gymnasium as gym
        >>> from collectors.backends.sync import SyncStepper
        >>> fns = [lambda: gym.make("CartPole-v1")] * 2
        >>> stepper = Watched(lambda: SyncStepper(fns), len(fns), worker_timeout=30.0)
        >>> stepper.num_envs, stepper.deadline.floor_s
        (2, 30.0)
        >>> stepper.close()
    """

    def __init__(self, make: Callable[[], Any], num_envs: int, worker_timeout: float) -> None:
        self.deadline = Deadline(worker_timeout)
        self._watchdog = Watchdog(self.deadline, [], f"envs 0-{num_envs - 1}" if num_envs > 1 else "env 0")
        self._finalizer = weakref.finalize(self, self._watchdog.close)
        self.inner: Any = None
        self.inner = self._call("start", make)
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space
        self.num_envs = self.inner.num_envs

    def _call(self, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the deadline for ``phase``; past it, the envs are dropped and the watchdog closed."""
        try:
            return self._watchdog.call(phase, fn, *args)
        except WorkerTimeoutError:
            self.inner = None  # hung: dropped, never closed
            self._watchdog.close()
            raise

    def reset(self, seeds: Sequence[int], obs_out: np.ndarray) -> None:
        self._call("reset", self._live().reset, seeds, obs_out)

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        return self._call("step", self._live().step, actions, out)

    def get_env_states(self) -> list[Any]:
        return self._call("state", self._live().get_env_states)

    def set_env_states(self, states: Sequence[Any]) -> None:
        self._call("state", self._live().set_env_states, states)

    def _live(self) -> Any:
        if self.inner is None:
            raise WorkerTimeoutError(f"the collecting process's own {self._watchdog.hosted} hung before (past "
                                     "--worker-timeout / worker_timeout): make a new collector")
        return self.inner

    def close(self) -> None:
        try:
            if self.inner is not None:
                self.inner.close()
                self.inner = None
        finally:
            self._finalizer()
