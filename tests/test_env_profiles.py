"""The env declares, the trainer asks (envs.profiles): an env of the tests' own with a profile (tests/profiled_env.py:
one baseline, one expert) gets the quality line against its baseline, ``trainer.evaluate`` against it and a
distillation round from its expert, through the command lines, with nothing of it in trainer/; and no module of
trainer/, collectors/ or checkpoints/ branches on an env's id."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.profiles import GENERIC, profile_of

REPO = Path(__file__).resolve().parents[1]
ENV = "tests.profiled_env:Guess-v0"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("profiled")
    out = _run("trainer.train", "--env", ENV, "--total-steps", "256", "--num-envs", "4", "--num-steps", "32",
               "--compile", "off", "--threads", "1", "--eval-episodes", "8", "--run-dir", "run", cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd, out.stdout


def test_the_quality_line_plays_the_baseline_the_profile_declares(trained):
    _, stdout = trained
    quality = next(line for line in stdout.splitlines() if line.startswith("quality:"))
    assert "against first" in quality and "return" in quality, quality


def test_evaluate_plays_the_profiles_baseline_beside_the_policy(trained):
    cwd, _ = trained
    out = _run("trainer.evaluate", "--checkpoint", "run", "--episodes", "6", "--out", "evaluated", cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((cwd / "evaluated" / "evaluation.json").read_text())
    assert list(result["baselines"]) == ["first"] and result["best_baseline"] == "first"
    # it acts 0 every step: a third of the targets on average (6 episodes of 16 steps), never all, here not none
    assert 0 < result["baselines"]["first"]["mean_return"] < 16
    assert "first" in result["paired_reward_per_step"]


def test_a_distillation_round_labels_with_the_profiles_expert(trained):
    cwd, _ = trained
    out = _run("trainer.distill", "run", "--episodes", "3", "--validation-episodes", "4", cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "oracle" in said and "48 states of 3 episodes" in said, said  # 3 episodes of 16 steps, all labelled


def test_an_env_without_a_profile_gets_the_generic_one():
    assert profile_of("CartPole-v1") is GENERIC and not GENERIC.baselines and GENERIC.expert is None
    assert profile_of("VREdge-v0").score == "reward_per_step" and "fair_share" in profile_of("VREdge-v0").baselines


def _env_id_branches(path: Path, root: Path = REPO) -> list[str]:
    """Comparisons of anything with an env id (a string constant ending in ``-v<digits>``) in ``path``'s code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                if (isinstance(operand, ast.Constant) and isinstance(operand.value, str)
                        and "-v" in operand.value and operand.value.rpartition("-v")[2].isdigit()):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {operand.value}")
    return found


def test_no_library_module_outside_envs_branches_on_an_env_id():
    branches = [b for package in ("trainer", "collectors", "checkpoints")
                for path in sorted((REPO / package).rglob("*.py")) for b in _env_id_branches(path)]
    assert branches == [], branches


def test_a_branch_on_an_env_id_would_be_found(tmp_path):
    (tmp_path / "m.py").write_text('def f(env):\n    return 1 if env == "VREdge-v0" else env not in ("x-v1",)\n')
    assert _env_id_branches(tmp_path / "m.py", tmp_path) == ["m.py:2 VREdge-v0"]
