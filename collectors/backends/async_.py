"""Envs in worker processes (forked from a forkserver, or spawned); step data through shared memory, control
through pipes.

The collecting process also steps a share of the envs itself (``main_share=True``):
while the workers step theirs it would otherwise sit idle, and on a machine with
few cores an extra busy process only evicts caches (see ``docs/benchmarks.md``). Those
steps get a worker's deadline all the same (:class:`~collectors.watchdog.Watchdog`).

Double buffering (``num_splits=k > 1``, Sample Factory's ``worker_num_splits``): the env
factories are split into ``k`` contiguous groups, and each group is spread over every
process (the collecting process first), so a process hosts one contiguous sub-range of
each group. The collector then pipelines the groups: while the workers step group ``g``,
the collecting process runs the policy on group ``g + 1`` and steps its own part of it
(:meth:`AsyncStepper.start_group` / :meth:`AsyncStepper.finish_group`). Groups are
contiguous in the rollout's env order, so the policy reads and writes plain slices.
"""

from __future__ import annotations

import functools
import pickle
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

import numpy as np
import torch

from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S, Deadline
from collectors.env_group import EnvError, EnvGroup, EpisodeInfo, StepViews, check_same_spaces
from collectors.processes import (
    WorkerDiedError,
    WorkerTimeoutError,
    child_main,
    collector_process,
    how_it_ended,
    process_context,
    send_to_parent,
    starting,
)
from collectors.resources import async_workers, usable_cores
from collectors.storage import torch_dtype
from collectors.watchdog import Watchdog

_FIELDS = ("next_obs", "rewards", "terminated", "truncated", "final_obs", "final_mask")  # final_* last
CLOSE_TIMEOUT_S = 3.0  # workers asked to close get this long before they are killed


def check_picklable(env_fns: Sequence[Callable[[], Any]], where: str = "the async backend's workers") -> None:
    """Reject factories that cannot reach another process (``where``), before any process starts."""
    for i, fn in enumerate(env_fns):
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"env factory {i} ({fn!r}) cannot be pickled for {where} "
                f"({type(e).__name__}: {e}). Use a top-level function, or functools.partial of one "
                "(lambdas and nested functions cannot be pickled).") from None


def _split(n: int, parts: int) -> list[range]:
    """Split ``range(n)`` into ``parts`` contiguous, nearly equal ranges."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _split_factories(num_factories: int, num_splits: int, parts: int) -> list[list[range]]:
    """Factory ranges ``[process][group]``: ``num_splits`` contiguous groups, each split over ``parts`` processes."""
    ranges: list[list[range]] = [[] for _ in range(parts)]
    for group in _split(num_factories, num_splits):
        for p, r in enumerate(_split(len(group), parts)):
            ranges[p].append(range(group.start + r.start, group.start + r.stop))
    return ranges


def _describe(ranges: list[range]) -> str:
    return ", ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in ranges)


@child_main
def _worker_main(env_fns: list[list], first_factories: list[int], conn) -> None:
    """Worker loop: build one env group per split, receive shared buffers, then serve commands."""
    torch.set_num_threads(1)
    groups = _built_groups(env_fns, first_factories, conn)
    if groups is None:  # the collecting process was told why
        return
    buffers = _buffers_from_parent(conn, groups)
    if buffers is not None:  # None: the collector was closed during start-up (Ctrl-C, say)
        views, actions = _group_views(groups, *buffers)
        _serve_commands(conn, groups, views, actions)
    for group in groups:
        group.close()


def _built_groups(env_fns: list[list], first_factories: list[int], conn) -> list[EnvGroup] | None:
    """One env group per split; ``None`` where one failed to build (those built are closed, the error sent)."""
    groups: list[EnvGroup] = []
    try:
        for fns, first in zip(env_fns, first_factories):
            groups.append(EnvGroup(fns, first_factory=first))
    except Exception as e:
        for group in groups:
            group.close()
        send_to_parent(conn, ("error", type(e).__name__, str(e)))
        return None
    return groups


def _buffers_from_parent(conn, groups: list[EnvGroup]) -> tuple[list[int], dict[str, torch.Tensor]] | None:
    """Say the groups are ready (with their spaces), and receive ``(first_indices, shared)``: each group's first
    rollout index and the shared step buffers. ``None`` where the collector closes instead, or is gone."""
    if not send_to_parent(conn, ("ready", [group.spaces for group in groups])):
        return None
    try:
        message = conn.recv()
    except (EOFError, OSError, pickle.UnpicklingError):  # killed while sending them: leave quietly
        return None
    if message[0] != "buffers":  # ("close", None)
        return None
    _, first_indices, shared = message
    return first_indices, shared


def _group_views(groups: list[EnvGroup], first_indices: list[int],
                 shared: dict[str, torch.Tensor]) -> tuple[list[StepViews], list[np.ndarray]]:
    """Each group's rows of the shared buffers, as NumPy views: ``(step views, actions)`` per group (the groups
    learn their first rollout index, for episode records and errors)."""
    views, actions = [], []
    for group, first in zip(groups, first_indices):
        group.first_index = first
        rows = slice(first, first + group.num_envs)
        views.append(StepViews(*(shared[f][rows].numpy() for f in _FIELDS)))
        actions.append(shared["actions"][rows].numpy())
    return views, actions


def _serve_commands(conn, groups: list[EnvGroup], views: list[StepViews], actions: list[np.ndarray]) -> None:
    """Answer the collecting process's commands until it says ``close`` or is gone."""
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):  # the collecting process is gone (killed mid-send)
            break
        if cmd == "close":  # nothing waits for an answer: the collecting process joins this one
            break
        if not send_to_parent(conn, _answer(cmd, arg, groups, views, actions)):
            break  # gone mid-command (killed, or stopped by a signal during a step)


