"""The foresight reference (envs.foresight.ForesightMPC) and its curve (benchmarks.foresight): k = 0 is BeliefMPC,
known rounds are the env's true future, the rest is drawn from the filter given them, and the command line plays
every player and writes its table and plot."""

import csv
import functools

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.belief_mpc import BeliefMPC
from envs.foresight import ForesightMPC
from envs.settings import ConfigError
from tests.messages import exits, raises
from trainer.evaluation import batched_reference_episodes, filter_episodes, run_episodes, summarize

CELLS = [{}, {"num_users": 4, "users": "2-3", "churn": 0.05}]


@pytest.mark.parametrize("kwargs", CELLS)
def test_knowing_no_round_is_belief_mpc_action_for_action(kwargs):
    venv = envs.VREdgeVectorEnv(3, seed=4, **{"num_users": 3, "max_steps": 30, **kwargs})
    obs, _ = venv.reset()
    belief, foresight = BeliefMPC(venv.config, horizon=3, scenarios=4), ForesightMPC(venv.config, 0, horizon=3,
                                                                                      scenarios=4)
    for _ in range(6):
        actions = belief(obs)
        np.testing.assert_array_equal(foresight(obs, [venv]), actions)
        obs, *_ = venv.step(actions)


def _played_out(venv: envs.VREdgeVectorEnv, rounds: int) -> tuple[np.ndarray, ...]:
    """What the env itself shows over its next ``rounds`` rounds (it moves): capacities, channel logits, regimes,
    fades, each ``[B, rounds, ...]``."""
    seen = []
    for _ in range(rounds):
        _, _, _, _, info = venv.step(np.full((venv.num_envs, venv.config.num_users), 3))
        state = venv.get_state()
        seen.append((info["capacity_mbps"], state["channel_logit"], state["regime"], state["fade"]))
    return tuple(np.stack(x, axis=1) for x in zip(*seen))


@pytest.mark.parametrize("known", [4, 9])
def test_a_horizon_all_known_is_one_scenario_the_env_plays_out(known):
    venv = envs.VREdgeVectorEnv(3, seed=7, num_users=3, max_steps=50)
    obs, _ = venv.reset()
    for _ in range(5):
        obs, *_ = venv.step(np.ones((3, 3), dtype=np.int64))
    mpc = ForesightMPC(venv.config, known, horizon=4, scenarios=8)
    futures = mpc.futures(obs, venv.get_state())
    assert futures.weight.shape == (3, 1) and (futures.weight == 1).all()
    for drawn, true in zip(futures[:4], _played_out(venv, 4)):
        np.testing.assert_array_equal(drawn[:, 0], true)


@pytest.mark.parametrize("kwargs", CELLS)
def test_known_rounds_open_every_scenario_and_the_filter_draws_the_rest_given_them(kwargs):
    venv = envs.VREdgeVectorEnv(2, seed=3, **{"num_users": 3, "max_steps": 50, **kwargs})
    obs, _ = venv.reset()
    mpc = ForesightMPC(venv.config, 2, horizon=5, scenarios=6)
    for _ in range(4):
        mpc.filter.update(obs)
        obs, *_ = venv.step(mpc.base(obs))
    mpc.filter.update(obs)
    before, draws = mpc.filter.log_posterior.copy(), mpc.filter._draws
    futures = mpc.futures(obs, venv.get_state())
    np.testing.assert_array_equal(mpc.filter.log_posterior, before)  # its own posterior is left as it was
    assert mpc.filter._draws > draws  # and the next draws are new ones
    assert futures.capacity.shape == (2, 6, 5) and futures.channel_logit.shape == (2, 6, 5, venv.config.num_users)
    np.testing.assert_allclose(futures.weight.sum(axis=1), 1.0)
    true = _played_out(venv, 2)
    for drawn, known in zip(futures[:4], true):
        np.testing.assert_array_equal(drawn[:, :, :2], np.repeat(known[:, None], 6, axis=1))
    assert (futures.capacity[:, :, 2:].std(axis=1) > 0).all()  # the rounds after differ between scenarios


