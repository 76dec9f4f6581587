"""A curriculum over network conditions (issue 64, after Genet): VR-edge's condition grid (episodes drawn from bins of
capacity scale and outage rate by weights in the env's state) and trainer.curriculum, which reweighs the envs by
where the best baseline beats the policy, through the collector's state, and resumes exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import checkpoints
from collectors import make_collector
from collectors.env_group import per_env_states
from envs.settings import ConfigError
from envs.vector import VREdgeVectorEnv
from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_profile import PROFILE, condition_bins
from tests.messages import raises
from trainer import curriculum as curriculum_module
from trainer import train as train_module
from trainer.config import TrainConfig
from trainer.flags import parse_args

GRID = {"capacity_scale": "0.25-4", "outage_prob": "0-0.1", "condition_grid": 2}


def _bin_of(kwargs: dict, scale: np.ndarray, outage: np.ndarray) -> np.ndarray:
    """Each episode's bin (as condition_bins numbers them) from its drawn scale and outage probability."""
    cfg = VREdgeConfig(**kwargs)
    k, (low_s, high_s), (low_p, high_p) = cfg.condition_grid, cfg.scale_range, cfg.outage_range
    i = np.floor(np.log(scale / low_s) / math.log(high_s / low_s) * k).astype(int)
    j = np.floor((outage - low_p) / (high_p - low_p) * k).astype(int)
    return i * k + j


def _drawn(env: VREdgeVectorEnv) -> tuple[np.ndarray, np.ndarray]:
    s = env.get_state()
    return s["capacity_scale"], s["outage_prob"]


def test_the_grid_draws_each_bin_by_its_weight_and_a_reset_keeps_the_weights():
    """Uniform weights: each bin a quarter of the episodes, uniformly inside it (log-uniform scale); weights set in
    the state: the next episodes are drawn by them, in the bin they name and nowhere else, episode after episode."""
    env = VREdgeVectorEnv(4000, num_users=2, max_steps=2, seed=3, **GRID)
    env.reset()
    bins = _bin_of(GRID, *_drawn(env))
    counts = np.bincount(bins, minlength=4) / len(bins)
    assert np.all(np.abs(counts - 0.25) < 0.03), counts
    scale, outage = _drawn(env)
    assert scale.min() >= 0.25 and scale.max() <= 4 and outage.min() >= 0 and outage.max() <= 0.1
    assert abs(np.mean(scale < 1) - 0.5) < 0.03  # log-uniform: as many below the middle (1) as above
    state = PROFILE.conditions.reweighed(env.get_state(), [0.0, 0.0, 1.0, 0.0])
    env.set_state(state)
    for _ in range(2):  # two whole episodes of 2 steps: every env reset twice, by its state's weights
        env.step(np.zeros((4000, 2), dtype=np.int64))
        env.step(np.zeros((4000, 2), dtype=np.int64))
        assert np.all(_bin_of(GRID, *_drawn(env)) == 2)  # scale 1-4, outage 0-0.05
    env.reset(seed=9)  # a reset with a seed too keeps what the curriculum set
    assert np.all(_bin_of(GRID, *_drawn(env)) == 2)


def test_the_bins_tile_the_ranges_and_play_alone():
    """condition_bins: the grid's bins in the order of its weights, their ranges meeting end to end, each playable
    on its own (the grid off)."""
    bins = condition_bins({**GRID, "num_users": 3})
    scales = [VREdgeConfig(**kw).scale_range for _, kw in bins]
    outages = [VREdgeConfig(**kw).outage_range for _, kw in bins]
    assert scales[0][0] == 0.25 and scales[-1][1] == pytest.approx(4) and scales[0][1] == pytest.approx(1)
    assert scales[0] == scales[1] and scales[1][1] == pytest.approx(scales[2][0])
    assert outages[0] == (0.0, 0.05) and outages[1] == pytest.approx((0.05, 0.1)) and outages[2] == outages[0]
    assert all(kw["condition_grid"] == 0 and kw["num_users"] == 3 for _, kw in bins)
    assert condition_bins({"capacity_scale": "0.5-2", "outage_prob": "0-0.1"}) == []


@pytest.mark.parametrize("kwargs, named", [
    ({"condition_grid": 2}, "condition_grid"),
    ({"condition_grid": 2, "capacity_scale": "0.5-2"}, "outage_prob"),
])
def test_a_grid_needs_both_ranges(kwargs, named):
    with raises(ConfigError, "condition_grid", named):
        VREdgeConfig(**kwargs)


