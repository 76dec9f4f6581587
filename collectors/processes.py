"""How a collector starts the processes it runs (async workers, the background collecting process), and how
they end with it.

Where the platform has one (Linux, macOS), they are forked from a forkserver: one per process that starts
them, started with the first of them, which has imported torch, tensordict, gymnasium and the collectors
once. A worker then starts in tens of milliseconds rather than the seconds a fresh interpreter spends
importing torch (``benchmarks/worker_start.py``), shares those modules' memory with its siblings, and exits
without an interpreter's teardown. Like a spawned process it still imports the program's main module (the
``if __name__ == "__main__":`` guard stays necessary), finding torch and the rest loaded. Without a
forkserver (Windows) they are spawned. The forkserver is the program's one (multiprocessing keeps one per
process): started first by the program itself, without this preload, it serves collectors too, and their
processes then import torch each.

The forkserver is started while stop signals are held back (:func:`starting`), so a collector's process it
forks begins with them blocked until it ignores them (:func:`child_main`; the program's own processes forked
from it get them back at once). A collector's process forked from it closes its copy of the forkserver's
lifeline (:func:`die_with_parent`): the forkserver then exits as soon as the process that started it dies,
and takes with it everything it forked, hung or not. (A process the program itself forks later inherits
the lifeline too, and keeps the forkserver up for as long as it lives.) A program that ends normally, with
every process it forked ended, kills its forkserver (:func:`_stop_forkserver`) rather than leave it to tear
down its torch for a second after the program.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from collectors.deadlines import START_TIMEOUT_S
from collectors.stop_signals import STOP_SIGNALS, held_back, ignore_stop_signals, stop_signals_blocked

_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1  # <linux/prctl.h>
# what the processes a collector starts run, with everything they import
PRELOAD = ("collectors.backends.async_", "collectors.background")
_CHILD_MAINS: set[Callable[..., Any]] = set()  # the functions collectors' processes run (child_main)


class WorkerDiedError(RuntimeError):
    """A worker process exited while the collector was waiting for it."""


class WorkerTimeoutError(WorkerDiedError):
    """A worker stayed silent past its deadline (a hung env step, a stopped process): handled as a dead one."""


def how_it_ended(exitcode: int | None) -> str:
    """A dead process's exit code in words: a signal by its name, SIGKILL with its usual cause.

    >>> how_it_ended(-9), how_it_ended(1)
    ("killed by SIGKILL (the kernel's out-of-memory killer, or kill -9)", 'exit code 1')
    """
    if exitcode is None:  # its pipe closed, but it has not exited within the join
        return "no exit code yet"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"killed by {name}" + (" (the kernel's out-of-memory killer, or kill -9)" if name == "SIGKILL" else "")


class _Registered:
    """What multiprocessing's after-fork registry holds (weakly) for this module."""


_REGISTERED = _Registered()


def process_context(start_method: str | None = None) -> BaseContext:
    """The multiprocessing context a collector starts its processes with (:func:`start_method_of`'s), the
    forkserver's preloading :data:`PRELOAD`."""
    start_method = start_method_of(start_method)
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))  # read when the forkserver starts: a running one keeps its own
    return ctx


def start_method_of(start_method: str | None) -> str:
    """``start_method`` checked: ``"forkserver"``, ``"spawn"``, or for ``None`` (or ``"auto"``, as the trainer's
    ``start_method`` setting says it) forkserver where the platform has one and spawn elsewhere. ``"fork"`` is
    refused: this process runs threads (torch's, a resource sharer's), and a forked copy of a lock one of them
    held can hang the child for ever.

    >>> start_method_of("spawn")
    'spawn'
    """
    offered = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    if start_method in (None, "auto"):
        start_method = offered[0]
    if start_method == "fork":
        raise ValueError(f"start_method='fork' is refused for a collector's processes: a forked copy of a lock "
                         f"held by one of this process's threads (torch's) can hang the child; choose "
                         f"{' or '.join(map(repr, offered))}, or None (or 'auto') for {offered[0]!r}")
    if start_method not in offered:
        raise ValueError(f"start_method={start_method!r} is not a start method this platform offers a collector's "
                         f"processes: choose {' or '.join(map(repr, offered))}, or None (or 'auto') for {offered[0]!r}")
    return start_method


