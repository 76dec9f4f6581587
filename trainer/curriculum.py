"""A curriculum over the env's conditions (``--curriculum-every K``), after Genet (Xia et al., SIGCOMM 2022): every K
iterations the greedy policy and the env's baselines play a few episodes of each condition the env declares
(:class:`envs.profiles.Conditions`: VR-edge's ``condition_grid`` bins of capacity scale and outage rate), and the
run's envs then draw their next episodes more often from the conditions where the best baseline beats the policy
most.

The weights: half the draws as the ranges alone (uniform over the bins, so that no condition is forgotten), half
in proportion to each bin's gap, the best baseline's score minus the policy's where positive (all uniform where the
policy is at least as good everywhere). Genet adds the condition where the gap is largest to the training mix;
spreading the half over every bin with a gap keeps one noisy bin from taking it all.

What it measures on is the training side only: the run's own env arguments (a trace set's train split), episodes
from a seed branch that training, validation, distillation and ``trainer.evaluate`` never use, a fresh branch per
update. The weights live in the envs' state (set through the collector's ``get_state`` / ``set_state``), so a
checkpoint holds them and a resumed run draws as an uninterrupted one; an update is a pure function of the weights
and the iteration, so one redone after a resume gives the same weights.

Example:
    >>> import numpy as np
    >>> curriculum_weights(np.array([0.2, 0.0, -0.1, 0.6]))  # half uniform, half by the positive gaps
    array([0.25 , 0.125, 0.125, 0.5  ])
    >>> curriculum_weights(np.array([-0.2, 0.0]))  # the policy at least as good everywhere: uniform
    array([0.5, 0.5])
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from collectors.env_group import per_env_states
from envs.profiles import Conditions, profile_of
from trainer.config import TrainConfig
from trainer.evaluation.episodes import Player, curriculum_seeds, play_together, policy_actions
from trainer.evaluation.policies import make_model

UNIFORM_SHARE = 0.5  # of the draws, spread uniformly over the bins whatever the gaps


def curriculum_weights(gaps: np.ndarray) -> np.ndarray:
    """One weight per bin from each bin's gap (the best baseline's score minus the policy's): the module's rule."""
    uniform = np.full(len(gaps), 1.0 / len(gaps))
    positive = np.maximum(gaps, 0.0)
    if positive.sum() <= 0:
        return uniform
    return UNIFORM_SHARE * uniform + (1 - UNIFORM_SHARE) * positive / positive.sum()


class Curriculum:
    """The run's curriculum: :meth:`update` when :meth:`due`.

    Example:
        >>> Curriculum.for_run(TrainConfig(env="CartPole-v1")) is None   # --curriculum-every 0 (the default)
        True
    """

    def __init__(self, cfg: TrainConfig, conditions: Conditions) -> None:
        self.env, self.every, self.seed = cfg.env, cfg.curriculum_every, cfg.seed
        self.episodes = cfg.curriculum_episodes
        self.conditions, self.score = conditions, profile_of(cfg.env).score
        self.bins = conditions.bins(cfg.env_options)
        self.policy = make_model(cfg).eval()  # a CPU copy: the learner's model may live on a GPU

    @classmethod
    def for_run(cls, cfg: TrainConfig) -> Curriculum | None:
        """The curriculum of a run with ``curriculum_every`` (``None`` without; the config checked that the env's
        arguments have conditions to reweigh)."""
        conditions = profile_of(cfg.env).conditions
        return cls(cfg, conditions) if cfg.curriculum_every and conditions is not None else None

    def describe(self) -> str:
        """The line a run starts with: what each update plays."""
        players = ", ".join(("the greedy policy", *self.conditions.baselines))
        return (f"curriculum: every {self.every} iterations, {len(self.bins)} conditions x {self.episodes} episodes "
                f"of {players}; the envs then draw more of the conditions where the best baseline leads "
                "(curriculum_every)")

    def due(self, iteration: int) -> bool:
        """Whether the envs are reweighed before ``iteration`` + 1 (every ``every`` iterations, not before the
        first: an untrained policy's gaps say nothing)."""
        return iteration > 0 and iteration % self.every == 0

    def gaps(self, model: torch.nn.Module, iteration: int) -> np.ndarray:
        """Each bin's gap for ``model``'s weights: the best baseline's mean score minus the greedy policy's, on the
        same episodes (this update's seeds, the same in every bin)."""
        self.policy.load_state_dict(model.state_dict())
        seeds = curriculum_seeds(self.seed, self.episodes, iteration)
        gaps = []
        for _, kwargs in self.bins:
            players = [Player(policy_actions(self.policy, deterministic=True), seeds)]
            players += [Player(profile_of(self.env).baselines[b](kwargs), seeds) for b in self.conditions.baselines]
            records = play_together(players, lambda kwargs=kwargs: gym.make(self.env, **kwargs))
            means = [np.mean([r[self.score] for r in played]) for played in records]
            gaps.append(max(means[1:]) - means[0])
        return np.array(gaps)

    def update(self, model: torch.nn.Module, collector: Any, iteration: int) -> dict[str, float]:
        """Measure the gaps, set every env's weights through ``collector``; the metrics row's columns."""
        started = time.perf_counter()
        gaps = self.gaps(model, iteration)
        weights = curriculum_weights(gaps)
        state = collector.get_state()
        state["env_states"] = [self.conditions.reweighed(s, weights) for s in per_env_states(state["env_states"])]
        collector.set_state(state)
        return {"curriculum_gap_max": float(gaps.max()), "curriculum_gap_mean": float(gaps.mean()),
                "curriculum_top_weight": float(weights.max()), "curriculum_s": time.perf_counter() - started}

