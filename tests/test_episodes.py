"""Episodes played by mode (trainer.evaluation.episodes): a policy (run_episodes), a reference that reads its envs
(reference_episodes), a stateful filter (filter_episodes) and a reference played as a filter
(batched_reference_episodes), over one loop; their records are those the flags played before them, to the bit."""

import functools
import hashlib
import inspect

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.belief_mpc import BeliefMPC
from envs.foresight import ForesightMPC
from envs.planner import ClairvoyantPlanner
from trainer.evaluation import batched_reference_episodes, filter_episodes, reference_episodes, run_episodes

SMALL = {"num_users": 2, "max_steps": 20}
CARTPOLE = functools.partial(gym.make, "CartPole-v1")


def _digest(records):
    return hashlib.sha256(repr(records).encode()).hexdigest()[:16]


def _played():
    """Each mode's records of 5 episodes on 3 envs (the envs restarted), as the flags played them before the modes:
    run_episodes(act), (..., with_envs=True), (..., whole_batch=True), (..., with_envs=True, whole_batch=True)."""
    cfg, env_fn = envs.VREdgeConfig(**SMALL), functools.partial(gym.make, "VREdge-v0", **SMALL)
    return {
        "policy": run_episodes(envs.make_baseline("fair_share", cfg), env_fn, 5, 0, num_envs=3),
        "single": run_episodes(lambda obs: (obs[:, 2] > 0).astype(np.int64), CARTPOLE, 5, 0, num_envs=3),
        "reference": reference_episodes(ClairvoyantPlanner(cfg, 2, 1), env_fn, 5, 0, num_envs=3),
        "filter": filter_episodes(BeliefMPC(cfg, horizon=2, scenarios=2), env_fn, 5, 0, num_envs=3),
        "batched_reference": batched_reference_episodes(ForesightMPC(cfg, 1, horizon=2, scenarios=2), env_fn, 5, 0,
                                                        num_envs=3),
    }


def test_each_mode_plays_the_records_the_flags_played():
    digests = {name: _digest(records) for name, records in _played().items()}
    assert digests == {"policy": "31c0070dce1575d8", "single": "6f2073b3c611a371", "reference": "0e264f9b94a92ace",
                       "filter": "00f01eba7b5258ab", "batched_reference": "b730d7df5219a134"}


def test_a_stateless_player_scores_the_same_in_every_mode():
    cfg, env_fn = envs.VREdgeConfig(**SMALL), functools.partial(gym.make, "VREdge-v0", **SMALL)
    fair = envs.make_baseline("fair_share", cfg)
    assert filter_episodes(fair, env_fn, 4, 1, num_envs=3) == run_episodes(fair, env_fn, 4, 1, num_envs=3)
    planner = ClairvoyantPlanner(cfg, 2, 1)
    assert batched_reference_episodes(planner, env_fn, 4, 1) == reference_episodes(planner, env_fn, 4, 1)


@pytest.mark.parametrize("play, player", [(run_episodes, "act"), (reference_episodes, "plan"),
                                          (filter_episodes, "act"), (batched_reference_episodes, "plan")])
def test_each_mode_takes_the_same_arguments_and_no_flag(play, player):
    assert list(inspect.signature(play).parameters) == [player, "env_fn", "episodes", "seed", "num_envs", "seeds"]


def test_run_episodes_refuses_the_flags():
    for flag in ("with_envs", "whole_batch"):
        with pytest.raises(TypeError, match=flag):
            run_episodes(lambda obs: np.zeros(len(obs), np.int64), CARTPOLE, 1, 0, **{flag: True})


@pytest.mark.parametrize("play", [filter_episodes, batched_reference_episodes])
def test_a_filter_on_an_env_without_a_batched_env_is_refused_in_one_line(play):
    with pytest.raises(ValueError) as refused:
        play(lambda *_: np.zeros(1, np.int64), CARTPOLE, 1, 0)
    message = str(refused.value)
    assert "\n" not in message and "'CartPole-v1'" in message and play.__name__ in message and "batched" in message