@contextlib.contextmanager
def starting(process: BaseProcess, ctx: BaseContext, timeout_s: float = START_TIMEOUT_S) -> Iterator[None]:
    """Start ``process`` (of ``ctx``) with stop signals held back
    (:func:`~collectors.stop_signals.stop_signals_blocked`) until the block ends: what the block does puts the
    process on record, to be shut down should a signal held back be delivered when it ends. The forkserver, if
    ``ctx`` uses one, is started inside that, so that a collector's process forked from it begins with them
    blocked until it ignores them (the program's own processes get them back as they start).

    The start is bounded: a forkserver's first fork waits for its imports (torch and the rest,
    :data:`PRELOAD`: seconds), and that wait gets ``timeout_s``. A forkserver that has not forked by then (an
    import that hangs), or that dies before it forks, is killed and raises :class:`WorkerTimeoutError` /
    :class:`WorkerDiedError` in one line; a stop signal held back meanwhile stops the wait at once (the
    forkserver is killed, and the signal is delivered as the block ends). Later starts from a forkserver that
    has forked, and spawned processes, are ``process.start()``: they wait on nothing that can hang.
    """
    with stop_signals_blocked():
        if ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()
        _start(process, ctx, timeout_s)
        yield


_forking: set[int] = set()  # forkservers (by pid) that have forked a process: ready, their imports done


def _start(process: BaseProcess, ctx: BaseContext, timeout_s: float) -> None:
    if ctx.get_start_method() != "forkserver":
        process.start()
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid in _forking:
        process.start()
        return
    failed: list[BaseException] = []

    def start_it() -> None:
        try:
            process.start()
        except BaseException as e:  # noqa: BLE001 - raised again below, in the caller's thread
            failed.append(e)

    pid, started_at = server._forkserver_pid, time.monotonic()
    thread = threading.Thread(target=start_it, name=f"start {process.name}", daemon=True)
    thread.start()
    while thread.is_alive() and time.monotonic() - started_at < timeout_s and not held_back():
        thread.join(0.05)
    what = f"the forkserver (pid {pid}) that starts this collector's processes (importing torch first)"
    if thread.is_alive():
        _kill_and_join(pid, thread)
        if held_back():  # raised in place of this as the block delivers the signal
            raise WorkerDiedError(f"{what} was stopped by a stop signal before it forked {process.name}")
        raise WorkerTimeoutError(
            f"{what} has not forked {process.name} within {timeout_s:.3g} s (an import that hangs?) and was "
            f"killed; look at what those imports load (a slow shared filesystem?), or start the processes with "
            f"start_method='spawn' (the trainer: start_method = \"spawn\" in a --config TOML file)")
    if failed:
        if isinstance(failed[0], (OSError, EOFError)):  # its pipe closed: the forkserver is gone
            raise WorkerDiedError(f"{what} ended before it forked {process.name} ({how_it_ended(_exit_code(pid))}; "
                                  f"what it printed is above); start the processes with start_method='spawn' "
                                  f"(the trainer: start_method = \"spawn\" in a --config TOML file) to import in "
                                  f"each of them instead") from None
        raise failed[0]
    _forking.add(pid)
    # after multiprocessing's own exit work (exit priority < 0: once it has joined this process's children)
    multiprocessing.util.Finalize(None, _stop_forkserver, args=(pid,), exitpriority=-10)


