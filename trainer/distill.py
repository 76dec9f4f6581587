"""Distil the causal reference into a trained VR-edge policy: one round of DAgger with ``BeliefMPC`` as the expert.

    python -m trainer.distill RUN_DIR [--episodes 64] [--epochs 3] [--lr 1e-4] [--validation-episodes 64] [--seed S]

The run's newest checkpoint plays ``--episodes`` episodes of its own cell; ``envs.belief_mpc.BeliefMPC`` labels every
state with the levels it would play; the actor is fine-tuned toward them. Where the result scores no lower on the
run's validation episodes, it is the run's next checkpoint (``ckpt_<iteration>_<round>.pt``, the same iteration,
its record of rounds in ``distilled``; ``latest`` names it, and ``best`` where it scores no lower than the best);
the checkpoint it came from stays as it was. Otherwise nothing is written. ``trainer.train`` (so ``make train``)
runs it when a VR-edge run of 1M+ steps finishes (``distill_rounds`` times). Running it again is another DAgger round
(the distilled policy plays episodes of its own, the expert labels again). A synthetic VR-edge cell only (the expert
filters its hidden state); a PPO run only. The library: ``trainer.ppo.distillation``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # first of all: a stop signal while torch loads is one line, not an import traceback
    from collectors.stop_signals import exit_at_once_on_stop_signals

    _STARTING = exit_at_once_on_stop_signals("nothing was written; run the same command again")

import argparse
import multiprocessing
from dataclasses import fields
from pathlib import Path

from envs.settings import ConfigError
from trainer.arguments import OneLineParser, ending_quietly_when_stdout_closes

NOTHING_WRITTEN = "nothing was written (the run ends with the checkpoint it ended with before)"


@ending_quietly_when_stdout_closes()  # `| head -1`: exit status 141, no traceback (the round is saved before it speaks)
def main(argv: list[str] | None = None) -> None:
    import checkpoints
    from trainer.interrupts import StopSignals
    from trainer.ppo.distillation import DistillSettings, distill_run, summary_line

    p = OneLineParser(prog="python -m trainer.distill", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run directory (its newest checkpoint is distilled)")
    for f in fields(DistillSettings):
        default = None if f.name == "seed" else f.default
        p.add_argument(f"--{f.name.replace('_', '-')}", type=float if f.type == "float" else int, default=default,
                       help=f"{f.metadata['help']} (default: " + ("the rounds the checkpoint has kept, so that each "
                       "round labels episodes of its own)" if default is None else "%(default)s)"))
    args = p.parse_args(argv)
    run = Path(args.run)
    if run.is_file():
        p.error(f"{run} is a file: pass the run directory it belongs to (its newest checkpoint is distilled)")
    if not run.is_dir():
        p.error(f"{run}: no such run directory")
    run = checkpoints.run_dir_of(run)  # the run's checkpoints folder stands for the run
    settings = {f.name: getattr(args, f.name) for f in fields(DistillSettings) if f.name != "seed"}
    saved: list[Path] = []  # the round's checkpoint, the moment it is on disk with its pointers
    try:
        # Ctrl-C or SIGTERM: one line saying what is on disk, exit status 128 + the signal, the run directory
        # unlocked; once done, a signal is noted and the process ends as it would have
        with StopSignals(until_exit=True) as signals:
            summary = distill_run(run, seed=args.seed, saved=saved, **settings,
                                  started=lambda line: print(f"distilling: {line}", file=sys.stderr, flush=True))
            signals.finish()
    except ConfigError as e:
        p.error(str(e))
    except checkpoints.CheckpointError as e:
        if not checkpoints.checkpoint_files(run):
            p.error(f"{run}: no checkpoint to distil (train it first: python -m trainer.train --run-dir {run})")
        raise SystemExit(f"error: {e}") from None  # (a record of rounds edited by hand, say)
    except ValueError as e:  # the run directory held by a live run
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt as e:
        done = f"the round was saved first: {saved[-1].resolve()}" if saved else NOTHING_WRITTEN
        print(f"\n{str(e) or 'interrupted'}: {done}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 130)) from None
    for note in summary["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(f"distilled:  {summary_line(summary)}")
    print(f"checkpoint: {Path(summary['checkpoint']).resolve()}")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()  # (the start-up's handlers stay until main's own: its imports load torch)
