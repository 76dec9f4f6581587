"""The heuristic baselines a policy is compared with (those the env's profile declares), and the best of them on
given episodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envs.profiles import profile_of
from trainer.evaluation.episodes import run_episodes


def best_baseline(env: str, names: Sequence[str], env_kwargs: dict[str, Any], env_fn: Callable[[], gym.Env],
                  seeds: list[int]) -> tuple[str | None, dict[str, list[dict[str, float]]]]:
    """The baseline of ``env``'s profile with the highest score (the profile's) on the episodes of ``seeds``, each
    built for ``env_kwargs`` and played in ``env_fn``'s envs, and every baseline's records.

    Pick it on other episodes than those it is then compared on: the best of several baselines
    on the test episodes is, by selection, lucky on them, which would shrink the policy's lead.
    """
    profile = profile_of(env)
    played = {name: run_episodes(profile.baselines[name](env_kwargs), env_fn, len(seeds), 0, seeds=seeds)
              for name in names}
    best = max(names, key=lambda n: np.mean([r[profile.score] for r in played[n]])) if names else None
    return best, played
