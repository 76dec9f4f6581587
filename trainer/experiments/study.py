"""A sweep's Optuna study and its trials (``python -m trainer.sweep``): each trial an ordinary run directory, its
objective the best validation return (``--eval-every``), reported at every validation so that the pruner can
stop it early.

    runs/sweep-space/            --dir (this by default: the space file's name)
        study.db                 the study (SQLite, by default; --storage URL: any Optuna database)
        trial-0000/ ...          one run directory per trial (trainer.train --resume, trainer.evaluate take them)
        .claims/                 which process runs which trial (trainer's run-directory locks)

Every process that runs the same command joins the same study, here (``--jobs``) or on other machines (a shared
``--storage``): ``--trials N`` is the study's total, and a process stops once N trials exist. A trial is claimed
by a lock (``checkpoints.RunDirLock``, in ``.claims/``) held while it trains and until the study is told how it
ended, so no trial is run twice; on this machine the processes ask for new trials one at a time (an ``flock``),
so none asks for more than N. A stop (Ctrl-C, SIGTERM) leaves the running trial RUNNING in the study, with its
checkpoint; the same command again claims it (its lock's process is gone), resumes its run from that checkpoint
as the same Optuna trial (its reported values are in the study: the pruner goes on exactly), then goes on with
new trials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

import checkpoints
from trainer.arguments import counted
from trainer.config import TrainConfig, named
from trainer.experiments.jobs import run_jobs, say, training_output
from trainer.experiments.space import SearchSpace
from trainer.flags import CommandLine, check_config
from trainer.interrupts import StopSignals
from trainer.metrics import rows_until
from trainer.run_layout import Machine, whole_iterations

try:
    import fcntl
except ImportError:  # Windows: no flock (see _asking_alone)
    fcntl = None

CLAIMS = ".claims"
VALIDATIONS = 10  # per trial, where the train flags give no --eval-every
# no trial is pruned before this many have finished: the median of fewer trials' RL curves is noise
PRUNER_STARTUP_TRIALS = 4
# ... nor before its own second validation: the first mostly scores the random initial policy, alike in every trial
PRUNER_WARMUP_VALIDATIONS = 2
# settings that change a trial's env steps per iteration: its validations then fall at other env steps
BATCH_SETTINGS = frozenset({"num_envs", "num_steps"})


@dataclass(frozen=True)
class Sweep:
    """What one ``trainer.sweep`` command runs: ``trials`` trials of the train flags (``train``) with the values
    ``space`` samples, in ``dir``, in the study ``study_name`` of ``storage``.

    Example:
        >>> from trainer.flags import parse_args
        >>> train = parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "160"])
        >>> sweep = Sweep(Path("runs/s"), "sqlite:///runs/s/study.db", "s", 4, SearchSpace(Path("x.toml"), ()),
        ...               train, eval_every=1)
        >>> sweep.trial_dir(3), sweep.settings
        (PosixPath('runs/s/trial-0003'), {'env': 'CartPole-v1', 'num_envs': 2, 'num_steps': 8, 'total_steps': 160, \
'eval_every': 1})
    """

    dir: Path
    storage: str
    study_name: str
    trials: int
    space: SearchSpace
    train: CommandLine
    eval_every: int
    pruner: str = "median"  # or "none"
    sampler_seed: int = 0
    jobs: int = 1
    argv: tuple[str, ...] = ()  # the sweep's command line: the same command again resumes it

    @property
    def settings(self) -> dict[str, Any]:
        """What every trial is given besides its sampled values, as ``trainer.train --config`` takes it: the
        train flags' settings (those of their --config file among them) and the validation schedule."""
        given = {k: v for k, v in self.train.given.items() if k not in ("config", "run_dir")}
        return {**given, "eval_every": self.eval_every}

    def trial_dir(self, number: int) -> Path:
        """Trial ``number``'s run directory."""
        return self.dir / f"trial-{number:04d}"

    def trial_config(self, number: int, params: dict[str, Any]) -> TrainConfig:
        """Trial ``number``'s config: the train flags' with ``params``; ``ValueError`` where the trainer refuses
        the combination (each value alone was checked with the space)."""
        cfg = self.train.config.replaced(**params, eval_every=self.eval_every, run_dir=str(self.trial_dir(number)))
        check_config(cfg, {**self.train.given, **params})
        return cfg


