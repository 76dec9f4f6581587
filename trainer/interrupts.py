"""Stop signals as an exception at a safe point: SIGINT, SIGTERM and SIGUSR1 during training.

A signal raises :class:`Interrupted` at once, unless it arrives inside a ``critical()``
section (taking the end-of-iteration snapshot, writing a checkpoint): then it is raised
when the section ends, so that no snapshot or file is ever half written. Once a stop is
under way, further signals (a second Ctrl-C while the checkpoint is saved) are noted
and otherwise ignored.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from collectors.stop_signals import STOP_SIGNALS


class Interrupted(KeyboardInterrupt):
    """Training was stopped by a signal; ``exit_status`` is the shell's convention (128 + signal number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_status = 128 + signum


class StopSignals:
    """Install the stop-signal handlers for a ``with`` block (main thread only; elsewhere a no-op).

    Example:
        >>> with StopSignals() as signals:
        ...     with signals.critical():
        ...         pass  # a signal here is raised only after this block
    """

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self.stopping = False
        self.finished = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.finished:
            _after_the_run(signum, frame)
            return
        if self.stopping:
            print(f"\n{signal.Signals(signum).name} again: already stopping, the checkpoint is being written",
                  file=sys.stderr)
            return
        if self._depth:
            self._pending = self._pending or signum
            return
        self.stopping = True
        raise Interrupted(signum)

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A section that a signal must not cut in two; the signal is raised when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._pending is not None and not self.stopping:
            self.stopping = True
            raise Interrupted(self._pending)

    def stop(self) -> None:
        """Mark a stop under way (an error is being handled): further signals wait for the save."""
        self.stopping = True

    def finish(self) -> None:
        """The work is done and saved: from here on a signal (a scheduler's early warning) stops nothing."""
        self.finished = True


def _after_the_run(signum: int, frame) -> None:
    """After the run finished, a stop signal (a scheduler's early warning) has nothing left to stop."""
    print(f"\n{signal.Signals(signum).name} after the run finished: nothing to stop", file=sys.stderr)


def ignore_late_signals() -> None:
    """From here on (the run finished and its handlers are gone), note a stop signal instead of stopping."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _after_the_run)
