"""A collector in its own process: the next rollout is collected while this process learns."""

from __future__ import annotations

import pickle
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait
from typing import Any

import torch
from tensordict import TensorDict

from collectors.backends.async_ import CLOSE_TIMEOUT_S as WORKER_CLOSE_TIMEOUT_S
from collectors.backends.async_ import check_picklable, stop_processes
from collectors.base import Collector, Policy, check_env_fns
from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S, START_TIMEOUT_S, Deadline
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
from collectors.rollout import Rollout

_CLOSE_TIMEOUT_S = 5.0
# the commands the collecting process answers only once its async workers have: its deadline on them fires first
_REACH_WORKERS = frozenset({"start", "collect", "get_state", "set_state"})
_REPORT_MARGIN_S = 2.0  # a busy machine's delay between the collecting process's error and its arrival here


class BackgroundCollector(Collector):
    """A :class:`~collectors.RolloutCollector` that runs in a process of its own: ``start()`` begins the next
    rollout and returns at once, ``wait()`` returns it (``collect()`` is both), so this process may learn meanwhile.
    Rollouts, states and episodes are exactly those of the same ``RolloutCollector`` in this process.

    Example:
        >>> import functools, gymnasium as gym, torch
        >>> from collectors.background import BackgroundCollector
        >>> from tests.factories import RandomPolicy
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 2
        >>> with BackgroundCollector(env_fns, RandomPolicy(2), num_steps=8) as c:  # doctest: +SKIP
        ...     c.start()        # collecting ...
        ...     rollout = c.wait()
        >>> rollout.batch.batch_size  # doctest: +SKIP
        torch.Size([8, 2])

    Args:
        env_fns, policy, backend, num_steps, seed, device, num_threads: as for ``RolloutCollector`` (picklable).
        worker_timeout: seconds the collecting process (and its async workers) may stay silent.
        start_method: how the collecting process, and its async workers, start (as for ``RolloutCollector``).
        options: further ``RolloutCollector`` options (``num_workers``, ``main_share``, ...).

    How weights reach it, its deadlines and its faults: docs/collectors.md#in-a-process-of-its-own-backgroundcollector.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Policy, backend: str = "sync",
                 num_steps: int = 128, seed: int | Sequence[int] = 0, device: str | torch.device = "cpu",
                 num_threads: int | None = None, worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S,
                 start_method: str | None = None, **options: Any) -> None:
        env_fns = check_env_fns(env_fns)
        super().__init__(policy, num_steps, device, num_threads)
        self.deadline = Deadline(worker_timeout)
        check_picklable(env_fns, "the collecting process (background=True)")
        policy_bytes = _pickled(policy)
        ctx = process_context(start_method)
        self._conn, child = ctx.Pipe()
        kwargs = dict(backend=backend, num_steps=num_steps, seed=seed, num_threads=num_threads,
                      worker_timeout=worker_timeout, start_method=start_method, **options)
        self._weights = _shared_weights(policy)
        self._process = collector_process(ctx, _serve, (child, env_fns, policy_bytes, self._weights, kwargs),
                                          name="collector", daemon=False)
        self._has_workers = backend == "async"
        self._workers_limit_s = self.deadline.floor_s  # its deadline on its workers, as it last said (the same floor)
        self._pending: int | None = None  # the policy version of the rollout in flight
        self._sent_at = 0.0  # when the rollout in flight was asked for
        self._rollouts = 0
        self._shared: TensorDict | None = None  # the collecting process's rollout buffer, in shared memory
        self._host: TensorDict | None = None  # pinned staging copy for CUDA: one transfer per rollout
        self._transfer_done: torch.cuda.Event | None = None
        self._started = {"ready": False}  # read by _stop: a process still starting gets time to finish
        try:
            # a stop signal is raised after this block, once the process is on record to be stopped
            with starting(self._process, ctx, self.deadline.limit("start")):
                child.close()
                self._finalizer = weakref.finalize(self, _stop, self._process, self._conn, self._started)
                self._closed = False
            self.num_envs, self.observation_space, self.action_space = self._reply("start", time.monotonic())
            self._started["ready"] = True
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol
    def _reply(self, what: str, sent_at: float) -> Any:
        """The collecting process's answer to what was sent at ``sent_at``; raises its error,
        ``WorkerDiedError`` if it died, ``WorkerTimeoutError`` if it stays silent past the deadline."""
        first = what == "start" or (what == "collect" and not self._rollouts)  # envs built, buffers allocated
        own_s = self.deadline.limit("start" if first else what)
        report_s = self._report_s(own_s) if what in _REACH_WORKERS else 0.0
        limit = own_s + report_s
        ready = wait([self._conn, self._process.sentinel], timeout=max(0.0, sent_at + limit - time.monotonic()))
        busy_s = None
        if self._conn in ready:
            try:
                kind, payload, *measures = self._conn.recv()
                if measures:
                    busy_s, self._workers_limit_s = measures
            except (EOFError, OSError):
                kind, payload = "died", None
        elif ready:
            kind, payload = "died", None
        else:
            envs = f"envs 0-{self.num_envs - 1}" if hasattr(self, "num_envs") else "its envs not yet built"
            leeway = f", {report_s:.2g} s of it for its workers' own deadline to fire first" if report_s else ""
            silent = WorkerTimeoutError(
                f"the collecting process (pid {self._process.pid}, {envs}) has been silent for "
                f"{time.monotonic() - sent_at:.1f} s during {what} (limit {limit:.3g} s{leeway}: a hung env step "
                "or a stopped process; raise it with --worker-timeout / worker_timeout)")
            self._process.kill()  # it would not answer a close either (its workers die with it)
            raise silent
        if kind == "ok":
            if not first:  # its own work: not the time this process spent learning before it read the answer
                self.deadline.measured(busy_s if busy_s is not None else time.monotonic() - sent_at)
            return payload
        if kind == "error":
            raise payload
        raise self._died(what)

    def _died(self, what: str) -> WorkerDiedError:
        self._process.join(timeout=_CLOSE_TIMEOUT_S)
        return WorkerDiedError(f"the collecting process (pid {self._process.pid}) died during {what}: "
                               f"{how_it_ended(self._process.exitcode)}")

    def _send(self, command: str, arg: Any = None) -> None:
        """``WorkerDiedError`` if the collecting process is gone (killed while this process learned)."""
        try:
            self._conn.send((command, arg))
        except OSError:  # BrokenPipeError, ConnectionResetError: nobody reads the pipe any more
            raise self._died(command) from None

    def _report_s(self, own_s: float) -> float:
        """How much later than ``own_s`` (this deadline) the collecting process may report one of its workers, or
        a step of its own envs, silent.

        A worker's silence counts from the step it was sent, up to a rollout after the rollout began, and lasts
        the collecting process's own deadline on its workers, which has measured its steps (the first rollout's
        too, which this one does not count) and may have stretched further than this one; then it kills the silent
        one, gives the others at most their close patience, and sends the error.
        Without this, both deadlines share a floor, this one starts first, and a stopped worker would
        be reported as the collecting process being silent.
        """
        if not self._has_workers:
            return 0.0
        beyond_s = max(0.0, self._workers_limit_s - own_s)
        return beyond_s + self.deadline.slowest_s + WORKER_CLOSE_TIMEOUT_S + _REPORT_MARGIN_S

    def _call(self, command: str, arg: Any = None) -> Any:
        self._check_open()
        if self._pending is not None:
            raise RuntimeError(f"{command}: a rollout is in flight; wait() for it first")
        try:
            self._send(command, arg)
            return self._reply(command, time.monotonic())
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ collect
    def start(self) -> None:
        """Begin the next rollout with the current weights; returns at once."""
        self._check_open()
        if self._pending is not None:
            raise RuntimeError("start(): a rollout is already in flight; wait() for it first")
        try:
            self._send("collect")
        except BaseException:
            self.close()  # as a failed wait() does: no process left behind
            raise
        self._pending, self._sent_at = self.policy_version, time.monotonic()

    def wait(self) -> Rollout:
        """The rollout begun by ``start()``, on ``device``."""
        if self._pending is None:
            raise RuntimeError("wait() without start()")
        version, self._pending = self._pending, None
        try:
            shared, episodes = self._reply("collect", self._sent_at)  # silence counts from start()
            self._rollouts += 1
        except BaseException:
            self.close()  # a failed rollout leaves no process behind
            raise
        if shared is not None:  # the first rollout: the buffer all later ones arrive in
            self._shared = shared
        moved = self._deliver(self._shared)
        return Rollout(moved["rollout"], moved["next_observations"], episodes, version, slice(0, self.num_envs))

    def _collect(self) -> Rollout:  # collect() is start() then wait()
        self.start()
        return self.wait()

    def _deliver(self, shared: TensorDict) -> TensorDict:
        """A copy of the shared buffer on ``device`` (the collecting process overwrites it next rollout)."""
        if self.device.type == "cpu":
            return shared.clone()
        if self._host is None:
            self._host = shared.consolidate(pin_memory=self.device.type == "cuda")
        else:
            if self._transfer_done is not None:
                self._transfer_done.synchronize()  # the previous copy has read the staging buffer
            self._host.update_(shared)
        moved = self._host.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._transfer_done = torch.cuda.Event()
            self._transfer_done.record()
        return moved

    # ------------------------------------------------------------------ weights and state
    def update_policy(self, policy_or_state_dict: Policy | Mapping[str, torch.Tensor]) -> None:
        """As ``RolloutCollector.update_policy``; the weights (or the new callable) go to the collecting process."""
        if self._pending is not None:
            raise RuntimeError("update_policy: a rollout is in flight; wait() for it first")
        super().update_policy(policy_or_state_dict)  # checked against this copy of the policy, keys and shapes
        if isinstance(policy_or_state_dict, Mapping):
            with torch.no_grad():
                for name, value in self.policy.state_dict().items():
                    self._weights[name].copy_(value)
            self._call("weights")
        else:  # a new callable: a copy of it, and shared weights of its own when it is a module
            self._weights = _shared_weights(self.policy)
            self._call("policy", (_pickled(self.policy), self._weights))

    def get_state(self) -> dict[str, Any]:
        """As ``RolloutCollector.get_state`` (not while a rollout is in flight)."""
        return self._call("get_state")

    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """As ``RolloutCollector.set_state``."""
        return self._call("set_state", (state, reseed))

    def _close(self) -> None:
        self._pending = None
        self._finalizer()


def _stop(process, conn, started: dict[str, bool]) -> None:
    """Ask the collecting process to close its envs, then kill it if it must; never raises.

    One still starting (building envs, starting its workers) is given the start-up timeout to
    finish: killed half-way through starting a worker, it would leave that worker reading
    truncated start-up data. It sees the pipe closed as soon as it is up, and exits cleanly.
    """
    try:
        conn.send(("close", None))
    except Exception:
        pass
    conn.close()
    stop_processes([process], patience=_CLOSE_TIMEOUT_S if started["ready"] else START_TIMEOUT_S)


def _pickled(policy: Policy) -> bytes:
    """Plain pickle (a copy), not torch's shared-memory reductions: the collecting process's policy is its own."""
    try:
        return pickle.dumps(policy)
    except Exception as e:
        raise TypeError(f"the policy ({type(policy).__name__}) cannot be pickled for the collecting process "
                        f"({type(e).__name__}: {e}); use an nn.Module or a top-level function") from None


def _shared_weights(policy: Policy) -> dict[str, torch.Tensor] | None:
    """A shared-memory copy of a module policy's ``state_dict``, through which its weights reach the collecting
    process; ``None`` for a plain callable.

    Written in place and read by the collecting process between rollouts, it is sent once. Passed with the
    process's arguments, its memory goes over when the process starts: weights sent over the pipe would go through
    multiprocessing's resource sharer, a thread here that a collecting process stopped half-way through
    fetching them (SIGSTOP, then the deadline) ends in a traceback.
    """
    if not isinstance(policy, torch.nn.Module):
        return None
    return {name: value.detach().to("cpu", copy=True).share_memory_() for name, value in policy.state_dict().items()}


@child_main  # stop signals reach the whole process group: the trainer handles them, then closes this one
def _serve(conn, env_fns: list, policy_bytes: bytes, weights: dict[str, torch.Tensor] | None,
           kwargs: dict[str, Any]) -> None:
    """The collecting process: a ``RolloutCollector`` serving collect, weights, policy and state commands.

    Ends quietly when the trainer is gone (its pipe closed): nobody is left to read an error.
    """
    from collectors.collector import RolloutCollector

    try:
        collector = RolloutCollector(env_fns, pickle.loads(policy_bytes), **kwargs)
    except Exception as e:
        send_to_parent(conn, ("error", _portable(e)))
        return
    commands = _CollectorCommands(collector, weights)
    with collector:
        if not send_to_parent(conn, ("ok", (collector.num_envs, collector.observation_space, collector.action_space))):
            return
        while True:
            try:
                command, arg = conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):  # the trainer is gone (killed mid-send)
                return
            if command == "close":
                return
            began = time.monotonic()
            try:
                reply = commands.answer(command, arg)
            except Exception as e:
                send_to_parent(conn, ("error", _portable(e)))
                if command == "collect":  # the collector closed itself: nothing more to serve
                    return
                continue
            # with how long it worked on it, and its deadline on its workers now (it may have stretched)
            if not send_to_parent(conn, ("ok", reply, time.monotonic() - began, workers_limit_s(collector))):
                return


def workers_limit_s(collector: Any) -> float:
    """The collector's deadline on a step of its workers (and of its own envs); 0 where it has none."""
    deadline = getattr(collector.stepper, "deadline", None)
    return deadline.limit("step") if deadline is not None else 0.0


