"""``python -m trainer.train --seeds 1-5 [--jobs J] ...``: one setup trained once per seed, each an ordinary run
directory, side by side in one folder::

    runs/VREdge-v0-seeds-1-5/     --run-dir (this by default)
        seeds.json                the setup the seeds share: every setting but the seed
        s1/  s2/  ...  s5/        one run directory per seed (trainer.evaluate, --resume, trainer.compare take them)

One seed after another, or ``--jobs J`` at once, each job with ``1/J`` of the machine's cores and memory (its run
layout divides that share: ``trainer.experiments.jobs``). The same command again goes on where the last one
stopped: a seed whose run finished is skipped, one with a checkpoint resumes from it, the others start. A setting
a resume may change (``--total-steps``, to train every seed longer) may differ on a rerun; any other must match
the folder's setup, which one line says otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

import checkpoints
from envs.settings import ConfigError
from trainer.arguments import command, counted, seeds_text
from trainer.common.world import World
from trainer.config import TrainConfig, named, with_current_names
from trainer.experiments.jobs import run_jobs, say, training_output
from trainer.flags import RESUMABLE_CHANGES, CommandLine
from trainer.run_layout import Machine, whole_iterations

SETUP = "seeds.json"


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """One seed's run directory, and where it stands: ``done`` of ``iterations`` (``done`` 0: no checkpoint).

    Example:
        >>> SeedRun(3, Path("runs/x/s3"), done=0, iterations=10).todo
        'starts'
    """

    seed: int
    run_dir: Path
    done: int
    iterations: int

    @property
    def todo(self) -> str:
        """``finished``, ``resumes`` (from its newest checkpoint) or ``starts``."""
        return "finished" if self.done >= self.iterations else "resumes" if self.done else "starts"


def folder_of(cfg: TrainConfig, seeds: tuple[int, ...]) -> Path:
    """The seeds' folder: ``--run-dir``, else ``runs/<env id>-seeds-<seeds>`` (the same command, the same folder:
    no time in its name, so that running it again resumes)."""
    return Path(cfg.run_dir or f"runs/{cfg.env.rpartition(':')[2]}-seeds-{seeds_text(seeds)}")


def setup_of(cfg: TrainConfig) -> dict[str, Any]:
    """What every seed of one folder shares: the settings, but the seed, the run directory and what a resume may
    change."""
    return {k: v for k, v in cfg.to_dict().items() if k not in ("seed", "run_dir", *RESUMABLE_CHANGES)}


def claimed_folder(folder: Path, cfg: TrainConfig) -> None:
    """Make ``folder`` the seeds' of ``cfg``'s setup (``seeds.json``), or raise :class:`ConfigError` where it holds
    another setup's seeds, or a run of its own."""
    setup, stored = setup_of(cfg), folder / SETUP
    if stored.exists():
        # a setting the folder's setup predates ran as its default, which is what a resume of its seeds reads
        theirs = {**setup_of(TrainConfig.from_dict({"algo": cfg.algo})), **with_current_names(_stored(stored, "setup"))}
        differ = {k: (theirs.get(k), v) for k, v in setup.items() if theirs.get(k) != v}
        if differ:
            key, (old, new) = next(iter(differ.items()))
            flags = ", ".join(f"{named(k)} {o!r} there, {n!r} here" for k, (o, n) in differ.items())
            raise ConfigError(key, new, message=f"{folder} holds the seeds of another setup ({flags}): run its own "
                              "command again to resume them, or pass another --run-dir")
        return
    if (folder / "config.json").exists() or checkpoints.checkpoint_files(folder):
        raise ConfigError("run_dir", str(folder), message=f"--run-dir {folder} is a run directory, not a folder of "
                          "seeds: pass another --run-dir (each seed's run directory goes inside it)")
    folder.mkdir(parents=True, exist_ok=True)
    checkpoints.files.write_whole(stored, json.dumps({"setup": setup}, indent=2))