def trial_iterations(cfg: TrainConfig) -> int:
    """Iterations of a trial of ``cfg`` (one process: a batch of ``num_envs x num_steps`` each)."""
    return whole_iterations(cfg.total_steps, cfg.num_envs * cfg.num_steps)


def default_eval_every(cfg: TrainConfig) -> int:
    """Iterations between validations where the train flags give no ``--eval-every``: about
    :data:`VALIDATIONS` per trial."""
    return max(1, trial_iterations(cfg) // VALIDATIONS)


class StorageError(ValueError):
    """The study's database cannot be opened (``--storage``), or the sweep folder's lock on asking it for trials."""


def study_storage(url: str) -> optuna.storages.RDBStorage:
    """The study's database at ``url``; SQLite waits for its lock (several processes write to one file), and a
    ``postgresql://`` URL without a driver uses psycopg2 where psycopg (3, SQLAlchemy's default) is missing.
    :class:`StorageError` names the URL (without its password) where it cannot be opened."""
    import sqlalchemy

    shown = shown_url(url)
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None:
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    engine = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as e:
        why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StorageError(f"--storage {shown}: cannot open the study's database: {why}") from None


def shown_url(url: str) -> str:
    """A database URL as it may be printed: its password hidden."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def pruner_of(sweep: Sweep) -> optuna.pruners.BasePruner:
    """``--pruner median``: Optuna's median pruner, patient as RL needs (:data:`PRUNER_STARTUP_TRIALS`,
    :data:`PRUNER_WARMUP_VALIDATIONS`); ``none``: every trial runs to its end."""
    if sweep.pruner == "none":
        return optuna.pruners.NopPruner()
    cfg = sweep.train.config
    warmup = PRUNER_WARMUP_VALIDATIONS * sweep.eval_every * cfg.num_envs * cfg.num_steps  # in env steps, as reported
    return optuna.pruners.MedianPruner(n_startup_trials=PRUNER_STARTUP_TRIALS, n_warmup_steps=warmup)


class StudyMismatchError(ValueError):
    """The study holds another sweep's trials (other train flags or another space)."""


class StudyLostError(ValueError):
    """The sweep's folder holds trials (or claims of trials) its study does not: the study's database was emptied,
    deleted, replaced or damaged."""


def opened_study(sweep: Sweep) -> optuna.Study:
    """The sweep's study, made where it does not exist yet; :class:`StudyMismatchError` where it holds another
    command's trials (a rerun must run the same trials: other train settings or another space would not)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # each trial's end is said here, in one line
    sweep.dir.mkdir(parents=True, exist_ok=True)
    with _asking_alone(sweep.dir):  # made, and its setup stored, once
        storage = study_storage(sweep.storage)
        check_folder_known(storage, sweep.dir, sweep.study_name)  # before a study that lost them is made or written
        study = optuna.create_study(storage=storage, study_name=sweep.study_name, direction="maximize",
                                    load_if_exists=True, pruner=pruner_of(sweep))
        setup = {"settings": sweep.settings, "space": sweep.space.to_dict()}
        stored = study.user_attrs.get("setup")
        if stored is None:
            study.set_user_attr("setup", setup)
        elif stored != setup:
            raise StudyMismatchError(f"study {sweep.study_name} in {shown_url(sweep.storage)} holds the trials of "
                                     f"another sweep ({_difference(stored, setup)}): run its own command again to go "
                                     "on with it, or pass another --dir or --study")
    return study


def check_folder_known(storage: optuna.storages.RDBStorage, folder: Path, name: str) -> None:
    """Raise :class:`StudyLostError` where the sweep's ``folder`` holds trials (run directories, claims) that its
    study ``name`` in ``storage`` does not: a trial is asked of the study before its folder or claim is made, so the
    study lost them (its database emptied, deleted or replaced), and a sweep would sample and run them again over
    theirs, a report would say none had run."""
    found = {int(m.group(1)) for p in (*folder.glob("trial-*"), *(folder / CLAIMS).glob("trial-*"))
             if (m := re.fullmatch(r"trial-(\d+)", p.name))}
    if not found:
        return
    try:
        known = len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
    except KeyError:  # no such study
        known = 0
    lost = sorted(n for n in found if n >= known)
    if lost:
        holds = f"holds only {counted(known, 'trial')}" if known else "is new (it holds no trial)"
        raise StudyLostError(f"{folder} holds trial-{lost[0]:04d} (of {counted(len(found), 'trial')} there) but "
                             f"study {name} in {shown_url(storage.url)} {holds}: its database was emptied, deleted "
                             "or replaced, and nothing was run or written; put the study's database back to go on, or "
                             f"start over in another --dir (or move {folder} aside)")


def _difference(stored: dict[str, Any], mine: dict[str, Any]) -> str:
    """What differs between two sweeps' setups, in words."""
    if stored["space"] != mine["space"]:
        return "another search space"
    theirs, ours = stored["settings"], mine["settings"]
    keys = sorted(k for k in {*theirs, *ours} if theirs.get(k) != ours.get(k))
    return ", ".join(f"{named(k)} {theirs.get(k, 'unset')} there, {ours.get(k, 'unset')} here"
                     for k in keys)


