"""A deadline on the envs a collecting process steps itself (the async backend's ``main_share``): :class:`Watchdog`.

An async worker that hangs is noticed by the process waiting for its answer (:mod:`collectors.deadlines`); envs
stepped in the collecting process itself have nobody waiting for them. The watchdog is that somebody: a thread
which, once such a step has run past the worker's deadline, interrupts the main thread with SIGALRM
(``signal.pthread_kill``). The handler raises inside the step, and the step's caller raises
:class:`~collectors.processes.WorkerTimeoutError`, as for a silent worker.

What an interrupt reaches: a hang that comes back to the interpreter (Python code, ``time.sleep``, a blocking call
that returns on a signal, which Python retries only after running the handler). What it cannot: C code that
never comes back (a lock or system call retried inside a library). Such a process can only be ended. Where the
program has said how (:func:`last_resort`: the trainer saves its last completed iteration), the watchdog, once
:data:`GRACE_S` have passed since the interrupt, kills this collector's worker processes, calls that, and ends
the process (``os._exit(1)``); without it the process stays hung, as a library must not end its host. This
needs the C code to have released the GIL (blocked in a lock or a system call, as most do): one that holds it
stops every thread of the process, the watchdog's too, and only stepping no env in that process bounds it.

SIGALRM is shared with the trainer's stop-signal patience (``trainer.interrupts``): the handler is installed
while a watchdog is open, acts only on its own interrupt, and passes every other SIGALRM to the handler it
replaced. The watchdog's thread blocks all signals, so that a process-directed one (a Ctrl-C, the patience
timer) wakes the main thread as before.

Linux and macOS. Where there is no ``signal.pthread_kill`` (Windows), or where the collector is not made in the
main thread (only the main thread runs Python's signal handlers), nothing bounds those envs (:data:`CAN_BOUND`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from collectors.deadlines import Deadline
from collectors.processes import WorkerTimeoutError

GRACE_S = 5.0  # after the interrupt: a step not back in Python by then is stuck in C code
CAN_BOUND = hasattr(signal, "pthread_kill")  # Windows: no way to interrupt the main thread from another one
# what has been done about a call: nothing yet, interrupted, the interrupt raised in it, or (interrupted without
# a last resort to call) nothing more to do
_ARMED, _INTERRUPTED, _RAISED, _GIVEN_UP = range(4)
_last_resorts: list[Callable[[WorkerTimeoutError], None]] = []

T = TypeVar("T")


@contextlib.contextmanager
def last_resort(end: Callable[[WorkerTimeoutError], None]) -> Iterator[None]:
    """While inside: a call of this process's envs that an interrupt could not end (stuck in C code) ends the process.

    Its collector's worker processes are killed, ``end(error)`` is called in the watchdog's thread (save what must
    not be lost, say why; the main thread is stuck, so it touches nothing that thread would be in the middle of),
    innermost first where blocks are nested, then the process exits with status 1.
    """
    _last_resorts.append(end)
    try:
        yield
    finally:
        _last_resorts.remove(end)


class _Expired(BaseException):
    """Raised inside the call by the interrupt: not an ``Exception``, so that an env's own ``except Exception``
    (or :class:`~collectors.env_group.EnvGroup`'s, which reports an env's errors) does not catch it."""


class _Call:
    """One call under the deadline: its phase, when it began, its limit and what the watchdog has done about it."""

    __slots__ = ("phase", "started", "limit", "state", "interrupted_at")

    def __init__(self, phase: str, limit: float) -> None:
        self.phase, self.limit, self.state = phase, limit, _ARMED
        self.started = self.interrupted_at = time.monotonic()


_TAKEN = _Call("", 0.0)  # in place of the call the last resort has taken over: the main thread must not go on


class Watchdog:
    """Runs calls on this process's envs (:meth:`call`) under ``deadline``'s limit for their phase.

    ``processes``: the collector's worker processes (a list it may still fill), killed before a last resort;
    ``hosted``: which envs this process steps (``"envs 0-1"``), for the error (an attribute: the caller may
    name them better once they are built), after ``whose`` (``"the collecting process's own"``).

    Example:
        >>> import time
        >>> from collectors.deadlines import Deadline
        >>> from collectors.watchdog import Watchdog
        >>> dog = Watchdog(Deadline(0.5), [], "envs 0-1")
        >>> dog.call("step", time.sleep, 30)  # doctest: +SKIP
        Traceback (most recent call last):
        collectors.processes.WorkerTimeoutError: the collecting process's own envs 0-1 (pid ...) have been stuck ...
        >>> dog.close()
    """

    def __init__(self, deadline: Deadline, processes: Sequence[Any], hosted: str,
                 whose: str = "the collecting process's own") -> None:
        self.deadline = deadline
        self._processes = processes
        self.hosted, self.whose = hosted, whose
        self._current: _Call | None = None
        self._lock = threading.Lock()  # between the main thread leaving a call and the last resort taking it
        self._closing = threading.Event()
        self.active = CAN_BOUND and threading.current_thread() is threading.main_thread()
        if not self.active:
            return
        self._previous = signal.signal(signal.SIGALRM, self._interrupted)
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="env watchdog", daemon=True)
        self._thread.start()

    def call(self, phase: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, in this thread; :class:`WorkerTimeoutError` if it takes longer than the deadline's limit
        for ``phase`` (``"start"``, ``"reset"``, ``"step"``, ...). How long it took stretches the deadline.
        Unbounded outside the main thread, the only one the interrupt reaches."""
        if not self.active or threading.get_ident() != self._main:
            return fn(*args)
        call = _Call(phase, self.deadline.limit(phase))
        self._current = call
        try:
            try:
                result = fn(*args)
            finally:
                self._leave()
        except _Expired:
            self._leave()  # again: the interrupt may have come inside the first one
            raise self._timeout(call) from None
        if phase != "start":  # start-up says nothing about a step
            self.deadline.measured(time.monotonic() - call.started)
        return result

    def _leave(self) -> None:
        with self._lock:
            taken = self._current is _TAKEN
            self._current = None
        while taken:  # back from C code too late: the last resort is ending the process; nothing must go on
            try:
                threading.Event().wait()
            except BaseException:  # a stop signal's handler: the process is ending all the same
                pass

    def _interrupted(self, signum: int, frame: Any) -> None:
        call = self._current
        if call is not None and call.state == _INTERRUPTED:  # once: a later SIGALRM is not ours
            call.state = _RAISED
            raise _Expired
        if callable(self._previous):  # not ours: the trainer's stop-signal patience, or the program's own
            self._previous(signum, frame)

    def _timeout(self, call: _Call, stuck: bool = False) -> WorkerTimeoutError:
        took = time.monotonic() - call.started
        ended = (f", and an interrupt did not end it within {GRACE_S:g} s (stuck inside C code, or an env that "
                 "catches every exception): this process is ended" if stuck else "")
        return WorkerTimeoutError(
            f"{self.whose} {self.hosted} (pid {os.getpid()}) have been stuck in {call.phase} "
            f"for {took:.1f} s (limit {call.limit:.3g} s: a hung env {call.phase}; raise it with --worker-timeout / "
            f"worker_timeout){ended}")

    # ------------------------------------------------------------------ the watchdog's thread
    def _watch(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # signals are the main thread's to take
        while not self._closing.is_set():
            call = self._current
            if call is None or call is _TAKEN or call.state == _GIVEN_UP:
                self._closing.wait(self.deadline.floor_s)  # a call made meanwhile is due no sooner
                continue
            due = call.started + call.limit if call.state == _ARMED else call.interrupted_at + GRACE_S
            if self._closing.wait(due - time.monotonic()):
                return
            if call.state == _ARMED:
                self._interrupt(call)
            else:
                self._end_if_stuck(call)

    def _interrupt(self, call: _Call) -> None:
        with self._lock:
            if self._current is not call:
                return
            call.state, call.interrupted_at = _INTERRUPTED, time.monotonic()
        signal.pthread_kill(self._main, signal.SIGALRM)

    def _end_if_stuck(self, call: _Call) -> None:
        """The interrupt did not end ``call``: with a last resort, end the process; without, leave it hung."""
        with self._lock:
            if self._current is not call:
                return
            if not _last_resorts:
                call.state = _GIVEN_UP
                return
            self._current = _TAKEN
        error = self._timeout(call, stuck=True)
        for p in list(self._processes):
            with contextlib.suppress(Exception):  # one already gone
                p.kill()
        for end in reversed(_last_resorts):
            try:
                end(error)
            except Exception as e:  # the process ends all the same: say what could not be done
                print(f"while ending the process: {type(e).__name__}: {e}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)

    def close(self) -> None:
        """Stop the thread and give SIGALRM back (from the main thread; elsewhere the handler stays, passing on)."""
        if not self.active:
            return
        self.active = False
        self._closing.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGALRM) == self._interrupted:  # still ours: one put in after stays
            signal.signal(signal.SIGALRM, self._previous)
