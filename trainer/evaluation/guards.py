"""A policy played through a guard its env declares (``EnvProfile.guards``; VR-edge's ``volatility``:
:class:`envs.guard.VolatilityGuard`), its threshold calibrated on the run's own training network: the guard's
statistic at its highest over that network's first :data:`CALIBRATION_EPISODES` validation episodes, so that where
the policy trained the guard does not act (the same threshold whatever the evaluation's episodes and seed).

    >>> import numpy as np
    >>> from envs.profiles import profile_of
    >>> from trainer.evaluation.guards import calibrated_threshold, guarded_records
    >>> make = profile_of("VREdge-v0").guards["volatility"].make
    >>> cell = {"num_users": 2, "max_steps": 30}
    >>> mid = lambda obs: np.full((len(obs), 2), 2)
    >>> threshold = calibrated_threshold(make, mid, "VREdge-v0", cell)
    >>> records, share = guarded_records(make, mid, threshold, "VREdge-v0", cell, episodes=4, seed=0)
    >>> [r["length"] for r in records], round(share, 3)  # it hedged the first 8 of 30 rounds
    ([30, 30, 30, 30], 0.267)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envs.profiles import Act, EnvKwargs
from trainer.evaluation.episodes import Records, filter_episodes, told_filter_episodes, validation_seeds

CALIBRATION_EPISODES = 50  # validation episodes (seed 0's branch) a threshold is the highest over: fewer, lower

GuardMaker = Callable[[Act, EnvKwargs, float], Any]  # EnvProfile.guards' values


def calibrated_threshold(make: GuardMaker, act: Act, env_id: str, trained_on: EnvKwargs,
                         episodes: int = CALIBRATION_EPISODES) -> float:
    """The threshold of ``make``'s guard for the policy ``act``: the highest value its statistic took (``peak``)
    while a guard that never acts on it played the first ``episodes`` validation episodes (seed 0's branch, which
    neither training nor evaluation uses) of the run's own env arguments ``trained_on`` (its randomised conditions
    and all): the guard would not have acted there. The highest of more episodes is higher (a quick check with a
    few is a guard quicker to act): the evaluation always takes :data:`CALIBRATION_EPISODES`."""
    watch = make(act, trained_on, math.inf)
    filter_episodes(watch, functools.partial(gym.make, env_id, **trained_on), episodes, 0,
                    seeds=validation_seeds(0, episodes))
    return float(watch.peak)


def guarded_records(make: GuardMaker, act: Act, threshold: float, env_id: str, env_kwargs: EnvKwargs, episodes: int,
                    seed: int) -> tuple[Records, float]:
    """The records of ``act`` through ``make``'s guard at ``threshold`` on the held-out episodes ``seed`` gives of
    the env ``env_kwargs`` make (one batched env of 16 rows, as ``run_episodes`` plays a policy: its matrix products
    on the same batch shapes), and the share of those episodes' steps the guard played."""
    guard, counts = make(act, env_kwargs, threshold), [0, 0]

    def counted(obs: Any, playing: Any) -> Any:
        actions = guard(obs)
        counts[0] += int(guard.guarded[playing].sum())
        counts[1] += int(playing.sum())
        return actions
    records = told_filter_episodes(counted, functools.partial(gym.make, env_id, **env_kwargs), episodes, seed)
    return records, counts[0] / max(counts[1], 1)
