"""Validation during training (``--eval-every K``): greedy play on held-out validation episodes, the best checkpoint.

Every ``K`` iterations the greedy policy plays ``--eval-episodes`` validation episodes, whose
seeds come from a ``SeedSequence`` branch that neither training nor ``trainer.evaluate``'s
test episodes use. The metrics row gets its reward per step and, where the env's profile declares baselines
(VR-edge's heuristics), the paired difference against the best of them on the same episodes (chosen once, when
the run starts). A validation mean return (not reward per step, which is constant in envs like CartPole)
at least as high as the best so far saves a checkpoint at once and points
the run's ``best`` pointer at it (next to ``latest``; retention keeps it).

At the end of a run (unless ``--eval-episodes 0``) the final policy plays the same validation episodes, against
the best baseline on them where the env has baselines: :func:`final_validation`, one line of how good the run is.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import checkpoints
from collectors.deadlines import Deadline
from collectors.watchdog import Watchdog
from envs.profiles import profile_of
from trainer.arguments import counted
from trainer.config import TrainConfig
from trainer.evaluation.baselines import best_baseline
from trainer.evaluation.episodes import (
    episodes_shown,
    native_vector_env,
    policy_actions,
    run_episodes,
    validation_seeds,
)
from trainer.evaluation.policies import make_model
from trainer.evaluation.servable import UNSERVABLE, unservable, unservable_text
from trainer.evaluation.statistics import paired_difference, summarize


class _Bounded(gym.Wrapper):
    """A validation env whose every reset and step is under ``watchdog``'s deadline (``--worker-timeout``): a hung
    one raises ``collectors.WorkerTimeoutError`` naming it, the run's last completed iteration saved."""

    def __init__(self, env: gym.Env, watchdog: Watchdog) -> None:
        super().__init__(env)
        self.watchdog = watchdog

    @classmethod
    def made(cls, make: Callable[[], gym.Env], watchdog: Watchdog) -> _Bounded:
        return cls(watchdog.call("start", make), watchdog)

    def reset(self, **kwargs: Any) -> Any:
        return self.watchdog.call("reset", functools.partial(self.env.reset, **kwargs))

    def step(self, action: Any) -> Any:
        return self.watchdog.call("step", self.env.step, action)


def validation_envs(cfg: TrainConfig) -> Callable[[], gym.Env]:
    """What makes the run's env for validation: every call of the env under ``--worker-timeout``, as the envs the run
    collects with; an env this project batches natively (VR-edge: its own NumPy code, whose episodes
    :func:`run_episodes` plays 5x faster batched) as it is."""
    make = functools.partial(gym.make, cfg.env, **cfg.env_options)
    if native_vector_env(make):
        return make
    watchdog = Watchdog(Deadline(cfg.worker_timeout), [], "envs", whose="the validation's")
    return functools.partial(_Bounded.made, make, watchdog)