def test_what_a_known_round_is_worth_is_played_by_run_episodes_on_the_batched_env():
    kw = {"num_users": 3, "max_steps": 25}
    cfg, env_fn = envs.VREdgeConfig(**kw), functools.partial(gym.make, "VREdge-v0", **kw)
    play = functools.partial(batched_reference_episodes, env_fn=env_fn, episodes=3, seed=0, num_envs=64)
    belief = filter_episodes(BeliefMPC(cfg, horizon=3, scenarios=4), env_fn, 3, 0, num_envs=64)
    assert play(ForesightMPC(cfg, 0, horizon=3, scenarios=4)) == belief
    assert play(ForesightMPC(cfg, 3, horizon=3, scenarios=4)) != belief


@pytest.mark.parametrize("known", [-1, 1.5, True, "2"])
def test_a_bad_known_is_one_line(known):
    with raises(ConfigError, "known", key="known", value=known):
        ForesightMPC(envs.VREdgeConfig(num_users=2), known)


# ---------------------------------------------------------------------------- python -m benchmarks.foresight

TINY = ["--episodes", "2", "--env-kwargs", "num_users=2,max_steps=12", "--horizon", "2", "--scenarios", "2"]


def test_the_curve_is_played_end_to_end_and_written(tmp_path, capsys):
    from benchmarks import foresight

    foresight.main([*TINY, "--k", "2", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == set(foresight.FILES)
    assert (tmp_path / "foresight.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((tmp_path / "foresight.csv").open()))
    assert [r["player"] for r in rows] == ["fair_share", "BeliefMPC (k=0)", "ForesightMPC k=1", "ForesightMPC k=2",
                                           "clairvoyant"]
    cfg, env_fn = envs.VREdgeConfig(num_users=2, max_steps=12), functools.partial(gym.make, "VREdge-v0",
                                                                                   num_users=2, max_steps=12)
    belief = filter_episodes(BeliefMPC(cfg, horizon=2, scenarios=2), env_fn, 2, 0, num_envs=64)
    assert float(rows[1]["reward_per_step"]) == summarize(belief)["reward_per_step"]  # k = 0: BeliefMPC's numbers
    share = rows[-1]["share_of_clairvoyant_lead"]  # (NaN where the clairvoyant is not ahead of BeliefMPC)
    assert float(rows[1]["vs_k0"]) == 0 and (share == "nan" or float(share) == 1.0)
    assert "| ForesightMPC k=2 | 2 |" in out and (tmp_path / "foresight.md").read_text().strip() in out


def test_a_checkpoints_policy_is_played_on_the_runs_cell(tmp_path, capsys):
    from benchmarks import foresight
    from trainer.evaluation import policy_actions
    from trainer.evaluation.policies import trained_model
    from trainer.flags import parse_args
    from trainer.train import train

    run = tmp_path / "run"
    train(parse_args(["--env", "VREdge-v0", "--env-kwargs", "num_users=2,max_steps=12", "--num-envs", "2",
                      "--num-steps", "8", "--total-steps", "16", "--threads", "1", "--run-dir", str(run)]).config,
          progress=False)
    foresight.main(["--episodes", "2", "--horizon", "2", "--scenarios", "2", "--k", "1", "--checkpoint", str(run),
                    "--out", str(tmp_path / "out")])  # (no --env-kwargs: the run's own cell)
    rows = list(csv.DictReader((tmp_path / "out" / "foresight.csv").open()))
    assert [r["player"] for r in rows][:2] == ["fair_share", "policy"]
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=2, max_steps=12)
    played = run_episodes(policy_actions(trained_model(run, "best")[0], True), env_fn, 2, 0)
    assert float(rows[1]["reward_per_step"]) == summarize(played)["reward_per_step"]


@pytest.mark.parametrize("argv, things", [(["--k", "-1"], ["--k", "-1"]), (["--horizon", "0"], ["--horizon", "0"]),
                                          (["--env-kwargs", "capacity_trace=pensieve"], ["capacity_trace"]),
                                          (["--episodes", "0"], ["--episodes", "0"]),
                                          (["--checkpoint", "no/such/run"], ["--checkpoint", "no/such/run"])])
def test_bad_input_is_one_line_and_exit_status_2(argv, things, capsys):
    from benchmarks import foresight

    with exits(2, *things, capsys=capsys):
        foresight.main(argv)