@contextlib.contextmanager
def _asking_alone(sweep_dir: Path) -> Iterator[None]:
    """The block run by one process of this machine at a time (an ``flock`` on ``.claims/ask.lock``): taking trials.
    Where there is no ``flock`` (Windows), unguarded: a trial asked past ``--trials`` is then told FAIL unrun."""
    path = sweep_dir / CLAIMS / "ask.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        held = checkpoints.appending(path)
    except OSError as e:  # a FIFO put in its place, say
        raise StorageError(f"--dir {sweep_dir}: cannot open {path}, the lock the sweep's processes take the study's "
                           f"trials under: {e.strerror or e}; move it aside") from None
    with held:
        if fcntl is not None:
            fcntl.flock(held, fcntl.LOCK_EX)  # released as the file closes, or as its process dies
        yield


def run_sweep(sweep: Sweep, machine: Machine | None = None) -> int:
    """Run the sweep's trials (``sweep.jobs`` at once) until the study holds ``sweep.trials``; the exit status: 0,
    1 where a trial failed (the others went on), a stop signal's (128 + its number) when stopped."""
    cfg = sweep.train.config
    machine = machine or Machine.detect(cfg.backend, cfg.ray_address, cfg.device)
    study = opened_study(sweep)
    ended = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False) if t.number < sweep.trials)
    sweep = dataclasses.replace(sweep, jobs=max(1, min(sweep.jobs, sweep.trials - ended)))  # none left idle
    _say_start(sweep, study, machine)
    statuses = run_jobs(functools.partial(sweep_job, sweep=sweep), sweep.jobs, machine)
    stopped = [s for s in statuses if s >= 128]
    return stopped[0] if stopped else max(statuses, default=0)


def _say_start(sweep: Sweep, study: optuna.Study, machine: Machine) -> None:
    """What the sweep runs, and where its study stands."""
    trials = study.get_trials(deepcopy=False)
    done = {state: sum(t.state == state for t in trials if t.number < sweep.trials)
            for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)}
    stands = ", ".join(f"{n} {state.name.lower()}" for state, n in done.items() if n)
    cfg = sweep.train.config
    lines = [f"sweep: {counted(sweep.trials, 'trial')} of --algo {cfg.algo} on {cfg.env} in {sweep.dir}, "
             f"{sweep.space.describe()}",
             f"study {sweep.study_name} in {shown_url(sweep.storage)}" + (f": {stands}" if stands else ": new"),
             f"objective: each trial's best validation return, every {counted(sweep.eval_every, 'iteration')}"
             + ("" if "eval_every" in sweep.train.given else f" (--eval-every not given: about {VALIDATIONS} "
                                                              "validations per trial)")
             + f"; pruner: {sweep.pruner}"]
    sampled = sorted(BATCH_SETTINGS & {d.name for d in sweep.space.dimensions})
    if sampled and sweep.pruner == "median":
        lines.append(f"note: the space samples {', '.join(sampled)}, so trials validate at different env steps; the "
                     "median pruner compares trials at the same env steps only, and prunes few of them")
    if sweep.jobs > 1:
        lines.append(f"{sweep.jobs} trials at a time, each with {counted(machine.split(sweep.jobs).cores, 'core')} "
                     f"of {machine.cores} (its run layout divides them; output in each trial's train.log)")
    print(*lines, sep="\n", file=sys.stderr, flush=True)


