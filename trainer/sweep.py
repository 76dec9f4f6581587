"""Tune a training's settings with Optuna: trials of trainer.train with the values a search space samples.

    python -m trainer.sweep --space SPACE.toml --trials N [--jobs J] [--dir DIR] [--storage URL] [--study NAME]
                            [--pruner median|none] [--sampler-seed S] -- [trainer.train flags]
    python -m trainer.sweep --report --dir DIR [--storage URL] [--study NAME]

Each trial trains the train flags with the values the space samples (TPE) as an ordinary run directory
(DIR/trial-0000, ...); its objective is its best validation return (--eval-every), reported at every validation
so that the median pruner stops weak trials early. The study lives in DIR/study.db by default; every process
that runs the same command (here with --jobs, or on other machines with a shared --storage) joins it, and
--trials N is the study's total. Ctrl-C keeps every finished trial; the same command again resumes the
interrupted one from its checkpoint and goes on. At the end: the table of trials, DIR/best.toml (for
trainer.train --config) and Optuna's history and importance plots (docs/experiments.md#sweeps).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from collectors.stop_signals import exiting_at_once_on_stop_signals
from trainer.arguments import OneLineParser, command, not_a_directory, not_writable
from trainer.experiments.space import SearchSpace, SpaceError
from trainer.flags import CommandLine, build_parser, parse_args

if TYPE_CHECKING:  # (torch and Optuna load once the command line is checked)
    from trainer.experiments.study import Sweep

PROG = "python -m trainer.sweep"
STUDY_FILE = "study.db"


def _parser() -> OneLineParser:
    """The sweep's own flags (those before ``--``)."""
    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog="The train flags after -- are trainer.train's: python -m trainer.train --help",
                      usage=f"{PROG} --space SPACE.toml --trials N [options] -- [trainer.train flags]\n"
                            f"       {PROG} --report --dir DIR [--storage URL] [--study NAME]")
    p.add_argument("--space", metavar="SPACE.toml",
                   help="the search space: one table per setting, [lr] with low, high and optionally log = true or "
                        "step, or choices = [...] (docs/experiments.md#sweeps)")
    p.add_argument("--trials", type=int, metavar="N",
                   help="trials in the study, in total: every process running this command stops once N exist")
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="train J trials at once, each with 1/J of the cores (default 1)")
    p.add_argument("--dir", metavar="DIR", help="the sweep's folder: a run directory per trial, the study's "
                                                "SQLite file, best.toml and the plots (default runs/sweep-<space "
                                                "file name>)")
    p.add_argument("--storage", metavar="URL", help=f"the study's Optuna database (default sqlite:///DIR/"
                                                    f"{STUDY_FILE}); postgresql://USER:PASS@HOST/DB lets several "
                                                    "machines run this command on one study")
    p.add_argument("--study", metavar="NAME", help="the study's name in its database (default DIR's name)")
    p.add_argument("--pruner", choices=("median", "none"), default="median",
                   help="median: stop a trial whose best validation return is below the median of the finished "
                        "trials' at the same env steps (once 4 trials have finished, from the trial's 2nd "
                        "validation on); none: every trial runs to its end (default median)")
    p.add_argument("--sampler-seed", type=int, metavar="S",
                   help="seed of the TPE sampler (default the train flags' --seed): with --jobs 1 the same command "
                        "samples the same trials")
    p.add_argument("--report", action="store_true",
                   help="train nothing: write the table, best.toml and the plots of the sweep in --dir")
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The sweep's flags and the train flags, at the first ``--``."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def _train_flags(parser: OneLineParser, flags: list[str]) -> CommandLine:
    """The train flags after ``--``, as ``trainer.train`` parses them (its one-line errors), less what a sweep
    does itself."""
    train = parse_args(flags, prog=PROG, hidden=("resume", "overwrite", "seeds", "jobs"))
    refused = {"run_dir": "each trial's run directory is DIR/trial-NNNN: pass --dir DIR before --",
               "resume": "the same sweep command resumes its trials: run it again",
               "overwrite": "a sweep's trials are its own; for a fresh sweep, pass another --dir",
               "seeds": "a sweep's trials share the train flags' --seed (one seed per sweep: --seed S)"}
    given = {"run_dir": "run_dir" in train.given, "resume": bool(train.resume), "overwrite": train.overwrite,
             "seeds": bool(train.seeds)}
    for key, why in refused.items():
        if given[key]:
            parser.error(f"--{key.replace('_', '-')} after --: {why}")
    if train.given.get("eval_every") == 0:
        parser.error("--eval-every 0 after --: a sweep's objective is the validation return; give --eval-every K > "
                     "0, or leave it out for about 10 validations per trial")
    return train


def _unknown_flags(parser: OneLineParser, unknown: list[str]) -> None:
    """The usage error for flags the sweep does not take: trainer.train's, given before the ``--``, are sent after
    it; any other is a typo of the sweep's own (did you mean)."""
    train_flags = {o for action in build_parser()._actions for o in action.option_strings}
    if any(w.partition("=")[0] in train_flags for w in unknown):  # (the rest: their values)
        parser.error(f"{' '.join(unknown)}: trainer.train's flags go after '--' (python -m trainer.sweep --space S "
                     f"--trials N -- {' '.join(unknown)})")
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def _checked_storage(parser: OneLineParser, url: str | None) -> None:
    """A ``--storage`` URL whose database driver is missing is named, with the extra that brings it."""
    drivers = ("psycopg2", "psycopg")
    if url and url.startswith("postgresql") and not any(importlib.util.find_spec(d) for d in drivers):
        parser.error("--storage postgresql://...: PostgreSQL needs psycopg2: pip install -e '.[postgresql]'")


