"""The durable training loop, the same for every algorithm (``trainer.algorithm``): :func:`train`.

It owns the run directory and its lock, the run layout, the collector, one snapshot per completed iteration, and
the checkpoint written whatever ends the run. Which algorithm runs is ``trainer.registry``'s business alone; the
command line around it is ``trainer.train``'s, and the experiments that run it many times (seeds, sweeps) are
``trainer.experiments``'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import checkpoints
from collectors import make_collector
from collectors.resources import torch_threads
from collectors.watchdog import last_resort
from envs.settings import ConfigError
from trainer.algorithm import Algorithm, NonFiniteLossError
from trainer.arguments import command, counted
from trainer.common.devices import resolve_device
from trainer.common.progress import progress_bar, ticking
from trainer.common.world import ALONE, World, joined_world
from trainer.config import TrainConfig
from trainer.curriculum import Curriculum
from trainer.evaluation.validation import Validator
from trainer.interrupts import STOP_PATIENCE_S, Interrupted, StopSignals
from trainer.memory import check_memory
from trainer.metrics import MetricsLog, keep_metrics_until
from trainer.registry import algorithm_class
from trainer.run_files import claim_new_run_dir, resume_state
from trainer.run_layout import Machine, RunLayout, check_world, compile_kept_on_resume, run_layout
from trainer.thread_plan import RunThreads
from trainer.tracking import Trackers, check_trackers


class TrainingStopped(Interrupted):
    """:class:`Interrupted` after the checkpoint was written: says where it is."""

    def __init__(self, signum: int, run_dir: Path, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(signum)
        self.run_dir, self.iteration, self.checkpoint = run_dir, iteration, checkpoint


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, overwrite: bool = False, machine: Machine | None = None,
          preface: Sequence[str] = (), until_exit: bool = False,
          on_iteration: Callable[[dict], bool] | None = None) -> dict:
    """Run ``cfg.algo`` (``trainer.registry``) as configured (or continue the run at ``resume``); returns a
    summary. ``preface``: lines printed before the run layout's, once the run can start (the command line's).
    ``on_iteration(row)``: called with each completed iteration's metrics row once it is logged and any checkpoint
    due is written (a sweep's pruner); ``True`` ends the run there, saved. A stop signal waits for its answer.

    ``max_iterations`` stops early after that many iterations in total (the LR schedule
    still follows ``total_steps``), leaving a checkpoint to resume from. ``machine``
    replaces the detected one in the run layout and the memory check (tests simulate machines with it).
    ``until_exit``: the process exits once this returns or raises (the command line): from the moment the
    run stops or finishes, stop signals are noted and ignored until it has exited (``StopSignals``).

    Durability: after every completed iteration the whole state is snapshotted (in memory, under a signal
    guard); whatever ends the run (SIGINT, SIGTERM, SIGUSR1, an error), that snapshot is the checkpoint written,
    never a half-done iteration. A signal raises :class:`TrainingStopped` once the checkpoint is on disk.
    """
    with contextlib.ExitStack() as stack:
        world = stack.enter_context(joined_world(str(resolve_device(cfg.device)), cfg.worker_timeout))  # torchrun's
        signals = stack.enter_context(StopSignals(until_exit, agreed=world.size > 1))  # ranks stop together
        run, trackers, threads = _started_run(stack, cfg, resume, given or {}, max_iterations, overwrite, machine,
                                              preface, world)
        algorithm, stop = run.algorithm, run.stop
        last = _LastCompleted(algorithm, threads, signals, run.run_dir, run.source, world)
        validator = _validator(algorithm, run.run_dir, world)  # --eval-every: the best checkpoint
        bar = _progress_bar(progress, algorithm.iteration, stop, world, compiles=bool(run.layout.compile))
        plan_lines = ThreadPlanLines(run.run_dir, bar, world.lead)
        start = (algorithm.env_steps, time.perf_counter())
        with (_closed_at_end(bar), ticking(bar), _saved_when_failed(last), _metrics_log(run.run_dir, world) as log,
              last_resort(functools.partial(_stuck_in_c, bar, last))):
            while algorithm.iteration < stop:
                signals.raise_if_lost(world)  # (and under torchrun, a stop any rank received)
                counts, reweighed = threads.apply(), _reweighed(run.curriculum, algorithm, run.collector, bar)
                row = algorithm.iterate(start)  # a rollout, then the update on it
                if row is None:  # a rollout it chose not to learn from (PPO: too stale)
                    continue
                plan_lines.record(threads)  # its own time: before validation
                row.update(collect_threads=counts["collect"], learn_threads=counts["learn"], **reweighed,
                           **validator.evaluate(algorithm.iteration, algorithm.model))
                last.complete(row, log)  # logged and snapshotted: the iteration is complete
                _show(row, algorithm.recent, bar, trackers)
                last.save_if_due(validator, stop)
                if last.ended_by(on_iteration, row):
                    break
        summary = _ended(run, last, signals, world)
    # a stop signal while the run closed (its collector) stopped nothing: a caller running many runs stops there
    return {**summary, "late_signal": signals.late}


COMPILING = "compiling (first iteration)"  # the bar's label until the first iteration is done
CURRICULUM = "curriculum update"  # the bar's label while the curriculum measures the conditions


def _reweighed(curriculum: Curriculum | None, algorithm: Algorithm, collector: Any, bar: tqdm) -> dict[str, float]:
    """Where the curriculum is due before this iteration, its update (the envs reweighed before the rollout: an
    update redone after a resume gives the same weights), said on the bar while it runs, and its columns for the
    iteration's row."""
    if curriculum is None or not curriculum.due(algorithm.iteration):
        return {}
    shown = not bar.disable
    if shown:
        bar.set_description_str(CURRICULUM)
    try:
        return curriculum.update(algorithm.model, collector, algorithm.iteration)
    finally:
        if shown:
            bar.set_description_str("", refresh=False)


def _progress_bar(progress: bool, iteration: int, stop: int, world: World, compiles: bool) -> tqdm:
    """The iterations' progress bar: rank 0's, where ``progress`` asks for one and there are iterations left.
    Where the acting step ``compiles``, the bar says so until the first iteration is done (:func:`_show`): the
    compile makes that iteration a minute or more on a busy 2-core CPU (the cell recipe's set policy), and a bar
    at 0 with nothing said reads as a hang, in a terminal and in a log (where it is a line every 20 s)."""
    shown = progress and iteration < stop and world.lead
    return progress_bar(stop, COMPILING if compiles else None, shown=None if shown else False, initial=iteration,
                        unit="it")


@contextlib.contextmanager
def _closed_at_end(bar: tqdm) -> Iterator[None]:
    """``bar`` closed however the run ends, after any save (the terminal may be gone then: SIGHUP)."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            bar.close()


@contextlib.contextmanager
def _saved_when_failed(last: _LastCompleted) -> Iterator[None]:
    """Whatever ends the run early (an error, a stop signal), the last completed iteration saved first, and the
    error raised with where that is (:meth:`_LastCompleted.failed`)."""
    try:
        yield
    except BaseException as e:
        error = last.failed(e)
        if error is not e:
            raise error from None
        raise


@dataclasses.dataclass
class _Run:
    """A run as planned before any file is touched (:func:`_planned_run`)."""

    cfg: TrainConfig
    layout: RunLayout
    algorithm: Algorithm
    run_dir: Path
    iterations: int  # all of them: what --total-steps makes
    stop: int  # where this call stops (max_iterations)
    source: Path | None  # the checkpoint resumed from
    saved: dict | None  # what it holds (None: a new run)
    nothing_to_do: bool  # a resume already at stop: it changes no file of the run
    notes: list[str]  # said once the run can start
    collector: Any = None  # once started (:func:`_started_run`)
    curriculum: Curriculum | None = None  # curriculum_every: the envs' conditions reweighed

    @property
    def per_iteration(self) -> int:
        """Env steps per iteration."""
        return self.layout.batch_envs * self.cfg.num_steps


def _started_run(stack: contextlib.ExitStack, cfg: TrainConfig, resume: str, given: dict, max_iterations: int | None,
                 overwrite: bool, machine: Machine | None, preface: Sequence[str],
                 world: World) -> tuple[_Run, Trackers, RunThreads]:
    """The run ready for its first iteration, with its trackers and its threads: planned, its directory claimed
    and its config written, its lines said, its collector started, a resumed run's state restored (the lock, the
    trackers, the collector and the rest are closed by ``stack``). Under torchrun, rank 0 alone claims, writes,
    tracks and says; every rank starts its collector on its share of the envs."""
    run = _planned_run(cfg, resume, given, max_iterations, machine, world)
    notes = run.notes + world.from_lead(lambda: _claimed_run_dir(stack, run, overwrite))
    lead = world.lead
    if lead:
        _say_start(preface, run)
    cfg, layout, thread_plan = run.cfg, run.layout, run.saved.get("thread_plan") if run.saved else None
    cfg.run_dir = str(run.run_dir)
    if lead and not run.nothing_to_do:
        _write_config(run.run_dir, cfg, layout.to_dict(), thread_plan)
    trackers = stack.enter_context(Trackers.for_run(cfg, run.run_dir, lead and not run.nothing_to_do))
    collector = stack.enter_context(make_collector(
        layout.env_factories(), run.algorithm.acting, backend=cfg.backend, num_steps=cfg.num_steps,
        seed=layout.collector_seed(cfg.seed), **layout.collector_kwargs(), **run.algorithm.collector_options()))
    run.algorithm.attach(collector)
    run.collector, run.curriculum = collector, Curriculum.for_run(cfg)
    stack.enter_context(torch_threads(layout.learn_threads))  # restored at the end: RunThreads sets it anew
    threads = RunThreads.for_run(layout, cfg.threads, collector, run.iterations, thread_plan)
    # (a run with nothing left to train times no thread: its plan would be news of nothing)
    planned = [] if run.nothing_to_do else [threads.describe()]
    said = notes + _restored(run) + planned + trackers.describe() + ([run.curriculum.describe()] if run.curriculum
                                                                    and not run.nothing_to_do else [])
    for note in said if lead else ():
        print(note, file=sys.stderr)
    return run, trackers, threads


def _planned_run(cfg: TrainConfig, resume: str, given: dict, max_iterations: int | None,
                 machine: Machine | None, world: World = ALONE) -> _Run:
    """The run ``cfg`` (or the one at ``resume``) makes on ``machine``: what fails (a missing extra, memory, the
    layout, what the env cannot take) fails here, before any file is touched. Under torchrun, rank 0 reads the
    checkpoint and names a new run's directory, for every rank."""
    saved, source, notes = None, None, []
    if resume:  # read before the lock is taken: files are replaced atomically, and a typo creates nothing
        cfg, source, saved, notes = world.from_lead(lambda: resume_state(resume, given))
        cfg, kept = compile_kept_on_resume(cfg, saved["config"], given)
        notes += [kept] if kept else []
    # the extras the run needs, before any line about it
    check_trackers(cfg)
    if cfg.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("backend", "ray", "needs the ray extra: pip install -e '.[ray]'")
    # the run layout: computed once here; nothing below recomputes it
    check_world(cfg, world)  # before Machine.detect, which may start Ray
    machine = machine or Machine.detect(cfg.backend, cfg.ray_address, cfg.device)
    check_memory(cfg, machine)  # before the layout (its lists grow with --num-envs), any env and any buffer
    layout = run_layout(cfg, machine, world)  # checks the env id
    algorithm = algorithm_class(cfg.algo).new(cfg, layout)  # what the env cannot take fails before any write
    # a module:id env is named by its id: a colon in a path breaks Windows, and PATH-like lists elsewhere
    run_dir = Path(cfg.run_dir or world.from_lead(
        lambda: f"runs/{cfg.env.rpartition(':')[2]}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"))
    iterations = layout.iterations(cfg)
    stop = min(iterations, max_iterations or iterations)
    return _Run(cfg, layout, algorithm, run_dir, iterations, stop, source, saved,
                nothing_to_do=bool(resume) and saved["iteration"] >= stop, notes=notes)