def sweep_job(index: int, share: Machine, sweep: Sweep) -> int:
    """One job of the sweep (``trainer.experiments.jobs``): trials one after another, each claimed (one left
    RUNNING by a stopped sweep, resumed) or new, until the study holds ``sweep.trials``; the exit status
    (:func:`run_sweep`'s)."""
    status, passed = 0, set()
    with StopSignals() as signals:  # in the study's bookkeeping a stop waits for it (train() has its own)
        try:
            study = opened_study(sweep)
            while (claimed := _claimed_trial(study, sweep, signals, passed)) is not None:
                try:  # claimed until the study is told how the trial ended
                    ended = _trial_run(claimed, sweep, share, signals, passed)
                finally:
                    claimed.lock.release()
                if ended >= 128:  # stopped: the next trial would only be stopped in turn
                    return ended
                status = max(status, ended)
        except KeyboardInterrupt as e:  # between trials: none is half told
            print(f"sweep: {e or 'interrupted'} between trials", file=sys.stderr, flush=True)
            return getattr(e, "exit_status", 130)
    return status


@dataclass
class _Claimed:
    """A trial this process runs: claimed (``lock``), its sampled ``params``, the validation returns already in the
    study by env steps (``reported``: a resumed trial's), and whether a stopped sweep left it (``resumed``)."""

    trial: optuna.Trial
    lock: checkpoints.RunDirLock
    params: dict[str, Any]
    reported: dict[int, float]
    resumed: bool


def _claimed_trial(study: optuna.Study, sweep: Sweep, signals: StopSignals, passed: set[int]) -> _Claimed | None:
    """The next trial for this process: a RUNNING one whose process is gone (its claim here is stale), else a new
    one while the study holds fewer than ``sweep.trials``; ``None`` once there is none. ``passed``: trials this
    process leaves to others (their run directory is in use)."""
    with signals.critical(), _asking_alone(sweep.dir):  # a stop waits: a trial asked is a trial claimed
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen.number >= sweep.trials or frozen.number in passed:
                continue
            lock = _claim(sweep, frozen.number, left=True)
            if lock is None:
                continue
            if any(t.number == frozen.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
                # (one asked but never sampled samples as it would have been, uninterrupted)
                study.sampler = _sampler(sweep.sampler_seed, frozen.number)
                trial = _marked(optuna.Trial(study, frozen._trial_id), sweep)  # the same trial: its params, values
                return _Claimed(trial, lock, sweep.space.sample(trial), dict(frozen.intermediate_values), True)
            lock.release()  # told how it ended between the look and the claim
        if len(study.get_trials(deepcopy=False)) >= sweep.trials:
            return None
        study.sampler = _sampler(sweep.sampler_seed, len(study.get_trials(deepcopy=False)))
        trial = study.ask()
        if trial.number >= sweep.trials:  # another machine asked first: this one is not run
            trial.set_user_attr("surplus", f"asked once {sweep.trials} trials existed: never run")
            study.tell(trial, state=TrialState.FAIL)
            return None
        lock = _claim(sweep, trial.number, left=False)
        return _Claimed(_marked(trial, sweep), lock, sweep.space.sample(trial), {}, False)


def _marked(trial: optuna.Trial, sweep: Sweep) -> optuna.Trial:
    """``trial``, its run directory and this host stored with it (the report's table shows them)."""
    trial.set_user_attr("run_dir", str(sweep.trial_dir(trial.number).resolve()))
    trial.set_user_attr("host", socket.gethostname())
    return trial


def _claim(sweep: Sweep, number: int, left: bool) -> checkpoints.RunDirLock | None:
    """This process's claim on trial ``number`` (its lock held); ``None`` where another live process holds it, or,
    for a trial ``left`` RUNNING, where it was never claimed here and may be another asker's, between its ask and
    its claim. Called under :func:`_asking_alone`: where every asker of the study asks under that lock (its SQLite
    file in the folder), an unclaimed RUNNING trial lost its asker in that moment (a kill -9), and is taken."""
    where = sweep.dir / CLAIMS / f"trial-{number:04d}"
    if left and not where.is_dir() and not _asked_here_only(sweep):
        return None
    lock = checkpoints.RunDirLock(where)
    try:
        return lock.acquire()
    except checkpoints.RunDirLockedError:
        if not left:
            raise
        return None


def _asked_here_only(sweep: Sweep) -> bool:
    """Whether the study's every trial is asked under this folder's ask lock: its database is SQLite, in the
    folder (a database elsewhere may be shared with other folders or machines)."""
    url = sweep.storage
    return url.startswith("sqlite:///") and Path(url.removeprefix("sqlite:///")).resolve().parent == \
        sweep.dir.resolve()


def _sampler(seed: int, number: int) -> optuna.samplers.TPESampler:
    """TPE, seeded for the trial about to be asked (``number`` trials exist): its values depend on the study's
    trials and the seed alone, not on what this process sampled before, so that a stopped and resumed sweep
    samples as an uninterrupted one (with --jobs 1)."""
    return optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([seed, number]).generate_state(1)[0]))