def _answer(cmd: str, arg: Any, groups: list[EnvGroup], views: list[StepViews], actions: list[np.ndarray]) -> tuple:
    """The reply to one command: ``("ok", reply)``, or the error an env (``env_error``) or the worker raised."""
    reply: Any = None
    try:
        if cmd == "step":  # arg: the split to step
            reply = groups[arg].step(actions[arg], views[arg])
        elif cmd == "reset":  # arg: seeds per split
            for group, seeds, v in zip(groups, arg, views):
                group.reset(seeds, v.next_obs)
        elif cmd == "get_states":
            reply = [group.get_states() for group in groups]
        elif cmd == "set_states":  # arg: states per split
            for group, states in zip(groups, arg):
                group.set_states(states)
        return ("ok", reply)
    except EnvError as e:
        return ("env_error", e.env_index, e.where, e.detail)
    except Exception as e:
        return ("error", type(e).__name__, f"{e}\n{traceback.format_exc()}")


def _shutdown(procs: list, conns: list) -> None:
    """Ask workers to close, then terminate and kill whatever is left; never raises."""
    for conn in conns:
        try:
            conn.send(("close", None))
        except Exception:
            pass
    stop_processes(procs, patience=CLOSE_TIMEOUT_S)
    for conn in conns:
        conn.close()


def stop_processes(procs: list, patience: float) -> None:
    """Give processes asked to stop ``patience`` seconds in all, then kill what is left.

    No SIGTERM in between: our processes ignore it (stop signals are the parent's), and a hung
    or stopped one would not act on it anyway.
    """
    end = time.monotonic() + patience
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def _rollout_rows(sizes: list[list[int]], num_splits: int) -> tuple[list[list[slice]], list[slice], int]:
    """Where each process's envs go in the rollout, from their counts ``sizes[process][group]``: rows follow
    factory order, group by group, and within a group process by process. Returns ``(rows[process][group],
    groups, num_envs)``, ``groups`` each group's contiguous slice."""
    rows: list[list[slice]] = [[slice(0)] * num_splits for _ in sizes]
    groups, offset = [], 0
    for g in range(num_splits):
        start = offset
        for p, proc in enumerate(sizes):
            rows[p][g] = slice(offset, offset + proc[g])
            offset += proc[g]
        groups.append(slice(start, offset))
    return rows, groups, offset


def _step_buffers(n: int, obs: Any, act: Any) -> dict[str, torch.Tensor]:
    """The step data of ``n`` envs in shared memory, which workers write and the collector reads: their actions,
    and what a step returns (observation and action spaces ``obs``, ``act``)."""
    obs_dtype, act_dtype = torch_dtype(obs.dtype), torch_dtype(act.dtype)
    return {
        "actions": torch.zeros((n, *act.shape), dtype=act_dtype).share_memory_(),
        "next_obs": torch.zeros((n, *obs.shape), dtype=obs_dtype).share_memory_(),
        "rewards": torch.zeros(n, dtype=torch.float32).share_memory_(),
        "terminated": torch.zeros(n, dtype=torch.bool).share_memory_(),
        "truncated": torch.zeros(n, dtype=torch.bool).share_memory_(),
        "final_obs": torch.zeros((n, *obs.shape), dtype=obs_dtype).share_memory_(),
        "final_mask": torch.zeros(n, dtype=torch.bool).share_memory_(),
    }