def _claimed_run_dir(stack: contextlib.ExitStack, run: _Run, overwrite: bool) -> list[str]:
    """Lock the run directory (until ``stack`` closes) and make it this run's: a partial save removed, a resumed
    run's newer checkpoints set aside and its later metrics dropped, a new run's directory claimed; what was done,
    in notes."""
    lock = stack.enter_context(checkpoints.RunDirLock(run.run_dir))
    stack.enter_context(last_resort(functools.partial(_say_and_unlock, lock)))  # an env stuck in C ends the process
    notes = [lock.stale] if lock.stale else []
    partial = [] if run.nothing_to_do else checkpoints.remove_partial_saves(run.run_dir)  # ours now that the lock is
    if partial:
        notes.append(f"removed {counted(len(partial), 'partial checkpoint file')} of a save that never finished "
                     f"({', '.join(p.name for p in partial)})")
    if run.saved is not None and not run.nothing_to_do:
        revision = checkpoints.revision_of(run.source)
        moved = checkpoints.set_aside_newer(run.run_dir, run.saved["iteration"], revision)
        if moved:  # named as they are now: each has a name of its own, never one set aside before
            notes.append(f"set aside {', '.join(p.name for p in moved)} in {moved[0].parent}: newer than the "
                         "checkpoint resumed from")
        dropped = keep_metrics_until(run.run_dir / "metrics.jsonl", run.saved["iteration"])
        if dropped:
            notes.append(f"metrics.jsonl: dropped {counted(dropped, 'row')} of iterations after "
                         f"{run.saved['iteration']} (they are run again)")
    elif run.saved is None:
        notes += claim_new_run_dir(run.run_dir, overwrite)
    return notes