def _stored(path: Path, key: str) -> dict[str, Any]:
    """What ``key`` holds in the JSON file ``path`` (``seeds.json``, a seed's ``config.json``: small files, read
    as :func:`checkpoints.read_small_file` reads them); a :class:`ConfigError` naming the file where it cannot be
    read, or holds no such object."""
    try:
        held = json.loads(checkpoints.read_small_file(path))
        why = "" if isinstance(held, dict) and isinstance(held.get(key), dict) else f"no {key!r} object in it"
    except OSError as e:
        why = e.strerror or str(e)
    except ValueError:  # not UTF-8, not JSON
        why = "not JSON"
    if why:
        raise ConfigError("run_dir", str(path.parent), message=f"cannot read {path}: {why}; move it aside (a "
                          "seed run's own files are written by trainer.train), or pass another --run-dir")
    return held[key]


def seed_runs(folder: Path, cfg: TrainConfig, seeds: tuple[int, ...]) -> list[SeedRun]:
    """Where each seed's run stands, read from its files (its newest checkpoint against the iterations
    ``cfg.total_steps`` makes in the run's own layout)."""
    runs = []
    for seed in seeds:
        run_dir = folder / f"s{seed}"
        saved = checkpoints.checkpoint_files(run_dir)
        done, iterations = 0, 1
        if saved:
            layout = _stored(run_dir / "config.json", "layout")
            done = checkpoints.checkpoint_iteration(saved[0])
            iterations = whole_iterations(cfg.total_steps, layout["batch_envs"] * cfg.num_steps)
        runs.append(SeedRun(seed, run_dir, done, iterations))
    return runs


def train_seeds(cli: CommandLine, preface: list[str], machine: Machine | None = None) -> int:
    """Train ``cli``'s setup once per seed of ``cli.seeds`` (``cli.jobs`` at once); the exit status: 0 once every
    seed has finished, a stop signal's (128 + its number) when stopped, 1 when a seed failed (the others go on)."""
    cfg, jobs = cli.config, cli.jobs
    if World.from_environment().size > 1:
        raise ConfigError("seeds", seeds_text(cli.seeds), message="--seeds runs one training per seed; under "
                          "torchrun, run each seed's data-parallel training on its own (--seed S)")
    if jobs > 1 and cfg.backend == "ray":
        raise ConfigError("backend", "ray", message="--jobs trains seeds side by side on this machine; with "
                          "--backend ray the cluster's CPUs are every seed's: use --jobs 1")
    folder = folder_of(cfg, cli.seeds)
    claimed_folder(folder, cfg)
    runs = seed_runs(folder, cfg, cli.seeds)
    todo = [r for r in runs if r.todo != "finished"]
    jobs = min(jobs, max(1, len(todo)))
    machine = machine or Machine.detect(cfg.backend, cfg.ray_address, cfg.device)
    share = machine.split(jobs)
    counts = {what: sum(r.todo == what for r in runs) for what in ("finished", "resumes", "starts")}
    print(*preface, f"{counted(len(runs), 'seed')} in {folder}: "
          + ", ".join(f"{n} {what}" for what, n in counts.items() if n)
          + (f"; {jobs} at a time, each with {counted(share.cores, 'core')} of {machine.cores} (its run layout "
             f"divides them; output in each run directory's train.log)" if jobs > 1 else ""), sep="\n",
          file=sys.stderr)
    if machine.cores < jobs:
        print(f"warning: --jobs {jobs} on {counted(machine.cores, 'core')}: the jobs share them", file=sys.stderr)
    work = functools.partial(_seeds_job, cli=cli, runs=todo, jobs=jobs)
    statuses = run_jobs(work, jobs, machine)
    return _said_end(folder, cfg, cli, statuses)


def _seeds_job(index: int, share: Machine, cli: CommandLine, runs: list[SeedRun], jobs: int) -> int:
    """Job ``index`` of ``jobs``: its seeds (every ``jobs``-th), one after another, until one is stopped."""
    status = 0
    for run in runs[index::jobs]:
        ended = _trained(run, cli, share, alone=jobs == 1)
        if ended >= 128:  # stopped: the next seed would only be stopped in turn
            return ended
        status = max(status, ended)
    return status


