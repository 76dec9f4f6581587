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
import importlib.util
import json
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
from trainer.algorithm import Algorithm, NonFiniteLossError
from trainer.arguments import counted
from trainer.config import ConfigError, TrainConfig
from trainer.evaluation.validation import Validator
from trainer.interrupts import STOP_PATIENCE_S, Interrupted, StopSignals, ignore_late_signals
from trainer.metrics import MetricsLog, keep_metrics_until
from trainer.registry import algorithm_class
from trainer.run_files import claim_new_run_dir, resume_state
from trainer.run_layout import Machine, compile_kept_on_resume, run_layout


class TrainingStopped(Interrupted):
    """:class:`Interrupted` after the checkpoint was written: says where it is."""

    def __init__(self, signum: int, run_dir: Path, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(signum)
        self.run_dir, self.iteration, self.checkpoint = run_dir, iteration, checkpoint


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, overwrite: bool = False, machine: Machine | None = None,
          preface: Sequence[str] = ()) -> dict:
    """Run ``cfg.algo`` (``trainer.registry``) as configured (or continue the run at ``resume``); returns a
    summary. ``preface``: lines printed before the run layout's, once the run can start (the command line's
    defaults line).

    ``max_iterations`` stops early after that many iterations in total (the LR schedule
    still follows ``total_steps``), leaving a checkpoint to resume from. ``machine``
    replaces the detected one in the run layout (tests simulate machines with it).

    Durability: after every completed iteration the whole state is snapshotted (in memory,
    under a signal guard); whatever ends the run (SIGINT, SIGTERM, SIGUSR1, an error), that
    snapshot is the checkpoint written, never a half-done iteration. A signal raises
    :class:`TrainingStopped` (a ``KeyboardInterrupt``) once the checkpoint is on disk.
    """
    with contextlib.ExitStack() as stack:
        signals = stack.enter_context(StopSignals())
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
        layout = run_layout(cfg, machine or Machine.detect(cfg.backend, cfg.ray_address))  # checks the env id
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
        if lock.stale:
            notes.append(lock.stale)
        partial = [] if nothing_to_do else checkpoints.remove_partial_saves(run_dir)  # ours now that the lock is
        if partial:
            notes.append(f"removed {counted(len(partial), 'partial checkpoint file')} of a save that never finished "
                         f"({', '.join(p.name for p in partial)})")
        if resume and not nothing_to_do:
            moved = checkpoints.set_aside_newer(run_dir, saved["iteration"])
            notes += [f"set aside {p.name}: newer than the checkpoint resumed from" for p in moved]
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
            (run_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": layout.to_dict()},
                                                            indent=2))
        writer = _tensorboard(run_dir) if cfg.tensorboard else None
        if writer:
            stack.callback(writer.close)
        collector = stack.enter_context(make_collector(
            layout.env_factories(), algorithm.acting, backend=cfg.backend, horizon=cfg.num_steps, seed=cfg.seed,
            **layout.collector_kwargs(), **algorithm.collector_options()))  # ray_async: one actor's slice
        algorithm.attach(collector)
        stack.enter_context(torch_threads(layout.learn_threads))  # the collector uses its own count while collecting
        if saved is not None:
            differs = algorithm.restore(saved)  # how the resumed run will differ: nothing, where none is to come
            notes += [f"resumed from {source} at iteration {algorithm.iteration}",
                      *(differs if algorithm.iteration < stop else [])]
        if algorithm.iteration >= stop:
            where = f"iteration {algorithm.iteration} of {iterations}" if algorithm.iteration <= iterations else \
                f"iteration {algorithm.iteration}, past the {iterations} that --total-steps {cfg.total_steps:,} makes"
            notes.append(f"the run is already at {where}: nothing to do (pass a larger --total-steps to train "
                         "longer)")
        for note in notes:
            print(note, file=sys.stderr)
        summary = _loop(algorithm, iterations, stop, run_dir, signals, writer, progress, source)
        longer = summary["longer_total_steps"]  # whole iterations: the command it goes into says nothing of rounding
        summary["longer_total_steps"] = -(-longer // per_iteration) * per_iteration
        signals.finish()  # closing the collector (a rollout may be in flight) must not turn into a stop
        return summary


def _loop(algorithm: Algorithm, iterations: int, stop: int, run_dir: Path, signals: StopSignals, writer,
          progress: bool, resumed_from: Path | None) -> dict:
    """Iterate until ``stop``; snapshot after each completed iteration; on any exit, save the newest snapshot."""
    cfg = algorithm.cfg
    with signals.critical(patience_s=STOP_PATIENCE_S):  # may wait on workers: a stop never waits for a hung one
        snapshot = algorithm.snapshot()
    saved_at = algorithm.iteration if algorithm.iteration else None  # resumed: that state is on disk already
    last_saved = resumed_from

    def save() -> Path:
        nonlocal saved_at, last_saved
        with signals.critical():
            last_saved = checkpoints.save_in_run_dir(run_dir, snapshot, snapshot["iteration"], cfg.keep_checkpoints)
            saved_at = snapshot["iteration"]
        return last_saved

    validator = Validator(cfg, run_dir, algorithm.iteration)  # --eval-every: validation episodes, the best checkpoint
    bar = tqdm(total=stop, initial=algorithm.iteration, disable=not progress or algorithm.iteration >= stop, unit="it",
               dynamic_ncols=True)
    start = (algorithm.env_steps, time.perf_counter())
    try:
        with MetricsLog(run_dir / "metrics.jsonl") as log:
            while algorithm.iteration < stop:
                row = algorithm.iterate(start)
                if row is None:  # a rollout it chose not to learn from (PPO: too stale)
                    continue
                row.update(validator.evaluate(algorithm.iteration, algorithm.model))
                with signals.critical():  # the iteration is complete once its snapshot and its row exist
                    with signals.critical(patience_s=STOP_PATIENCE_S):  # abandoned: the previous one is saved
                        completed = algorithm.snapshot()
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
        signals.stop()  # a signal from here on waits: the snapshot is saved first
        done = snapshot["iteration"]
        if done and saved_at != done and not isinstance(e, checkpoints.CheckpointError):  # (that save just failed)
            try:
                save()
            except checkpoints.CheckpointError as failed:
                print(f"could not save the last completed iteration: {failed}", file=sys.stderr)
        where = (f"the newest checkpoint {last_saved} holds iteration {saved_at}" if last_saved
                 else "no iteration was completed, nothing to save" if not done
                 else f"iteration {done} completed but no checkpoint could be written")
        if isinstance(e, KeyboardInterrupt):
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            raise TrainingStopped(signum, run_dir, saved_at or 0, last_saved) from None
        if isinstance(e, NonFiniteLossError):
            raise NonFiniteLossError(f"{e}; {where}") from None
        # notes (PEP 678), so that they follow the error's own line, wherever it is printed
        _add_note(e, f"training failed: {where}")
        if last_saved:  # an env error, a dead or silent worker: what was completed is saved, and resumes
            _add_note(e, f"resume:        {_command('-m', 'trainer.train', '--resume', str(Path(run_dir).resolve()))}")
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
        summary = train(cli.config, resume=cli.resume, given=cli.given, overwrite=cli.overwrite, preface=preface)
        ignore_late_signals()
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
        raise SystemExit("\n".join([f"error: {e}".rstrip(), *getattr(e, "__notes__", ())])) from None
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
