"""trainer.evaluate on held-out networks (issue 50 item 5): a run trained on traces plays their test split and says
so; ``--env-kwargs`` plays any run on other env arguments, key by key over its own, refusing those that change the
policy's spaces; QoE_lin stands beside reward per step, paired as well."""

import json

import numpy as np
import pytest

from envs.make_traces import write_traces
from tests.messages import exits, names, not_names
from trainer import evaluate as evaluate_cli
from trainer.flags import parse_args
from trainer.train import train

TINY = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--device", "cpu", "--eval-episodes", "0"]
QUICK = ["--episodes", "3", "--baselines", "fair_share,buffer", "--reference", "none"]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """A run trained on the synthetic cell (3 users, episodes of 30 steps), and a set of the user's own, split."""
    root = tmp_path_factory.mktemp("evaluate_traces")
    write_traces(root / "set" / "train", files=3, seconds=60, seed=1)
    write_traces(root / "set" / "test", files=2, seconds=60, seed=2)
    run = root / "run"
    train(parse_args([*TINY, "--env-kwargs", "num_users=3,max_steps=30", "--run-dir", str(run)]).config,
          progress=False)
    return run, root / "set"


def evaluated(run, *argv, capsys):
    evaluate_cli.main(["--checkpoint", str(run), *QUICK, "--out", str(run.parent), *argv])
    return json.loads((run.parent / "evaluation.json").read_text()), capsys.readouterr().out


def test_any_run_plays_a_trace_set_given_as_env_kwargs_on_its_test_split(synthetic_run, capsys):
    run, traces = synthetic_run
    payload, out = evaluated(run, "--env-kwargs", f"capacity_trace={traces},user_traces={traces},max_steps=20",
                             capsys=capsys)
    # key by key: the given ones in, the run's others kept; a set that comes split played on its test folder
    assert payload["env_kwargs"] == {"num_users": 3, "max_steps": 20, "capacity_trace": str(traces),
                                     "user_traces": str(traces), "trace_split": "test"}
    assert payload["policy"]["mean_length"] == 20  # what was played is what was said
    header = out.splitlines()[0]
    names(header, traces, "test")
    not_names(header, "own")  # the traces are the ones given, not the run's
    payload, _ = evaluated(run, "--env-kwargs", f"user_traces={traces},trace_split=train", capsys=capsys)
    assert payload["env_kwargs"]["trace_split"] == "train"  # asked for: the files training would play


def test_qoe_lin_is_reported_and_paired_beside_reward_per_step(synthetic_run, capsys):
    run, _ = synthetic_run
    payload, out = evaluated(run, capsys=capsys)
    assert set(payload["paired_qoe_lin"]) == set(payload["paired_reward_per_step"]) == {"fair_share", "buffer"}
    for name, paired in payload["paired_qoe_lin"].items():  # a paired mean is the difference of the means
        assert paired["mean"] == pytest.approx(payload["policy"]["qoe_lin"] - payload["baselines"][name]["qoe_lin"])
        assert paired["episodes"] == 3
    columns = next(line for line in out.splitlines() if line.startswith("policy ")).split()
    assert columns.index("QoE_lin/user") == columns.index("reward/step") + 1


def test_a_run_trained_on_traces_plays_their_test_split_and_says_so(tmp_path, synthetic_run, capsys):
    _, traces = synthetic_run
    run = tmp_path / "traced"
    train(parse_args([*TINY, "--run-dir", str(run), "--env-kwargs",
                      f"num_users=3,max_steps=30,capacity_trace={traces},user_traces={traces},trace_split=train"]
                     ).config, progress=False)
    payload, out = evaluated(run, capsys=capsys)
    assert payload["env_kwargs"]["trace_split"] == "test"
    names(out.splitlines()[0], traces, "own", "test")
    payload, _ = evaluated(run, "--env-kwargs", "capacity_trace=,user_traces=", capsys=capsys)  # the synthetic cell
    assert not payload["env_kwargs"]["capacity_trace"] and not payload["env_kwargs"]["user_traces"]


