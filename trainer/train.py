"""Train a policy: ``python -m trainer.train`` (PPO on VR-edge with defaults; ``--algo apex`` for Ape-X;
``--help`` for every flag).

:func:`train` is the durable loop, the same for every algorithm (``trainer.algorithm``): the run directory and
its lock, the run layout, the collector, one snapshot per completed iteration, the checkpoint written whatever
ends the run. Which algorithm runs is ``trainer.registry``'s business alone.
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # first of all: the window for an import traceback is Python's own start-up alone
    from collectors.stop_signals import exit_at_once_on_stop_signals

    # a stop signal while torch and the rest load: one line, not an import traceback (handlers restored below)
    _STARTING = exit_at_once_on_stop_signals("nothing to save, nothing was written; run the same command again")

from trainer.flags import RESUMABLE_CHANGES, CommandLine, build_parser, defaults_used, parse_args

if __name__ == "__main__":
    COMMAND_LINE = parse_args()  # the command line checked (--help answered) before torch loads: seconds, not ten

import contextlib
import functools
import importlib.util
import json
import math
import multiprocessing
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

import checkpoints
from collectors import EnvError, RayConnectError, WorkerDiedError, make_collector
from collectors.resources import torch_threads
from collectors.watchdog import last_resort
from envs.vr_edge import MEMORY_ARGUMENTS, VREdgeConfig
from trainer.algorithm import Algorithm, NonFiniteLossError
from trainer.arguments import counted
from trainer.common.devices import learner_device
from trainer.common.spaces import action_heads, model_spaces
from trainer.config import ConfigError, EnvSizes, TrainConfig
from trainer.evaluation.validation import Validator
from trainer.interrupts import STOP_PATIENCE_S, Interrupted, StopSignals
from trainer.metrics import MetricsLog, keep_metrics_until
from trainer.registry import algorithm_class
from trainer.run_files import claim_new_run_dir, resume_state
from trainer.run_layout import Machine, compile_kept_on_resume, run_layout
from trainer.thread_plan import RunThreads


class TrainingStopped(Interrupted):
    """:class:`Interrupted` after the checkpoint was written: says where it is."""

    def __init__(self, signum: int, run_dir: Path, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(signum)
        self.run_dir, self.iteration, self.checkpoint = run_dir, iteration, checkpoint


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, overwrite: bool = False, machine: Machine | None = None,
          preface: Sequence[str] = (), until_exit: bool = False) -> dict:
    """Run ``cfg.algo`` (``trainer.registry``) as configured (or continue the run at ``resume``); returns a
    summary. ``preface``: lines printed before the run layout's, once the run can start (the command line's
    defaults line).

    ``max_iterations`` stops early after that many iterations in total (the LR schedule
    still follows ``total_steps``), leaving a checkpoint to resume from. ``machine``
    replaces the detected one in the run layout and the memory check (tests simulate machines with it).
    ``until_exit``: the process exits once this returns or raises (the command line): from the moment the
    run stops or finishes, stop signals are noted and ignored until it has exited (``StopSignals``).

    Durability: after every completed iteration the whole state is snapshotted (in memory,
    under a signal guard); whatever ends the run (SIGINT, SIGTERM, SIGUSR1, an error), that
    snapshot is the checkpoint written, never a half-done iteration. A signal raises
    :class:`TrainingStopped` (a ``KeyboardInterrupt``) once the checkpoint is on disk.
    """
    with contextlib.ExitStack() as stack:
        signals = stack.enter_context(StopSignals(until_exit))
        saved, source, notes = None, None, []
        if resume:  # read before the lock is taken: files are replaced atomically, and a typo creates nothing
            cfg, source, saved, notes = resume_state(resume, given or {})
            cfg, kept = compile_kept_on_resume(cfg, saved["config"], given or {})
            notes += [kept] if kept else []
        # the extras the run needs, before any line about it
        if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("tensorboard", True, "needs the tensorboard extra: pip install -e '.[tensorboard]'")
        if cfg.backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError("backend", "ray", "needs the ray extra: pip install -e '.[ray]'")
        # the run layout: computed once here; nothing below recomputes it
        machine = machine or Machine.detect(cfg.backend, cfg.ray_address)
        _check_memory(cfg, machine)  # before the layout (its lists grow with --num-envs), any env and any buffer
        layout = run_layout(cfg, machine)  # checks the env id
        algorithm = algorithm_class(cfg.algo).new(cfg, layout)  # what the env cannot take fails before any write
        # a module:id env is named by its id: a colon in a path breaks Windows, and PATH-like lists elsewhere
        run_dir = Path(cfg.run_dir or
                       f"runs/{cfg.env.rpartition(':')[2]}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        iterations = layout.iterations(cfg)
        per_iteration = layout.batch_envs * cfg.num_steps
        stop = min(iterations, max_iterations or iterations)
        # decided before anything is touched: a resume with nothing to do changes no file of the run
        nothing_to_do = bool(resume) and saved["iteration"] >= stop
        lock = stack.enter_context(checkpoints.RunDirLock(run_dir))
        stack.enter_context(last_resort(functools.partial(_say_and_unlock, lock)))  # an env stuck in C ends the process
        if lock.stale:
            notes.append(lock.stale)
        partial = [] if nothing_to_do else checkpoints.remove_partial_saves(run_dir)  # ours now that the lock is
        if partial:
            notes.append(f"removed {counted(len(partial), 'partial checkpoint file')} of a save that never finished "
                         f"({', '.join(p.name for p in partial)})")
        if resume and not nothing_to_do:
            moved = checkpoints.set_aside_newer(run_dir, saved["iteration"])
            if moved:  # named as they are now: each has a name of its own, never one set aside before
                notes.append(f"set aside {', '.join(p.name for p in moved)} in {moved[0].parent}: newer than the "
                             "checkpoint resumed from")
            dropped = keep_metrics_until(run_dir / "metrics.jsonl", saved["iteration"])
            if dropped:
                notes.append(f"metrics.jsonl: dropped {counted(dropped, 'row')} of iterations after "
                             f"{saved['iteration']} (they are run again)")
        elif not resume:
            notes += claim_new_run_dir(run_dir, overwrite)
        # said once the run can start: an error of the layout, the env or the run directory (taken by another run,
        # locked) is the one line, not the last of several
        print(*preface, layout.describe(), *(f"warning: {w}" for w in layout.warnings), *algorithm.start_notes(),
              sep="\n", file=sys.stderr)
        if iterations * per_iteration != cfg.total_steps:  # said, not silently rounded
            print(f"note: --total-steps {cfg.total_steps:,} is not a whole number of iterations of {per_iteration:,} "
                  f"env steps: the run makes {iterations} ({iterations * per_iteration:,} env steps)", file=sys.stderr)
        cfg.run_dir = str(run_dir)
        if not nothing_to_do:
            _write_config(run_dir, cfg, layout.to_dict(), saved.get("thread_plan") if saved else None)
        writer = _tensorboard(run_dir) if cfg.tensorboard else None
        if writer:
            stack.callback(writer.close)
        collector = stack.enter_context(make_collector(
            layout.env_factories(), algorithm.acting, backend=cfg.backend, num_steps=cfg.num_steps, seed=cfg.seed,
            **layout.collector_kwargs(), **algorithm.collector_options()))  # keeps_collecting: one actor's slice
        algorithm.attach(collector)
        stack.enter_context(torch_threads(layout.learn_threads))  # restored at the end: RunThreads sets it anew
        threads = RunThreads.for_run(layout, cfg.threads, collector, iterations,
                                     saved.get("thread_plan") if saved else None)
        if saved is not None:
            differs = algorithm.restore(saved)  # how the resumed run will differ: nothing, where none is to come
            notes += [f"resumed from {source} at iteration {algorithm.iteration}",
                      *(differs if algorithm.iteration < stop else [])]
        if algorithm.iteration >= stop:
            where = f"iteration {algorithm.iteration} of {iterations}" if algorithm.iteration <= iterations else \
                f"iteration {algorithm.iteration}, past the {iterations} that --total-steps {cfg.total_steps:,} makes"
            notes.append(f"the run is already at {where}: nothing to do (pass a larger --total-steps to train "
                         "longer)")
        for note in notes + [threads.describe()]:
            print(note, file=sys.stderr)
        summary = _loop(algorithm, iterations, stop, run_dir, signals, writer, progress, source, threads)
        longer = summary["longer_total_steps"]  # whole iterations: the command it goes into says nothing of rounding
        summary["longer_total_steps"] = -(-longer // per_iteration) * per_iteration
        signals.finish()  # closing the collector (a rollout may be in flight) must not turn into a stop
        return summary


def _loop(algorithm: Algorithm, iterations: int, stop: int, run_dir: Path, signals: StopSignals, writer,
          progress: bool, resumed_from: Path | None, threads: RunThreads) -> dict:
    """Iterate until ``stop``; snapshot after each completed iteration; on any exit, save the newest snapshot."""
    cfg = algorithm.cfg

    def snapshot_now() -> dict:
        with signals.critical(patience_s=STOP_PATIENCE_S):  # may wait on workers: a stop never waits for a hung one
            return {**algorithm.snapshot(), "thread_plan": threads.state()}

    snapshot = snapshot_now()
    saved_at = algorithm.iteration if algorithm.iteration else None  # resumed: that state is on disk already
    last_saved = resumed_from

    def save() -> Path:
        nonlocal saved_at, last_saved
        with signals.critical():
            last_saved = checkpoints.save_in_run_dir(run_dir, snapshot, snapshot["iteration"], cfg.keep_checkpoints)
            saved_at = snapshot["iteration"]
        return last_saved

    def failed(e: BaseException) -> BaseException:
        """What ends the run, once the last completed iteration is saved: ``e`` with notes saying where it is (a stop
        signal: :class:`TrainingStopped`)."""
        signals.stop()  # a signal from here on waits: the snapshot is saved first
        done = snapshot["iteration"]
        if done and saved_at != done and not isinstance(e, checkpoints.CheckpointError):  # (that save just failed)
            try:
                save()
            except checkpoints.CheckpointError as why:
                print(f"could not save the last completed iteration: {why}", file=sys.stderr)
        where = (f"the newest checkpoint {last_saved} holds iteration {saved_at}" if last_saved
                 else "no iteration was completed, nothing to save" if not done
                 else f"iteration {done} completed but no checkpoint could be written")
        if isinstance(e, KeyboardInterrupt):
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            return TrainingStopped(signum, run_dir, saved_at or 0, last_saved)
        if isinstance(e, NonFiniteLossError):
            return NonFiniteLossError(f"{e}; {where}")
        # notes (PEP 678), so that they follow the error's own line, wherever it is printed
        _add_note(e, f"training failed: {where}")
        if last_saved:  # an env error, a dead or silent worker: what was completed is saved, and resumes
            _add_note(e, f"resume:        {_command('-m', 'trainer.train', '--resume', str(Path(run_dir).resolve()))}")
        return e

    def stuck_in_c(error: Exception) -> None:
        """The last resort (``collectors.watchdog``): an env of this process is stuck where no interrupt reaches it,
        and the process is about to end. Run in the watchdog's thread, this one being stuck: what the error path
        below does, but for raising (``train``'s own last resort prints the error)."""
        with contextlib.suppress(OSError):
            bar.close()
        failed(error)

    validator = Validator(cfg, run_dir, algorithm.iteration)  # --eval-every: validation episodes, the best checkpoint
    bar = tqdm(total=stop, initial=algorithm.iteration, disable=not progress or algorithm.iteration >= stop, unit="it",
               dynamic_ncols=True)
    start = (algorithm.env_steps, time.perf_counter())
    try:
        with MetricsLog(run_dir / "metrics.jsonl") as log, last_resort(stuck_in_c):
            while algorithm.iteration < stop:
                signals.raise_if_lost()
                counts = threads.apply()
                row = algorithm.iterate(start)
                if row is None:  # a rollout it chose not to learn from (PPO: too stale)
                    continue
                changed = threads.record()  # the iteration's own time: before validation and saves
                if changed:
                    bar.write(changed, file=sys.stderr)
                    if threads.state()["chosen"]:  # a plan made (not one begun): config.json keeps the last one
                        _record_thread_plan(run_dir / "config.json", threads.state())
                row.update(collect_threads=counts["collect"], learn_threads=counts["learn"])
                row.update(validator.evaluate(algorithm.iteration, algorithm.model))
                with signals.critical():  # the iteration is complete once its snapshot and its row exist
                    completed = snapshot_now()  # abandoned if it waits too long: the previous one is saved
                    log.append(row)  # whole or not at all: if it fails, the previous iteration is the last completed
                    snapshot = completed
                if writer:
                    for k, v in row.items():
                        if isinstance(v, (int, float)):
                            writer.add_scalar(k, v, row["env_steps"])
                bar.update(1)
                recent = algorithm.recent
                bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{np.mean(recent):.2f}" if recent else "-")
                if algorithm.iteration % cfg.checkpoint_every == 0 or algorithm.iteration == stop or validator.improved:
                    validator.saved(save())
    except BaseException as e:
        error = failed(e)
        if error is not e:
            raise error from None
        raise
    finally:
        with contextlib.suppress(OSError):  # after any save: the terminal may be gone (SIGHUP)
            bar.close()
    for note in algorithm.end_notes():
        print(note, file=sys.stderr)
    return {"run_dir": str(run_dir), "iterations": algorithm.iteration, "env_steps": algorithm.env_steps,
            "checkpoint": str(last_saved) if last_saved else None, **algorithm.summary(),
            "longer_total_steps": algorithm.longer_total_steps(),
            "recent_return": float(np.mean(algorithm.recent)) if algorithm.recent else None,
            "finished": algorithm.iteration >= iterations}


def _write_config(run_dir: Path, cfg: TrainConfig, layout: dict, thread_plan: dict | None) -> None:
    """``config.json``: the run's settings, its layout, and its thread plan once there is one."""
    (run_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": layout,
                                                     "thread_plan": thread_plan}, indent=2))


