"""The signals that stop a run (Ctrl-C, a scheduler's SIGTERM, an early-warning SIGUSR1, the SIGHUP of a closed
terminal), and how the processes a collector starts leave them to the process that started them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

# multiprocessing is imported where it is used: `python -m trainer.train` sets its stop-signal
# handlers from this module before anything else loads, and each millisecond before that is one in which a
# Ctrl-C prints an import traceback

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP")
                     if hasattr(signal, name))


def handled_stop_signals() -> tuple[int, ...]:
    """The stop signals this process should handle: those not ignored when it started (``nohup`` ignores
    SIGHUP so that the run outlives its terminal; that choice is the user's and stays)."""
    return tuple(s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN)


def exit_at_once_on_stop_signals(said: str) -> dict[int, Any]:
    """Until the returned handlers are put back: a stop signal prints ``"\\nSIGINT while starting: {said}"`` and
    ends the process at once, exit status 128 + the signal (``os._exit``). For a command's start-up, while it
    imports torch and the rest: raised as an exception there, a signal may abort the process from inside torch's
    C++ initialisation, break numpy's import, or be printed and ignored inside a finalizer while the command
    goes on; until the command starts its work nothing is open that an exit must close."""
    def stopped_while_starting(signum: int, frame: Any) -> None:
        if said:  # (empty: another process says it)
            print(f"\n{signal.Signals(signum).name} while starting: {said}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    return {s: signal.signal(s, stopped_while_starting) for s in handled_stop_signals()}


@contextlib.contextmanager
def exiting_at_once_on_stop_signals(said: str) -> Iterator[None]:
    """:func:`exit_at_once_on_stop_signals` for a ``with`` block (the imports of a command that has started)."""
    previous = exit_at_once_on_stop_signals(said)
    try:
        yield
    finally:
        restore_handlers(previous)


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put back the signal handlers :func:`exit_at_once_on_stop_signals` replaced (what it returned)."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


_held: list[int] = []  # stop signals caught while held back (:func:`stop_signals_blocked`), to be delivered after


def _hold(signum: int, frame: Any) -> None:
    _held.append(signum)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold stop signals back for a block that must happen whole (a checkpoint and its pointers written): in the
    main thread, where Python runs every handler, the handlers are replaced meanwhile by one that only notes the
    signal; when the block ends, each signal noted is delivered to the handler it would have met (which may raise
    there, once the block is done). Elsewhere, nothing is held.

    Example:
        >>> import os, signal
        >>> said = []
        >>> before = signal.signal(signal.SIGUSR1, lambda signum, frame: said.append("delivered"))
        >>> with stop_signals_held():
        ...     os.kill(os.getpid(), signal.SIGUSR1)  # noted, not delivered, inside the block
        ...     said.append("whole")
        >>> said
        ['whole', 'delivered']
        >>> _ = signal.signal(signal.SIGUSR1, before)
    """
    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, _hold) for s in STOP_SIGNALS
                    if signal.getsignal(s) not in (signal.SIG_IGN, None)}  # (None: a C handler, not ours to swap)
    caught_before = len(_held)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        caught = list(dict.fromkeys(_held[caught_before:]))
        del _held[caught_before:]
        raised: BaseException | None = None
        for signum in caught:  # to the handler it would have met (an outer block's _hold notes it again)
            try:
                signal.raise_signal(signum)
            except BaseException as error:  # (a Ctrl-C's KeyboardInterrupt): the others are delivered first
                raised = raised or error
        if raised is not None:
            raise raised


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Hold stop signals back while starting a process: the parent is not cut off mid-way through
    sending it its start-up data, and the child inherits the blocked mask until it ignores them
    (see :func:`ignore_stop_signals`), so a Ctrl-C during its imports prints no traceback. A signal held
    back is delivered, to the handler it would have met, when the block ends.

    Blocking them in this thread is not enough where the process has other threads (torch's, started with
    them unblocked): the kernel gives the signal to one of those, and Python runs its handler here all the
    same. In the main thread, the handlers are therefore replaced meanwhile by one that only notes the
    signal (:func:`stop_signals_held`; :func:`held_back` says whether one came).
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: nothing to hold back
        yield
        return
    # multiprocessing's resource tracker, started by the first spawn, unblocks SIGINT and SIGTERM when it
    # starts: started here, it cannot open the window in which a Ctrl-C reaches a child still importing
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    with stop_signals_held():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a signal pending in this thread meets _hold here


def held_back() -> bool:
    """Inside :func:`stop_signals_blocked`: whether a stop signal came, and waits for the block to end."""
    pending = signal.sigpending() if hasattr(signal, "sigpending") else set()
    return bool(_held) or bool(pending & set(STOP_SIGNALS))


def leave_ctrl_c_to_the_parent() -> None:
    """In a pool's worker: Ctrl-C reaches the whole process group, and the parent says it once and ends the pool
    (its end terminates the workers, so they keep SIGTERM's default, unlike :func:`ignore_stop_signals`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def ignore_stop_signals() -> None:
    """In a worker: Ctrl-C, a scheduler's SIGTERM, an early-warning SIGUSR1 or a closed terminal's SIGHUP reach
    the whole process group; they are the parent's to handle (it takes the envs' state, then shuts the workers
    down)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # what arrived while blocked is now discarded
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