def _say_start(preface: Sequence[str], run: _Run) -> None:
    """The run's first lines on stderr, said once the run can start: an error of the layout, the env or the run
    directory (taken by another run, locked) is the one line, not the last of several."""
    print(*preface, run.layout.describe(), *(f"warning: {w}" for w in run.layout.warnings),
          *run.algorithm.start_notes(), sep="\n", file=sys.stderr)
    iterations, per_iteration, total = run.iterations, run.per_iteration, run.cfg.total_steps
    if iterations * per_iteration != total:  # said, not silently rounded
        print(f"note: --total-steps {total:,} is not a whole number of iterations of {per_iteration:,} env steps: "
              f"the run makes {iterations} ({iterations * per_iteration:,} env steps)", file=sys.stderr)


def _restored(run: _Run) -> list[str]:
    """Notes on where the run starts: a resumed run's state restored into its algorithm (and how it will differ:
    nothing, where no iteration is to come), and whether any iteration is left to do."""
    algorithm, notes = run.algorithm, []
    if run.saved is not None:
        differs = algorithm.restore(run.saved)
        notes += [f"resumed from {run.source} at iteration {algorithm.iteration}",
                  *(differs if algorithm.iteration < run.stop else [])]
    if algorithm.iteration >= run.stop:
        iterations, total = run.iterations, run.cfg.total_steps
        where = f"iteration {algorithm.iteration} of {iterations}" if algorithm.iteration <= iterations else \
            f"iteration {algorithm.iteration}, past the {iterations} that --total-steps {total:,} makes"
        notes.append(f"the run is already at {where}: nothing to do (pass a larger --total-steps to train longer)")
    return notes


