"""Aggregates over runs, as rliable defines them (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice",
NeurIPS 2021): the mean, the interquartile mean, the probability of improvement, and stratified bootstrap
confidence intervals of each.

Scores are ``[runs, tasks]`` arrays: ``scores[n, m]`` is run ``n``'s score on task ``m`` (a comparison here has
one task, the env its runs were trained on). Every estimator also takes a stack of them, ``[..., runs, tasks]``,
and returns one value per array of the stack, so that a bootstrap computes its replicates in a few NumPy calls
instead of a Python loop. tests/test_compare.py checks the numbers against rliable's own.

    >>> scores = np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [30.0]])  # 8 runs of one task
    >>> float(mean(scores)), float(iqm(scores))  # one lucky run pulls the mean, not the IQM
    (7.25, 4.5)
    >>> float(probability_of_improvement(scores, scores - 1.5))  # P(a run of these > a run of those)
    0.65625
    >>> bootstrap_interval(iqm, scores).round(2).tolist()  # its 95% CI: [low, high]
    [2.5, 12.0]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

CONFIDENCE = 0.95
REPS = 50_000  # bootstrap replicates: rliable's default
SEED = 0  # the bootstrap's: the same scores give the same interval, run after run
_CHUNK = 1 << 22  # resampled scores held at once (32 MiB of float64): the replicates are drawn in chunks of this


def mean(scores: np.ndarray) -> np.ndarray:
    """The mean over tasks of each task's mean over runs (rliable's ``aggregate_mean``); ``[..., runs, tasks]`` ->
    ``[...]``."""
    return np.asarray(scores, dtype=np.float64).mean(axis=-2).mean(axis=-1)


def iqm(scores: np.ndarray) -> np.ndarray:
    """The interquartile mean of all runs' scores on all tasks together (rliable's ``aggregate_iqm``,
    ``scipy.stats.trim_mean(scores, 0.25, axis=None)``): the mean of what is left once the lowest and the highest
    quarter are cut (``int(0.25 n)`` scores each). Robust to one lucky or failed seed, and less noisy than the
    median. ``[..., runs, tasks]`` -> ``[...]``."""
    scores = np.asarray(scores, dtype=np.float64)
    flat = np.sort(scores.reshape(*scores.shape[:-2], -1), axis=-1)
    cut = int(0.25 * flat.shape[-1])
    return flat[..., cut:flat.shape[-1] - cut].mean(axis=-1)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y): the probability that a run of ``x`` scores above a run of ``y`` on a task, averaged over tasks
    (rliable's ``probability_of_improvement``: the Mann-Whitney U statistic over ``runs_x * runs_y``); a tie counts
    one half, so a set of runs against itself is 0.5. ``[..., runs_x, tasks]`` and ``[..., runs_y, tasks]`` ->
    ``[...]``."""
    x, y = np.asarray(x, dtype=np.float64)[..., :, None, :], np.asarray(y, dtype=np.float64)[..., None, :, :]
    per_task = (x > y).mean(axis=(-3, -2)) + 0.5 * (x == y).mean(axis=(-3, -2))
    return per_task.mean(axis=-1)


def bootstrap_interval(statistic: Callable[..., np.ndarray], *scores: np.ndarray, reps: int = REPS,
                       seed: int = SEED, confidence: float = CONFIDENCE) -> np.ndarray:
    """The percentile confidence interval of ``statistic(*scores)`` by the stratified bootstrap (rliable's
    ``get_interval_estimates``, its ``StratifiedBootstrap``; ``StratifiedIndependentBootstrap`` for several arrays):
    ``reps`` times, each ``[runs, tasks]`` array of ``scores`` is drawn again, independently, runs with replacement
    within each task; the interval holds the middle ``confidence`` of the ``statistic`` of those draws.

    ``statistic`` takes stacks (``[reps, runs, tasks]`` per array) and returns ``[reps, *shape]``; returns ``[2,
    *shape]``: the lower bounds, then the upper ones. Seeded: the same scores give the same interval.
    """
    arrays = [np.asarray(s, dtype=np.float64) for s in scores]
    for a in arrays:
        if a.ndim != 2 or not a.size:
            raise ValueError(f"scores must be [runs, tasks] arrays with at least one run, got shape {list(a.shape)}")
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK // int(np.prod([a.size for a in arrays])))  # x against y compares runs_x * runs_y pairs
    values = np.concatenate([statistic(*(_resampled(a, min(chunk, reps - start), rng) for a in arrays))
                             for start in range(0, reps, chunk)])
    tail = 100 * (1 - confidence) / 2
    return np.percentile(values, [tail, 100 - tail], axis=0)


def _resampled(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` stratified draws of ``scores`` ``[runs, tasks]``: within each task, ``runs`` runs drawn with
    replacement; ``[reps, runs, tasks]``."""
    runs, tasks = scores.shape
    return scores[rng.integers(runs, size=(reps, runs, tasks)), np.arange(tasks)]
