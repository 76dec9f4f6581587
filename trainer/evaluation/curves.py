"""Learning curves of groups of runs, from their ``metrics.jsonl``: a metric against env steps, the mean over a
group's runs on a grid of env steps they all reached, with a 95% bootstrap band, and their plot."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from trainer.evaluation import aggregate
from trainer.evaluation.report import pyplot, write_figures
from trainer.metrics import corrupt_rows_said, read_rows

POINTS = 100  # at most, on a group's grid
BAND_REPS = 2_000  # a band drawn, not a number compared: 2,000 replicates put its edges within ~2% of its width


def learning_curve(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(env_steps, values)`` of ``metric`` in a run's ``metrics.jsonl``, by env steps, from the rows that have it
    (``episode_return`` is empty in an iteration where no episode ended, ``val_return`` is there at validations
    alone); a corrupt row (torn by a crash, damaged) is skipped, and said on stderr in one line. A ``ValueError``
    naming the file where it cannot be read or no row has ``metric``."""
    path = Path(run_dir) / "metrics.jsonl"
    rows, corrupt = read_rows(path)
    if corrupt:
        print(f"note: {corrupt_rows_said(path, corrupt)}", file=sys.stderr)
    points: dict[float, float] = {}
    for row in rows:
        try:
            steps, value = float(row["env_steps"]), float(row[metric])
        except (ValueError, KeyError, TypeError):  # without the metric (None in this row)
            continue
        if math.isfinite(value):
            points[steps] = value
    if not points:
        raise ValueError(f"{path} has no {metric} in any row: no learning curve of it" if path.exists() else
                         f"cannot read {path} for the learning curves: no such file")
    steps = np.array(sorted(points))
    return steps, np.array([points[s] for s in steps])


def group_curve(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """The mean of a group's learning curves (:func:`learning_curve`) and its 95% band, on a grid of env steps.

    The grid is the runs' own env steps (at most :data:`POINTS` of them, evenly picked) from the last first step
    to the first last one, the steps every run reached; each run is interpolated linearly onto it (runs with
    other iteration sizes log other steps). The band resamples runs with replacement (pointwise percentile
    bootstrap). Returns lists: ``env_steps``, ``mean``, ``ci95_low``, ``ci95_high``, and ``runs``; a
    ``ValueError`` where the runs share no env steps.
    """
    start, end = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
    if start > end:
        raise ValueError(f"its runs' learning curves share no env steps (one starts at {start:.0f}, one ends at "
                         f"{end:.0f})")
    grid = np.unique(np.concatenate([s[(s >= start) & (s <= end)] for s, _ in curves]))
    if len(grid) > POINTS:
        grid = grid[np.linspace(0, len(grid) - 1, POINTS).round().astype(int)]
    values = np.stack([np.interp(grid, s, v) for s, v in curves])  # [runs, points]
    # the points as the bootstrap's "tasks": each point's runs are drawn alone, the same marginal as whole runs
    low, high = aggregate.bootstrap_interval(lambda v: v.mean(axis=-2), values, reps=BAND_REPS)
    return {"env_steps": grid.tolist(), "mean": values.mean(axis=0).tolist(), "ci95_low": low.tolist(),
            "ci95_high": high.tolist(), "runs": len(curves)}


def plot_curves(groups: dict[str, dict[str, Any]], metric: str, out: Path) -> list[Path]:
    """Each group's curve (:func:`group_curve`, by label) with its band, against env steps, ``metric`` (in words) on
    the other axis, one colour per group (as in :func:`trainer.evaluation.comparison.plot_scores`); written as
    ``out``.png and .svg; returns the files."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, curve) in enumerate(groups.items()):
        colour = f"C{i}"
        ax.plot(curve["env_steps"], curve["mean"], color=colour, label=f"{label} ({curve['runs']} runs)")
        ax.fill_between(curve["env_steps"], curve["ci95_low"], curve["ci95_high"], color=colour, alpha=0.2,
                        linewidth=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"{metric}\n(mean over runs, 95% bootstrap CI)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return write_figures(fig, out)