class _LastCompleted:
    """The state at the end of the last completed iteration, in memory, and the newest checkpoint: what any end of
    the run saves, never a half-done iteration. Under torchrun every rank takes the snapshot (it gathers every
    rank's envs) and rank 0 alone saves it."""

    def __init__(self, algorithm: Algorithm, threads: RunThreads, signals: StopSignals, run_dir: Path,
                 resumed_from: Path | None, world: World) -> None:
        self.algorithm, self.threads, self.signals, self.run_dir = algorithm, threads, signals, run_dir
        self.world = world
        self.snapshot = self.taken()
        self.saved_at = algorithm.iteration if algorithm.iteration else None  # resumed: that state is on disk already
        self.last_saved = resumed_from

    def taken(self) -> dict:
        """The whole state now, with the thread plan (it may wait on workers: a stop never waits for a hung one)."""
        with self.signals.critical(patience_s=STOP_PATIENCE_S):
            return {**self.algorithm.snapshot(), "thread_plan": self.threads.state()}

    def complete(self, row: dict, log: MetricsLog) -> None:
        """Complete the iteration: it is complete once its snapshot and its metrics ``row`` exist."""
        with self.signals.critical():
            completed = self.taken()  # abandoned if it waits too long: the previous one is saved
            log.append(row)  # whole or not at all: if it fails, the previous iteration is the last completed
            self.snapshot = completed

    def save(self) -> Path:
        """The checkpoint the last completed iteration is saved in now."""
        with self.signals.critical():
            self.last_saved = checkpoints.save_in_run_dir(self.run_dir, self.snapshot, self.snapshot["iteration"],
                                                          self.algorithm.cfg.keep_checkpoints)
            self.saved_at = self.snapshot["iteration"]
        return self.last_saved

    def save_if_due(self, validator: Validator, stop: int) -> None:
        """Save the completed iteration where it is due: every ``--checkpoint-every``, the run's last (``stop``), a
        new best validation; rank 0 alone."""
        iteration = self.algorithm.iteration
        if self.world.lead and (iteration % self.algorithm.cfg.checkpoint_every == 0 or iteration == stop
                                or validator.improved):
            validator.saved(self.save())

    def ended_by(self, on_iteration: Callable[[dict], bool] | None, row: dict) -> bool:
        """Whether ``on_iteration`` (:func:`train`'s caller) ends the run after the completed iteration ``row``; if it
        does, that iteration is saved first."""
        if on_iteration is None:
            return False
        with self.signals.critical():  # a caller's bookkeeping (a study's database) is never cut in two
            end = on_iteration(row)
        if end and self.world.lead and self.saved_at != self.snapshot["iteration"]:
            self.save()
        return bool(end)

    def failed(self, e: BaseException) -> BaseException:
        """What ends the run, once the last completed iteration is saved: ``e`` with notes saying where it is (a stop
        signal: :class:`TrainingStopped`)."""
        self.signals.stop()  # a signal from here on waits: the snapshot is saved first
        done = self.snapshot["iteration"]
        if done and self.saved_at != done and self.world.lead and not isinstance(e, checkpoints.CheckpointError):
            try:
                self.save()
            except checkpoints.CheckpointError as why:
                print(f"could not save the last completed iteration: {why}", file=sys.stderr)
        where = (f"the newest checkpoint {self.last_saved} holds iteration {self.saved_at}" if self.last_saved
                 else "no iteration was completed, nothing to save" if not done
                 else f"rank 0 writes the checkpoints: the newest is {Path(self.run_dir) / 'checkpoints' / 'latest'}"
                 if not self.world.lead else f"iteration {done} completed but no checkpoint could be written")
        if isinstance(e, KeyboardInterrupt):
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            return TrainingStopped(signum, self.run_dir, self.saved_at or 0, self.last_saved)
        if isinstance(e, NonFiniteLossError):
            return NonFiniteLossError(f"{e}; {where}")
        # notes (PEP 678), so that they follow the error's own line, wherever it is printed
        _add_note(e, f"training failed: {where}")
        if self.last_saved or done and not self.world.lead:  # an env error, a dead worker or rank: what was saved
            resume = train_command("--resume", str(Path(self.run_dir).resolve()))
            _add_note(e, f"resume:        {resume}")
        return e