class Validator:
    """Runs the validation episodes when due and keeps the run's ``best`` pointer.

    Example:
        >>> from trainer.config import TrainConfig
        >>> v = Validator(TrainConfig(env="CartPole-v1", eval_every=0), "/tmp/run", iteration=0)
        >>> v.evaluate(1, model=None), v.improved   # eval_every 0: never due
        ({}, False)

    After :meth:`evaluate` returns a row (``val_return`` and ``val_reward_per_step``, scalars, and, against a
    baseline, ``val_baseline``, ``val_vs_baseline``, ``val_vs_baseline_ci95``, ``val_best``),
    ``improved`` says whether it is the best so far; pass the checkpoint saved for that
    iteration to :meth:`saved`.
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, iteration: int) -> None:
        self.every, self.run_dir, self.improved = cfg.eval_every, Path(run_dir), False
        self.keep = cfg.keep_checkpoints
        self._row: dict[str, Any] = {}
        if not self.every:
            return
        self.seeds = validation_seeds(cfg.seed, cfg.eval_episodes)
        self.policy = make_model(cfg).eval()  # a CPU copy: the learner's model may live on a GPU
        self.env_fn = validation_envs(cfg)
        self.baseline, self.baseline_records = None, None
        self.score, self.abandonment = profile_of(cfg.env).score, profile_of(cfg.env).abandonment
        if baselines := list(profile_of(cfg.env).baselines):
            self.baseline, played = best_baseline(cfg.env, baselines, cfg.env_options, self.env_fn, self.seeds)
            self.baseline_records = played[self.baseline]
        best = checkpoints.best_info(self.run_dir)
        # a best from this run's past (not from iterations a resume set aside) is the score to beat
        self.best_score = (best.get("val_return", -np.inf) if best and best.get("iteration", np.inf) <= iteration
                           else -np.inf)

    def _play(self, act) -> list[dict[str, float]]:
        return run_episodes(act, self.env_fn, len(self.seeds), 0, seeds=self.seeds)

    def evaluate(self, iteration: int, model: torch.nn.Module | None) -> dict[str, Any]:
        """Play the validation episodes with ``model``'s weights (greedy, on the CPU) when ``iteration`` is due;
        the metrics to log."""
        self.improved = False
        if not self.every or iteration % self.every:
            return {}
        self.policy.load_state_dict(model.state_dict())
        records = self._play(policy_actions(self.policy, deterministic=True))
        summary = summarize(records)
        score = summary["mean_return"]
        row: dict[str, Any] = {"val_return": score, "val_reward_per_step": summary["reward_per_step"]}
        if self.baseline_records is not None:
            d = paired_difference(records, self.baseline_records, self.score)
            row.update(val_baseline=self.baseline, val_vs_baseline=d["mean"], val_vs_baseline_ci95=d["ci95"])
            cannot = unservable(summary, summarize(self.baseline_records), self.abandonment)
            row.update({} if cannot is None else {"val_unservable": cannot})  # (what the quality line says)
        # a tie goes to the later checkpoint: in a capped env (CartPole's 500) the first perfect score is often a
        # lucky one on the way up, and a later one has kept it for longer
        self.improved = score >= self.best_score
        if self.improved:
            self.best_score = score
        row["val_best"] = self.improved
        self._row = {"iteration": iteration, **row}
        return row

    def saved(self, checkpoint: Path) -> None:
        """The checkpoint written after this iteration: becomes ``best`` if the iteration improved."""
        if self.improved:
            checkpoints.set_best(self.run_dir, checkpoint, self._row, self.keep)
            self.improved = False


def final_validation(cfg: TrainConfig, model: torch.nn.Module) -> dict[str, Any]:
    """The greedy ``model`` on the run's validation episodes: ``episodes``, ``policy`` (:func:`summarize`), the
    ``seconds`` it took and, where the env's profile declares baselines, the ``baseline`` best on the same episodes
    and the paired ``difference`` by the profile's score (``score``, shown as ``score_label``). In a terminal a bar
    shows the episodes played, and that Ctrl-C skips them.

    The baseline is picked on the episodes it is compared on: by selection it is lucky on them, so the policy's
    lead is if anything understated; ``trainer.evaluate`` picks it on other episodes than its test episodes. Where
    the policy and that baseline both lose their users in most episodes, ``unservable`` holds the line that says so
    (:func:`trainer.evaluation.servable.unservable_text`).
    """
    started = time.perf_counter()
    seeds = validation_seeds(cfg.seed, cfg.eval_episodes)
    env_fn = validation_envs(cfg)
    profile = profile_of(cfg.env)
    baselines = list(profile.baselines)
    players = 1 + len(baselines)  # the bar counts every player's episodes; the line names the episodes per player
    with episodes_shown(len(seeds) * players, f"quality: {len(seeds)} episodes x {counted(players, 'player')} "
                                              "(Ctrl-C skips it)"):
        records = run_episodes(policy_actions(model.eval(), deterministic=True), env_fn, len(seeds), 0, seeds=seeds)
        result: dict[str, Any] = {"episodes": len(seeds), "policy": summarize(records), "score": profile.score,
                                  "score_label": profile.score_label}
        if baselines:
            name, played = best_baseline(cfg.env, baselines, cfg.env_options, env_fn, seeds)
            result.update(baseline=name, difference=paired_difference(records, played[name], profile.score))
            best = summarize(played[name])
            if unservable(result["policy"], best, profile.abandonment):
                result["unservable"] = unservable_text(result["policy"], name, best, profile.abandonment)
    return {**result, "seconds": time.perf_counter() - started}


def quality_line(result: dict[str, Any]) -> str:
    """:func:`final_validation`'s result in words, one line."""
    policy, episodes = result["policy"], counted(result["episodes"], "validation episode")
    took = f"; took {result['seconds']:.0f} s"
    if "baseline" not in result:
        mean_return = _interval(policy["mean_return"], policy["mean_return_ci95"])
        return f"mean return {mean_return}, greedy, on {episodes}{took}"
    d, score = result["difference"], _summary_key(result["score"])
    line = (f"{policy[score]:.3f} {result['score_label']}, {_interval(d['mean'], d['ci95'], '+.3f')} against "
            f"{result['baseline']}, the best baseline on the same {episodes} (better in {d['wins']}){took}")
    return f"{line}; {result['unservable']}" if "unservable" in result else line


def best_quality_line(env: str, best: dict[str, Any], episodes: int) -> str:
    """The ``best`` checkpoint's validation (:func:`checkpoints.best_info`, on ``episodes`` episodes) of a run on
    ``env`` in words, one line."""
    line = f"the best checkpoint (iteration {best.get('iteration', '?')}): "
    on = f"on {counted(episodes, 'validation episode')}"
    if "val_baseline" not in best:
        return line + f"mean return {best.get('val_return', float('nan')):.2f}, greedy, {on}"
    profile = profile_of(env)
    value = best.get(f"val_{profile.score}", float("nan"))  # (val_return, val_reward_per_step: Validator's row)
    line += (f"{value:.3f} {profile.score_label}, "
             f"{_interval(best['val_vs_baseline'], best['val_vs_baseline_ci95'], '+.3f')} against "
             f"{best['val_baseline']} {on}")
    return line + (f"; {UNSERVABLE}: the policy and {best['val_baseline']} lose their users in most of these "
                   "episodes, so the comparison is no result" if best.get("val_unservable") else "")


def _summary_key(score: str) -> str:
    """The key :func:`summarize` gives the mean of a record's ``score``."""
    return "mean_" + score if score in ("return", "length") else score


def _interval(value: float, ci95: float, spec: str = ".2f") -> str:
    """``+0.017 ± 0.004 (95% CI)``, both at one precision; the value alone where one episode gives no interval."""
    if not math.isfinite(ci95):
        return f"{value:{spec}}"
    return f"{value:{spec}} ± {ci95:{spec.lstrip('+')}} (95% CI)"
