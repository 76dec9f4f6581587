"""Algorithms as units: the loop runs whatever ``trainer.registry`` names, and knows nothing of it."""

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_a_third_algorithm_trains_checkpoints_and_resumes_through_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "random", RandomActions)
    train_module.main(RANDOM + ["--total-steps", str(2 * 16 * 6), "--run-dir", str(tmp_path / "straight")])
    python_m_trainer_train(*RANDOM, "--total-steps", str(2 * 16 * 3), "--run-dir", str(tmp_path / "split"))
    resumed = python_m_trainer_train("--resume", str(tmp_path / "split"), "--total-steps", str(2 * 16 * 6))
    assert "resumed from" in resumed.stderr and "not identical" not in resumed.stderr
    assert rows(tmp_path / "split") == rows(tmp_path / "straight") and len(rows(tmp_path / "straight")) == 6
    a, b = (checkpoints.latest_loadable(tmp_path / run)[1] for run in ("straight", "split"))
    assert a["iteration"] == b["iteration"] == 6
    assert a["collector"]["steps"].tolist() == b["collector"]["steps"].tolist()


def test_an_unregistered_algorithm_is_a_clear_error(capsys):
    from trainer.flags import parse_args
    with exits(2, "--algo", "'random'", "ppo", "apex", capsys=capsys):  # and the algorithms there are
        parse_args(["--algo", "random"])
