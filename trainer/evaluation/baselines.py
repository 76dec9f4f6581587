"""The heuristic baselines a policy is compared with (those the env's profile declares), and the best of them on
given episodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envs.profiles import profile_of
from trainer.evaluation.episodes import Player, play_together


def best_baseline(env: str, names: Sequence[str], env_kwargs: dict[str, Any], env_fn: Callable[[], gym.Env],
                  seeds: list[int]) -> tuple[str | None, dict[str, list[dict[str, float]]]]:
    """The baseline of ``env``'s profile with the highest score (the profile's) on the episodes of ``seeds``, each
    built for ``env_kwargs`` and played in ``env_fn``'s envs, and every baseline's records.

    Pick it on other episodes than those it is then compared on: the best of several baselines
    on the test episodes is, by selection, lucky on them, which would shrink the policy's lead.
    The baselines play together, in one batched env (:func:`trainer.evaluation.episodes.play_together`).
    """
    profile = profile_of(env)
    records = play_together([Player(profile.baselines[n](env_kwargs), list(seeds)) for n in names], env_fn) \
        if names else []
    played = dict(zip(names, records))
    best = max(names, key=lambda n: np.mean([r[profile.score] for r in played[n]])) if names else None
    return best, played
