"""How a collector starts the processes it runs (async workers, the background collecting process), and how
they end with it.

Where the platform has one (Linux, macOS), they are forked from a forkserver: one per process that starts
them, started with the first of them, which has imported torch, tensordict, gymnasium and the collectors
once. A worker then starts in tens of milliseconds rather than the seconds a fresh interpreter spends
importing torch (``benchmarks/worker_start.py``), shares those modules' memory with its siblings, and exits
without an interpreter's teardown. Like a spawned process it still imports the program's main module (the
``if __name__ == "__main__":`` guard stays necessary), finding torch and the rest loaded. Without a
forkserver (Windows) they are spawned.

The forkserver is started while stop signals are held back (:func:`starting`), so it and every process it
forks begin with them blocked until they ignore them. A process forked from it closes its copy of the
forkserver's lifeline (:func:`die_with_parent`): the forkserver then exits as soon as the process that
started it dies, and takes with it everything it forked, hung or not.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from collectors.stop_signals import stop_signals_blocked

_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1  # <linux/prctl.h>
# what the processes a collector starts run, with everything they import
PRELOAD = ("collectors.backends.async_", "collectors.background")


def process_context(start_method: str | None = None) -> BaseContext:
    """The multiprocessing context a collector starts its processes with.

    ``start_method``: ``"forkserver"`` (preloading :data:`PRELOAD`), ``"spawn"``, or ``None`` for forkserver
    where the platform has one and spawn elsewhere. ``"fork"`` is refused: this process runs threads (torch's,
    a resource sharer's), and a forked copy of a lock one of them held can hang the child for ever.
    """
    offered = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    if start_method is None:
        start_method = offered[0]
    if start_method not in offered:
        raise ValueError(f"start_method={start_method!r} is not one this platform offers a collector's processes: "
                         f"choose {' or '.join(map(repr, offered))}, or None for {offered[0]!r}"
                         + (" (fork is refused: a forked copy of a lock held by one of this process's threads "
                            "can hang the child)" if start_method == "fork" else ""))
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))  # read when the forkserver starts: a running one keeps its own
    return ctx


@contextlib.contextmanager
def starting(ctx: BaseContext) -> Iterator[None]:
    """Around ``Process.start()``: stop signals held back (:func:`~collectors.stop_signals.stop_signals_blocked`),
    and the forkserver, if ``ctx`` uses one, started inside that, so that it and every process forked from it
    begin with them blocked. A signal held back is delivered when the block ends."""
    with stop_signals_blocked():
        if ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()
        yield


def show_name() -> None:
    """Linux: this process's multiprocessing name (15 bytes of it) becomes its name in ``top``, ``ps -o comm``
    and ``psutil``: the processes forked from one forkserver share its command line, and this tells them apart."""
    if sys.platform.startswith("linux"):
        import ctypes

        name = multiprocessing.current_process().name.encode()[:15]
        try:
            ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the name stays the interpreter's
            pass


def die_with_parent() -> bool:
    """In a process a collector started: be killed when that collector's process dies, even mid-way through a
    hung env step (Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``). Elsewhere the parent's end of the pipe closing
    ends the command loop, the fallback liveness check. Returns ``False`` when the collector's process is
    already gone (then exit).

    A spawned process is killed when its parent dies. A forked one's parent is the forkserver, which exits
    once every holder of its lifeline is gone: this closes the copy each forked process inherits, so the last
    holder is the process that started the forkserver. Linux sends the signal when the *thread* that started
    the process ends: start a collector from a thread that outlives it (the main thread, as the trainer does).

    multiprocessing's resource tracker goes with the workers: it exits once every process holding its pipe
    (the parent, which was killed, and its workers, which this kills) is gone.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the closed pipe still ends the loop
            pass
    parent = multiprocessing.parent_process()
    if parent is None:
        return True
    if _close_forkserver_lifeline():
        return _alive(parent.pid)  # the forkserver may have gone with it before prctl took effect
    return os.getppid() == parent.pid  # it may have died before prctl took effect


def send_to_parent(conn: Connection, message: Any) -> bool:
    """In a process a collector started: send ``message`` up its pipe; ``False`` when the collector's process is
    gone (a forked process may outlive it by the moment its forkserver takes to exit: it leaves quietly)."""
    try:
        conn.send(message)
        return True
    except OSError:
        return False


def _close_forkserver_lifeline() -> bool:
    """In a process forked from a forkserver: close its inherited end of the forkserver's lifeline, and say
    whether there was one (``False`` in a spawned process)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    server = forkserver._forkserver  # its lifeline is held in no public place
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:  # spawned, or this process's own server
        return False
    os.close(fd)
    server._forkserver_alive_fd = None
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
