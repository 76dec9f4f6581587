"""Train a policy: ``python -m trainer.train`` (PPO on VR-edge with defaults; ``--algo apex`` for Ape-X;
``--help`` for every flag; ``--seeds 1-5`` for one run per seed, ``trainer.experiments.seeds``).

The command line around the durable loop, ``trainer.loop.train`` (re-exported here): what it says, its exit
statuses, torchrun's restarts.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # first of all: the window for an import traceback is Python's own start-up alone
    from collectors.stop_signals import exit_at_once_on_stop_signals, restore_handlers

    # a stop signal while torch and the rest load: one line, not an import traceback (handlers restored below);
    # under torchrun, rank 0's
    _STARTING = exit_at_once_on_stop_signals("nothing to save, nothing was written; run the same command again"
                                             if os.environ.get("RANK", "0") == "0" else "")

from trainer.flags import RESUMABLE_CHANGES, CommandLine, build_parser, defaults_used, parse_args

if __name__ == "__main__":
    COMMAND_LINE = parse_args()  # the command line checked (--help answered) before torch loads: seconds, not ten

import contextlib
import dataclasses
import multiprocessing
from pathlib import Path

import checkpoints
from collectors import EnvError, RayConnectError, WorkerDiedError
from envs.settings import ConfigError
from trainer.algorithm import NonFiniteLossError
from trainer.arguments import command, counted, ending_quietly_when_stdout_closes, exit_after_rank_0
from trainer.common.world import LeadFailedError, RankLostError, World, WorldEnvironmentError
from trainer.config import named
from trainer.loop import TrainingStopped, error_text, train, train_command

__all__ = ["TrainingStopped", "main", "train", "train_command"]


def _no_torchrun_restart() -> None:
    """Under ``torchrun --max-restarts``, end this node's torchrun (the ranks' parent) rather than let it restart
    the ranks: for a stop signal, or a setting a restart would refuse again. torchrun then passes SIGTERM to the
    ranks, which are exiting already, and stops."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's SIGTERM to this rank: it is on its way out
        if os.environ.get("LOCAL_RANK") == "0":
            os.kill(os.getppid(), signal.SIGTERM)


def _restarted_run(cli: CommandLine) -> str:
    """The run a torchrun restart (``--max-restarts``) resumes: the same command's ``--run-dir``, once it holds a
    checkpoint; ``""`` otherwise. A run that torchrun may restart needs a ``--run-dir`` to be found again."""
    if cli.resume or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return ""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts and not cli.config.run_dir:
        raise ConfigError("run_dir", "", f"is needed under torchrun --max-restarts {restarts}: a restart resumes the "
                          "run there; pass --run-dir DIR")
    if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) and checkpoints.checkpoint_files(cli.config.run_dir or "."):
        return cli.config.run_dir
    return ""


def _rank() -> int:
    """This process's rank under torchrun (0 alone); where the environment describes no valid world (set by hand),
    the one line that names the variable, and exit status 1."""
    try:
        return World.from_environment().rank
    except WorldEnvironmentError as e:
        raise SystemExit(f"error: {e}") from None


def _stored_setting(key: str, cli: CommandLine) -> str:
    """Where a resumed run's setting came from, when the command line did not give it: its checkpoint."""
    if not cli.resume or key in cli.given:
        return ""
    name = named(key)
    change = f"pass {name}" if name.startswith("--") else f"set {name} in a --config TOML file"
    return f" (the run's stored {name}" + (f"; {change} to change it on resume)" if key in RESUMABLE_CHANGES
                                           else ")")


# (the run directory may hold its config already: the same command takes it over, and a resume starts again from
# its checkpoint)
NOTHING_TO_SAVE = "before the first iteration completed: nothing to save; run the same command again"


