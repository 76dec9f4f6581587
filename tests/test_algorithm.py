"""Algorithms as units: the loop runs whatever ``trainer.registry`` names, and knows nothing of it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoints
from tests.messages import exits
from tests.random_algorithm import RandomActions
from trainer import train as train_module
from trainer.registry import ALGORITHMS

REPO = Path(__file__).resolve().parents[1]
# what `python -m trainer.train` runs, after one registry line that this process adds from outside the package
TRAIN_WITH_RANDOM = ("import runpy\n"
                     "from tests.random_algorithm import RandomActions\n"
                     "from trainer.registry import ALGORITHMS\n"
                     "ALGORITHMS['random'] = RandomActions\n"
                     "runpy.run_module('trainer.train', run_name='__main__', alter_sys=True)\n")
RANDOM = ["--algo", "random", "--env", "VREdge-v0", "--env-kwargs", "num_users=2,max_steps=20", "--num-envs", "2",
          "--num-steps", "16", "--checkpoint-every", "2", "--seed", "3", "--device", "cpu", "--threads", "1"]


def python_m_trainer_train(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", TRAIN_WITH_RANDOM, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "sps"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_a_third_algorithm_trains_checkpoints_and_resumes_through_the_command_line(tmp_path, monkeypatch):
    """Its own setting, ``hold``, declared in its own module only: a flag, a TOML key, stored, resumed."""
    monkeypatch.setitem(ALGORITHMS, "random", RandomActions)
    train_module.main(RANDOM + ["--hold", "3", "--total-steps", str(2 * 16 * 6),
                                "--run-dir", str(tmp_path / "straight")])
    (tmp_path / "hold.toml").write_text("hold = 3\n")
    python_m_trainer_train(*RANDOM, "--config", str(tmp_path / "hold.toml"), "--total-steps", str(2 * 16 * 3),
                           "--run-dir", str(tmp_path / "split"))
    assert json.loads((tmp_path / "split" / "config.json").read_text())["config"]["hold"] == 3
    resumed = python_m_trainer_train("--resume", str(tmp_path / "split"), "--total-steps", str(2 * 16 * 6))
    assert "resumed from" in resumed.stderr and "not identical" not in resumed.stderr
    assert rows(tmp_path / "split") == rows(tmp_path / "straight") and len(rows(tmp_path / "straight")) == 6
    train_module.main(RANDOM + ["--total-steps", str(2 * 16 * 6), "--run-dir", str(tmp_path / "every_step")])
    assert rows(tmp_path / "every_step") != rows(tmp_path / "straight")  # the setting took effect
    a, b = (checkpoints.latest_loadable(tmp_path / run)[1] for run in ("straight", "split"))
    assert a["iteration"] == b["iteration"] == 6
    assert a["collector"]["steps"].tolist() == b["collector"]["steps"].tolist()


def test_a_third_algorithms_setting_is_in_its_own_help_group_checked_by_its_declared_limits(monkeypatch, capsys):
    from trainer.flags import build_parser, parse_args
    monkeypatch.setitem(ALGORITHMS, "random", RandomActions)
    groups = {g.title: [a.dest for a in g._group_actions] for g in build_parser()._action_groups}
    assert groups[f"random ({RandomActions.description})"] == ["hold"]
    assert parse_args(["--algo", "random", "--hold", "4"]).config.algo_settings.hold == 4
    with pytest.raises(SystemExit) as e:
        parse_args(["--algo", "random", "--hold", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--hold" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        parse_args(["--hold", "2"])  # PPO's run: not its setting
    assert "--hold" in capsys.readouterr().err


def test_an_unregistered_algorithm_is_a_clear_error(capsys):
    from trainer.flags import parse_args
    with exits(2, "--algo", "'random'", "ppo", "apex", capsys=capsys):  # and the algorithms there are
        parse_args(["--algo", "random"])
