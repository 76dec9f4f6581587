"""Nothing outside the run, nothing lost (issue 43): pointers and links that lead out of a run are refused and
nothing is written into another run; a ``latest`` pointer a kill left behind a complete checkpoint is no rollback;
nothing set aside is ever replaced."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import checkpoints
from checkpoints.run_dir import checkpoint_iteration
from collectors.processes import process_context
from tests.test_durability import assert_same_tensors, final_state, metrics, run
from trainer import train as train_module

STEPS = 2 * 8  # env steps per iteration of TINY
# VR-edge: its envs' states are in the checkpoint, so a resume is exact (CartPole's episodes would restart);
# --threads 1: a run of 100 iterations would plan its threads by timing, and other counts round differently
TINY = ["--env", "VREdge-v0", "--num-envs", "2", "--num-steps", "8", "--checkpoint-every", "1",
        "--keep-checkpoints", "10", "--seed", "5", "--device", "cpu", "--backend", "sync", "--compile", "off",
        "--threads", "1"]
HOSTILE = "../../victim/checkpoints/ckpt_00000004.pt"  # from attacked/checkpoints into the other run


def iterations(n: int) -> list[str]:
    return ["--total-steps", str(STEPS * n)]


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` in a process of its own, as a user types it."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)


def hashes(directory: Path, pattern: str = "*") -> dict[str, str]:
    """The files under ``directory`` that match ``pattern``, each with its SHA-256."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob(pattern)) if p.is_file()}


def one_line_naming(err: str, *names: str) -> bool:
    return any(all(name in line for name in names) for line in err.splitlines())


# ---------------------------------------------------------------------------- pointers out of the run

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """``victim`` (4 iterations, with an evaluation) and ``attacked`` (2), side by side."""
    root = tmp_path_factory.mktemp("runs")
    run(TINY + iterations(4) + ["--run-dir", str(root / "victim")])
    run(TINY + iterations(2) + ["--run-dir", str(root / "attacked")])
    newest = root / "victim" / "checkpoints" / "ckpt_00000004.pt"
    (root / "victim" / "evaluation.json").write_text(json.dumps({"checkpoint": str(newest), "episodes": 1}))
    return root


@pytest.fixture
def attacked(two_runs, tmp_path) -> tuple[Path, Path, dict[str, str]]:
    """A copy of the two runs whose ``attacked`` run's ``best`` and ``latest`` name the other run's newest
    checkpoint; returns both runs and the other's files' hashes."""
    root = shutil.copytree(two_runs, tmp_path / "runs")
    pointers = root / "attacked" / "checkpoints"
    (pointers / "best").write_text(json.dumps({"file": HOSTILE, "iteration": 4, "val_return": 1e9}))
    (pointers / "latest").write_text(HOSTILE + "\n")
    return root / "victim", root / "attacked", hashes(root / "victim")


def test_evaluate_follows_no_pointer_out_of_the_run(attacked):
    victim, run_dir, before = attacked
    done = command("trainer.evaluate", "--checkpoint", str(run_dir), "--episodes", "1", "--baselines", "none",
                   "--reference", "none")
    assert done.returncode == 0, done.stderr
    assert hashes(victim) == before  # its evaluation.json was replaced
    own = run_dir / "checkpoints" / "ckpt_00000002.pt"
    assert json.loads((run_dir / "evaluation.json").read_text())["checkpoint"] == str(own.resolve())
    assert one_line_naming(done.stderr, str(run_dir / "checkpoints" / "best"), HOSTILE), done.stderr