def _ended(run: _Run, last: _LastCompleted, signals: StopSignals, world: World) -> dict:
    """The run's summary once its loop has ended, its algorithm's end notes said (rank 0's)."""
    for note in run.algorithm.end_notes() if world.lead else ():
        print(note, file=sys.stderr)
    summary = _summary(run, last.last_saved)
    signals.finish()  # closing the collector (a rollout may be in flight) must not turn into a stop
    return summary


def _validator(algorithm: Algorithm, run_dir: Path, world: World) -> Validator:
    """The run's validation, from where the run starts (rank 0's alone: it writes the run's files)."""
    cfg = algorithm.cfg if world.lead else dataclasses.replace(algorithm.cfg, eval_every=0)
    return Validator(cfg, run_dir, algorithm.iteration)


class _NoMetrics:
    """A rank's metrics under torchrun, other than rank 0's: every rank computes the same rows, rank 0 writes them."""

    def append(self, row: dict) -> None:
        pass


def _metrics_log(run_dir: Path, world: World) -> contextlib.AbstractContextManager:
    """``metrics.jsonl``, open for appending (rank 0's alone)."""
    return MetricsLog(run_dir / "metrics.jsonl") if world.lead else contextlib.nullcontext(_NoMetrics())


def _stuck_in_c(bar: tqdm, last: _LastCompleted, error: Exception) -> None:
    """The last resort (``collectors.watchdog``): an env of this process is stuck where no interrupt reaches it,
    and the process is about to end. Run in the watchdog's thread, this one being stuck: what the error path
    of :func:`train` does, but for raising (``train``'s own last resort prints the error)."""
    with contextlib.suppress(OSError):
        bar.close()
    last.failed(error)