def _record_thread_plan(config: Path, thread_plan: dict | None) -> None:
    """Put a new thread plan into ``config.json``, replaced whole (a kill leaves the old file or the new one)."""
    stored = json.loads(config.read_text())
    tmp = config.with_name(config.name + ".tmp")
    tmp.write_text(json.dumps({**stored, "thread_plan": thread_plan}, indent=2))
    tmp.replace(config)


def _say_and_unlock(lock: checkpoints.RunDirLock, error: Exception) -> None:
    """The process ends (``collectors.watchdog.last_resort``, after ``_loop``'s has saved what was completed):
    say why, as ``main`` says an error, and give the run directory back."""
    print(_error_text(error), file=sys.stderr)
    lock.release()


def _error_text(error: BaseException) -> str:
    """An error as the command line prints it: ``error: ...``, then its notes (where the run stands, the resume)."""
    return "\n".join([f"error: {error}".rstrip(), *getattr(error, "__notes__", ())])


def _check_memory(cfg: TrainConfig, machine: Machine) -> None:
    """``ConfigError`` where the run would need more memory than ``machine`` has available
    (``TrainConfig.check_memory``); nothing is checked where that is not known (a machine a test simulates)."""
    if machine.memory is not None:
        copies = _rollout_copies(cfg, learner_device(cfg.device, machine.gpus))
        cfg.check_memory(_env_sizes(cfg), copies, machine.memory)


