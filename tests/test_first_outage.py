"""benchmarks.first_outage: each episode's first outage, and how episodes end against it."""

from __future__ import annotations

import numpy as np

import envs
from benchmarks.first_outage import OUTAGE, outage_episodes, summary
from tests.messages import exits
from tests.test_generalisation import _run_dir
from trainer.evaluation.episodes import evaluation_seeds

# a cell whose outages (4% of the capacity, starting with probability 0.2 a round) a download at the top level
# cannot survive and one at the lowest mostly can (but not with the buffer still empty in its first rounds)
CELL = {"num_users": 2, "max_steps": 30, "outage_prob": 0.2, "outage_depth": 0.04}


def at(level: int):
    return lambda obs: np.full((len(obs), 2), level, dtype=np.int64)


def first_outage_alone(level: int, seed: int) -> tuple[int, int, int]:
    """One episode played alone in a single env: its length, whether a user's leaving ended it, and the round of
    its first outage (0: none)."""
    import gymnasium as gym

    env, cfg = gym.make("VREdge-v0", **CELL), envs.VREdgeConfig(**CELL)
    capacity = cfg.num_user_features * cfg.num_users + cfg.history - 1
    env.reset(seed=seed)
    first = 0
    for t in range(1, cfg.max_steps + 1):
        obs, _, terminated, truncated, _ = env.step(np.full(2, level))
        if not first and obs[capacity] < OUTAGE:
            first = t
        if terminated or truncated:
            return t, int(terminated), first
    raise AssertionError("the episode did not end")


def test_each_episode_is_its_seeds_played_alone_and_the_top_level_ends_in_its_first_outage():
    seeds = evaluation_seeds(0, 6)
    for level in (0, 5):
        played = outage_episodes(at(level), CELL, 6, 0)
        assert [(e["length"], e["terminated"], e["first_outage"]) for e in played] == [
            first_outage_alone(level, s) for s in seeds]
    top, lowest = summary(outage_episodes(at(5), CELL, 6, 0)), summary(outage_episodes(at(0), CELL, 6, 0))
    assert top["met_an_outage"] == top["ended_in_its_round"] > 0  # every one it met ended there
    assert lowest["met_an_outage"] > 0 and lowest["ended_in_its_round"] < top["ended_in_its_round"]
    assert top["mean_length"] < lowest["mean_length"]


def test_an_episode_without_an_outage_counts_none_nor_one_that_ran_to_its_last_round():
    calm = summary([{"length": 30, "terminated": 0, "first_outage": 0},
                    {"length": 12, "terminated": 1, "first_outage": 10},
                    {"length": 30, "terminated": 0, "first_outage": 30}])  # its last round an outage: nobody left
    assert calm["met_an_outage"] == 2 and calm["ended_in_its_round"] == 0 and calm["ended_within_2"] == 1
    assert calm["first_outage_quartiles"] == [15, 20, 25] and calm["mean_length"] == 24


def test_bad_input_is_one_line(tmp_path, capsys):
    from benchmarks import first_outage

    a, b = _run_dir(tmp_path / "a", num_users=3), _run_dir(tmp_path / "b", num_users=4)
    out = str(tmp_path / "out")
    with exits(2, "--network", "moon", capsys=capsys):
        first_outage.main([str(a), "--network", "moon", "--out", out])
    with exits(2, "cells", capsys=capsys):
        first_outage.main([str(a), str(b), "--out", out])
    with exits(2, "--episodes", capsys=capsys):
        first_outage.main([str(a), "--episodes", "0", "--out", out])
    with exits(2, "config.json", capsys=capsys):
        first_outage.main([str(tmp_path), "--out", out])
    with exits(2, "checkpoints", capsys=capsys):  # (a traceback once, after the traces were written)
        first_outage.main([str(a), "--out", out])
    (tmp_path / "afile").write_text("")
    with exits(2, "--out", "afile", capsys=capsys):
        first_outage.main([str(a), "--out", str(tmp_path / "afile")])
    assert not (tmp_path / "out").exists()