class AsyncStepper:
    """Envs split over ``num_workers`` worker processes, plus a share in this process.

    Workers are forked from a forkserver that has imported torch and the collectors once, or spawned where
    the platform has none or ``start_method="spawn"`` asks for it (:mod:`collectors.processes`).

    ``groups`` lists the ``num_splits`` env groups as contiguous slices of the rollout's
    env indices; every process hosts a non-empty part of every group. ``step`` steps all
    groups in lockstep; a collector pipelines them with ``start_group`` / ``finish_group``.

    Every wait on a worker is bounded by ``worker_timeout`` seconds, stretched to 20 times the
    slowest answer measured (:class:`~collectors.deadlines.Deadline`); a worker silent for longer
    raises :class:`WorkerTimeoutError` naming it and its envs, and all workers are shut down.
    This process's own share gets the same limit (Linux and macOS: :class:`~collectors.watchdog.Watchdog`,
    where the stepper is made in the main thread): a call of its envs that takes longer is interrupted and
    raises :class:`WorkerTimeoutError` naming them; they are dropped without being closed.
    Workers are killed when this process dies (Linux), even in the middle of a hung step.

    Example (``num_workers`` processes; ``num_envs`` = all envs):
        >>> import functools, gymnasium as gym
        >>> from collectors.backends.async_ import AsyncStepper
        >>> stepper = AsyncStepper([functools.partial(gym.make, "CartPole-v1")] * 4, num_workers=1,
        ...                        worker_timeout=30.0)  # doctest: +SKIP
        >>> stepper.num_envs, stepper.groups  # doctest: +SKIP
        (4, [slice(0, 4, None)])
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], num_workers: int | None = None,
                 main_share: bool = True, num_splits: int = 1,
                 worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S, start_method: str | None = None) -> None:
        self.deadline = Deadline(worker_timeout)
        self._ctx = process_context(start_method)
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
        check_num_splits(num_splits, len(env_fns), parts)
        check_picklable(env_fns)
        ranges = _split_factories(len(env_fns), num_splits, parts)
        self.num_splits = num_splits
        self._factory_ranges: list[list[range]] = []
        self.procs: list = []
        self.conns: list = []
        self.local: list[EnvGroup] = []
        self._in_flight: list[int] = []  # groups sent to the workers and not yet finished, oldest first
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns)
        self._watchdog = Watchdog(self.deadline, self.procs, f"env factories {_describe(ranges[0])} (envs not yet "
                                  "built)") if main_share else None
        if self._watchdog:
            weakref.finalize(self, self._watchdog.close)
        try:
            self._start(env_fns, ranges[1:] if main_share else ranges, ranges[0] if main_share else None)
        except BaseException:
            self.close()
            raise

    def _start(self, env_fns, worker_ranges: list[list[range]], local_ranges: list[range] | None) -> None:
        """Start the workers (this process builds its own groups meanwhile), lay the rollout's rows out over the
        processes, and give every worker the shared step buffers."""
        self._start_workers(env_fns, worker_ranges)
        self._factory_ranges = worker_ranges
        if local_ranges is not None:  # built while the workers build theirs
            for r in local_ranges:
                self.local.append(self._here("start", functools.partial(EnvGroup, [env_fns[i] for i in r],
                                                                        first_factory=r.start)))
        replies = self._wait_all(phase="start")
        # spaces[process][split]: a list of (obs space, action space, envs) per factory
        spaces = ([[g.spaces for g in self.local]] if self.local else []) + replies
        check_same_spaces([s for proc in spaces for split in proc for s in split])
        self.observation_space, self.action_space, _ = spaces[0][0][0]
        sizes = [[sum(s[2] for s in split) for split in proc] for proc in spaces]
        rows, self.groups, self.num_envs = _rollout_rows(sizes, self.num_splits)
        self._place_rows(rows)
        self.shared = _step_buffers(self.num_envs, self.observation_space, self.action_space)
        self._np = {k: v.numpy() for k, v in self.shared.items()}
        for w, worker_rows in enumerate(self._worker_rows):
            self._send(w, ("buffers", [r.start for r in worker_rows], self.shared))

    def _start_workers(self, env_fns, worker_ranges: list[list[range]]) -> None:
        """One worker process per entry of ``worker_ranges`` (its factory ranges, one per split), each on record
        (``procs``, ``conns``) as soon as it started."""
        ctx = self._ctx
        for w, ranges in enumerate(worker_ranges):
            parent, child = ctx.Pipe()
            p = collector_process(ctx, _worker_main, ([[env_fns[i] for i in r] for r in ranges],
                                                      [r.start for r in ranges], child),
                                  name=f"env-worker-{w}", daemon=True)
            with starting(p, ctx, self.deadline.limit("start")):  # a stop signal is raised once it is on record
                child.close()
                self.procs.append(p)
                self.conns.append(parent)

    def _place_rows(self, rows: list[list[slice]]) -> None:
        """Record which rollout rows ``rows[process][group]`` each process steps (this process's first)."""
        self._local_rows = rows[0] if self.local else []
        for group, r in zip(self.local, self._local_rows):  # rollout indices, for episode records and errors
            group.first_index = r.start
        if self._watchdog:
            self._watchdog.hosted = f"envs {_describe([range(r.start, r.stop) for r in self._local_rows])}"
        self._worker_rows = rows[1:] if self.local else rows
        # workers' rows of each group are contiguous: they follow the collecting process's part
        self._group_worker_rows = [slice(self._local_rows[g].stop if self.local else grp.start, grp.stop)
                                   for g, grp in enumerate(self.groups)]

    def _wait_all(self, phase: str) -> list[Any]:
        """Wait for one reply per worker, in worker order; raise on errors, dead or silent workers.

        Blocks in ``multiprocessing.connection.wait`` on the pipes and the process
        sentinels: no busy spinning, and a worker that dies wakes us at once; one silent
        past the deadline raises :class:`WorkerTimeoutError`.
        """
        replies: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        error: Exception | None = None
        sent, limit = time.monotonic(), self.deadline.limit(phase)
        while pending:
            conns = {c: w for w, c in pending.items()}
            sentinels = {self.procs[w].sentinel: w for w in pending}
            ready = wait([*conns, *sentinels], timeout=max(0.0, sent + limit - time.monotonic()))
            if not ready:
                w = min(pending)
                silent = WorkerTimeoutError(
                    f"async worker {w} (pid {self.procs[w].pid}, {self._hosted_by(w)}) "
                    f"has been silent for {time.monotonic() - sent:.1f} s during {phase} (limit {limit:.3g} s: "
                    "a hung env step or a stopped process; raise it with --worker-timeout / worker_timeout)")
                for late in pending:  # it would not answer a close either: its patience would only be waited out
                    self.procs[late].kill()
                raise silent
            for obj in ready:
                w = conns[obj] if obj in conns else sentinels[obj]
                if w not in pending:
                    continue
                conn = pending.pop(w)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    error = error or self._died(w, phase)
                    continue
                if msg[0] in ("ok", "ready"):
                    replies[w] = msg[1]
                elif msg[0] == "env_error":
                    error = error or EnvError(msg[1], f"{msg[2]} in async worker {w}", msg[3])
                else:
                    exc = {"ValueError": ValueError, "TypeError": TypeError}.get(msg[1], RuntimeError)
                    error = error or exc(f"async worker {w}: {msg[2]}")
        if error is not None:
            raise error
        if phase != "start":
            self.deadline.measured(time.monotonic() - sent)
        return replies

    def _died(self, w: int, phase: str) -> WorkerDiedError:
        """The error for worker ``w``, found dead (its pipe closed) during ``phase``."""
        self.procs[w].join(timeout=1.0)
        return WorkerDiedError(f"async worker {w} (pid {self.procs[w].pid}, {self._hosted_by(w)}) died during "
                               f"{phase}: {how_it_ended(self.procs[w].exitcode)}")

    def _send(self, w: int, message: tuple) -> None:
        """Send ``message`` to worker ``w``; ``WorkerDiedError`` if it is gone (a worker killed while the
        learner updated is found here, by the next command, not by a reply)."""
        try:
            self.conns[w].send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: nobody reads the pipe any more
            raise self._died(w, message[0]) from None

    def _hosted_by(self, w: int) -> str:
        """``"envs 4-7"``: worker ``w``'s envs as rollout indices (its env factories while those are not yet
        known)."""
        rows = getattr(self, "_worker_rows", None)
        if rows is None:
            return f"its envs not yet built, from env factories {_describe(self._factory_ranges[w])}"
        return f"envs {_describe([range(r.start, r.stop) for r in rows[w] if r.stop > r.start])}"

    def _here(self, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this process's envs, under the workers' deadline. Past it, the stepper is closed, as for a
        silent worker; envs that hung are dropped, not closed (a close would hang as well: a hung worker too is
        killed rather than asked to close)."""
        try:
            return self._watchdog.call(phase, fn, *args)
        except WorkerTimeoutError:
            self.local = []
            self.close()
            raise

    def _command(self, cmd: str, args: list | None = None) -> list[Any]:
        for w in range(len(self.conns)):
            self._send(w, (cmd, None if args is None else args[w]))
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
            seeds_ = list(seeds)
            for w, rows in enumerate(self._worker_rows):
                self._send(w, ("reset", [seeds_[r] for r in rows]))
            for group, rows in zip(self.local, self._local_rows):
                self._here("reset", group.reset, seeds_[rows], obs_out[rows])
            self._wait_all(phase="reset")
            for rows in self._worker_rows:
                for r in rows:
                    obs_out[r] = self._np["next_obs"][r]
        self._guarded(run)

    def start_group(self, g: int, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        """Send group ``g``'s actions (rows of ``actions[N]``) to the workers, then step this process's part
        of the group into ``out`` (``[N]`` views of one step); returns the episodes that part finished.

        The workers' results reach ``out`` in :meth:`finish_group`, which must be called once per
        ``start_group``, in the same order.
        """
        def run():
            rows = self._group_worker_rows[g]
            self._np["actions"][rows] = actions[rows]
            for w in range(len(self.conns)):
                self._send(w, ("step", g))
            self._in_flight.append(g)
            if not self.local:
                return []
            local = self._local_rows[g]
            return self._here("step", self.local[g].step, actions[local], out.slice(local))
        return self._guarded(run)

    def finish_group(self, g: int, out: StepViews) -> list[EpisodeInfo]:
        """Wait for the workers' part of group ``g`` (the oldest started); copy it into ``out``; return its episodes."""
        def run():
            if not self._in_flight or self._in_flight[0] != g:
                raise RuntimeError(f"async backend: finish_group({g}) but the oldest group in flight is "
                                   f"{self._in_flight[0] if self._in_flight else None}")
            episodes = [e for reply in self._wait_all(phase="step") for e in reply]
            self._in_flight.pop(0)
            rows = self._group_worker_rows[g]
            for f in _FIELDS[:-2]:
                getattr(out, f)[rows] = self._np[f][rows]
            mask = self._np["final_mask"][rows]
            out.final_mask[rows] = mask
            if mask.any():  # only true final observations: other rows of the rollout stay zero
                where = mask.reshape(mask.shape + (1,) * (out.final_obs.ndim - 1))
                np.copyto(out.final_obs[rows], self._np["final_obs"][rows], where=where)
            return episodes
        return self._guarded(run)

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        """Step every env once, all groups in lockstep."""
        episodes = [e for g in range(self.num_splits) for e in self.start_group(g, actions, out)]
        for g in range(self.num_splits):
            episodes.extend(self.finish_group(g, out))
        return episodes

    def get_env_states(self) -> list[Any]:
        states: list[Any] = [None] * self.num_envs
        for group, rows in zip(self.local, self._local_rows):
            states[rows] = self._here("get_states", group.get_states)
        for reply, worker_rows in zip(self._guarded(self._command, "get_states"), self._worker_rows):
            for part, rows in zip(reply, worker_rows):
                states[rows] = part
        return states

    def set_env_states(self, states: Sequence[Any]) -> None:
        """``states`` has one entry per env (not per factory), so any split over workers can restore it."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} envs")
        states = list(states)
        for group, rows in zip(self.local, self._local_rows):
            self._here("set_states", group.set_states, states[rows])
        self._guarded(self._command, "set_states", [[states[r] for r in rows] for rows in self._worker_rows])

    def close(self) -> None:
        for group in self.local:
            group.close()
        self.local = []
        self._in_flight.clear()
        self._finalizer()
        if self._watchdog:
            self._watchdog.close()


def check_num_splits(num_splits: int, num_factories: int, processes: int) -> None:
    """Every process needs a factory in every group: ``num_splits * processes <= num_factories``."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits={num_splits!r} is invalid: an integer >= 1 (1: lockstep, 2: double-buffered)")
    if num_splits * processes > num_factories:
        raise ValueError(f"num_splits={num_splits} with {processes} processes needs at least {num_splits * processes} "
                         f"env factories (one per process and group), got {num_factories}: lower num_splits or "
                         "num_workers")
