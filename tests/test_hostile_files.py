"""Nothing hangs or floods on a hostile file (issue 52): a FIFO, a device or a huge file where a run's small file is
read is refused (or skipped) in one line, within seconds; a sweep whose study lost its trials is refused; torchrun's
environment is checked; nothing is written into another run or under ``$HOME``. Each reproducer of the issue runs
through the command line, as a user types it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import checkpoints
from checkpoints.files import UnreadableFileError, appending, lines_of, read_small_file, reading, write_whole
from tests.messages import error_line, names, one_line, usage_error

REPO = Path(__file__).resolve().parent.parent
# a command still running then hangs (a FIFO hung them for ever): each below ends in 3-8 s on 2 idle cores, the 10 s
# the issue asks; a bound that tight would fail on cores shared with other test runs
HANG_S = 60.0
TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--threads", "1", "--seed", "3",
        "--eval-every", "2", "--eval-episodes", "2"]
SMALL_FILES = ("checkpoints/best", "checkpoints/latest", "config.json", "metrics.jsonl", "lock", ".lock.guard",
               "threads.log", "evaluation.json", "metrics.jsonl.tmp", "wandb_id")
pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs: POSIX")


def command(*args: str, env: dict[str, str] | None = None, timeout: float = HANG_S) -> tuple[int, str, float]:
    """``python ARGS`` as a user runs it: exit status, stderr, and the seconds it took (a hang fails the test)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    return done.returncode, done.stderr, time.monotonic() - start


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A CartPole run of 4 iterations, validated every 2 (so it has a ``best`` pointer)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    status, err, _ = command("-m", "trainer.train", *TINY, "--total-steps", "64", "--run-dir", str(run_dir))
    assert status == 0, err
    assert (run_dir / "checkpoints" / "best").is_file()
    return run_dir


def fifo_run(trained: Path, where: Path, *names_: str) -> Path:
    """A copy of ``trained`` at ``where`` with a FIFO in place of each of ``names_``."""
    run_dir = shutil.copytree(trained, where)
    for name in names_:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    return run_dir


USES = {  # how each command is typed on a run directory
    "load_policy": lambda run: ("-c", "import sys, trainer; trainer.load_policy(sys.argv[1])", str(run)),
    "evaluate": lambda run: ("-m", "trainer.evaluate", "--checkpoint", str(run), "--episodes", "2"),
    "compare": lambda run: ("-m", "trainer.compare", str(run), "--episodes", "2", "--out", str(run.parent / "cmp")),
    "resume": lambda run: ("-m", "trainer.train", "--resume", str(run), "--total-steps", "96"),
}


@pytest.mark.parametrize("use", [pytest.param(u, marks=pytest.mark.slow) if u in ("compare", "resume") else u
                                 for u in USES])  # (quick: two; compare and resume, 20-50 s each, in the whole suite)
def test_a_fifo_as_best_is_skipped_in_one_line(trained, tmp_path, use):
    """The issue's reproducer: a FIFO planted as ``checkpoints/best`` hung all four commands; now each plays the
    newest checkpoint, saying the refused pointer once (a resume replaces it with the run's own)."""
    run_dir = fifo_run(trained, tmp_path / "ff", "checkpoints/best")
    home = tmp_path / "home"
    home.mkdir()
    status, err, took = command(*USES[use](run_dir), env={"HOME": str(home), "XDG_CACHE_HOME": "",
                                                          "XDG_CONFIG_HOME": "", "MPLCONFIGDIR": ""})
    assert status == 0, err  # within HANG_S: bounded (it hung for ever); 3-8 s measured, the 10 s
    said = [line for line in err.splitlines() if mentions_path(line, run_dir / "checkpoints" / "best")]
    if use == "resume":  # a resume does not read best until its validation, which writes it anew
        assert not said and (run_dir / "checkpoints" / "best").is_file()
    else:
        assert len(said) == 1, err
        names(said[0], "FIFO")
    assert not any(home.rglob("*")), list(home.rglob("*"))  # matplotlib's cache too: nothing under $HOME


def mentions_path(line: str, path: Path) -> bool:
    return str(path) in line


def test_a_fifo_as_metrics_stops_a_resume_in_one_line(trained, tmp_path):
    """A FIFO as ``metrics.jsonl`` hung ``--resume`` after the checkpoint loaded; now one line says which file and
    what to do, and the FIFO is left as it is (neither read nor written)."""
    run_dir = fifo_run(trained, tmp_path / "ff", "metrics.jsonl")
    status, err, took = command(*USES["resume"](run_dir))
    assert status == 1, (status, took, err)
    error_line(err, run_dir / "metrics.jsonl", "FIFO")
    assert checkpoints.checkpoint_files(run_dir)[0].name == "ckpt_00000004.pt"  # nothing trained, nothing lost