class _Validations:
    """A trial's training hook (``train(on_iteration=...)``): each validation return reported to the study at its
    env steps, and the pruner asked; ``True`` (pruned) ends the run. ``reported``: the values the study holds
    already (a resumed trial's), by env steps."""

    def __init__(self, trial: optuna.Trial, reported: dict[int, float]) -> None:
        self.trial, self.values, self.pruned = trial, dict(reported), False

    def __call__(self, row: dict[str, Any]) -> bool:
        if "val_return" not in row:
            return False
        self._reported(row)
        self.pruned = self.trial.should_prune()
        return self.pruned

    def _reported(self, row: dict[str, Any]) -> None:
        step = int(row["env_steps"])
        if step not in self.values:  # (a resume from an older checkpoint plays validations again: the same values)
            self.trial.report(row["val_return"], step)
            self.trial.set_user_attr("env_steps", step)
            self.values[step] = row["val_return"]

    def caught_up(self, metrics: Path, saved: int) -> None:
        """Report the validations of a stopped run's ``metrics``, up to its checkpoint's iteration ``saved``, that
        the study misses: a kill between a validation's checkpoint and its report."""
        for row in rows_until(metrics, saved):
            if "val_return" in row:
                self._reported(row)

    def pruned_already(self) -> bool:
        """Whether the pruner stops the trial at its last reported validation (a stop came before the study was
        told): asked again, as the stopped sweep would have."""
        self.pruned = bool(self.values) and self.trial.should_prune()
        return self.pruned

    @property
    def best(self) -> float | None:
        """The trial's value: its best validation return (``None`` before any)."""
        return max(self.values.values(), default=None)

    @property
    def last_step(self) -> int:
        return max(self.values, default=0)


