"""Several trainings at once on one machine: ``--jobs J`` of ``trainer.train --seeds`` and ``trainer.sweep``.

Each job is a process of its own (spawned: a clean torch, no forked threads) given its share of the machine,
``Machine.split(J)``: the cores and the memory divided by ``J``, so that the run layout of each training divides
that share as it would a machine of that size (``trainer.run_layout``), and ``J`` jobs never keep more processes
busy than there are cores. One job runs here, in this process, with the whole machine.

Stop signals: the jobs run in process groups of their own, so that a Ctrl-C at the terminal reaches this process
alone, which passes it to each job once (a job's trainer saves its last completed iteration and stops: a second
signal would only be noted). A job whose parent dies gets SIGTERM (Linux), which saves and stops it too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from collectors.stop_signals import handled_stop_signals
from trainer.run_layout import Machine

Work = Callable[[int, Machine], int]  # (the job's index, its share of the machine) -> its exit status


def run_jobs(work: Work, jobs: int, machine: Machine | None = None) -> list[int]:
    """``work(index, share)`` for each index in ``range(jobs)``, at once, each in a process of its own with its
    share of ``machine`` (detected if ``None``); ``jobs == 1`` runs it in this process. Returns their exit
    statuses, in index order, once every job has ended. ``work`` must pickle (a module's function, or a
    ``functools.partial`` of one).

    Example:
        >>> run_jobs(lambda index, share: 0, 1, Machine(cores=2))
        [0]
    """
    machine = machine or Machine.detect()
    if jobs == 1:
        return [work(0, machine)]
    share = machine.split(jobs)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_job, args=(work, index, share), name=f"job-{index}", daemon=False)
                 for index in range(jobs)]
    with _passing_stops_on(processes):
        for p in processes:
            p.start()
        for p in processes:
            _joined(p)
    return [p.exitcode if p.exitcode >= 0 else 128 - p.exitcode for p in processes]


def _job(work: Work, index: int, share: Machine) -> None:
    """A job's process: in a process group of its own (a terminal's Ctrl-C is its parent's to pass on once), and
    stopped (SIGTERM) if its parent dies."""
    from collectors.processes import die_with_parent

    os.setpgid(0, 0)
    if not die_with_parent(signal.SIGTERM):
        return
    sys.exit(work(index, share))


@contextlib.contextmanager
def _passing_stops_on(processes: list[multiprocessing.process.BaseProcess]) -> Iterator[None]:
    """For the block, a stop signal to this process is passed on to every job still running."""
    def pass_on(signum: int, _frame: object) -> None:
        for p in processes:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    previous = {s: signal.signal(s, pass_on) for s in handled_stop_signals()}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _joined(process: multiprocessing.process.BaseProcess) -> None:
    """Wait for ``process`` to end, a signal handler's run (passing a stop on) being no reason to stop waiting."""
    while process.exitcode is None:
        process.join(timeout=0.5)


@contextlib.contextmanager
def output_to(path: str | os.PathLike) -> Iterator[None]:
    """This process's standard output and error (the file descriptors: what its collector's worker processes
    print too) appended to ``path`` for the block: one job's training, while others share the terminal."""
    from checkpoints.files import appending  # (a FIFO planted there is refused, not waited for)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with appending(path) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def training_output(log: Path, alone: bool) -> Iterator[None]:
    """Where one training of a job prints: the terminal when it runs alone (its progress bar); else ``log``, with
    the whole traceback of an error (the terminal, shared by the jobs, gets the caller's one line)."""
    if alone:
        yield
        return
    with output_to(log):
        try:
            yield
        except Exception:
            traceback.print_exc()
            raise


def say(line: str) -> None:
    """``line`` on standard error in one write, its newline included: the jobs share the terminal, and two lines
    written at once must not run into each other (``print`` writes the newline apart)."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()