@pytest.mark.parametrize("settings, named", [
    ({"env_kwargs": "capacity_scale=0.5-2,outage_prob=0-0.1"}, "condition_grid"),
    ({"env": "CartPole-v1"}, "condition_grid"),
    ({"env_kwargs": "capacity_scale=0.5-2,outage_prob=0-0.1,condition_grid=2", "overlap": True}, "--overlap"),
    ({"env_kwargs": "capacity_scale=0.5-2,outage_prob=0-0.1,condition_grid=2", "curriculum_episodes": 0},
     "curriculum_episodes"),
    ({"env_kwargs": "capacity_scale=0.5-2,outage_prob=0-0.1,condition_grid=2", "backend": "ray"}, "ray"),
    ({"env_kwargs": "capacity_scale=0.5-2,outage_prob=0-0.1,condition_grid=2", "backend": "device"}, "device"),
])
def test_what_a_curriculum_cannot_reweigh_is_refused_in_one_line(settings, named):
    with raises(ValueError, named):
        TrainConfig.from_dict({"env": "VREdge-v0", "curriculum_every": 4, **settings}).validate()


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_weights_set_through_the_collector_reach_every_env(backend):
    """The curriculum's path to the envs: the collector's state, reweighed, set back; the envs' next episodes are
    drawn in the bin the weights name (in worker processes too), and a state taken after holds the weights."""
    import functools

    envs_of = [functools.partial(VREdgeVectorEnv, 3, **GRID, num_users=2, max_steps=3) for _ in range(2)]
    with make_collector(envs_of, lambda obs: torch.zeros(len(obs), 2, dtype=torch.int64), backend=backend,
                        num_steps=4, seed=1) as collector:
        collector.collect()
        state = collector.get_state()
        state["env_states"] = [PROFILE.conditions.reweighed(s, [0, 1.0, 0, 0]) for s in
                               per_env_states(state["env_states"])]
        collector.set_state(state)
        collector.collect()  # 4 steps of 3-step episodes: every env has started an episode since
        after = per_env_states(collector.get_state()["env_states"])
    assert len(after) == 6
    for s in after:
        assert np.array_equal(np.asarray(s["condition_weights"]).reshape(-1), [0, 1, 0, 0])
        assert _bin_of(GRID, np.asarray(s["capacity_scale"]), np.asarray(s["outage_prob"])).tolist() == [1]


def test_the_update_reweighs_by_the_gaps(monkeypatch):
    """Curriculum.update: the gaps measured become the rule's weights in every env; the row says the largest gap
    and weight."""
    cfg = TrainConfig(env="VREdge-v0", env_kwargs="num_users=2,max_steps=3,capacity_scale=0.25-4,outage_prob=0-0.1,"
                      "condition_grid=2", curriculum_every=2, num_envs=2)
    curriculum = curriculum_module.Curriculum.for_run(cfg)
    monkeypatch.setattr(curriculum, "gaps", lambda model, iteration: np.array([0.0, 0.3, -0.2, 0.1]))
    import functools

    with make_collector([functools.partial(VREdgeVectorEnv, 2, **cfg.env_options)], lambda obs: torch.zeros(
            len(obs), 2, dtype=torch.int64), backend="sync", num_steps=2, seed=0) as collector:
        row = curriculum.update(None, collector, 2)
        weights = [np.asarray(s["condition_weights"]).reshape(-1) for s in
                   per_env_states(collector.get_state()["env_states"])]
    expected = curriculum_module.curriculum_weights(np.array([0.0, 0.3, -0.2, 0.1]))
    assert np.allclose(expected, [0.125, 0.5, 0.125, 0.25])
    assert all(np.array_equal(w, expected) for w in weights)
    assert row["curriculum_gap_max"] == pytest.approx(0.3) and row["curriculum_top_weight"] == pytest.approx(0.5)
    assert not curriculum.due(0) and curriculum.due(2) and not curriculum.due(3)


def test_the_gaps_are_the_best_baseline_minus_the_greedy_policy_on_each_bin():
    """Curriculum.gaps: per bin, the best of the profile's curriculum baselines minus the greedy policy, by the
    profile's score, on the update's own episodes (played here one player at a time to check)."""
    import functools

    import gymnasium as gym

    from trainer.evaluation.episodes import curriculum_seeds, policy_actions, run_episodes
    from trainer.evaluation.policies import make_model

    cfg = TrainConfig(env="VREdge-v0", env_kwargs="num_users=2,max_steps=6,capacity_scale=0.25-4,outage_prob=0-0.1,"
                      "condition_grid=2", curriculum_every=2, curriculum_episodes=3)
    curriculum = curriculum_module.Curriculum.for_run(cfg)
    model = make_model(cfg)
    gaps = curriculum.gaps(model, 4)
    seeds = curriculum_seeds(cfg.seed, 3, 4)
    for gap, (_, kwargs) in zip(gaps, condition_bins(cfg.env_options), strict=True):
        make = functools.partial(gym.make, "VREdge-v0", **kwargs)

        def score(act, make=make) -> float:
            return float(np.mean([r["reward_per_step"] for r in run_episodes(act, make, 3, 0, seeds=seeds)]))

        best = max(score(PROFILE.baselines[b](kwargs)) for b in ("fair_share", "robust_mpc"))
        assert gap == pytest.approx(best - score(policy_actions(model.eval(), deterministic=True)))
    assert curriculum_seeds(cfg.seed, 3, 4) != curriculum_seeds(cfg.seed, 3, 6)


