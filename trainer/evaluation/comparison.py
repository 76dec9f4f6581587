"""Groups of runs compared (``python -m trainer.compare``): every run's policy played greedily on the same held-out
episodes; per group the mean and the interquartile mean of its runs' scores with stratified bootstrap 95% CIs; per
pair of groups the probability of improvement and the paired per-episode difference; the table and the plot."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from torch import nn

import checkpoints
from envs.profiles import profile_of
from trainer.config import TrainConfig
from trainer.evaluation import aggregate
from trainer.evaluation.episodes import Records, held_out_env_kwargs, policy_actions, run_episodes
from trainer.evaluation.policies import picked_checkpoint, policy_from_state
from trainer.evaluation.report import plus_minus, pyplot, write_figures
from trainer.evaluation.statistics import paired_difference

SCORES = {"return": "return", "reward_per_step": "reward/step"}  # what a run can be scored by, as the table says it


class LoadedRun(NamedTuple):
    """A run's policy, ready to play (:func:`load_run`), and which checkpoint it is.

    Example: a CartPole run trained in a few seconds, loaded and played on 2 held-out episodes::

        >>> import tempfile
        >>> from trainer.flags import parse_args
        >>> from trainer.train import train
        >>> run = Path(tempfile.mkdtemp())
        >>> _ = train(parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps",
        ...                       "16", "--threads", "1", "--run-dir", str(run)]).config, progress=False)
        >>> loaded = load_run(run, "best")  # no --eval-every, so no best: its newest checkpoint
        >>> loaded.which, loaded.env_steps, loaded.cfg.env
        ('the latest checkpoint (the run has no best checkpoint)', 16, 'CartPole-v1')
        >>> records = play(loaded, episodes=2, seed=0)  # what each episode scored
        >>> len(records), sorted(records[0])
        (2, ['length', 'return', 'reward_per_step'])
        >>> import shutil; shutil.rmtree(run)  # (the example's run)
    """

    run: Path  # the run directory
    source: Path  # its checkpoint file
    sha256: str  # its content hash (checkpoints.content_hash): what results name it by, with its path
    which: str  # which checkpoint that is, in words
    env_steps: int  # the env steps it was trained for
    model: nn.Module  # its policy, frozen, on the CPU
    cfg: TrainConfig  # the run's
    env_kwargs: dict[str, Any]  # the env arguments it is played with (held_out_env_kwargs)


def load_run(run: Path, pick: str) -> LoadedRun:
    """The policy of a run directory's ``pick`` (``best`` or ``latest``: :func:`picked_checkpoint`); a
    ``ValueError`` (``CheckpointError``) naming it where none loads."""
    picked = picked_checkpoint(run, pick)
    sha256 = checkpoints.content_hash(picked.source)  # right after the load: the weights played (the path may change)
    model, cfg = policy_from_state(picked.state, picked.source)
    return LoadedRun(run, picked.source, sha256, picked.label, int(picked.state.get("env_steps", 0)), model, cfg,
                     held_out_env_kwargs(cfg.env, cfg.env_options))


def play(run: LoadedRun, episodes: int, seed: int) -> Records:
    """The records of ``run``'s greedy policy over the held-out test episodes ``seed`` gives, those
    ``trainer.evaluate`` plays (:func:`trainer.evaluation.episodes.evaluation_seeds`)."""
    env_fn = functools.partial(gym.make, run.cfg.env, **run.env_kwargs)
    return run_episodes(policy_actions(run.model, deterministic=True), env_fn, episodes, seed)


def score_keys(env: str) -> tuple[str, ...]:
    """What a run on ``env`` is scored by, each the mean over its episodes: the return, and the env's own score
    where its profile declares another (VR-edge: the reward per step, its score in ``trainer.evaluate`` and
    validation)."""
    return tuple(dict.fromkeys(("return", profile_of(env).score)))


def scores_of(played: list[Records], key: str) -> np.ndarray:
    """A group's scores by ``key`` as the estimators take them: ``[runs, 1]``, each run's mean over its episodes
    (one task: the env)."""
    return np.array([[np.mean([e[key] for e in records])] for records in played])


def group_statistics(scores: np.ndarray) -> dict[str, Any]:
    """``runs``, ``scores`` (each run's, its mean over tasks), and their ``mean`` and ``iqm``, each with its 95%
    interval (``mean_ci95``, ``iqm_ci95``: ``[low, high]``, stratified bootstrap), of a group's ``[runs, tasks]``
    scores."""
    return {"runs": len(scores), "scores": scores.mean(axis=1).tolist(),
            "mean": float(aggregate.mean(scores)),
            "mean_ci95": aggregate.bootstrap_interval(aggregate.mean, scores).tolist(),
            "iqm": float(aggregate.iqm(scores)),
            "iqm_ci95": aggregate.bootstrap_interval(aggregate.iqm, scores).tolist()}


def episode_means(played: list[Records], keys: tuple[str, ...]) -> Records:
    """One record per episode: the mean over a group's runs of what each scored in that episode (all played the
    same episodes, in the same order)."""
    return [{k: float(np.mean([records[i][k] for records in played])) for k in keys}
            for i in range(len(played[0]))]


def pair_statistics(a: list[Records], b: list[Records], key: str) -> dict[str, Any]:
    """Group ``a`` against group ``b`` by ``key``: ``probability_of_improvement`` P(a run of A scores above a run
    of B) with its 95% interval (``probability_of_improvement_ci95``, stratified bootstrap), and
    ``paired_difference``: per episode, A's mean over its runs minus B's, its mean over the episodes with a 95% CI
    (:func:`trainer.evaluation.statistics.paired_difference`: the episodes' shared difficulty cancels)."""
    x, y = scores_of(a, key), scores_of(b, key)
    return {"probability_of_improvement": float(aggregate.probability_of_improvement(x, y)),
            "probability_of_improvement_ci95": aggregate.bootstrap_interval(
                aggregate.probability_of_improvement, x, y).tolist(),
            "paired_difference": paired_difference(episode_means(a, (key,)), episode_means(b, (key,)), key)}


def compared(groups: dict[str, list[Records]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Each group's statistics by each of ``keys`` (``{"groups": {label: {key: group_statistics}}}``) and each
    pair's, in the order given (``"pairs": [{"a": A, "b": B, key: pair_statistics}]``)."""
    return {"groups": {label: {k: group_statistics(scores_of(played, k)) for k in keys}
                       for label, played in groups.items()},
            "pairs": [{"a": a, "b": b, **{k: pair_statistics(groups[a], groups[b], k) for k in keys}}
                      for a, b in itertools.combinations(groups, 2)]}


def format_comparison(comparison: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The table of :func:`compared`'s statistics: per score, a row per group, then a line per pair."""
    lines = []
    width = max(12, *(len(label) + 2 for label in comparison["groups"]))
    for k in keys:
        lines += ["", f"{SCORES[k]} (per run: its mean over the episodes; 95% CIs: stratified bootstrap over runs)",
                  f"{'group':<{width}}{'runs':>5}  {'mean':>28}  {'IQM':>28}"]
        for label, group in comparison["groups"].items():
            s = group[k]
            lines.append(f"{label:<{width}}{s['runs']:>5}  {_interval(s['mean'], s['mean_ci95']):>28}  "
                         f"{_interval(s['iqm'], s['iqm_ci95']):>28}")
        for pair in comparison["pairs"]:
            a, b, p = pair["a"], pair["b"], pair[k]
            d, improvement = p["paired_difference"], p["probability_of_improvement"]
            interval = f" {plus_minus(d['ci95'])} (95% CI)" if plus_minus(d["ci95"]) else ""  # (one episode: none)
            runs = (comparison["groups"][a][k]["runs"], comparison["groups"][b][k]["runs"])
            lines.append(f"P({a} > {b}) = {_interval(improvement, p['probability_of_improvement_ci95'], 2)}"
                         f"{_few_runs(*runs)}; {a} - {b} per episode {d['mean']:+.3f}{interval}, {a} higher in "
                         f"{d['wins']}/{d['episodes']} episodes")
    return "\n".join(lines[1:])


FEW_RUNS = 5  # fewer runs a side than this: P and its interval rest on a handful of pairs, and say so


def _few_runs(a: int, b: int) -> str:
    """`` (from 3 runs against 3: few)`` where a side has fewer than :data:`FEW_RUNS` runs: a P of 1.00 [1.00,
    1.00] from 3 runs a side reads more certain than 9 pairs can make it."""
    return f" (from {a} runs against {b}: few)" if min(a, b) < FEW_RUNS else ""


def _interval(value: float, ci95: list[float], digits: int = 3) -> str:
    """``1.234 [1.100, 1.400]``."""
    return f"{value:.{digits}f} [{ci95[0]:.{digits}f}, {ci95[1]:.{digits}f}]"


def plot_scores(comparison: dict[str, Any], keys: tuple[str, ...], out: Path) -> list[Path]:
    """Per score of ``keys``, a panel of :func:`compared`'s groups: each group's runs as dots, its IQM with its 95% CI
    as a bar, one colour per group (as in :func:`trainer.evaluation.curves.plot_curves`); written as
    ``out``.png and .svg; returns the files."""
    plt = pyplot()
    labels = list(comparison["groups"])
    fig, axes = plt.subplots(1, len(keys), figsize=((2 + 1.2 * len(labels)) * len(keys), 4.5), squeeze=False)
    for ax, k in zip(axes[0], keys):
        for i, label in enumerate(labels):
            s = comparison["groups"][label][k]
            scores = s["scores"]
            spread = np.linspace(-0.3, -0.1, len(scores)) if len(scores) > 1 else np.full(1, -0.2)
            ax.scatter(i + spread, scores, color=f"C{i}", alpha=0.6, s=18, label="runs" if i == 0 else None)
            ax.errorbar(i + 0.15, s["iqm"], yerr=[[s["iqm"] - s["iqm_ci95"][0]], [s["iqm_ci95"][1] - s["iqm"]]],
                        fmt="D", color="black", capsize=6, markersize=6, zorder=3,
                        label="IQM, 95% CI" if i == 0 else None)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_ylabel(f"{SCORES[k]} (per run: mean over the held-out episodes)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return write_figures(fig, out)
