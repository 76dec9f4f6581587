"""Distil the causal ceiling into a trained VR-edge policy: one round of DAgger with ``BeliefMPC`` as the expert.

    python -m trainer.distill RUN_DIR [--episodes 64] [--epochs 3] [--lr 1e-4] [--validation-episodes 64] [--seed S]

The run's newest checkpoint plays ``--episodes`` episodes of its own cell; ``envs.belief_mpc.BeliefMPC`` labels every
state with the levels it would play; the actor is fine-tuned toward them (``trainer.ppo.distill``). The checkpoint
is rewritten in place with the distilled weights (the weights before it kept beside them, as ``undistilled_model``,
and what was done as ``distilled``) only where they score no lower on the run's validation episodes; otherwise it is
left as it was. ``trainer.train`` (so ``make train``) runs it when a VR-edge run of 1M+ steps finishes
(``distill_rounds`` times). Running it again is another DAgger round (the distilled policy plays episodes of their
own, the expert labels again). A synthetic VR-edge cell only (the expert filters its hidden state); a PPO run only.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from envs.settings import ConfigError
from trainer.arguments import OneLineParser, counted

NOTHING_WRITTEN = "nothing was written (the checkpoint is as it was)"


def distill_run(run_dir: str | Path, seed: int | None = None, **settings: Any) -> dict[str, Any]:
    """Distil the newest checkpoint of ``run_dir`` (module docstring) with :class:`trainer.ppo.distill.DistillSettings`
    ``settings``; returns :func:`trainer.ppo.distill.distilled`'s summary with the ``checkpoint`` file. ``seed``
    (of the labelled episodes): by default the number of rounds the checkpoint has kept, so that each round labels
    episodes of its own. Holds the run directory's lock throughout (a training run there must not be writing).
    ``ValueError`` (``ConfigError``) where the run cannot be distilled, in one line."""
    import checkpoints
    from trainer.evaluation.policies import policy_from_state
    from trainer.ppo.distill import DistillSettings, distillation_refusal, distilled

    chosen = DistillSettings(**settings)  # bad settings: one line before the checkpoint is read
    with checkpoints.RunDirLock(run_dir):
        source, state, _ = checkpoints.latest_loadable(run_dir)
        chosen = dataclasses.replace(chosen, seed=len(state.get("distilled", [])) if seed is None else seed)
        model, cfg = policy_from_state(state, source)
        if cfg.algo != "ppo":
            raise ConfigError("run", str(run_dir), message=f"{run_dir}: an --algo {cfg.algo} run; distillation "
                              "fine-tunes a PPO policy's actor")
        if why := distillation_refusal(cfg.env, cfg.env_options):
            raise ConfigError("run", str(run_dir), message=f"{run_dir}: {why}")
        summary = distilled(model, cfg.env_options, cfg.seed, chosen, cfg.max_grad_norm)
        if summary["kept"]:
            state = {**state, "undistilled_model": state.get("undistilled_model", state["model"]),
                     "model": {k: v.clone() for k, v in model.state_dict().items()},
                     "distilled": [*state.get("distilled", []), _stored(summary)]}
            if "acting_model" in state:  # --overlap: the policy that acts next is the distilled one
                state["acting_model"] = state["model"]
            source = checkpoints.save_in_run_dir(run_dir, state, int(state["iteration"]), cfg.keep_checkpoints)
    return {**summary, "checkpoint": source}


def _stored(summary: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint keeps of a distillation: plain numbers and lists."""
    d = summary["difference"]
    return {"states": summary["states"], "agreement": summary["agreement"], "cross_entropy": summary["cross_entropy"],
            "validation_difference": float(d["mean"]), "validation_ci95": float(d["ci95"]),
            "settings": summary["settings"]}


