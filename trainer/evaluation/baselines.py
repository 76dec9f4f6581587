"""The heuristic baselines a policy is compared with (VR-edge's), and the best of them on given episodes."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

import envs
from trainer.evaluation.episodes import Player, play_together
from trainer.evaluation.statistics import summarize


def best_baseline(names: list[str], config: envs.VREdgeConfig, env_fn: Callable[[], gym.Env], seeds: list[int]
                  ) -> tuple[str | None, dict[str, list[dict[str, float]]]]:
    """The baseline with the highest reward per step on the episodes of ``seeds``, and every baseline's records.

    Pick it on other episodes than those it is then compared on: the best of several baselines
    on the test episodes is, by selection, lucky on them, which would shrink the policy's lead.
    The baselines play together, in one batched env (:func:`trainer.evaluation.episodes.play_together`).
    """
    records = play_together([Player(envs.make_baseline(n, config), list(seeds)) for n in names], env_fn) \
        if names else []
    played = dict(zip(names, records))
    best = max(names, key=lambda n: summarize(played[n])["reward_per_step"]) if names else None
    return best, played