@pytest.mark.parametrize("use", list(USES))
def test_fifos_everywhere_in_a_run_hang_no_command(trained, tmp_path, use):
    """A FIFO in place of every small file a command may read or append to: each command ends, its checkpoint
    files untouched; what fails says so in one error line, without a traceback."""
    run_dir = fifo_run(trained, tmp_path / "ff", *SMALL_FILES)
    before = {p.name: p.stat().st_size for p in checkpoints.checkpoint_files(run_dir)}
    status, err, _ = command(*USES[use](run_dir))
    assert "Traceback" not in err, err
    if status:
        error_line(err)
    assert {p.name: p.stat().st_size for p in checkpoints.checkpoint_files(run_dir)} == before or use == "resume"


def test_corrupt_rows_in_the_middle_of_metrics_are_counted_and_named(trained, tmp_path):
    """``trainer.compare`` skipped corrupt rows in the middle of ``metrics.jsonl`` silently; now one line counts them
    and names their lines."""
    run_dir = shutil.copytree(trained, tmp_path / "run")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # torn
    lines.insert(3, '{"iteration": "three"}')  # damaged
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    status, err, _ = command(*USES["compare"](run_dir))
    assert status == 0, err
    said = [line for line in err.splitlines() if str(run_dir / "metrics.jsonl") in line]
    assert len(said) == 1, err
    names(said[0], 2, "2", "4")  # two rows, lines 2 and 4


def test_a_best_pointer_out_of_the_run_is_said_by_load_policy(trained, tmp_path):
    """``load_policy`` ignored a ``best`` pointer leading out of the run without the line its docstring promises."""
    run_dir = shutil.copytree(trained, tmp_path / "run")
    other = shutil.copytree(trained, tmp_path / "other")
    (run_dir / "checkpoints" / "best").write_text(json.dumps(
        {"file": "../../other/checkpoints/ckpt_00000002.pt", "iteration": 2}))
    status, err, _ = command(*USES["load_policy"](run_dir))
    assert status == 0, err
    names(one_line(err), run_dir / "checkpoints" / "best", "outside")
    assert other.exists()


# ---------------------------------------------------------------------------- checkpoints.files

def test_small_files_are_regular_bounded_and_never_waited_for(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    for refused in (fifo, tmp_path, Path("/dev/zero")):
        with pytest.raises(UnreadableFileError, match="not a regular file"):
            read_small_file(refused)
    with pytest.raises(UnreadableFileError, match="FIFO"):
        appending(fifo)
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: refused by its size, never read
    with pytest.raises(UnreadableFileError, match="1,073,741,824 bytes"):
        read_small_file(big)
    with pytest.raises(UnreadableFileError):
        with reading(big, limit=1 << 20):
            pass
    assert time.monotonic() - start < 2.0
    write_whole(fifo, "replaced")  # a FIFO where a file is written whole: replaced, not waited for
    assert read_small_file(fifo) == "replaced"


def test_an_overlong_line_costs_no_more_than_its_cap(tmp_path):
    path = tmp_path / "rows"
    path.write_bytes(b"a" * 100 + b"\n" + b"b" * 10 + b"\n" + b"c" * 35)
    with reading(path) as f:
        assert list(lines_of(f, longest=16)) == [b"a" * 16, b"b" * 10, b"c" * 16]


# ---------------------------------------------------------------------------- sweeps

SPACE = "[lr]\nlow = 1e-4\nhigh = 1e-3\nlog = true\n"


def sweep(folder: Path, *extra: str) -> tuple[int, str, float]:
    space = folder.parent / "space.toml"
    space.write_text(SPACE)
    return command("-m", "trainer.sweep", "--space", str(space), "--trials", "1", "--dir", str(folder), *extra, "--",
                   *TINY, "--total-steps", "32")


@pytest.mark.slow  # (a sweep's trial, then its damage: 12-30 s each)
@pytest.mark.parametrize("damage", ["emptied", "deleted"])
def test_a_sweep_whose_study_lost_its_trials_is_refused(tmp_path, damage):
    """An emptied or deleted ``study.db`` turned a finished sweep into failed trials run over the old ones; now the
    same command, and ``--report``, are refused in one line naming the folder and the study, and nothing changes."""
    folder = tmp_path / "sw"
    status, err, _ = sweep(folder)
    assert status == 0, err
    if damage == "emptied":
        (folder / "study.db").write_bytes(b"")
    else:
        (folder / "study.db").unlink()
    kept = {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.name != "study.db"}
    status, err, _ = sweep(folder)
    usage_error(status, err, folder, "trial-0000", "--dir")
    status, err, _ = command("-m", "trainer.sweep", "--report", "--dir", str(folder))
    usage_error(status, err, folder, "trial-0000")
    assert {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.name != "study.db"} == kept


@pytest.mark.slow  # (a sweep's command: 20 s)
def test_a_fifo_as_the_sweeps_ask_lock_is_one_line(tmp_path):
    folder = tmp_path / "sw"
    (folder / ".claims").mkdir(parents=True)
    os.mkfifo(folder / ".claims" / "ask.lock")
    status, err, _ = sweep(folder)
    usage_error(status, err, folder / ".claims" / "ask.lock", "FIFO")
    assert not (folder / "trial-0000").exists()


@pytest.mark.parametrize("folder", ["/proc/self", "/proc/self/sweep", "/sys/kernel"])
def test_an_unwritable_sweep_folder_is_one_line(tmp_path, folder):
    if not Path(folder).parent.exists():
        pytest.skip(f"no {Path(folder).parent} here")
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    status, err, _ = command("-m", "trainer.sweep", "--space", str(space), "--trials", "1", "--dir", folder, "--",
                             *TINY, "--total-steps", "32")
    usage_error(status, err, "--dir", folder)


# ---------------------------------------------------------------------------- compare --out

@pytest.mark.parametrize("inside", ["", "checkpoints", "plots/new"])
def test_compare_writes_into_no_run(trained, tmp_path, inside):
    out = trained / inside if inside else trained
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    status, err, _ = command("-m", "trainer.compare", str(trained), "--episodes", "1", "--out", str(out))
    usage_error(status, err, "--out", trained)
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before


# ---------------------------------------------------------------------------- torchrun's environment

TRAIN = ("-m", "trainer.train", *TINY, "--total-steps", "32")


WRONG_TORCHRUN = [  # (a rank started with each: 20 s each; quick: the first)
    ({"WORLD_SIZE": "two"}, ("WORLD_SIZE",)),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}, ("RANK", "WORLD_SIZE")),
    ({"WORLD_SIZE": "2", "RANK": "-1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}, ("RANK",)),
    ({"WORLD_SIZE": "2", "RANK": "0"}, ("MASTER_ADDR", "MASTER_PORT")),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, ("MASTER_PORT",)),
]