def _trained(run: SeedRun, cli: CommandLine, share: Machine, alone: bool) -> int:
    """Train (or resume) one seed's run; its exit status (:func:`train_seeds`'). ``alone``: the only job, its
    progress on the terminal; otherwise its output goes to the run's ``train.log`` and one line says what became
    of it."""
    from collectors.resources import torch_threads
    from trainer.interrupts import noted_signals
    from trainer.loop import TrainingStopped, train  # (torch: once the command line is checked)
    from trainer.run_end import end_of_run

    cfg = dataclasses.replace(cli.config, seed=run.seed, run_dir=str(run.run_dir))
    resume = str(run.run_dir) if run.done else ""
    given = ({k: v for k, v in cli.given.items() if k in RESUMABLE_CHANGES} if resume
             else {**cli.given, "seed": run.seed, "run_dir": str(run.run_dir)})
    start = f"seed {run.seed}: {'resumes from iteration ' + str(run.done) if resume else 'starts'} in {run.run_dir}"
    say(start if alone else f"{start} (log: {run.run_dir / 'train.log'})")
    try:
        with training_output(run.run_dir / "train.log", alone):
            summary = train(cfg, progress=alone, resume=resume, given=given, machine=share)
    except TrainingStopped as e:
        say(f"seed {run.seed}: {e} after iteration {e.iteration}")
        return e.exit_status
    except KeyboardInterrupt as e:  # before its first iteration
        say(f"seed {run.seed}: {e or 'interrupted'} before its first iteration")
        return getattr(e, "exit_status", 130)
    except Exception as e:  # an env's error, a dead worker: the seed's, the others go on
        where = "\n".join(getattr(e, "__notes__", ())) if alone else f"(see {run.run_dir / 'train.log'})"
        say(f"seed {run.seed}: failed: {e or type(e).__name__}\n{where}".rstrip())
        return 1
    say(f"seed {run.seed}: finished at iteration {summary['iterations']} ({summary['env_steps']:,} env steps)")
    noted = len(noted_signals())
    if not summary["late_signal"]:  # (a stop as it closed: nothing more of this seed, nor the next)
        # the run's end (distillation's labels, the quality line) on the job's cores too: torch's own count in each
        # of several jobs oversubscribes the machine, and its threads then wait on each other (measured: 3 jobs on
        # 2 cores labelled a round of the cell recipe in about 27 minutes, against 3 alone on both cores)
        with torch_threads(None if alone else share.cores):
            end_of_run(summary, lambda label, line: say(f"seed {run.seed}: {label}: {line}"))
    if len(skipped_by := noted_signals()) > noted:  # a stop that skipped the seed's end: no next seed
        return 128 + skipped_by[-1]
    return 128 + summary["late_signal"] if summary["late_signal"] else 0  # a stop as it closed: no next seed


def _said_end(folder: Path, cfg: TrainConfig, cli: CommandLine, statuses: list[int]) -> int:
    """Say where every seed stands, and how to go on; the exit status."""
    runs = seed_runs(folder, cfg, cli.seeds)
    unfinished = [r for r in runs if r.todo != "finished"]
    print(f"seeds: {folder.resolve()} ({len(runs) - len(unfinished)} of {len(runs)} finished)")
    for r in runs:
        print(f"  s{r.seed}: " + {"finished": _finished(r, cfg), "starts": "not started"}.get(
            r.todo, f"at iteration {r.done} of {r.iterations}"))
    from trainer.loop import train_command

    if unfinished:
        print(f"resume:        {train_command(*cli.argv)}")
    else:
        print(f"evaluate:      {command('-m', 'trainer.evaluate', '--checkpoint', str(runs[0].run_dir.resolve()))}"
              + (f" (one seed's; s{runs[1].seed}, ... alike)" if len(runs) > 1 else ""))
        print(f"compare:       {command('-m', 'trainer.compare', str(folder.resolve()), 'OTHER_FOLDER')}")
    stopped = [s for s in statuses if s >= 128]
    return stopped[0] if stopped else max(statuses, default=0) if unfinished else 0


def _finished(run: SeedRun, cfg: TrainConfig) -> str:
    """A finished seed's state; one trained past ``cfg.total_steps`` (a rerun with fewer) says so."""
    if run.done == run.iterations:
        return "finished"
    return (f"finished at iteration {run.done}, past the {run.iterations} that --total-steps {cfg.total_steps} "
            "makes (pass a larger --total-steps to train longer)")