def _env_sizes(cfg: TrainConfig) -> EnvSizes:
    """What one env of the run holds, in bytes: VR-edge's from its arguments (nothing is built: its observation may
    be what does not fit), any other env's from the spaces of one built."""
    if cfg.env == "VREdge-v0":
        vr = VREdgeConfig(**cfg.env_options)
        observation = 4 * vr.obs_dim  # float32
        return EnvSizes(observation, action=8 * vr.num_users, scores=vr.num_users * vr.num_levels,
                        own=vr.state_bytes + 2 * observation, scaled_by=MEMORY_ARGUMENTS)  # (+ its space's bounds)
    observations, actions, _ = model_spaces(cfg)
    observation = observations.dtype.itemsize * math.prod(observations.shape)
    heads = action_heads(actions)
    if heads is None:  # no policy here acts in it: the algorithm says so once the layout is made
        return EnvSizes(observation, action=0, scores=0)
    action = 4 * heads.sizes[0] if heads.kind == "box" else 8 * len(heads.sizes)  # float32 reals, int64 choices
    return EnvSizes(observation, action, scores=sum(heads.sizes))


def _rollout_copies(cfg: TrainConfig, device: str) -> int:
    """Copies of a rollout in this machine's memory: the collector's, and on a CPU learner the one it learns on
    (``RolloutStorage.to_device`` copies); with ``--overlap``, the collecting process's two, the shared buffer it
    hands them over in and this process's own; ``--backend device`` writes its one on the learner's device, not
    here when that is a GPU."""
    on_cpu = device == "cpu"
    if cfg.backend == "device":
        return int(on_cpu)
    if cfg.overlap:
        return 4
    return 2 if on_cpu else 1


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also on Python 3.10 (where the traceback does not print it; ``main`` does)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]


