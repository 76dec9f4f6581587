"""Train a policy: ``python -m trainer.train`` (PPO on VR-edge with defaults; ``--algo apex`` for Ape-X;
``--help`` for every flag)."""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

import checkpoints
from collectors import make_collector
from collectors.resources import torch_threads
from trainer.apex import ApexRun
from trainer.batching import plan_minibatches
from trainer.config import TrainConfig, parse_args
from trainer.interrupts import STOP_SIGNALS, Interrupted, StopSignals
from trainer.layout import Machine, run_layout
from trainer.learner import learn
from trainer.metrics import keep_metrics_until, metrics_row
from trainer.pipeline import Pipeline, make_pipeline
from trainer.ppo import NonFiniteLossError, PPOSettings
from trainer.run import Run, claim_new_run_dir, resolve_device, resume_state
from trainer.validation import Validator


class TrainingStopped(Interrupted):
    """:class:`Interrupted` after the checkpoint was written: says where it is."""

    def __init__(self, signum: int, run_dir: Path, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(signum)
        self.run_dir, self.iteration, self.checkpoint = run_dir, iteration, checkpoint


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, overwrite: bool = False, machine: Machine | None = None) -> dict:
    """Run PPO (or Ape-X, ``cfg.algo == "apex"``: ``trainer.apex``) as configured (or continue the run at
    ``resume``); returns a summary.

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
        # the run layout: computed once here; nothing below recomputes it
        layout = run_layout(cfg, machine or Machine.detect(cfg.backend, cfg.ray_address))  # checks the env id
        print(layout.describe(), *(f"warning: {w}" for w in layout.warnings), sep="\n", file=sys.stderr)
        factories, batch_envs = layout.env_factories(), layout.batch_envs  # ray_async: one actor's slice
        if cfg.algo == "apex":
            run = ApexRun.new(cfg, resolve_device(cfg.device))  # an action space DQN cannot take fails here
            print(run.replay.describe(), file=sys.stderr)
        else:
            plan = plan_minibatches(batch_envs, cfg.num_steps, cfg.batch_size or None)
            for w in plan.warnings:
                print(f"warning: {w}", file=sys.stderr)
            run = Run.new(cfg)  # a model the env cannot have fails here, before anything is written
        run_dir = Path(cfg.run_dir or f"runs/{cfg.env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        lock = stack.enter_context(checkpoints.RunDirLock(run_dir))
        if resume:
            moved = checkpoints.set_aside_newer(run_dir, saved["iteration"])
            notes += [f"set aside {p.name}: newer than the checkpoint resumed from" for p in moved]
            dropped = keep_metrics_until(run_dir / "metrics.jsonl", saved["iteration"])
            if dropped:
                notes.append(f"metrics.jsonl: dropped {dropped} rows of iterations after {saved['iteration']} "
                             "(they are run again)")
        else:
            notes += claim_new_run_dir(run_dir, overwrite)
        if lock.stale:
            notes.append(lock.stale)
        cfg.run_dir = str(run_dir)
        (run_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": layout.to_dict()},
                                                        indent=2))
        writer = _tensorboard(run_dir) if cfg.tensorboard else None
        if writer:
            stack.callback(writer.close)
        iterations = max(1, cfg.total_steps // (batch_envs * cfg.num_steps))
        stop = min(iterations, max_iterations or iterations)
        options = layout.collector_kwargs()
        if isinstance(run, ApexRun) and cfg.backend == "ray":  # Ray actors build transitions and priorities
            from trainer.apex_ray import ApexWorker
            options.update(worker_cls=ApexWorker, worker_kwargs={"n_step": cfg.n_step, "gamma": cfg.gamma})
        collector = stack.enter_context(make_collector(
            factories, run.policy if isinstance(run, ApexRun) else run.acting, backend=cfg.backend,
            horizon=cfg.num_steps, seed=cfg.seed, device="cpu" if isinstance(run, ApexRun) else run.device,
            **options))  # Ape-X: the transitions go to the replay, on the CPU; the learner samples from there
        if isinstance(run, ApexRun):
            step, snapshot = functools.partial(run.iterate, collector), functools.partial(run.snapshot, collector)
            restore = functools.partial(run.restore, collector=collector)
            if saved is not None and saved["replay"] is None:
                notes.append("the checkpoint holds no replay (--save-replay false): it refills from new experience, "
                             "so the resumed run is not identical to an uninterrupted one")
        else:
            pipeline = make_pipeline(collector, run.acting.state_dict(), cfg.overlap)
            settings = PPOSettings.from_config(cfg, plan.minibatch_size)
            step = functools.partial(_iteration, run, pipeline, settings, iterations)
            snapshot = functools.partial(run.snapshot, pipeline)
            restore = functools.partial(run.restore, pipeline=pipeline)
        stack.enter_context(torch_threads(layout.learn_threads))  # the collector uses its own count while collecting
        if saved is not None:
            exact = restore(saved)
            notes.append(f"resumed from {source} at iteration {run.iteration}")
            if not exact:
                notes.append("these envs offer no get_state(): their episodes restart from derived seeds, so the "
                             "resumed run is not identical to an uninterrupted one")
        if run.iteration >= stop:
            notes.append(f"the run is already at iteration {run.iteration} of {iterations}: nothing to do "
                         "(pass a larger --total-steps to train longer)")
        for note in notes:
            print(note, file=sys.stderr)
        summary = _loop(run, step, snapshot, iterations, stop, run_dir, signals, writer, progress, source)
        signals.finish()  # closing the collector (a rollout may be in flight) must not turn into a stop
        return summary


def _iteration(run: Run, pipeline: Pipeline, settings: PPOSettings, iterations: int,
               start: tuple[int, float]) -> dict | None:
    """Take the next rollout, learn from it, hand the new weights over; returns the metrics row (``None``
    for a rollout too stale to learn from). Only ``run`` and the pipeline change."""
    cfg, it = run.cfg, run.iteration + 1
    rollout = pipeline.next_rollout()
    lag = pipeline.collector.policy_version - rollout.policy_version
    run.lags[lag] = run.lags.get(lag, 0) + 1
    if cfg.ray_async and lag > cfg.max_lag:  # too stale to correct well: the next one is fresher
        run.dropped += 1
        return None
    run.recent.extend(e["return"] for e in rollout.episodes)
    lr = cfg.lr * (1 - (it - 1) / iterations) if cfg.anneal_lr else cfg.lr
    stats = learn(run, rollout, settings, it, lr)
    pipeline.learned(run.model.state_dict())
    run.iteration, run.env_steps = it, run.env_steps + rollout.numel()
    sps = (run.env_steps - start[0]) / (time.perf_counter() - start[1])
    return metrics_row(it, run.env_steps, sps, lr, stats, rollout, lag)


def _loop(run: Run | ApexRun, step: Callable[[tuple[int, float]], dict | None], take_snapshot: Callable[[], dict],
          iterations: int, stop: int, run_dir: Path, signals: StopSignals, writer, progress: bool,
          resumed_from: Path | None) -> dict:
    """Iterate (``step``) until ``stop``; snapshot (``take_snapshot``) after each completed iteration; on any
    exit, save the newest one."""
    cfg = run.cfg
    with signals.critical():
        snapshot = take_snapshot()
    saved_at = run.iteration if run.iteration else None  # resumed: that state is on disk already
    last_saved = resumed_from

    def save() -> Path:
        nonlocal saved_at, last_saved
        with signals.critical():
            last_saved = checkpoints.save_in_run_dir(run_dir, snapshot, snapshot["iteration"], cfg.keep_checkpoints)
            saved_at = snapshot["iteration"]
        return last_saved

    validator = Validator(cfg, run_dir, run.iteration)  # --eval-every: validation episodes, the best checkpoint
    bar = tqdm(total=stop, initial=run.iteration, disable=not progress, unit="it", dynamic_ncols=True)
    start = (run.env_steps, time.perf_counter())
    try:
        with (run_dir / "metrics.jsonl").open("a") as log:
            while run.iteration < stop:
                row = step(start)
                if row is None:  # a batch too stale to learn from
                    continue
                row.update(validator.evaluate(run.iteration, run.model))
                with signals.critical():  # the iteration is complete once its snapshot and its row exist
                    snapshot = take_snapshot()
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                if writer:
                    for k, v in row.items():
                        if isinstance(v, (int, float)):
                            writer.add_scalar(k, v, row["env_steps"])
                bar.update(1)
                bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{np.mean(run.recent):.2f}" if run.recent else "-")
                if run.iteration % cfg.checkpoint_every == 0 or run.iteration == stop or validator.improved:
                    validator.saved(save())
    except BaseException as e:
        signals.stop()  # a signal from here on waits: the snapshot is saved first
        bar.close()
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
        print(f"training failed: {where}", file=sys.stderr)
        raise
    finally:
        bar.close()
    if cfg.ray_async:
        print(f"policy lag (versions behind: batches): {dict(sorted(run.lags.items()))}; dropped {run.dropped} "
              f"batches older than --max-lag {cfg.max_lag}", file=sys.stderr)
    return {"run_dir": str(run_dir), "iterations": run.iteration, "env_steps": run.env_steps,
            "checkpoint": str(last_saved) if last_saved else None,
            **({"lags": dict(run.lags), "dropped": run.dropped} if isinstance(run, Run) else {}),  # PPO's lag
            "recent_return": float(np.mean(run.recent)) if run.recent else None,
            "finished": run.iteration >= iterations}


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ValueError("--tensorboard needs the tensorboard extra: pip install -e '.[tensorboard]'") from e
    return SummaryWriter(str(run_dir / "tb"))


def _command(*args: str) -> str:
    """A shell command with this interpreter and absolute paths, so that it runs as printed from any
    directory (the packages may live in a venv that is not on the PATH)."""
    return " ".join(shlex.quote(a) for a in (sys.executable, *args))


def _ignore_late_signals() -> None:
    """After the run finished, a stop signal (a scheduler's early warning) has nothing left to stop."""
    def note(signum, frame):
        print(f"{signal.Signals(signum).name} after the run finished: nothing to stop", file=sys.stderr)
    for signum in STOP_SIGNALS:
        signal.signal(signum, note)


def main(argv: list[str] | None = None) -> None:
    cli = parse_args(argv)
    try:
        summary = train(cli.config, resume=cli.resume, given=cli.given, overwrite=cli.overwrite)
        _ignore_late_signals()
    except TrainingStopped as e:
        print(f"\n{e} after iteration {e.iteration}" +
              (f"; checkpoint: {e.checkpoint}" if e.checkpoint else "; no checkpoint (no iteration completed)"),
              file=sys.stderr)
        run_dir = str(e.run_dir.resolve())
        if e.checkpoint:
            print(f"resume:        {_command('-m', 'trainer.train', '--resume', run_dir)}", file=sys.stderr)
        else:
            print("start again:   the same command (the run directory holds no checkpoint)", file=sys.stderr)
        raise SystemExit(e.exit_status) from None
    except KeyboardInterrupt as e:  # before the first iteration: nothing to save
        print(f"\n{e or 'interrupted'} before the first iteration: nothing to save; to start over, run the same "
              "command again", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None
    except (ValueError, TypeError, NonFiniteLossError) as e:
        raise SystemExit(f"error: {e}") from None
    run_dir = str(Path(summary["run_dir"]).resolve())
    print(f"run directory: {run_dir} ({summary['iterations']} iterations, {summary['env_steps']:,} env steps)")
    print(f"metrics:       {run_dir}/metrics.jsonl")
    if summary["checkpoint"]:
        print(f"checkpoint:    {Path(summary['checkpoint']).resolve()}")
        print(f"evaluate:      {_command('-m', 'trainer.evaluate', '--checkpoint', run_dir)}")
        if not summary["finished"]:
            print(f"resume:        {_command('-m', 'trainer.train', '--resume', run_dir)}")
        else:
            print(f"train longer:  {_command('-m', 'trainer.train', '--resume', run_dir, '--total-steps', 'N')}")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
