"""Envs in spawned worker processes; step data through shared memory, control through pipes.

The collecting process also steps a share of the envs itself (``main_share=True``):
while the workers step theirs it would otherwise sit idle, and on a machine with
few cores an extra busy process only evicts caches (see ``docs/benchmarks.md``).
"""

from __future__ import annotations

import pickle
import signal
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as tmp

from collectors.env_group import EnvError, EnvGroup, EpisodeInfo, StepViews, check_same_spaces
from collectors.resources import async_workers, usable_cores
from collectors.storage import torch_dtype

_FIELDS = ("next_obs", "rewards", "terminated", "truncated", "final_obs", "final_mask")  # final_* last
_CLOSE_TIMEOUT_S = 3.0


class WorkerDiedError(RuntimeError):
    """A worker process exited while the collector was waiting for it."""


def check_picklable(env_fns: Sequence[Callable[[], Any]]) -> None:
    """Reject factories that cannot reach a spawned worker, before any worker starts."""
    for i, fn in enumerate(env_fns):
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"env factory {i} ({fn!r}) cannot be pickled for the async backend's spawned workers "
                f"({type(e).__name__}: {e}). Use a top-level function, or functools.partial of one "
                "(lambdas and nested functions cannot be pickled).") from None


def _split(n: int, parts: int) -> list[range]:
    """Split ``range(n)`` into ``parts`` contiguous, nearly equal ranges."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _worker_main(env_fns: list, first_factory: int, conn) -> None:
    """Worker loop: build the envs, receive shared buffers, then serve step/reset/state commands."""
    # Ctrl-C, a scheduler's SIGTERM or an early-warning SIGUSR1 reach the whole process group; they are the
    # collecting process's to handle: it takes the envs' state before it shuts the workers down
    for name in ("SIGINT", "SIGTERM", "SIGUSR1"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        group = EnvGroup(env_fns, first_factory=first_factory)
    except Exception as e:
        conn.send(("error", type(e).__name__, str(e)))
        return
    conn.send(("ready", group.spaces))
    _, first_index, shared = conn.recv()
    group.first_index = first_index
    rows = slice(first_index, first_index + group.num_envs)
    views = StepViews(*(shared[f][rows].numpy() for f in _FIELDS))
    actions = shared["actions"][rows].numpy()
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError):  # the collecting process is gone (killed): nothing left to serve
            group.close()
            return
        try:
            if cmd == "step":
                conn.send(("ok", group.step(actions, views)))
            elif cmd == "reset":
                group.reset(arg, views.next_obs)
                conn.send(("ok", None))
            elif cmd == "get_states":
                conn.send(("ok", group.get_states()))
            elif cmd == "set_states":
                group.set_states(arg)
                conn.send(("ok", None))
            elif cmd == "close":
                group.close()
                conn.send(("ok", None))
                return
        except EnvError as e:
            conn.send(("env_error", e.env_index, str(e)))
        except Exception as e:
            conn.send(("error", type(e).__name__, f"{e}\n{traceback.format_exc()}"))


def _shutdown(procs: list, conns: list) -> None:
    """Ask workers to close, then terminate and kill whatever is left; never raises."""
    for conn in conns:
        try:
            conn.send(("close", None))
        except Exception:
            pass
    for p in procs:
        p.join(timeout=_CLOSE_TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=_CLOSE_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()


class AsyncBackend:
    """Envs split over ``num_workers`` spawned processes, plus a share in this process."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]], num_workers: int | None = None,
                 main_share: bool = True) -> None:
        if num_workers is None:  # one busy process per usable core (a sharing collecting process is one of them)
            cores = usable_cores()
            num_workers = async_workers(cores, len(env_fns))[0] if main_share else min(cores, len(env_fns))
        parts = num_workers + (1 if main_share else 0)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or not 1 <= parts <= len(env_fns) \
                or num_workers < 1:
            hi = len(env_fns) - (1 if main_share else 0)
            raise ValueError(f"num_workers={num_workers!r} is out of range: with {len(env_fns)} env factories "
                             f"and main_share={main_share} it must be an integer in [1, {max(hi, 1)}] "
                             "(each process needs at least one factory)")
        check_picklable(env_fns)
        ranges = _split(len(env_fns), parts)
        self._factory_ranges: list[range] = []
        self.procs: list = []
        self.conns: list = []
        self.local: EnvGroup | None = None
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns)
        try:
            self._start(env_fns, ranges[1:] if main_share else ranges, ranges[0] if main_share else None)
        except BaseException:
            self.close()
            raise

    def _start(self, env_fns, worker_ranges: list[range], local_range: range | None) -> None:
        ctx = tmp.get_context("spawn")
        for r in worker_ranges:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=([env_fns[i] for i in r], r.start, child), daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        if local_range is not None:  # built while the workers build theirs
            self.local = EnvGroup([env_fns[i] for i in local_range], first_factory=local_range.start)
        self._factory_ranges = worker_ranges
        replies = self._wait_all(phase="start")
        spaces = ([*self.local.spaces] if self.local else []) + [s for reply in replies for s in reply]
        check_same_spaces(spaces)
        self.observation_space, self.action_space, _ = spaces[0]
        sizes = ([self.local.num_envs] if self.local else []) + [sum(s[2] for s in reply) for reply in replies]
        self.num_envs = sum(sizes)
        n, obs, act = self.num_envs, self.observation_space, self.action_space
        obs_dtype, act_dtype = torch_dtype(obs.dtype), torch_dtype(act.dtype)
        self.shared = {
            "actions": torch.zeros((n, *act.shape), dtype=act_dtype).share_memory_(),
            "next_obs": torch.zeros((n, *obs.shape), dtype=obs_dtype).share_memory_(),
            "rewards": torch.zeros(n, dtype=torch.float32).share_memory_(),
            "terminated": torch.zeros(n, dtype=torch.bool).share_memory_(),
            "truncated": torch.zeros(n, dtype=torch.bool).share_memory_(),
            "final_obs": torch.zeros((n, *obs.shape), dtype=obs_dtype).share_memory_(),
            "final_mask": torch.zeros(n, dtype=torch.bool).share_memory_(),
        }
        self._np = {k: v.numpy() for k, v in self.shared.items()}
        offset = self.local.num_envs if self.local else 0
        self._local_rows = slice(0, offset)
        self._worker_rows = []
        for conn, size in zip(self.conns, sizes[1:] if self.local else sizes):
            conn.send(("buffers", offset, self.shared))
            self._worker_rows.append(slice(offset, offset + size))
            offset += size

    def _wait_all(self, phase: str) -> list[Any]:
        """Wait for one reply per worker, in worker order; raise on errors or dead workers.

        Blocks in ``multiprocessing.connection.wait`` on the pipes and the process
        sentinels: no busy spinning, and a worker that dies wakes us at once.
        """
        replies: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        error: Exception | None = None
        while pending:
            conns = {c: w for w, c in pending.items()}
            sentinels = {self.procs[w].sentinel: w for w in pending}
            for obj in wait([*conns, *sentinels]):
                w = conns[obj] if obj in conns else sentinels[obj]
                if w not in pending:
                    continue
                conn = pending.pop(w)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self.procs[w].join(timeout=1.0)
                    error = error or WorkerDiedError(
                        f"async worker {w} (pid {self.procs[w].pid}, hosting factories "
                        f"{self._factory_ranges[w].start}-{self._factory_ranges[w].stop - 1}) died during "
                        f"{phase} with exit code {self.procs[w].exitcode}")
                    continue
                if msg[0] in ("ok", "ready"):
                    replies[w] = msg[1]
                elif msg[0] == "env_error":
                    error = error or EnvError(msg[1], f"async worker {w}", msg[2].split(":\n", 1)[-1])
                else:
                    exc = {"ValueError": ValueError, "TypeError": TypeError}.get(msg[1], RuntimeError)
                    error = error or exc(f"async worker {w}: {msg[2]}")
        if error is not None:
            raise error
        return replies

    def _command(self, cmd: str, args: list | None = None) -> list[Any]:
        for w, conn in enumerate(self.conns):
            conn.send((cmd, None if args is None else args[w]))
        return self._wait_all(phase=cmd)

    def _guarded(self, fn, *args):
        """Run ``fn``; on any failure shut the workers down before re-raising."""
        try:
            return fn(*args)
        except BaseException:
            self.close()
            raise

    def reset(self, seeds: Sequence[int], obs_out: np.ndarray) -> None:
        def run():
            for conn, rows in zip(self.conns, self._worker_rows):
                conn.send(("reset", list(seeds[rows])))
            if self.local is not None:
                self.local.reset(seeds[self._local_rows], obs_out[self._local_rows])
            self._wait_all(phase="reset")
            for rows in self._worker_rows:
                obs_out[rows] = self._np["next_obs"][rows]
        self._guarded(run)

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        def run():
            self._np["actions"][self._local_rows.stop:] = actions[self._local_rows.stop:]
            for conn in self.conns:
                conn.send(("step", None))
            episodes = self.local.step(actions[self._local_rows], out.slice(self._local_rows)) if self.local else []
            for reply in self._wait_all(phase="step"):
                episodes.extend(reply)
            rows = slice(self._local_rows.stop, self.num_envs)
            for f in _FIELDS[:-2]:
                getattr(out, f)[rows] = self._np[f][rows]
            mask = self._np["final_mask"][rows]
            out.final_mask[rows] = mask
            if mask.any():  # only true final observations: other rows of the rollout stay zero
                where = mask.reshape(mask.shape + (1,) * (out.final_obs.ndim - 1))
                np.copyto(out.final_obs[rows], self._np["final_obs"][rows], where=where)
            return episodes
        return self._guarded(run)

    def get_env_states(self) -> list[Any]:
        local = self.local.get_states() if self.local else []
        return local + [s for reply in self._guarded(self._command, "get_states") for s in reply]

    def set_env_states(self, states: Sequence[Any]) -> None:
        """``states`` has one entry per env (not per factory), so any split over workers can restore it."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} envs")
        if self.local:
            self.local.set_states(states[self._local_rows])
        self._guarded(self._command, "set_states", [list(states[rows]) for rows in self._worker_rows])

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local = None
        self._finalizer()