def main(argv: list[str] | None = None) -> None:
    """``python -m trainer.sweep``: a sweep run (or its report written) as ``argv`` asks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    ours, flags = _split(argv)
    args, unknown = parser.parse_known_args(ours)
    if unknown:
        _unknown_flags(parser, unknown)
    if importlib.util.find_spec("optuna") is None:
        parser.error("trainer.sweep needs Optuna: pip install -e '.[experiments]'")
    _checked_storage(parser, args.storage)
    if args.report:
        if flags or args.trials is not None:
            parser.error("--report writes what the study holds: it takes no --trials and no train flags")
        if not (args.dir or args.space):
            parser.error("--report needs the sweep's --dir (or its --space, for the default folder)")
        raise SystemExit(_report(parser, args))
    if not args.space:
        parser.error("--space SPACE.toml is required (the settings to sample)")
    if args.trials is None or args.trials < 1:
        parser.error(f"--trials N is required, N >= 1{'' if args.trials is None else f', got {args.trials}'}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if why := not_a_directory("--dir", str(_folder(args))) or not_writable("--dir", str(_folder(args))):
        parser.error(why)
    train = _train_flags(parser, flags)
    if args.jobs > 1 and train.config.backend == "ray":
        parser.error("--jobs trains trials side by side on this machine; with --backend ray the cluster's CPUs are "
                     "every trial's: use --jobs 1")
    try:
        space = SearchSpace.read(args.space, train.config, train.given)
    except SpaceError as e:
        parser.error(str(e))
    with exiting_at_once_on_stop_signals("nothing was run; run the same command again"):
        from trainer.experiments import study
    sweep = _sweep(parser, args, train, space, argv)
    try:
        status = study.run_sweep(sweep)
    except (study.StudyMismatchError, study.StudyLostError, study.StorageError) as e:
        parser.error(str(e))
    raise SystemExit(_said_end(sweep, status))


def _sweep(parser: OneLineParser, args: argparse.Namespace, train: CommandLine, space: SearchSpace,
           argv: list[str]) -> Sweep:
    """The sweep the command line asks for, its defaults filled in."""
    from trainer.experiments import study

    folder = _folder(args)
    every = train.config.eval_every or study.default_eval_every(train.config)
    iterations = study.trial_iterations(train.config)
    if every > iterations:
        parser.error(f"--eval-every {every} after --: a trial makes {iterations} iterations, so it would never "
                     "validate; give a smaller --eval-every")
    return study.Sweep(folder, args.storage or _default_storage(folder), args.study or folder.resolve().name,
                       args.trials, space, train, every, args.pruner,
                       train.config.seed if args.sampler_seed is None else args.sampler_seed, args.jobs, tuple(argv))


def _folder(args: argparse.Namespace) -> Path:
    """The sweep's folder: ``--dir``, else ``runs/sweep-<the space file's name>``."""
    return Path(args.dir) if args.dir else Path("runs") / f"sweep-{Path(args.space).stem}"


def _default_storage(folder: Path) -> str:
    return f"sqlite:///{(folder / STUDY_FILE).resolve()}"


def _said_end(sweep: Sweep, status: int) -> int:
    """Say the report and where the sweep stands; the exit status (``status``, the trials')."""
    from trainer.experiments import study, study_report

    try:
        opened = study.opened_study(sweep)
        study_report.report(opened, sweep.dir)
        left = [t.number for t in study_report.trials_of(opened) if t.state.name == "RUNNING"]
        made = len(study_report.trials_of(opened))
    except KeyboardInterrupt:  # a stop while the report is written: the trials are all told already
        return status or 130
    if left or made < sweep.trials:
        running = f"{'trial' if len(left) == 1 else 'trials'} {', '.join(map(str, left))} running or stopped; " \
            if left else ""
        print(f"{running}{made} of {sweep.trials} trials exist\n"
              f"resume:        {command('-m', 'trainer.sweep', *sweep.argv)}")
    return status


def _report(parser: OneLineParser, args: argparse.Namespace) -> int:
    """``--report``: the sweep's table, ``best.toml`` and plots, from its study."""
    folder = _folder(args)
    if not args.storage and not (folder / STUDY_FILE).is_file():
        parser.error(f"--dir {folder}: no sweep there (no {STUDY_FILE}); pass the sweep's --dir, or its --storage")
    with exiting_at_once_on_stop_signals("nothing was written"):
        import optuna

        from trainer.experiments import study, study_report
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, url = args.study or folder.resolve().name, args.storage or _default_storage(folder)
    try:
        storage = study.study_storage(url)
        study.check_folder_known(storage, folder, name)  # a report of a study that lost them would say none ran
        opened = optuna.load_study(study_name=name, storage=storage)
    except (study.StorageError, study.StudyLostError) as e:
        parser.error(str(e))
    except KeyError:
        parser.error(f"--study {name}: no such study in {study.shown_url(url)}")
    study_report.report(opened, folder)
    return 0


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
