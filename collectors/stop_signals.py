"""The signals that stop a run (Ctrl-C, a scheduler's SIGTERM, an early-warning SIGUSR1), and how the processes
a collector starts leave them to the process that started them."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Hold stop signals back while starting a process: the parent is not cut off mid-way through
    sending it its start-up data, and the child inherits the blocked mask until it ignores them
    (see :func:`ignore_stop_signals`), so a Ctrl-C during its imports prints no traceback."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: nothing to hold back
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a signal held back is delivered here


def ignore_stop_signals() -> None:
    """In a worker: Ctrl-C, a scheduler's SIGTERM or an early-warning SIGUSR1 reach the whole process
    group; they are the parent's to handle (it takes the envs' state, then shuts the workers down)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # what arrived while blocked is now discarded
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
