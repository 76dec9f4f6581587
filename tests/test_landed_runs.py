"""Run directories written by the landed version before issue 48 (``tests/data/landed``, stored as that version
wrote them, with ``ray_async`` since renamed ``keep_collecting``) still resume, evaluate and load, through the
command lines as a user runs them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import checkpoints
import trainer
from trainer.run_files import resume_state

LANDED = Path(__file__).resolve().parent / "data" / "landed"
# iterations each landed run holds, the --total-steps that makes it longer, and the iterations that makes
RUNS = {"ppo-vredge": (4, 384, 6), "apex-cartpole": (10, 240, 15), "ppo-vredge-distilled": (4, 384, 6),
        "ppo-cells-set": (4, 384, 6)}
# the checkpoint trainer.evaluate plays: the PPO runs' best (validation) and the Ape-X run's newest (it validated not)
EVALUATED = {"ppo-vredge": "ckpt_00000002.pt", "apex-cartpole": "ckpt_00000010.pt",
             "ppo-vredge-distilled": "ckpt_00000004.pt", "ppo-cells-set": "ckpt_00000002.pt"}


def landed(name: str, tmp_path: Path) -> Path:
    """A copy of the landed run ``name`` in ``tmp_path`` (the stored one stays as it was written)."""
    return Path(shutil.copytree(LANDED / name, tmp_path / name))


def python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh process, in ``cwd``; exit status 0 expected (stderr shown otherwise)."""
    paths = [str(LANDED.parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]  # this checkout's code
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc


def iterations(run_dir: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
@pytest.mark.parametrize("name", RUNS)
def test_a_landed_run_resumes_for_longer(tmp_path, name):
    run_dir, (done, total_steps, then) = landed(name, tmp_path), RUNS[name]
    assert iterations(run_dir) == list(range(1, done + 1))
    python(["-m", "trainer.train", "--resume", str(run_dir), "--total-steps", str(total_steps)], tmp_path)
    assert iterations(run_dir) == list(range(1, then + 1))  # went on from where it was, no iteration again
    assert checkpoints.checkpoint_iteration(checkpoints.checkpoint_files(run_dir)[0]) == then
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["config"]["keep_collecting"] is False and "ray_async" not in stored["config"]


@pytest.mark.parametrize("name", RUNS)
def test_a_landed_run_evaluates(tmp_path, name):
    run_dir = landed(name, tmp_path)
    # the policy alone: the baselines and the clairvoyant reference are the env's, and the bulk of the time
    python(["-m", "trainer.evaluate", "--checkpoint", str(run_dir), "--episodes", "2", "--baselines", "none",
            "--reference", "none"], tmp_path)
    report = json.loads((run_dir / "evaluation.json").read_text())
    assert Path(report["checkpoint"]).name == EVALUATED[name]
    assert report["episodes"] == 2 and report["policy"]["episodes"] == 2
    assert np.isfinite(report["policy"]["mean_return"])


@pytest.mark.parametrize("name", RUNS)
def test_a_landed_run_loads_as_a_policy_that_acts(tmp_path, name):
    policy = trainer.load_policy(landed(name, tmp_path))
    assert policy.config.algo == name.partition("-")[0] and policy.config.keep_collecting is False
    action = policy(policy.observation_space.sample())
    assert policy.action_space.contains(np.asarray(action, dtype=policy.action_space.dtype))


def test_a_landed_folder_of_seeds_goes_on_with_the_same_command_for_longer(tmp_path):
    folder = landed("seeds", tmp_path)
    assert [iterations(folder / s) for s in ("s1", "s2")] == [[1, 2]] * 2
    # the command that made it (tests/data/landed/README.md), with a larger --total-steps: the same setup
    python(["-m", "trainer.train", "--seeds", "1-2", "--num-envs", "2", "--num-steps", "8", "--total-steps", "48",
            "--hidden", "8", "--run-dir", str(folder)], tmp_path)
    assert [iterations(folder / s) for s in ("s1", "s2")] == [[1, 2, 3]] * 2


def test_a_stored_ray_async_is_read_as_keep_collecting(tmp_path):
    """What the landed runs stored as ``ray_async`` is ``keep_collecting`` when a resume or a policy reads it
    (the landed runs stored false, today's default: true shows that the value is read, not defaulted)."""
    run_dir = landed("ppo-vredge", tmp_path)
    source = checkpoints.checkpoint_files(run_dir)[0]
    state = checkpoints.load(source)
    assert state["config"]["ray_async"] is False and "keep_collecting" not in state["config"]
    state["config"].update(ray_async=True, backend="ray")
    checkpoints.save(source, state)
    cfg, _, saved, _ = resume_state(str(run_dir), {})
    assert cfg.keep_collecting is True and saved["config"]["keep_collecting"] is True
    assert trainer.load_policy(source).config.keep_collecting is True


@pytest.mark.slow  # (processes that distil, export and train)
def test_a_run_distilled_in_place_before_checkpoints_were_never_rewritten_goes_on(tmp_path):
    """A run whose newest checkpoint a distillation rewrote in place (with ``undistilled_model`` beside the
    distilled weights, and its ``distilled`` record) exports with its record, takes a new round as a new file,
    and its record is carried into the checkpoints a resume writes."""
    run_dir = landed("ppo-vredge-distilled", tmp_path)
    old = checkpoints.checkpoint_files(run_dir)[0]
    before, state = old.read_bytes(), checkpoints.load(old)
    assert "undistilled_model" in state and len(state["distilled"]) == 1
    python(["-m", "trainer.export", "--checkpoint", str(run_dir), "--format", "torchscript", "--out",
            str(tmp_path / "shipped")], tmp_path)
    card = json.loads((tmp_path / "shipped" / "policy.json").read_text())
    assert card["checkpoint"]["distilled"] == state["distilled"]
    python(["-m", "trainer.distill", str(run_dir), "--episodes", "1", "--validation-episodes", "2", "--epochs", "1",
            "--lr", "1e-9"], tmp_path)
    assert old.read_bytes() == before  # never rewritten
    newest = checkpoints.checkpoint_files(run_dir)[0]
    if newest != old:  # the round was kept (it scored no lower): the record grows, seeded by the rounds before
        assert newest.name == "ckpt_00000004_1.pt"
        assert [r["settings"]["seed"] for r in checkpoints.load(newest)["distilled"]] == [0, 1]
    record = checkpoints.load(newest)["distilled"]
    python(["-m", "trainer.train", "--resume", str(run_dir), "--total-steps", "384"], tmp_path)
    resumed = checkpoints.load(checkpoints.checkpoint_files(run_dir)[0])
    assert resumed["iteration"] == 6 and resumed["distilled"] == record
