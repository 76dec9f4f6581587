"""Stop signals as an exception at a safe point: SIGINT, SIGTERM, SIGUSR1 and SIGHUP during training.

A signal raises :class:`Interrupted` at once, unless it arrives inside a ``critical()``
section (taking the end-of-iteration snapshot, writing a checkpoint): then it is raised
when the section ends, so that no snapshot or file is ever half written. A section that waits on
other processes (the snapshot asks async workers for their envs' state) is given a
patience: a signal is raised at most that long after it arrived, abandoning the section,
so that a hung or stopped worker never holds a stop back. Once a stop is under way,
further signals (a second Ctrl-C while the checkpoint is saved) are noted and otherwise
ignored; in a command line (``until_exit``), until the process has exited.
"""

from __future__ import annotations

import atexit
import functools
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from collectors.stop_signals import handled_stop_signals

if TYPE_CHECKING:
    from trainer.common.world import World

STOP_PATIENCE_S = 5.0  # how long a stop signal waits for a section that waits on other processes
FINISHED = "after the run finished: nothing to stop"  # what a late signal is told
STOPPED = "ignored: the run is already stopping"
_CAN_BOUND = hasattr(signal, "setitimer")  # Windows: no interval timer, a patient section is a plain one


class Interrupted(KeyboardInterrupt):
    """Training was stopped by a signal; ``exit_status`` is the shell's convention (128 + signal number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_status = 128 + signum


class StopSignals:
    """Install the stop-signal handlers for a ``with`` block (main thread only; elsewhere a no-op).

    ``agreed``: a rank of a data-parallel run; a signal is only noted, and raised on every rank at the next
    :meth:`agree` (one rank alone must not leave the others waiting in a collective).

    ``until_exit``: the process exits once the block ends (a command line). Where a stop was under way or the
    work finished, the block then leaves stop signals noted and ignored (:func:`ignore_late_signals`) in place of
    its handlers, not the handlers from before it: a storm of signals that goes on after the stop's checkpoint is
    written cannot end the process with a later signal's exit status, or before it has said what was saved.

    Example:
        >>> with StopSignals() as signals:
        ...     with signals.critical():
        ...         pass  # a signal here is raised only after this block
        ...     with signals.critical(patience_s=5.0):
        ...         pass  # ... or 5 s after it arrived, whichever comes first
    """

    def __init__(self, until_exit: bool = False, agreed: bool = False) -> None:
        self.until_exit, self.agreed = until_exit, agreed
        self._depth = 0
        self._pending: int | None = None
        self.stopping = False
        self.finished = False
        self.late: int | None = None  # the first signal noted once finished (a caller running many runs heeds it)
        self._raised: int | None = None  # the signal of an Interrupted raised, until the stop is handled
        self._previous: dict[int, object] = {}
        self._patient = False  # inside a section with a patience: a pending signal is raised by SIGALRM
        self._patience_s = 0.0

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in handled_stop_signals():
                self._previous[signum] = signal.signal(signum, self._handle)
            if _CAN_BOUND:
                self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._patience_over)
        return self

    def __exit__(self, *exc) -> None:
        if self.until_exit and self._previous and (self.stopping or self.finished):  # no moment without a handler
            ignore_late_signals(STOPPED if self.stopping else FINISHED)
        for signum, handler in self._previous.items():
            if signum == signal.SIGALRM or signal.getsignal(signum) == self._handle:  # still ours (a command line
                signal.signal(signum, handler)  # may have put ignore_late_signals' in its place: that stays)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.finished:
            self.late = self.late or signum
            _note(FINISHED, signum, frame)
            return
        if self.stopping:
            _note("again: already stopping (what completed is being saved)", signum, frame)
            return
        if self._depth or self.agreed:
            if self._patient and self._pending is None:  # the first one sets the patience; others do not extend it
                signal.setitimer(signal.ITIMER_REAL, self._patience_s)
            self._pending = self._pending or signum
            return
        self._raise(signum)

    def _raise(self, signum: int) -> None:
        self.stopping, self._raised = True, signum
        raise Interrupted(signum)

    def _patience_over(self, signum: int, frame) -> None:
        """SIGALRM: a signal has waited ``patience_s`` for a patient section; raise it inside the section."""
        if self._patient and self._pending is not None and not self.stopping:
            self.stopping = True
            print(f"\n{signal.Signals(self._pending).name}: the snapshot did not finish within "
                  f"{self._patience_s:g} s (a worker is not answering); stopping at the previous one", file=sys.stderr)
            self._raise(self._pending)

    @contextmanager
    def critical(self, patience_s: float | None = None) -> Iterator[None]:
        """A section that a signal must not cut in two; the signal is raised when it ends.

        ``patience_s``: the section waits on other processes, and is abandoned (the signal raised
        inside it) once a signal has waited that long; the caller must then drop what it made.
        """
        patient = patience_s is not None and _CAN_BOUND and not self._patient and not self.agreed
        self._depth += 1
        if patient:
            self._patient, self._patience_s = True, patience_s
            if self._pending is not None:  # arrived just before: the patience runs from now
                signal.setitimer(signal.ITIMER_REAL, patience_s)
        try:
            yield
        finally:
            if patient:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._patient = False
            self._depth -= 1
        if not self._depth and self._pending is not None and not self.stopping and not self.agreed:
            if self.finished:  # the section finished the work: the signal that waited for it has nothing to stop
                _note(FINISHED, self._pending, None)
                self._pending = None
                return
            self._raise(self._pending)

    def raise_if_lost(self, world: World | None = None) -> None:
        """Raise again a stop that was raised but never handled: a handler runs wherever the main thread is, and
        there the ``Interrupted`` may be swallowed (a ``__del__``, a finaliser, a library's ``except
        BaseException``); every later signal then only says "already stopping". Called at each iteration's
        start, so that a stop is late by at most one iteration, never lost (a run next to busy loops once
        trained on for 15 minutes after its SIGTERM). Under torchrun (``agreed``), the ranks then :meth:`agree`."""
        if self._raised is not None:
            raise Interrupted(self._raised)
        if world is not None:
            self.agree(world)

    def agree(self, world: World) -> None:
        """Under torchrun (``agreed``): raise, on every rank, the stop any rank has received (the ranks stop at
        the same iteration boundary, where none is inside a collective); alone, nothing."""
        if self.agreed and not self.stopping:
            signum = world.most(self._pending or 0)
            if signum:
                self._pending = None
                self._raise(signum)

    def stop(self) -> None:
        """Mark a stop under way (an error, or the stop, is being handled): further signals wait for the save."""
        self.stopping, self._raised = True, None

    def finish(self) -> None:
        """The work is done and saved: from here on a signal (a scheduler's early warning) stops nothing."""
        self.finished = True


_NOTED: list[int] = []  # the stop signals noted since the run finished (a skippable block after it is skipped)


def _note(said: str, signum: int, frame) -> None:
    """A stop signal that stops nothing: ``SIGTERM {said}`` on a line of its own on stderr. Not said where it cannot
    be: the handler may run inside a write to stderr that the signal interrupted (Python's reentrant call error),
    or after the terminal is gone."""
    _NOTED.append(signum)
    with suppress(OSError, RuntimeError, ValueError):
        print(f"\n{signal.Signals(signum).name} {said}", file=sys.stderr)


def ignore_late_signals(said: str = FINISHED) -> None:
    """From here on (the run finished, or stopped with what it completed saved), note a stop signal (``said``)
    instead of stopping; once the interpreter exits, ignore it: Python's finalization puts the default action
    (death by the signal, exit status 128 + N) back in place of a Python handler, but leaves an ignored signal
    ignored."""
    _NOTED.clear()  # (a process may make several runs: what an earlier one noted is not this one's)
    for signum in handled_stop_signals():
        signal.signal(signum, functools.partial(_note, said))
    atexit.unregister(_ignore_stop_signals_at_exit)  # once, however many runs this process made
    atexit.register(_ignore_stop_signals_at_exit)


def _ignore_stop_signals_at_exit() -> None:
    for signum in handled_stop_signals():
        signal.signal(signum, signal.SIG_IGN)


class Skipped(BaseException):
    """A stop signal ended work that may be left undone (:func:`skippable`); ``signum`` says which. Not an
    ``Exception``, as ``KeyboardInterrupt`` is not: code that turns any error into its own (a loader that tries
    the next checkpoint) must not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def noted_signals() -> tuple[int, ...]:
    """The stop signals noted since the run finished (:func:`ignore_late_signals`), or that skipped a
    :func:`skippable` block, oldest first."""
    return tuple(_NOTED)


@contextmanager
def skippable() -> Iterator[None]:
    """For the block (work after the run is saved that may be left undone: the end-of-run validation), the first
    stop signal raises :class:`Skipped` in it; the handlers from before the block (a finished run's notes) meet
    any other, during it and after. A stop signal already noted since the run finished skips the block at once: a
    Ctrl-C pressed as the run ends, a moment before the block began, means it too."""
    before = {signum: signal.getsignal(signum) for signum in handled_stop_signals()}

    def skip(signum: int, frame) -> None:
        for other, handler in before.items():
            signal.signal(other, handler)
        _NOTED.append(signum)  # a stop that skipped this block skips the blocks after it too
        raise Skipped(signum)

    for signum in before:
        signal.signal(signum, skip)
    try:  # noted is checked once the handlers are ours: a signal noted a moment before is not missed
        if _NOTED:
            raise Skipped(_NOTED[-1])
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