SAY_PLANS_EVERY_S = 60.0  # a change of thread plan on the terminal at most this often; every one in threads.log


class ThreadPlanLines:
    """What a run's thread plan says as it changes: on the terminal at most once a minute (on a busy machine it may
    plan again every few iterations, and the lines would bury the progress bar), each change in the run's
    ``threads.log``; a plan made (not one begun) kept in ``config.json``, which keeps the last one. Rank 0 alone
    (``lead``) under torchrun.

    Example (a change of plan each second: the first is said, the next two only logged):
        >>> import io, tempfile; from pathlib import Path
        >>> class Changes:  # a thread plan that changes at every record
        ...     def record(self): return "threads: planning again"
        ...     def state(self): return {"chosen": None}
        >>> lines = ThreadPlanLines(Path(tempfile.mkdtemp()), tqdm(file=io.StringIO()), lead=True)
        >>> [lines.record(Changes(), now=t) for t in (0.0, 1.0, 2.0)]
        [True, False, False]
        >>> lines.record(Changes(), now=61.0), len((lines.run_dir / "threads.log").read_text().splitlines())
        (True, 4)
    """

    def __init__(self, run_dir: Path, bar: tqdm, lead: bool) -> None:
        self.run_dir, self.bar, self.lead = run_dir, bar, lead
        self.said_at, self.unsaid = float("-inf"), 0

    def record(self, threads: RunThreads, now: float | None = None) -> bool:
        """Record the iteration's time in the plan; whether a change was said on the terminal."""
        changed = threads.record()
        if not (changed and self.lead):
            return False
        try:
            with checkpoints.appending(self.run_dir / "threads.log") as log:
                log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {changed}\n")
            if threads.state()["chosen"]:
                _record_thread_plan(self.run_dir / "config.json", threads.state())
        except (OSError, ValueError) as e:  # a FIFO put in place of either, say: said, and the run goes on
            self.bar.write(f"threads: the change could not be kept in {self.run_dir} "
                           f"({getattr(e, 'strerror', None) or e})", file=sys.stderr)
        now = time.monotonic() if now is None else now
        if now - self.said_at < SAY_PLANS_EVERY_S:
            self.unsaid += 1
            return False
        more = f" ({counted(self.unsaid, 'more change')} in threads.log)" if self.unsaid else ""
        self.bar.write(changed + more, file=sys.stderr)
        self.said_at, self.unsaid = now, 0
        return True