@ending_quietly_when_stdout_closes()  # `| head -1`: exit status 141, no traceback (the run is saved before it speaks)
def main(argv: list[str] | None = None, cli: CommandLine | None = None) -> None:
    """``python -m trainer.train``: the command line ``argv`` (or the one already parsed, ``cli``) run."""
    cli = cli or parse_args(argv)
    defaults = "" if cli.resume else defaults_used(cli.config, cli.given)
    # next to the run layout's lines: what the bare command runs is not the same for every algo
    preface = [f"defaults for --algo {cli.config.algo} on {cli.config.env}: {defaults}"] if defaults else []
    rank = _rank()  # under torchrun, rank 0 says what every rank did; the others, their own
    try:
        if cli.seeds:
            from trainer.experiments.seeds import train_seeds
            raise SystemExit(train_seeds(cli, preface))
        cli = dataclasses.replace(cli, resume=cli.resume or _restarted_run(cli))  # torchrun --max-restarts
        summary = train(cli.config, resume=cli.resume, given=cli.given, overwrite=cli.overwrite, preface=preface,
                        until_exit=True)  # a storm of signals after the stop's checkpoint changes no exit status
    except TrainingStopped as e:
        _no_torchrun_restart()  # a stop is a stop: torchrun --max-restarts must not undo it
        run_dir = str(e.run_dir.resolve())
        with contextlib.suppress(OSError):  # a SIGHUP's terminal is gone: what was completed is saved all the same
            if rank:  # rank 0 says where the run is
                raise SystemExit(e.exit_status) from None
            if e.checkpoint:
                print(f"\n{e} after iteration {e.iteration}; checkpoint: {e.checkpoint.resolve()}\n"
                      f"resume:        {train_command('--resume', run_dir)}", file=sys.stderr)
            else:  # stopped in the first iteration: as before it, below
                print(f"\n{e} {NOTHING_TO_SAVE}", file=sys.stderr)
        raise SystemExit(e.exit_status) from None
    except KeyboardInterrupt as e:  # before the first iteration
        _no_torchrun_restart()
        if not rank:
            print(f"\n{e or 'interrupted'} {NOTHING_TO_SAVE}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None
    except ConfigError as e:  # a setting this machine cannot run: as the flags' errors, exit status 2
        _no_torchrun_restart()  # a restart would meet it again
        if rank:  # every rank meets it: rank 0 says it
            exit_after_rank_0(2)
        build_parser().error(f"{cli.error_text(e)}{_stored_setting(e.key, cli)}")
    except (ValueError, TypeError, NonFiniteLossError, WorkerDiedError, EnvError, RayConnectError,
            RankLostError, LeadFailedError) as e:
        # an env's error carries the env's own traceback; the trainer's frames above it would only be noise
        if rank and (isinstance(e, LeadFailedError) or isinstance(e, RankLostError) and 0 not in e.lost):
            exit_after_rank_0(1)  # rank 0 lives, and says it
        raise SystemExit(f"rank {rank}: " * bool(rank) + error_text(e)) from None
    if not rank:
        _say_summary(summary)


def _say_summary(summary: dict) -> None:
    """Where a finished (or stopped early) run's files are, on stdout, its end (``trainer.run_end``: distillation,
    the checkpoint it ends with, the quality line) and the commands that go on from it."""
    from trainer.run_end import end_of_run

    run_dir = str(Path(summary["run_dir"]).resolve())
    print(f"run directory: {run_dir} ({counted(summary['iterations'], 'iteration')}, {summary['env_steps']:,} env "
          "steps)")
    print(f"metrics:       {run_dir}/metrics.jsonl")
    if summary["checkpoint"]:
        checkpoint = end_of_run(summary, _say).resolve()
        # the run directory stands for its newest checkpoint: a resume with nothing to do from an older one
        # names that one, so that evaluating it or training it longer goes on from what was described
        newest = [p.resolve() for p in checkpoints.checkpoint_files(run_dir)[:1]] == [checkpoint]
        target = run_dir if newest else str(checkpoint)
        print(f"evaluate:      {command('-m', 'trainer.evaluate', '--checkpoint', target)}")
        if not summary["finished"]:
            print(f"resume:        {train_command('--resume', target)}")
        else:
            longer = str(summary["longer_total_steps"])  # a value to paste, not a placeholder
            print(f"train longer:  {train_command('--resume', target, '--total-steps', longer)}")


def _say(label: str, line: str) -> None:
    """One labelled line of the run's end on stdout, aligned with the others."""
    print(f"{label + ':':<15}{line}")


if __name__ == "__main__":
    restore_handlers(_STARTING)  # torch has loaded: from here on, a stop is train's (StopSignals)
    multiprocessing.freeze_support()
    main(cli=COMMAND_LINE)
