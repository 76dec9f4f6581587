"""The end of a run: what every run that has trained to its last iteration goes through, whoever started it
(``python -m trainer.train``, each seed of ``--seeds``, a resume that trains): its algorithm's
:meth:`~trainer.algorithm.Algorithm.after_training` (PPO: distillation rounds, each a new checkpoint), then the
checkpoint the run ends with and one line of how good it is. A resume with nothing to train changes no file: it
says the checkpoint and the quality line alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import checkpoints
from trainer.interrupts import Skipped, skippable
from trainer.loop import error_text
from trainer.registry import algorithm_class

Say = Callable[[str, str], None]  # say(label, line): "distilled", "checkpoint", "quality"


def end_of_run(summary: dict[str, Any], say: Say) -> Path:
    """The end of the run :func:`trainer.loop.train` returned ``summary`` of (module docstring), said through
    ``say``; returns the checkpoint the run ends with (a distillation round's, where one was kept). From the first
    moment, a stop signal skips what is left: the run is saved."""
    run_dir, checkpoint = Path(summary["run_dir"]), Path(summary["checkpoint"])
    if summary["finished"] and summary["trained"]:
        algorithm_class(summary["config"]["algo"]).after_training(run_dir, summary["config"], say)
        newest = checkpoints.checkpoint_files(run_dir)[:1]
        if newest and checkpoints.checkpoint_order(newest[0]) > checkpoints.checkpoint_order(checkpoint):
            checkpoint = newest[0]  # (a name of the run's own: the run saved it as it trained)
    say("checkpoint", str(checkpoint.resolve()))
    if summary["finished"]:
        _say_quality(run_dir, checkpoint, say)
    return checkpoint


def _say_quality(run_dir: Path, checkpoint: Path, say: Say) -> None:
    """One line of how good a finished run is: its best checkpoint's validation where it validated, else its final
    policy on the validation episodes (none with ``--eval-episodes 0``; from the first moment, a stop signal skips
    it: the run is saved)."""
    try:
        with skippable():
            line = _quality(run_dir, checkpoint)
    except Skipped as e:
        line = f"not measured ({e}); the run is saved"
    except Exception as e:  # an env that hangs (--worker-timeout) or fails there: the run is saved all the same
        line = f"not measured: {error_text(e)}; the run is saved"
    if line:
        say("quality", line)


def _quality(run_dir: Path, checkpoint: Path) -> str:
    from trainer.evaluation.policies import trained_model
    from trainer.evaluation.validation import best_quality_line, final_validation, quality_line

    model, cfg, _ = trained_model(checkpoint)
    if cfg.eval_every and (best := checkpoints.best_info(run_dir)):
        return best_quality_line(cfg.env, best, cfg.eval_episodes)
    return quality_line(final_validation(cfg, model)) if cfg.eval_episodes else ""
