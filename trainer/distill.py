"""Distil an expert into a trained VR-edge policy: rounds of DAgger, with the causal reference (``BeliefMPC`` on
``fair_share``) or, for approximate policy iteration, the rollout on the policy itself as the expert.

    python -m trainer.distill RUN_DIR [--episodes 64] [--epochs E] [--lr LR] [--validation-episodes 64] [--seed S]
                                      [--expert reference|rollout] [--rounds 1]

The run's newest checkpoint plays ``--episodes`` episodes of its own cell; the expert labels every state with the
levels it would play (``--expert reference``: ``envs.belief_mpc.BeliefMPC`` on ``fair_share``; ``rollout``: its
rollout on the policy being distilled, ending on the policy's critic); the actor is fine-tuned toward them. Where
the result scores no lower on the run's validation episodes, it is the run's next checkpoint
(``ckpt_<iteration>_<round>.pt``, the same iteration, its record of rounds in ``distilled``; ``latest`` names it, and
``best`` where it scores no lower than the best); the checkpoint it came from stays as it was. Otherwise nothing is
written. ``--rounds N`` does up to N rounds, each on the policy the round before kept, and stops at the first not
kept: with ``--expert rollout`` that is approximate policy iteration (rollout, distil, repeat while each round
beats the last on validation episodes). ``trainer.train`` (so ``make train``) runs the reference's rounds when a
VR-edge run of 1M+ steps finishes (``distill_rounds`` times). Running it again is another round (the distilled
policy plays episodes of its own, the expert labels again). A synthetic VR-edge cell only (the expert filters its
hidden state); a PPO run only. The library: ``trainer.ppo.distillation``.
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

from envs.settings import ConfigError, help_of, limits_of
from trainer.arguments import OneLineParser, ending_quietly_when_stdout_closes

NOTHING_WRITTEN = "nothing was written (the run ends with the checkpoint it ended with before)"


@ending_quietly_when_stdout_closes()  # `| head -1`: exit status 141, no traceback (the round is saved before it speaks)
def main(argv: list[str] | None = None) -> None:
    import checkpoints
    from trainer.interrupts import StopSignals
    from trainer.ppo.distillation import DistillSettings, distill_rounds

    p = _parser()
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
            said = _Said(args.rounds)
            distill_rounds(run, args.rounds, args.seed, saved, started=said.started, ended=said.ended, **settings)
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
    print(f"checkpoint: {Path(said.last()['checkpoint']).resolve()}")


def _parser() -> OneLineParser:
    from trainer.ppo.distillation import DistillSettings

    p = OneLineParser(prog="python -m trainer.distill", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="run directory (its newest checkpoint is distilled)")
    for f in fields(DistillSettings):
        default = None if f.name == "seed" else f.default
        kind = {"float": float, "str": str}.get(f.type, int)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=default,
                       choices=limits_of(f).choices or None,
                       help=f"{help_of(f)} (default: " + ("the rounds the checkpoint has kept, so that each "
                       "round labels episodes of its own)" if default is None else "%(default)s)"))
    p.add_argument("--rounds", type=int, default=1, help="rounds, one after another, each labelling the episodes "
                   "the policy the last one kept plays; the first not kept ends them (with --expert rollout: "
                   "approximate policy iteration, each round's expert built on the policy before it) (default: "
                   "%(default)s)")
    return p


class _Said:
    """What the command says of its rounds: a line as each starts, and each one's outcome as the next starts, the
    last's by :meth:`last` once the work is done (a stop signal then cuts no line short)."""

    def __init__(self, rounds: int) -> None:
        self.rounds, self.done = rounds, []

    def started(self, line: str) -> None:
        if self.done:
            _said(*self.done[-1])
        print(f"distilling: {line}", file=sys.stderr, flush=True)

    def ended(self, summary: dict) -> None:
        self.done.append((summary, f"round {len(self.done) + 1} of {self.rounds}: " if self.rounds > 1 else ""))

    def last(self) -> dict:
        _said(*self.done[-1])
        return self.done[-1][0]


def _said(summary: dict, which: str) -> None:
    """A round's notes, then its outcome in a line (:func:`trainer.ppo.distillation.summary_line`)."""
    from trainer.ppo.distillation import summary_line

    for note in summary["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(f"distilled:  {which}{summary_line(summary)}", flush=True)


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()  # (the start-up's handlers stay until main's own: its imports load torch)