@pytest.mark.parametrize("given, named", [
    ("num_users=2", ["num_users=2", "[19]", "[26]"]),  # the observations: 2 users' against 3 users'
    ("bitrates_mbps=[5,10,20]", ["bitrates_mbps=[5,10,20]"]),  # fewer actions per user
])
def test_env_kwargs_that_change_the_policys_spaces_are_refused_in_one_line(synthetic_run, given, named):
    run, _ = synthetic_run
    with exits(1, *named):
        evaluate_cli.main(["--checkpoint", str(run), *QUICK, "--env-kwargs", given])


@pytest.mark.parametrize("argv, named", [
    (["--env-kwargs", "user_traces=nowhere"], ["user_traces=nowhere"]),  # before torch loads
    (["--env-kwargs", "capacity_trace=pensieve", "--capacity-trace", "pensieve"], ["--capacity-trace",
                                                                                    "capacity_trace"]),
    (["--env-kwargs", "trace_split=test", "--trace-split", "test"], ["--trace-split", "trace_split"]),
    (["--env-kwargs", "num_users"], ["--env-kwargs", "'num_users'"]),
])
def test_bad_env_kwargs_are_usage_errors(synthetic_run, capsys, argv, named):
    run, _ = synthetic_run
    with exits(2, *named, capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(run), *QUICK, *argv])


def test_guard_plays_the_policy_through_the_envs_guard_calibrated_on_the_runs_own_network(synthetic_run, capsys):
    """``--guard volatility``: the threshold is the guard's peak on the run's own cell (validation episodes), the
    policy's records are those of the policy through the guard at that threshold, the baselines' unchanged."""
    import functools
    import math

    import gymnasium as gym

    from envs.profiles import profile_of
    from trainer.evaluation.episodes import filter_episodes, policy_actions, validation_seeds
    from trainer.evaluation.guards import guarded_records
    from trainer.evaluation.policies import trained_model

    run, traces = synthetic_run
    plain, _ = evaluated(run, capsys=capsys)
    payload, out = evaluated(run, "--guard", "volatility", "--env-kwargs", f"capacity_trace={traces}", capsys=capsys)
    guard = payload["guard"]
    assert guard["name"] == "volatility" and guard["calibration_episodes"] == 50  # (not --episodes': fixed)
    make = profile_of("VREdge-v0").guards["volatility"].make
    act = policy_actions(trained_model(run, pick="best")[0], deterministic=True)
    own = {"num_users": 3, "max_steps": 30}
    watch = make(act, own, math.inf)
    filter_episodes(watch, functools.partial(gym.make, "VREdge-v0", **own), 50, 0, seeds=validation_seeds(0, 50))
    assert guard["threshold"] == watch.peak  # calibrated on the run's own cell, not on the traces played
    records, share = guarded_records(make, act, guard["threshold"], "VREdge-v0", payload["env_kwargs"], 3, 0)
    assert payload["policy"]["reward_per_step"] == pytest.approx(np.mean([r["reward_per_step"] for r in records]))
    assert guard["guarded_share"] == pytest.approx(share) and 0 < share <= 1
    names(out, "guard: volatility", f"{guard['threshold']:.3f}", f"{share:.0%}", "jumped", "lowest")
    rows = [line for line in out.splitlines() if line.startswith("policy (")]
    assert rows and all("volatility" in row for row in rows), rows  # the policy's row says it played guarded
    assert "guard" not in plain
    again, _ = evaluated(run, "--guard", "volatility", "--episodes", "2", "--seed", "5", capsys=capsys)
    assert again["guard"]["threshold"] == guard["threshold"]  # the evaluation's episodes and seed do not move it
    alone, _ = evaluated(run, "--guard", "volatility", "--env-kwargs", f"capacity_trace={traces}", "--baselines",
                         "none", capsys=capsys)  # (no one else played)
    assert alone["policy"]["reward_per_step"] == payload["policy"]["reward_per_step"] and alone["baselines"] == {}
    none, _ = evaluated(run, "--guard", "none", capsys=capsys)
    assert "guard" not in none and none["policy"] == plain["policy"]
