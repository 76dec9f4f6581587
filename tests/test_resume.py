import json

import pytest
import torch

import checkpoints
from tests.factories import settings_file
from tests.messages import exits, names, raises
from trainer import evaluate as evaluate_cli
from trainer import train as train_module
from trainer.flags import parse_args


def run(argv, **kw):
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given,
                              overwrite=cli.overwrite, **kw)


def params(run_dir):
    return checkpoints.latest_loadable(run_dir)[1]["model"]


SMALL_VR = ["--env", "VREdge-v0", "--num-envs", "4", "--num-steps", "16", "--total-steps", str(4 * 16 * 6),
            "--checkpoint-every", "1", "--seed", "5", "--config", settings_file("scaled_rewards")]


@pytest.mark.parametrize("backend", ["sync", pytest.param("serial", marks=pytest.mark.slow)])
def test_stop_and_resume_gives_the_same_parameters_bit_for_bit(tmp_path, backend):
    argv = SMALL_VR + ["--backend", backend]
    straight = run(argv + ["--run-dir", str(tmp_path / "straight")])
    first = run(argv + ["--run-dir", str(tmp_path / "split")], max_iterations=3)
    assert first["iterations"] == 3 and not first["finished"]
    second = run(["--resume", str(tmp_path / "split")])
    assert straight["iterations"] == second["iterations"] == 6
    a, b = params(tmp_path / "straight"), params(tmp_path / "split")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and the stop mattered: three iterations fewer give different weights
    third = checkpoints.load(tmp_path / "straight" / "checkpoints" / "ckpt_00000004.pt")["model"]
    assert any(not torch.equal(third[k], a[k]) for k in a)


def test_resume_with_a_conflicting_flag_is_an_error(tmp_path):
    run(SMALL_VR + ["--run-dir", str(tmp_path)], max_iterations=1)
    with raises(ValueError, "--num-envs", "8", "4"):  # given, and the run's
        run(["--resume", str(tmp_path), "--num-envs", "8"])


def test_resume_of_envs_without_get_state_restarts_episodes_and_says_so(tmp_path, capsys):
    argv = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--total-steps", "256",
            "--run-dir", str(tmp_path)]
    run(argv, max_iterations=2)
    summary = run(["--resume", str(tmp_path)])
    assert summary["iterations"] == 4
    assert "derived seeds" in capsys.readouterr().err


def test_baselines_named_for_an_env_without_them_are_a_note(tmp_path, capsys):
    run(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--total-steps", "64", "--run-dir",
         str(tmp_path)])
    capsys.readouterr()
    evaluate_cli.main(["--checkpoint", str(tmp_path), "--episodes", "1", "--baselines", "lowest", "--json"])
    printed = capsys.readouterr()
    assert json.loads(printed.out)["baselines"] == {}
    names(printed.err, "--baselines", "CartPole-v1")
    evaluate_cli.main(["--checkpoint", str(tmp_path), "--episodes", "1", "--json"])  # the default: no note
    assert "note:" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def vr_run(tmp_path_factory):
    """A one-iteration VR-edge run directory, shared by the evaluation tests."""
    run_dir = tmp_path_factory.mktemp("vr_run")
    run(SMALL_VR + ["--run-dir", str(run_dir)], max_iterations=1)
    return run_dir


def test_evaluate_command_prints_table_and_writes_json(vr_run, capsys):
    tmp_path = vr_run
    evaluate_cli.main(["--checkpoint", str(tmp_path), "--episodes", "3", "--baselines", "lowest,fair_share",
                       "--json"])
    printed = capsys.readouterr()
    payload = json.loads(printed.out)  # with --json, stdout holds the JSON alone
    out = printed.err  # and the table goes to stderr
    assert set(payload["baselines"]) == {"lowest", "fair_share"}
    assert payload["policy"]["episodes"] == 3 and "quality_ci95" in payload["policy"]
    assert payload["baselines"]["lowest"]["quality"] == 0.0
    assert "fair_share" in out and "reward/step" in out
    assert json.loads((tmp_path / "evaluation.json").read_text()) == payload
    paired = payload["paired_reward_per_step"]["lowest"]  # the same 3 episodes, differenced
    assert paired["episodes"] == 3 and paired["mean"] == pytest.approx(
        payload["policy"]["reward_per_step"] - payload["baselines"]["lowest"]["reward_per_step"])
    assert "paired over the same episodes" in out
    png = tmp_path / "evaluation.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, status, named", [
    (["--checkpoint", "{missing}"], 2, ["--checkpoint", "{missing}"]),
    (["--checkpoint", "{empty}"], 1, ["{empty}"]),
    # the env given, and the run's
    (["--checkpoint", "{run}", "--env", "CartPole-v1"], 2, ["--env", "CartPole-v1", "{run}", "VREdge-v0"]),
])
def test_evaluate_bad_input_is_a_one_line_error(tmp_path, vr_run, capsys, argv, status, named):
    """A flag that does not fit (a path that is not there, another env) is a usage error, exit status 2, as
    trainer.train's are; a checkpoint that cannot be used is an error of the run, exit status 1."""
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing.pt", "empty": tmp_path / "empty", "run": vr_run}
    with exits(status, *[n.format(**paths) for n in named], capsys=capsys):
        evaluate_cli.main([a.format(**paths) for a in argv])


def test_nan_loss_stops_with_the_iteration_and_keeps_good_checkpoints(tmp_path):
    import tests.factories  # noqa: F401 - registers NaNReward-v0
    from trainer.algorithm import NonFiniteLossError
    argv = ["--env", "NaNReward-v0", "--num-envs", "2", "--num-steps", "64", "--total-steps", "1024",
            "--checkpoint-every", "1", "--run-dir", str(tmp_path)]
    with raises(NonFiniteLossError, "iteration 3", "ckpt_00000002.pt"):  # when, and the checkpoint to go back to
        run(argv)
    path, state, problems = checkpoints.latest_loadable(tmp_path)
    assert path.name == "ckpt_00000002.pt" and not problems
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