def test_export_follows_no_pointer_out_of_the_run(attacked):
    victim, run_dir, before = attacked
    done = command("trainer.export", "--checkpoint", str(run_dir), "--format", "torchscript")
    assert done.returncode == 0, done.stderr
    assert hashes(victim) == before  # it held export/policy.pt
    own = run_dir / "checkpoints" / "ckpt_00000002.pt"
    assert json.loads((run_dir / "export" / "policy.json").read_text())["checkpoint"]["path"] == str(own.resolve())
    assert (run_dir / "export" / "policy.pt").is_file()
    assert one_line_naming(done.stderr, str(run_dir / "checkpoints" / "best"), HOSTILE), done.stderr


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_links_planted_where_outputs_go_lead_nothing_out_of_the_run(two_runs, tmp_path):
    """A link at ``RUN/evaluation.json`` is replaced, not written through; a ``RUN/export`` that links out of the run
    is refused, naming it, and nothing lands where it leads."""
    root = shutil.copytree(two_runs, tmp_path / "runs")
    victim, run_dir = root / "victim", root / "attacked"
    (run_dir / "evaluation.json").symlink_to(victim / "evaluation.json")
    (run_dir / "export").symlink_to(victim, target_is_directory=True)
    before = hashes(victim)
    evaluated = command("trainer.evaluate", "--checkpoint", str(run_dir), "--episodes", "1", "--baselines", "none",
                        "--reference", "none")
    assert evaluated.returncode == 0, evaluated.stderr
    assert not (run_dir / "evaluation.json").is_symlink() and hashes(victim) == before
    exported = command("trainer.export", "--checkpoint", str(run_dir), "--format", "torchscript")
    assert exported.returncode != 0 and one_line_naming(exported.stderr, str(run_dir / "export"))
    assert hashes(victim) == before


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_resume_follows_no_pointer_out_of_the_run(attacked):
    """The resume took the other run's state (iteration 4) and went on from it: rows 1, 2, then 5, 6."""
    victim, run_dir, before = attacked
    done = command("trainer.train", "--resume", str(run_dir), *iterations(6))
    assert done.returncode == 0, done.stderr
    assert hashes(victim) == before
    assert [r["iteration"] for r in metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert final_state(run_dir)["iteration"] == 6
    assert len(checkpoints.checkpoint_files(run_dir)) == 6  # its own two kept
    assert one_line_naming(done.stderr, str(run_dir / "checkpoints" / "latest"), HOSTILE), done.stderr


def _saved(run_dir: Path, iteration: int) -> Path:
    return checkpoints.save_in_run_dir(run_dir, {"iteration": iteration, "w": torch.full((3,), iteration)}, iteration,
                                       keep=10)


def test_a_pointer_or_a_link_out_of_the_run_is_refused_where_a_file_is_asked_for(tmp_path):
    """Passed as the checkpoint, a run's ``best`` or ``latest`` pointer that leads out of it stands for the run
    itself; a checkpoint file of the run that is a link to another run's is skipped."""
    other, own = tmp_path / "other", tmp_path / "own"
    _saved(other, 9)
    for i in (1, 2):
        _saved(own, i)
    folder = own / "checkpoints"
    (folder / "best").write_text(json.dumps({"file": "../../other/checkpoints/ckpt_00000009.pt"}))
    (folder / "latest").write_text(str(other / "checkpoints" / "ckpt_00000009.pt"))  # absolute, too
    for pointer in ("best", "latest"):
        path, state, problems = checkpoints.latest_loadable(folder / pointer)
        assert path == folder / "ckpt_00000002.pt" and state["iteration"] == 2
        assert any("ckpt_00000009.pt" in p and pointer in p for p in problems), problems
    assert checkpoints.best_or_why_not(own)[0] is None and checkpoints.best_info(own) is None
    (folder / "latest").unlink()
    (folder / "ckpt_00000003.pt").symlink_to(other / "checkpoints" / "ckpt_00000009.pt")
    path, state, problems = checkpoints.latest_loadable(own)
    assert path == folder / "ckpt_00000002.pt" and state["iteration"] == 2
    assert any("ckpt_00000003.pt" in p for p in problems), problems


# ---------------------------------------------------------------------------- the order of truth on resume

def test_a_latest_pointer_a_kill_left_behind_is_no_rollback(tmp_path):
    """A kill after ckpt_3 was written and before ``latest`` moved: the resume goes on from ckpt_3, sets nothing
    aside, says so in one line, and ends as an uninterrupted run."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(TINY + iterations(4) + ["--run-dir", str(straight)])
    run(TINY + iterations(4) + ["--run-dir", str(killed)], max_iterations=3)
    (killed / "checkpoints" / "latest").write_text("ckpt_00000002.pt\n")
    done = command("trainer.train", "--resume", str(killed))
    assert done.returncode == 0, done.stderr
    assert not list((killed / "checkpoints").glob("*.orphaned"))
    assert one_line_naming(done.stderr, "latest", "ckpt_00000002.pt", "ckpt_00000003.pt"), done.stderr
    a, b = final_state(straight), final_state(killed)
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert metrics(straight) == metrics(killed)


# ---------------------------------------------------------------------------- nothing set aside is replaced

def test_setting_aside_twice_keeps_both_copies(tmp_path):
    for i in (1, 2, 3):
        _saved(tmp_path, i)
    first = checkpoints.set_aside_newer(tmp_path, 1)
    kept = hashes(tmp_path, "*.orphaned")
    for i in (2, 3):
        checkpoints.save_in_run_dir(tmp_path, {"iteration": i, "w": torch.zeros(3)}, i, keep=10)  # another future
    second = checkpoints.set_aside_newer(tmp_path, 1)
    assert len(set(first + second)) == 4 and all(p.is_file() for p in first + second)
    assert kept.items() <= hashes(tmp_path, "*.orphaned").items()


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_two_rollbacks_to_the_same_checkpoint_keep_every_copy_set_aside(tmp_path):
    """``--resume RUN/checkpoints/ckpt_1.pt`` twice: the second set iterations 2 and 3 aside over the first's."""
    run_dir = tmp_path / "run"
    run(TINY + iterations(3) + ["--run-dir", str(run_dir)])
    rollback = ["--resume", str(run_dir / "checkpoints" / "ckpt_00000001.pt")]
    run(rollback)
    first = hashes(run_dir, "*.orphaned")
    assert len(first) == 2
    done = command("trainer.train", *rollback)
    assert done.returncode == 0, done.stderr
    now = hashes(run_dir, "*.orphaned")
    assert len(now) == 4 and first.items() <= now.items()
    assert one_line_naming(done.stderr, *(Path(name).name for name in now.keys() - first.keys())), done.stderr


# ---------------------------------------------------------------------------- random kills

KILLS = 20
KILLED_ITERATIONS = 100  # more than 20 kills get through: each lets one save happen, and rarely more than 3


def _train_logging_to(log: str, argv: list[str]) -> None:
    """``trainer.train``'s command line with ``argv``, what it prints going to the file ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    train_module.main(argv)


def _newest_saved(run_dir: Path) -> int:
    files = checkpoints.checkpoint_files(run_dir) if (run_dir / "checkpoints").is_dir() else []
    return checkpoint_iteration(files[0]) if files else 0


def _wait_for_a_save_after(run_dir: Path, iteration: int, proc, log: Path) -> None:
    deadline = time.monotonic() + 120
    while _newest_saved(run_dir) <= iteration:
        assert proc.is_alive(), log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.005)


@pytest.mark.slow
def test_random_kills_lose_no_saved_iteration(tmp_path):
    """Issue 43's target: 20 SIGKILLs at random moments of a run that saves every iteration, each followed by a
    resume. Every resume goes on from the newest complete checkpoint (whatever ``latest`` says: one kill in about
    a dozen lands between a save and the pointer's update), so nothing is ever set aside, and the run ends with the
    weights and rows of an uninterrupted one.

    Each run is the command line (``trainer.train.main``) in a process of its own, forked from the collectors'
    forkserver, which has imported torch: 21 fresh interpreters would spend most of the test importing."""
    rng = random.Random(43)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(TINY + iterations(KILLED_ITERATIONS) + ["--run-dir", str(straight)])
    ctx = process_context()
    argv = TINY + iterations(KILLED_ITERATIONS) + ["--run-dir", str(killed)]
    for kill in range(KILLS + 1):
        saved, log = _newest_saved(killed), tmp_path / f"run_{kill}.log"
        proc = ctx.Process(target=_train_logging_to, args=(str(log), argv))
        proc.start()
        if kill < KILLS:
            _wait_for_a_save_after(killed, saved, proc, log)
            time.sleep(rng.uniform(0.0, 0.1))
            proc.kill()
        proc.join(300)
        assert proc.exitcode == (-signal.SIGKILL if kill < KILLS else 0), log.read_text()
        assert not list((killed / "checkpoints").glob("*.orphaned")), log.read_text()  # a saved iteration lost
        argv = ["--resume", str(killed)]
    a, b = final_state(straight), final_state(killed)
    assert a["iteration"] == b["iteration"] == KILLED_ITERATIONS
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert metrics(straight) == metrics(killed)