@pytest.mark.parametrize("environment, named", WRONG_TORCHRUN[:1] + [pytest.param(*case, marks=pytest.mark.slow)
                                                                  for case in WRONG_TORCHRUN[1:]])
def test_a_wrong_torchrun_environment_is_one_line(tmp_path, environment, named):
    status, err, _ = command(*TRAIN, "--run-dir", str(tmp_path / "run"), env=environment)
    assert status == 1, err
    error_line(err, *named)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank", ["0", pytest.param("1", marks=pytest.mark.slow)])  # (a worker timeout each)
def test_a_failed_rendezvous_is_one_line_within_the_worker_timeout(tmp_path, rank):
    """Rank 0 alone (its peer never comes) or rank 1 alone (no rank 0 at the address): one line naming the
    variables, once ``--worker-timeout`` has passed, without torch's C++ retry lines."""
    port = str(29_600 + os.getpid() % 300)
    environment = {"WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": rank, "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port}
    status, err, took = command(*TRAIN, "--worker-timeout", "3", "--run-dir", str(tmp_path / "run"),
                                env=environment)
    assert status == 1, err
    names(one_line(err), "MASTER_ADDR", "MASTER_PORT", "127.0.0.1", port, "--worker-timeout")
    assert took < 3 + 25, took  # the timeout, plus starting Python and torch on busy cores


def test_the_printed_torchrun_command_keeps_its_logs_in_the_run(monkeypatch, tmp_path):
    from trainer.loop import train_command

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    printed = train_command("--resume", str(tmp_path / "run" / "checkpoints" / "ckpt_00000004.pt")).split()
    assert printed[printed.index("--log-dir") + 1] == str(tmp_path / "run" / "torchrun")
    assert printed.index("--log-dir") < printed.index("trainer.train")


def test_a_fifo_as_a_seed_folders_setup_is_one_line(tmp_path):
    """``trainer.train --seeds`` reads the folder's ``seeds.json`` first: a FIFO there is one usage error line."""
    folder = tmp_path / "seeds"
    folder.mkdir()
    os.mkfifo(folder / "seeds.json")
    flags = [flag for i, flag in enumerate(TINY) if "--seed" not in TINY[i - 1: i + 1]]  # --seeds gives them
    status, err, _ = command("-m", "trainer.train", *flags, "--total-steps", "32", "--seeds", "1-2",
                             "--run-dir", str(folder))
    usage_error(status, err, folder / "seeds.json", "FIFO", "--run-dir")
    assert sorted(p.name for p in folder.iterdir()) == ["seeds.json"]
