"""A run directory's files as ``trainer.train`` uses them: a new run claims a directory, a resumed run reads its
checkpoint and config (the lock, the checkpoints and their pointers are ``checkpoints``')."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import checkpoints
from collectors.env_group import env_state_count
from envs.settings import ConfigError
from trainer import __version__
from trainer.config import TrainConfig, with_current_names
from trainer.evaluation.policies import check_weights_fit
from trainer.flags import resumed_config

RUN_FILES = ("checkpoints", "metrics.jsonl", "config.json", "evaluation.json", "evaluation.png",
             "evaluation_cells.json", "evaluation_cells.png", "tb", "wandb", "wandb_id")


def claim_new_run_dir(run_dir: Path, overwrite: bool) -> list[str]:
    """Refuse a directory that holds another run's checkpoints unless ``overwrite``; clear that run's files.

    A directory without checkpoints holds nothing to resume (a run stopped before its first
    save): it is free, and what that run left is cleared so that it does not mix with this one.
    Returns notes for the user.
    """
    if checkpoints.checkpoint_files(run_dir) and not overwrite:
        raise ConfigError("run_dir", str(run_dir), message=f"run directory {run_dir} already holds a run "
                          f"(checkpoints); resume it with --resume {run_dir}, choose another --run-dir, or pass "
                          "--overwrite to delete that run")
    left = [name for name in RUN_FILES if (run_dir / name).exists()]
    for name in left:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    if not left:
        return []
    return [f"--overwrite: deleted the previous run's files in {run_dir}" if overwrite else
            f"{run_dir}: cleared {', '.join(left)} of an earlier run that wrote no checkpoint"]


def resume_state(resume: str, given: dict[str, Any]) -> tuple[TrainConfig, Path, dict[str, Any], list[str]]:
    """Load the checkpoint to resume from; returns the resumed config, its file, state and notes."""
    source, saved, problems = checkpoints.latest_loadable(resume)
    saved = {**saved, "config": with_current_names(saved["config"])}
    notes = [f"skipped {p}" for p in problems]
    lagging = checkpoints.lagging_latest(resume, source)  # a kill after a save: no rollback, nothing set aside
    notes += [lagging] if lagging else []
    if saved.get("version") != __version__:
        notes.append(f"{source} was written by parallel-rollouts {saved.get('version')}; this is {__version__}")
    run_dir = checkpoints.run_dir_of(resume)
    if "run_dir" in given and Path(given["run_dir"]).resolve() != run_dir.resolve():
        raise ConfigError("run_dir", given["run_dir"], message=f"--resume writes into the run directory it resumes "
                          f"({run_dir}); to continue a copy, copy the directory and resume the copy (drop --run-dir)")
    cfg = resumed_config({**saved["config"], "run_dir": str(run_dir)}, {**given, "run_dir": str(run_dir)},
                         str(source))
    check_weights_fit(cfg, saved["model"], source)  # before a network of the stored config's size is built
    _check_env_count(cfg, saved, source)  # before that many envs are built
    return cfg, source, saved, notes


def _check_env_count(cfg: TrainConfig, saved: dict[str, Any], source: Path) -> None:
    """Raise ``ValueError`` unless the stored config's ``num_envs`` is the number of envs its collector state holds
    (by env index on every backend): a config edited to ask for a billion envs is refused, not built."""
    if "collector" not in saved:
        return
    held = env_state_count(saved["collector"]["env_states"])
    if held != cfg.num_envs:
        raise ValueError(f"{source}: its config asks for num_envs={cfg.num_envs:,} but its collector state holds "
                         f"{held:,} envs; a config edited or mixed from two runs?")