def _run(argv, **kw):
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given, **kw)


@pytest.mark.parametrize("backend", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_a_run_with_a_curriculum_resumes_bit_for_bit(tmp_path, backend):
    """Stopped where an update is due (its weights not yet in any checkpoint) and resumed, a run ends as an
    uninterrupted one: the same weights in the envs and the same model. And the curriculum mattered: without it the
    run ends elsewhere."""
    toml = tmp_path / "curriculum.toml"
    toml.write_text("curriculum_every = 2\ncurriculum_episodes = 2\n")
    plain = ["--env", "VREdge-v0", "--env-kwargs", "num_users=2,max_steps=5,capacity_scale=0.25-4,outage_prob=0-0.1,"
             "condition_grid=2", "--num-envs", "4", "--num-steps", "8", "--total-steps", str(4 * 8 * 6),
             "--checkpoint-every", "1", "--seed", "7", "--compile", "off", "--threads", "1", "--backend", backend,
             "--eval-episodes", "0"]
    argv = [*plain, "--config", str(toml)]
    _run(argv + ["--run-dir", str(tmp_path / "straight")])
    _run(argv + ["--run-dir", str(tmp_path / "split")], max_iterations=4)
    _run(["--resume", str(tmp_path / "split")])
    a, b = (checkpoints.latest_loadable(tmp_path / d)[1] for d in ("straight", "split"))
    assert a["iteration"] == b["iteration"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    rows = [line for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines() if "curriculum" in line]
    assert len(rows) == 2  # before iterations 3 and 5 (after 2 and 4)
    _run(plain + ["--run-dir", str(tmp_path / "plain")])
    c = checkpoints.latest_loadable(tmp_path / "plain")[1]["model"]
    assert any(not torch.equal(c[k], a["model"][k]) for k in c)


def test_the_genet_recipe_is_the_robust_recipe_with_the_curriculum():
    """docs/genet.toml and docs/robust.toml train on the same conditions: the table compares them as the curriculum
    and its absence (every other setting the default's)."""
    from pathlib import Path

    docs = Path(__file__).parents[1] / "docs"
    genet, robust = (parse_args(["--config", str(docs / name)]).config for name in ("genet.toml", "robust.toml"))
    for cfg in (genet, robust):
        cfg.validate()
    assert genet.curriculum_every > 0 and robust.curriculum_every == 0
    assert {k: v for k, v in genet.env_options.items() if k != "condition_grid"} == robust.env_options
    assert genet.env_options["condition_grid"] > 0 and condition_bins(genet.env_options)
    default = parse_args(["--env", "VREdge-v0"]).config
    assert (genet.total_steps, genet.algo_settings) == (robust.total_steps, robust.algo_settings) == (
        default.total_steps, default.algo_settings)


def test_a_run_says_its_curriculum_at_the_start_and_on_the_bar_while_it_updates(tmp_path, monkeypatch, capsys):
    """The start names what each update plays; the bar reads 'curriculum update' while one runs (an update takes
    10-90 s), and no longer after it."""
    import sys

    from trainer.loop import CURRICULUM

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar as a terminal draws it
    toml = tmp_path / "curriculum.toml"
    toml.write_text("curriculum_every = 2\ncurriculum_episodes = 2\n")
    cli = parse_args(["--env", "VREdge-v0", "--env-kwargs", "num_users=2,max_steps=5,capacity_scale=0.25-4,"
                      "outage_prob=0-0.1,condition_grid=2", "--num-envs", "2", "--num-steps", "8", "--total-steps",
                      "48", "--compile", "off", "--threads", "1", "--eval-episodes", "0", "--config", str(toml),
                      "--run-dir", str(tmp_path / "run")])
    train_module.train(cli.config, progress=True)
    err = capsys.readouterr().err
    assert "curriculum: every 2 iterations, 4 conditions x 2 episodes" in err
    frames = [f for f in err.split("\r") if "/3 [" in f]
    assert any(CURRICULUM in f for f in frames) and CURRICULUM not in frames[-1]