def _trial_run(claimed: _Claimed, sweep: Sweep, share: Machine, signals: StopSignals, passed: set[int]) -> int:
    """Train (or resume) a claimed trial and tell the study how it ended; the exit status: 0, 1 (it failed), or a
    stop signal's (it stays RUNNING, its checkpoint written). One line on the terminal says each event; with
    several jobs, the training's own output goes to the run directory's ``train.log``."""
    from trainer.loop import TrainingStopped, train  # (torch: once the command line is checked)

    trial, number = claimed.trial, claimed.trial.number
    run_dir, alone = sweep.trial_dir(number), sweep.jobs == 1
    validations = _Validations(trial, claimed.reported)
    saved = checkpoints.checkpoint_files(run_dir) if claimed.resumed else []
    resume = str(run_dir) if saved else ""
    if saved:
        with signals.critical():
            validations.caught_up(run_dir / "metrics.jsonl", checkpoints.checkpoint_iteration(saved[0]))
    if resume and validations.pruned_already():
        return _told(trial, validations, signals, f"pruned at {validations.last_step:,} env steps")
    values = " ".join(f"{k}={_short(v)}" for k, v in claimed.params.items())
    where = f"{run_dir}" + ("" if alone else f" (log: {run_dir / 'train.log'})")
    say(f"trial {number}: {'resumes' if resume else 'starts'} {values} in {where}")
    try:
        with training_output(run_dir / "train.log", alone):
            cfg = sweep.trial_config(number, claimed.params)
            with signals.critical():
                trial.set_user_attr("budget", _env_steps_to_end(cfg))
            summary = train(cfg, progress=alone, resume=resume, machine=share, on_iteration=validations)
    except TrainingStopped as e:
        with signals.critical():  # what it spent until the stop (a validation said it last)
            trial.set_user_attr("env_steps", e.iteration * cfg.num_envs * cfg.num_steps)
        say(f"trial {number}: {e} after iteration {e.iteration}; it stays RUNNING in the study, and the same "
             "command resumes it")
        return e.exit_status
    except KeyboardInterrupt as e:  # before its first iteration
        say(f"trial {number}: {e or 'interrupted'} before its first iteration; the same command starts it again")
        return getattr(e, "exit_status", 130)
    except checkpoints.RunDirLockedError as e:  # someone trains it by hand: theirs, left RUNNING
        passed.add(number)
        say(f"trial {number}: left as it is: {e}")
        return 0
    except Exception as e:  # an env's error, a sampled combination the trainer refuses: this trial's; others go on
        notes = "\n".join(getattr(e, "__notes__", ())) if alone else ""
        with signals.critical():
            trial.set_user_attr("error", f"{type(e).__name__}: {e}")
            _tell(trial, TrialState.FAIL)
        say(f"trial {number}: failed: {e or type(e).__name__}\n{notes}".rstrip())
        return 1
    trial_end = (f"pruned at {summary['env_steps']:,} env steps" if validations.pruned
                 else f"finished at {summary['env_steps']:,} env steps")
    status = _told(trial, validations, signals, trial_end, summary["env_steps"])
    return 128 + summary["late_signal"] if summary["late_signal"] else status  # a stop as it closed: no next trial


def _told(trial: optuna.Trial, validations: _Validations, signals: StopSignals, end: str,
          env_steps: int | None = None) -> int:
    """Tell the study how the trial ended (pruned, or complete with its best validation return; failed without
    any validation) and say it; the exit status."""
    with signals.critical():
        if env_steps is not None:
            trial.set_user_attr("env_steps", env_steps)
        if validations.pruned:
            _tell(trial, TrialState.PRUNED)
        elif validations.best is None:
            trial.set_user_attr("error", "no validation: --eval-every is more than the trial's iterations")
            _tell(trial, TrialState.FAIL)
            say(f"trial {trial.number}: failed: {end} without a validation")
            return 1
        else:
            _tell(trial, TrialState.COMPLETE, validations.best)
    say(f"trial {trial.number}: {end}, best validation return {_short(validations.best)}")
    return 0


def _env_steps_to_end(cfg: TrainConfig) -> int:
    """The env steps a trial of ``cfg`` spends if it runs to its end."""
    return trial_iterations(cfg) * cfg.num_envs * cfg.num_steps


def _tell(trial: optuna.Trial, state: TrialState, value: float | None = None) -> None:
    """Tell the trial's study that it ended in ``state`` (with ``value``, complete)."""
    trial.study.tell(trial, value, state=state)


def _short(value: Any) -> str:
    """A value as a line shows it: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