def _stop_forkserver(pid: int) -> None:
    """At exit, with no child left: kill the forkserver ``pid`` and reap it. Left to end by itself, it would tear
    down an interpreter that has imported torch, for about a second after the program has ended (reparented,
    using a core); it holds nothing to clean up, and every process it forked has ended."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid != pid or multiprocessing.active_children():  # replaced, or still serving someone
        return
    os.kill(pid, signal.SIGKILL)
    server._stop()  # reaps it and removes its socket file


def _kill_and_join(pid: int, thread: threading.Thread) -> None:
    """Kill the forkserver ``pid``: its end makes the start in ``thread`` read end-of-file at once (the thread is a
    daemon: should it not end within seconds, it is left). Returns once the forkserver has exited, not while it is
    exiting: its socket closes before its exit ends (freeing torch's memory takes a while on a busy machine), and
    the next collector's ``forkserver.ensure_running`` would otherwise take it for alive and connect to it."""
    os.kill(pid, signal.SIGKILL)
    thread.join(5.0)
    _exit_code(pid, patience_s=10.0)  # waits for the exit without reaping it (multiprocessing's waitpid does)


def _exit_code(pid: int, patience_s: float = 1.0) -> int | None:
    """The exit code (``-signal`` if killed) of this process's child ``pid`` once it has exited, ``None`` if it has not
    within ``patience_s``; the child is left to be reaped by its owner (multiprocessing's forkserver bookkeeping)."""
    if not hasattr(os, "waitid"):
        return None
    until = time.monotonic() + patience_s
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is not None:
            return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
        if time.monotonic() > until:
            return None
        time.sleep(0.01)


def child_main(target: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the module-level function a collector's process runs (started by :func:`collector_process`).

    In the process, before ``target`` runs: stop signals are ignored (they reach the whole process group and are
    the collector's to handle), the process shows its name (:func:`show_name`), takes the environment its
    collector had when it started it (a forkserver's children would otherwise have the forkserver's, from when
    it started), and dies with its collector (:func:`die_with_parent`); ``target`` is not run when the
    collector is already gone.
    """
    @functools.wraps(target)
    def main(environment: dict[str, str], *args: Any) -> Any:
        ignore_stop_signals()
        show_name()
        if os.environ != environment:
            os.environ.clear()
            os.environ.update(environment)
        if not die_with_parent():
            return None
        return target(*args)

    _CHILD_MAINS.add(main)
    return main


def collector_process(ctx: BaseContext, target: Callable[..., Any], args: tuple, name: str,
                      daemon: bool) -> BaseProcess:
    """A process of ``ctx`` that runs ``target(*args)``, a :func:`child_main`, with this process's environment;
    start it with :func:`starting`."""
    if target not in _CHILD_MAINS:
        raise TypeError(f"{target!r} is not decorated with collectors.processes.child_main")
    return ctx.Process(target=target, args=(dict(os.environ), *args), name=name, daemon=daemon)


def _unblock_others_forked_from_ours(_: object) -> None:
    """In a process just forked from a forkserver that this module's importer started (with stop signals held
    back, :func:`starting`): a process that is not a collector's (the program's own, through the same
    forkserver, which is one per program) gets stop signals as any process does."""
    process = multiprocessing.current_process()
    if (hasattr(signal, "pthread_sigmask") and getattr(process, "_target", None) not in _CHILD_MAINS
            and _forked_from_a_forkserver()):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def show_name() -> None:
    """Linux: this process's multiprocessing name (15 bytes of it) becomes its name in ``top``, ``ps -o comm``
    and ``psutil``: the processes forked from one forkserver share its command line, and this tells them apart."""
    import ctypes

    _prctl(_PR_SET_NAME, ctypes.c_char_p(multiprocessing.current_process().name.encode()[:15]))


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """In a process a collector started: be killed when that collector's process dies, even mid-way through a
    hung env step (Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; a training job of ``trainer.experiments.jobs``
    asks for SIGTERM, on which it saves and stops). Elsewhere the parent's end of the pipe closing
    ends the command loop, the fallback liveness check. Returns ``False`` when the collector's process is
    already gone (then exit).

    A spawned process is killed when its parent dies. A forked one's parent is the forkserver, which exits
    once every holder of its lifeline is gone: this closes the copy each forked process inherits, so the last
    holder is the process that started the forkserver. Linux sends the signal when the *thread* that started
    the process ends: start a collector from a thread that outlives it (the main thread, as the trainer does).

    multiprocessing's resource tracker goes with the workers: it exits once every process holding its pipe
    (the parent, which was killed, and its workers, which this kills) is gone.
    """
    _prctl(_PR_SET_PDEATHSIG, signum)
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


def _prctl(option: int, value: Any) -> None:
    """Linux's ``prctl(option, value)`` for this process; nothing elsewhere, or where libc has no prctl (then the
    name stays the interpreter's, and the closed pipe alone ends a worker whose collector died)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _forked_from_a_forkserver() -> bool:
    """Whether this process was forked from a forkserver and still holds its inherited end of the forkserver's
    lifeline (held in no public place)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    server = forkserver._forkserver
    # a forked process has the fd it inherited, and no forkserver of its own started yet
    return getattr(server, "_forkserver_alive_fd", None) is not None and getattr(server, "_forkserver_pid", 1) is None


def _close_forkserver_lifeline() -> bool:
    """In a process forked from a forkserver: close its inherited end of the forkserver's lifeline, and say
    whether there was one (``False`` in a spawned process)."""
    if not _forked_from_a_forkserver():
        return False
    from multiprocessing import forkserver

    os.close(forkserver._forkserver._forkserver_alive_fd)
    forkserver._forkserver._forkserver_alive_fd = None
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


# run in each process forked (by any start method) from a process that has imported this module, such as the
# forkserver, which imports it first of all (PRELOAD)
multiprocessing.util.register_after_fork(_REGISTERED, _unblock_others_forked_from_ours)
