"""Checkpoints of a run directory: ``checkpoints/ckpt_<iteration>.pt``, retention and a ``latest`` pointer."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from checkpoints.store import CheckpointError, load, save

_NAME = re.compile(r"ckpt_(\d+)\.pt$")
LATEST = "latest"


def _write_pointer(directory: Path, name: str) -> None:
    tmp = directory / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / LATEST)


def save_in_run_dir(run_dir: str | os.PathLike, state: dict[str, Any], iteration: int, keep: int) -> Path:
    """Save ``state`` as iteration ``iteration``, point ``latest`` at it, keep the newest ``keep`` files.

    The pointer moves only after the new file is complete, so it never names a partial file.
    """
    if keep < 1:
        raise ValueError(f"keep={keep} is invalid: must be >= 1")
    directory = Path(run_dir) / "checkpoints"
    path = save(directory / f"ckpt_{iteration:08d}.pt", state)
    _write_pointer(directory, path.name)
    for old in _checkpoint_files(directory)[keep:]:
        old.unlink(missing_ok=True)
    return path


def _checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoint files, newest iteration first."""
    files = [p for p in directory.glob("ckpt_*.pt") if _NAME.search(p.name)]
    return sorted(files, key=lambda p: int(_NAME.search(p.name).group(1)), reverse=True)


def candidates(path: str | os.PathLike) -> list[Path]:
    """A checkpoint file itself, or a run directory's checkpoints: ``latest`` first, then newest first."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint file or run directory")
    directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    files = _checkpoint_files(directory)
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text().strip()
        files = [named] + [f for f in files if f != named]
    if not files:
        raise CheckpointError(f"{path}: no checkpoints found (expected {directory}/ckpt_*.pt)")
    return files


def latest_loadable(path: str | os.PathLike, map_location: str = "cpu") -> tuple[Path, dict[str, Any], list[str]]:
    """Load the newest checkpoint that loads; returns ``(file, state, problems with newer files)``.

    Raises :class:`CheckpointError` listing every problem when none loads.
    """
    problems = []
    for candidate in candidates(path):
        try:
            return candidate, load(candidate, map_location), problems
        except CheckpointError as e:
            problems.append(str(e))
    raise CheckpointError("no loadable checkpoint:\n  " + "\n  ".join(problems))