def _show(row: dict, recent: Sequence[float], bar: tqdm, trackers: Trackers) -> None:
    """A completed iteration's metrics ``row`` on the progress bar and in the run's ``trackers``."""
    trackers.log(row)
    if not bar.disable and bar.desc:  # the compiling label: the first iteration is done
        bar.set_description_str("", refresh=False)
    bar.update(1)
    bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{np.mean(recent):.2f}" if recent else "-")


def _summary(run: _Run, checkpoint: Path | None) -> dict:
    """What :func:`train` returns: where the run is, its newest ``checkpoint``, the algorithm's own figures, and the
    --total-steps that trains it longer (whole iterations: the command it goes into says nothing of rounding)."""
    algorithm = run.algorithm
    longer = algorithm.longer_total_steps()
    started_at = run.saved["iteration"] if run.saved else 0
    return {"run_dir": str(run.run_dir), "iterations": algorithm.iteration, "env_steps": algorithm.env_steps,
            "checkpoint": str(checkpoint) if checkpoint else None, **algorithm.summary(),
            "longer_total_steps": -(-longer // run.per_iteration) * run.per_iteration,
            "recent_return": float(np.mean(algorithm.recent)) if algorithm.recent else None,
            "finished": algorithm.iteration >= run.iterations, "trained": algorithm.iteration > started_at,
            "config": run.cfg.to_dict()}


def _write_config(run_dir: Path, cfg: TrainConfig, layout: dict, thread_plan: dict | None) -> None:
    """``config.json``: the run's settings, its layout, and its thread plan once there is one."""
    checkpoints.files.write_whole(run_dir / "config.json", json.dumps(
        {"config": cfg.to_dict(), "layout": layout, "thread_plan": thread_plan}, indent=2))


def _record_thread_plan(config: Path, thread_plan: dict | None) -> None:
    """Put a new thread plan into ``config.json``, replaced whole (a kill leaves the old file or the new one)."""
    stored = json.loads(checkpoints.read_small_file(config))
    checkpoints.files.write_whole(config, json.dumps({**stored, "thread_plan": thread_plan}, indent=2))


def _say_and_unlock(lock: checkpoints.RunDirLock, error: Exception) -> None:
    """The process ends (``collectors.watchdog.last_resort``, after the loop's own, :func:`_stuck_in_c`, has saved
    what was completed): say why, as ``trainer.train.main`` says an error, and give the run directory back."""
    print(error_text(error), file=sys.stderr)
    lock.release()


def error_text(error: BaseException) -> str:
    """An error as the command line prints it: ``error: ...``, then its notes (where the run stands, the resume)."""
    return "\n".join([f"error: {error}".rstrip(), *getattr(error, "__notes__", ())])


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also on Python 3.10 (where the traceback does not print it; ``main`` does)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]


TORCHRUN_LOGS = "torchrun"  # torchrun's --log-dir in a run directory, as the printed commands and the docs pass it


def train_command(*args: str) -> str:
    """``python -m trainer.train ARGS`` as :func:`trainer.arguments.command` prints it (the resume command of a
    failed run's note); under torchrun on one node, the torchrun command with as many ranks (a run resumes at any
    world size: docs/distributed.md), torchrun's own log folder in the run resumed (``--log-dir RUN/torchrun``:
    nothing of the run in the system's temporary folder)."""
    world = World.from_environment()
    if world.size > 1 and world.nodes == 1:
        logs = ["--log-dir", str(checkpoints.run_dir_of(args[args.index("--resume") + 1]) / TORCHRUN_LOGS)] \
            if "--resume" in args else []
        return command("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world.local_size),
                       *logs, "-m", "trainer.train", *args)
    return command("-m", "trainer.train", *args)