def summary_line(summary: dict[str, Any]) -> str:
    """A distillation's outcome in words, one line."""
    d, (agree_before, agree_after) = summary["difference"], summary["agreement"]
    episodes = counted(summary["episodes"], "episode")
    what = (f"BeliefMPC's levels on {summary['states']:,} states of {episodes}; agreement "
            f"{agree_before:.2f} -> {agree_after:.2f}; validation reward/step {d['mean']:+.4f} ± {d['ci95']:.4f} "
            f"over {counted(d['episodes'], 'episode')}")
    return what + ("" if summary["kept"] else " (lower: not kept, the checkpoint is as it was)")


# distillation takes about 2 minutes on 2 cores (docs/ceiling.md): a run shorter than this (a minute or so of
# training) is a test or a smoke run, not a policy to ship; it was measured on 3M-step runs
DISTILL_AFTER_STEPS = 1_000_000


def asks_for_distillation(config: dict[str, Any]) -> tuple[int, int]:
    """``(episodes, rounds)`` to distil a finished run with, from its stored ``config``: its ``distill_episodes``
    and ``distill_rounds`` where it is a PPO run of at least :data:`DISTILL_AFTER_STEPS` env steps on a VR-edge cell
    the expert can play; else ``(0, 0)``."""
    from trainer.ppo.distill import distillation_refusal

    if config.get("algo") != "ppo" or int(config.get("total_steps", 0)) < DISTILL_AFTER_STEPS:
        return 0, 0
    from trainer.config import TrainConfig, with_current_names

    env_options = TrainConfig.from_dict(with_current_names(config), stored=True).env_options
    episodes = int(config.get("distill_episodes", 0))
    if not episodes or distillation_refusal(str(config.get("env")), env_options):
        return 0, 0
    return episodes, int(config.get("distill_rounds", 1))


def after_training(run_dir: str | Path) -> list[str]:
    """What ``trainer.train`` says of a finished run it distils (:func:`asks_for_distillation`): each round of
    :func:`distill_run` (round ``r`` labels the episodes of seed ``r``), one line each; none where it does not. From
    the first moment a stop signal skips what is left, and an error is said in a line: the run is saved either way
    (with the rounds done)."""
    import checkpoints
    from trainer.arguments import command
    from trainer.interrupts import Skipped, skippable
    from trainer.loop import error_text

    lines: list[str] = []
    try:
        episodes, rounds = asks_for_distillation(checkpoints.latest_loadable(run_dir)[1]["config"])
        if not episodes:  # (a run it does not distil says nothing, whatever signal came before)
            return lines
        with skippable():
            for r in range(rounds):
                said = summary_line(distill_run(run_dir, seed=r, episodes=episodes))
                lines.append(f"round {r + 1} of {rounds}: {said}" if rounds > 1 else said)
    except Skipped as e:
        lines.append(f"not done ({e}); the run is saved: {command('-m', 'trainer.distill', str(run_dir))} does it")
    except Exception as e:  # an env that fails, a cell the expert cannot play: the run is saved all the same
        lines.append(f"not done: {error_text(e)}; the run is saved")
    return lines


def main(argv: list[str] | None = None) -> None:
    from trainer.ppo.distill import DistillSettings

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
    import checkpoints  # (torch: once the command line is checked)
    from trainer.interrupts import StopSignals

    run = checkpoints.run_dir_of(run)  # the run's checkpoints folder stands for the run
    settings = {f.name: getattr(args, f.name) for f in fields(DistillSettings) if f.name != "seed"}

    try:
        with StopSignals():  # Ctrl-C or SIGTERM: one line, exit status 128 + the signal, the run directory unlocked
            summary = distill_run(run, seed=args.seed, **settings)
    except ConfigError as e:
        p.error(str(e))
    except checkpoints.CheckpointError:
        p.error(f"{run}: no checkpoint to distil (train it first: python -m trainer.train --run-dir {run})")
    except ValueError as e:  # the run directory held by a live run
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt as e:
        print(f"\n{str(e) or 'interrupted'}: {NOTHING_WRITTEN}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 130)) from None
    print(f"distilled:  {summary_line(summary)}")
    print(f"checkpoint: {Path(summary['checkpoint']).resolve()}")


if __name__ == "__main__":
    sys.exit(main())
