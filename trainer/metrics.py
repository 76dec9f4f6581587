"""The run's metrics: one JSON row per completed iteration in ``metrics.jsonl``."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import checkpoints
import checkpoints.files
from collectors import Rollout
from trainer.common.world import ALONE, World

QOE_KEYS = ("quality", "stall_s", "switches")  # per-episode metrics VR-edge reports (envs/README.md)


def metrics_row(iteration: int, env_steps: int, sps: float, lr: float, stats: dict[str, float],
                episodes: list[dict[str, Any]], reward_per_step: float, lag: int) -> dict[str, Any]:
    """The row of one iteration: counters, the update's statistics, and what the rollout's ``episodes`` scored
    (both from :func:`run_episodes_and_reward`)."""
    row = {"iteration": iteration, "env_steps": env_steps, "sps": sps, "lr": lr, **stats,
           "episodes": len(episodes),
           "episode_return": float(np.mean([e["return"] for e in episodes])) if episodes else None,
           "episode_length": float(np.mean([e["length"] for e in episodes])) if episodes else None,
           "reward_per_step": reward_per_step, "policy_lag": lag}
    for k in QOE_KEYS:
        vals = [e[k] for e in episodes if k in e]
        if vals:
            row[k] = float(np.mean(vals))
    return row


def run_episodes_and_reward(rollout: Rollout, world: World = ALONE) -> tuple[list[dict[str, Any]], float]:
    """The episodes that ended in ``rollout`` and its mean reward per step, over every rank's share of the run's
    envs (each episode's ``env`` the run's index), the same on every rank."""
    if world.size == 1:  # (a Ray actor's rollout may hold transitions, not [T, N] steps)
        return rollout.episodes, float(rollout.batch["rewards"].mean())
    offset = world.envs(rollout.batch.shape[1] * world.size).start
    mine = [{**e, "env": e["env"] + offset} for e in rollout.episodes]
    reward = world.mean_(rollout.batch["rewards"].mean().double()[None])
    return [e for part in world.gather_objects(mine) for e in part], float(reward)


def steps_per_second(start: tuple[int, float], env_steps: int) -> float:
    """Env steps per second since ``start``, ``(env steps, time.perf_counter())`` when the loop began."""
    return (env_steps - start[0]) / (time.perf_counter() - start[1])


class MetricsWriteError(ValueError):
    """A row could not be written (disk full, quota): the message names the file and why; the file ends with
    the last complete row."""


class MetricsLog:
    """``metrics.jsonl`` open for appending rows, each written whole or not at all.

    A row is one ``write`` of a complete line; a write that fails part-way (a full disk) is cut back to the
    last complete row and raises :class:`MetricsWriteError`, so the file never ends in a torn row.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> with MetricsLog(path) as log:
        ...     log.append({"iteration": 1, "sps": 512.0})
        >>> path.read_text()
        '{"iteration": 1, "sps": 512.0}\\n'
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = checkpoints.files.open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, None)
        except OSError as e:
            raise MetricsWriteError(f"cannot write {path}: {e.strerror or e}") from None

    def append(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            done = 0
            while done < len(data):  # a write may take part of the line (and the next one then fails)
                done += os.write(self._fd, data[done:])
        except OSError as e:
            with contextlib.suppress(OSError):  # if even this fails, resuming drops the torn row (keep_metrics_until)
                os.ftruncate(self._fd, end)
            raise MetricsWriteError(f"cannot write {self.path}: {e.strerror or e}; row {row.get('iteration')} is "
                                    "not in it, and that iteration counts as not completed") from None

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MetricsReadError(ValueError):
    """``metrics.jsonl`` cannot be read (not a regular file, larger than a run's may be, a read error): the message
    names the file, why, and what to do."""


def read_rows(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a run's ``metrics.jsonl`` and the numbers (from 1) of its corrupt lines: not a JSON object with an
    integer ``iteration`` (a row torn by a crash, a damaged one; a blank line is neither a row nor corrupt). ``([],
    [])`` where there is no file; :class:`MetricsReadError` where it cannot be read."""
    rows, corrupt = [], []
    for number, line in _lines(path):
        row = _row(line)
        if row is not None:
            rows.append(row)
        elif line.strip():
            corrupt.append(number)
    return rows, corrupt


def corrupt_rows_said(path: Path, corrupt: list[int]) -> str:
    """One line naming the corrupt lines of ``path`` that :func:`read_rows` skipped (the first few), ``""`` where
    there are none."""
    if not corrupt:
        return ""
    shown = ", ".join(map(str, corrupt[:5])) + (", ..." if len(corrupt) > 5 else "")
    return (f"{path}: skipped {len(corrupt)} corrupt row{'' if len(corrupt) == 1 else 's'} (not a JSON row with an "
            f"iteration: line{'' if len(corrupt) == 1 else 's'} {shown})")


def keep_metrics_until(path: Path, iteration: int) -> int:
    """Drop rows of iterations after ``iteration`` (lost in a crash, to be run again), and torn ones; returns how
    many. Rewritten atomically, so a crash here leaves the old file; :class:`MetricsReadError` where it cannot be
    read (a FIFO planted in its place: it is then neither read nor written)."""
    dropped = sum(not _kept(line, iteration) for _, line in _lines(path))
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.unlink(missing_ok=True)  # whatever was left in its place
            with open(tmp, "xb") as out:
                for _, line in _lines(path):
                    if _kept(line, iteration):
                        out.write(line + b"\n")
            os.replace(tmp, path)
        except OSError as e:
            raise MetricsWriteError(f"cannot write {path}: {e.strerror or e}; it is as it was") from None
    return dropped


def rows_until(path: Path, iteration: int) -> list[dict[str, Any]]:
    """The rows of ``path`` of iterations up to ``iteration`` (a torn or blank line left out); ``[]`` where there is
    no file."""
    return [row for row in read_rows(path)[0] if row["iteration"] <= iteration]


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The numbered lines of ``path`` (``metrics.jsonl``), read as a stream (:func:`checkpoints.reading`); none where
    there is no file."""
    try:
        with checkpoints.reading(path) as f:
            yield from enumerate(checkpoints.files.lines_of(f), 1)
    except FileNotFoundError:
        return
    except OSError as e:
        raise MetricsReadError(f"cannot read {path}: {e.strerror or e}; move it aside (the run's own metrics.jsonl "
                               "is a regular file of JSON rows), or put the run's back") from None


def _row(line: bytes) -> dict[str, Any] | None:
    """The row a line holds, or ``None`` where it holds none (torn, blank, damaged)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(row, dict) and isinstance(row.get("iteration"), int) and not isinstance(row["iteration"], bool)
    return row if ok else None


def _kept(line: bytes, iteration: int) -> bool:
    row = _row(line)
    return row is not None and row["iteration"] <= iteration