class _CollectorCommands:
    """The commands the collecting process answers with its collector: the rollout shared with the trainer
    (made at the first collect, then written in place) and the policy weights the trainer writes."""

    def __init__(self, collector: Any, weights: dict[str, torch.Tensor] | None) -> None:
        self.collector, self.weights = collector, weights
        self.shared: TensorDict | None = None

    def answer(self, command: str, arg: Any) -> Any:
        """The reply to ``command`` (with its argument ``arg``)."""
        if command == "collect":
            return self._collected()
        if command == "weights":  # the trainer has written them into the shared copy
            self.collector.update_policy(self.weights)
            return None
        if command == "policy":
            pickled, self.weights = arg
            self.collector.update_policy(pickle.loads(pickled))
            return None
        if command == "get_state":
            return self.collector.get_state()
        if command == "set_state":
            return self.collector.set_state(*arg)
        raise ValueError(f"unknown command {command!r}")

    def _collected(self) -> tuple[TensorDict | None, Any]:
        """One rollout, written into the shared copy: ``(the shared copy at the first collect, else None;
        the rollout's episodes)``."""
        rollout = self.collector.collect()
        fresh = self.shared is None
        if fresh:
            self.shared = TensorDict({"rollout": rollout.batch, "next_observations": rollout.next_observations},
                                     batch_size=[]).clone().share_memory_()
        else:
            self.shared["rollout"].update_(rollout.batch)
            self.shared["next_observations"].copy_(rollout.next_observations)
        return (self.shared if fresh else None, rollout.episodes)


def _portable(error: Exception) -> Exception:
    """The error itself if it survives pickling, else a ``RuntimeError`` carrying its type, text and traceback."""
    text = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    try:
        copy = pickle.loads(pickle.dumps(error))
        if str(copy) == str(error):
            return error
    except Exception:
        pass
    return RuntimeError(f"in the collecting process: {text}")