def _tensorboard(run_dir: Path):
    from torch.utils.tensorboard import SummaryWriter  # (the extra is there: checked before the run began)

    return SummaryWriter(str(run_dir / "tb"))


def _command(*args: str) -> str:
    """A shell command with this interpreter and absolute paths, so that it runs as printed from any
    directory (the packages may live in a venv that is not on the PATH)."""
    return " ".join(shlex.quote(a) for a in (sys.executable, *args))


def _stored_setting(key: str, cli: CommandLine) -> str:
    """Where a resumed run's setting came from, when the command line did not give it: its checkpoint."""
    if not cli.resume or key in cli.given:
        return ""
    flag = "--" + key.replace("_", "-")
    return f" (the run's stored {flag}" + (f"; pass {flag} to change it on resume)" if key in RESUMABLE_CHANGES
                                           else ")")


# (the run directory may hold its config already: the same command takes it over, and a resume starts again from
# its checkpoint)
NOTHING_TO_SAVE = "before the first iteration completed: nothing to save; run the same command again"


def main(argv: list[str] | None = None, cli: CommandLine | None = None) -> None:
    """``python -m trainer.train``: the command line ``argv`` (or the one already parsed, ``cli``) run."""
    cli = cli or parse_args(argv)
    defaults = "" if cli.resume else defaults_used(cli.config, cli.given)
    # next to the run layout's lines: what the bare command runs is not the same for every algo
    preface = [f"defaults for --algo {cli.config.algo} on {cli.config.env}: {defaults}"] if defaults else []
    try:
        summary = train(cli.config, resume=cli.resume, given=cli.given, overwrite=cli.overwrite, preface=preface,
                        until_exit=True)  # a storm of signals after the stop's checkpoint changes no exit status
    except TrainingStopped as e:
        run_dir = str(e.run_dir.resolve())
        with contextlib.suppress(OSError):  # a SIGHUP's terminal is gone: what was completed is saved all the same
            if e.checkpoint:
                print(f"\n{e} after iteration {e.iteration}; checkpoint: {e.checkpoint.resolve()}\n"
                      f"resume:        {_command('-m', 'trainer.train', '--resume', run_dir)}", file=sys.stderr)
            else:  # stopped in the first iteration: as before it, below
                print(f"\n{e} {NOTHING_TO_SAVE}", file=sys.stderr)
        raise SystemExit(e.exit_status) from None
    except KeyboardInterrupt as e:  # before the first iteration
        print(f"\n{e or 'interrupted'} {NOTHING_TO_SAVE}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None
    except ConfigError as e:  # a setting this machine cannot run: as the flags' errors, exit status 2
        build_parser().error(f"{cli.error_text(e)}{_stored_setting(e.key, cli)}")
    except (ValueError, TypeError, NonFiniteLossError, WorkerDiedError, EnvError, RayConnectError) as e:
        # an env's error carries the env's own traceback; the trainer's frames above it would only be noise
        raise SystemExit(_error_text(e)) from None
    run_dir = str(Path(summary["run_dir"]).resolve())
    print(f"run directory: {run_dir} ({counted(summary['iterations'], 'iteration')}, {summary['env_steps']:,} env "
          "steps)")
    print(f"metrics:       {run_dir}/metrics.jsonl")
    if summary["checkpoint"]:
        checkpoint = str(Path(summary["checkpoint"]).resolve())
        print(f"checkpoint:    {checkpoint}")
        # the run directory stands for its newest checkpoint: a resume with nothing to do from an older one
        # names that one, so that evaluating it or training it longer goes on from what was described
        newest = checkpoints.checkpoint_files(run_dir)[:1] == [Path(checkpoint)]
        target = run_dir if newest else checkpoint
        print(f"evaluate:      {_command('-m', 'trainer.evaluate', '--checkpoint', target)}")
        if not summary["finished"]:
            print(f"resume:        {_command('-m', 'trainer.train', '--resume', target)}")
        else:
            longer = str(summary["longer_total_steps"])  # a value to paste, not a placeholder
            print(f"train longer:  {_command('-m', 'trainer.train', '--resume', target, '--total-steps', longer)}")


if __name__ == "__main__":
    for _signum, _handler in _STARTING.items():
        signal.signal(_signum, _handler)
    multiprocessing.freeze_support()
    main(cli=COMMAND_LINE)
