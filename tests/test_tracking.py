"""Tracking (issue 42): ``--wandb PROJECT`` beside ``--tensorboard`` (``trainer.tracking``).

The promise under test: every metrics row of ``metrics.jsonl`` reaches each tracker, its numbers at its
``env_steps``; W&B names the run for its directory (grouped by its experiment folder), takes the run's settings
as its config, writes its files into the run directory, works offline (``WANDB_MODE=offline``), continues the same
W&B run on resume, is finished whatever ends the run, and leaves no process behind; under torchrun, rank 0 alone
tracks; a missing extra is a one-line usage error before anything is written.

W&B's offline files are read back with :func:`wandb_records` (W&B has no reader of its own any more: the
``.wandb`` file is a LevelDB-style log of ``wandb_internal.Record`` protobufs).
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest

from tests.messages import names, usage_error
from trainer import train as train_module
from trainer.config import TrainConfig
from trainer.flags import parse_args
from trainer.registry import algorithm_class
from trainer.tracking import WANDB_ID, Trackers, wandb_names

REPO = Path(__file__).resolve().parents[1]
TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--backend", "sync", "--device", "cpu"]


@pytest.fixture
def offline(tmp_path, monkeypatch) -> dict[str, str]:
    """W&B offline, its own files (settings, caches) in ``tmp_path``: the environment of a run without a network."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(home / "wandb-dir"), "HOME": str(home),
           "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"), "WANDB_CACHE_DIR": str(home / ".cache" / "wandb")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **env, "PYTHONPATH": str(REPO)}


# ---------------------------------------------------------------------------- reading W&B's offline files

def wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB log blocks of
    32 KiB, each chunk with a 7-byte header (CRC, length, type: 1 whole, 2/3/4 first/middle/last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block, header = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", path
    records, pos, parts = [], header, b""
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # the rest of a block too short for a chunk header: padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        parts += data[pos + header:pos + header + length]
        pos += header + length
        if kind in (1, 4):
            records.append(Record.FromString(parts))
            parts = b""
    return records


def offline_runs(run_dir: Path) -> list[Path]:
    """The ``.wandb`` files of the run's offline W&B runs, oldest first (one per process that tracked)."""
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def history(records: list) -> list[dict]:
    """The rows logged, each with its ``_step`` (W&B's own keys other than that left out)."""
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {".".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
    return rows


def the_run(records: list):
    """The run record: id, project, name, group, config."""
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return run


def exit_code(records: list) -> int:
    """The exit status the run was finished with (AssertionError: it was never finished)."""
    [code] = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    return code


def metrics_rows(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` as W&B should hold it: each row's numbers, at its env steps."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{**{k: v for k, v in row.items() if isinstance(v, (int, float))}, "_step": row["env_steps"]}
            for row in rows]


def same_rows(logged: list[dict], expected: list[dict]) -> None:
    assert [r["_step"] for r in logged] == [r["_step"] for r in expected]
    for got, want in zip(logged, expected):
        assert got == pytest.approx(want), (got, want)


def wandb_services_of(pid: int) -> list[psutil.Process]:
    """W&B's service processes started by process ``pid`` (each is told its parent's pid), still running."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = p.info["cmdline"] or []
        if any("wandb" in part for part in line[:1]) and str(pid) in line:
            found.append(p)
    return found


def train_cli(run_dir: Path, env: dict, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer.train", *TINY, "--run-dir", str(run_dir), *argv],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(argv: list[str], **kw) -> dict:
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given, **kw)


# ---------------------------------------------------------------------------- W&B through the command line

@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_a_cli_run_logs_every_metrics_row_to_an_offline_wandb_run_and_leaves_no_process(tmp_path, offline):
    run_dir = tmp_path / "exp" / "s1"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    proc = train_cli(run_dir, offline, "--total-steps", "128", "--wandb", "myproj")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    [path] = offline_runs(run_dir)  # its files in the run directory, nowhere else
    assert path.stat().st_size > 0 and not list(Path(offline["WANDB_DIR"]).rglob("*.wandb"))
    records = wandb_records(path)
    same_rows(history(records), metrics_rows(run_dir))  # every row, every number, at its env steps
    assert len(history(records)) == 4
    run = the_run(records)
    assert (run.project, run.display_name, run.run_group) == ("myproj", "exp/s1", "exp")
    assert run.run_id == (run_dir / WANDB_ID).read_text().strip()
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    stored = json.loads((run_dir / "config.json").read_text())["config"]
    assert {k: config.get(k) for k in stored} == stored  # the run's settings, every one
    assert exit_code(records) == 0
    tracking = [line for line in err.splitlines() if line.startswith("wandb")]
    assert len(tracking) == 1 and names(tracking[0], run.run_id)  # the trainer's one line; W&B's own: none
    assert wandb_services_of(proc.pid) == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.slow
def test_a_stopped_run_finishes_its_wandb_run_and_leaves_no_process(tmp_path, offline):
    run_dir = tmp_path / "run"
    proc = train_cli(run_dir, offline, "--total-steps", "1000000", "--checkpoint-every", "1", "--wandb", "myproj")
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    [path] = offline_runs(run_dir)
    records = wandb_records(path)
    same_rows(history(records), metrics_rows(run_dir))  # up to the last completed iteration
    assert exit_code(records) == 128 + signal.SIGINT  # finished, saying how the run ended
    assert wandb_services_of(proc.pid) == []


@pytest.mark.slow
def test_a_cli_resume_continues_the_same_wandb_run(tmp_path, offline):
    run_dir = tmp_path / "exp" / "s2"
    first = subprocess.run([sys.executable, "-m", "trainer.train", *TINY, "--total-steps", "64", "--wandb", "myproj",
                            "--run-dir", str(run_dir)], cwd=REPO, env=offline, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([sys.executable, "-m", "trainer.train", "--resume", str(run_dir), "--total-steps", "128"],
                           cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    runs = [wandb_records(p) for p in offline_runs(run_dir)]
    assert len(runs) == 2 and the_run(runs[0]).run_id == the_run(runs[1]).run_id  # one W&B run, synced as one
    assert the_run(runs[1]).display_name == "exp/s2"  # whatever directory the resume ran in
    same_rows(history(runs[0]) + history(runs[1]), metrics_rows(run_dir))


# ---------------------------------------------------------------------------- W&B through the Python API

def test_a_resumed_run_continues_its_wandb_run_and_may_turn_it_off(tmp_path, offline):
    run_dir = tmp_path / "run"
    run([*TINY, "--total-steps", "128", "--wandb", "myproj", "--run-dir", str(run_dir)], max_iterations=2)
    run(["--resume", str(run_dir)], max_iterations=3)  # the run's stored --wandb
    first, second = (wandb_records(p) for p in offline_runs(run_dir))
    assert the_run(first).run_id == the_run(second).run_id == (run_dir / WANDB_ID).read_text().strip()
    assert [r["iteration"] for r in history(first) + history(second)] == [1, 2, 3]
    run(["--resume", str(run_dir), "--wandb", ""])  # off: the last iteration tracked nowhere
    assert len(offline_runs(run_dir)) == 2
    assert len(metrics_rows(run_dir)) == 4
    run(["--resume", str(run_dir), "--wandb", "myproj"])  # nothing to do: no W&B run, no file changed
    assert len(offline_runs(run_dir)) == 2
    assert wandb_services_of(os.getpid()) == []  # each run's service ended with it, not at this process's exit


def test_a_run_that_fails_finishes_its_wandb_run_with_an_error_status(tmp_path, offline, monkeypatch):
    ppo = algorithm_class("ppo")
    iterate = ppo.iterate

    def failing_third(self, start):
        if self.iteration == 2:
            raise RuntimeError("the simulator exploded")
        return iterate(self, start)

    monkeypatch.setattr(ppo, "iterate", failing_third)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError):
        run([*TINY, "--total-steps", "128", "--wandb", "myproj", "--run-dir", str(run_dir)])
    [path] = offline_runs(run_dir)
    records = wandb_records(path)
    assert exit_code(records) == 1
    same_rows(history(records), metrics_rows(run_dir))
    assert wandb_services_of(os.getpid()) == []


def test_a_new_run_in_the_directory_of_one_that_saved_nothing_starts_a_new_wandb_run(tmp_path, offline):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / WANDB_ID).write_text("leftover\n")  # a run stopped before its first checkpoint
    (run_dir / "wandb").mkdir()
    run([*TINY, "--total-steps", "32", "--wandb", "myproj", "--run-dir", str(run_dir)])
    [path] = offline_runs(run_dir)
    assert the_run(wandb_records(path)).run_id not in ("", "leftover")


def test_wandb_could_not_start_is_a_one_line_usage_error(tmp_path, offline, monkeypatch, capfd):
    import wandb

    def refused(**kw):
        raise wandb.errors.UsageError("No API key configured.\nUse `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refused)
    with pytest.raises(SystemExit) as info:
        train_module.main([*TINY, "--total-steps", "32", "--wandb", "myproj", "--run-dir", str(tmp_path / "run")])
    usage_error(info.value.code, capfd.readouterr().err, "--wandb", "myproj")


# ---------------------------------------------------------------------------- the setting

def test_wandb_without_its_extra_is_refused_before_the_run_starts(tmp_path, capfd, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else
                        find_spec(name, *a))
    with pytest.raises(SystemExit) as info:
        train_module.main([*TINY, "--wandb", "myproj", "--run-dir", str(tmp_path / "run")])
    err = capfd.readouterr().err
    names(usage_error(info.value.code, err, "--wandb", "myproj"), "pip", ".[wandb]")
    assert "layout:" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("project", ["team/proj", "a" * 129])
def test_a_project_name_wandb_refuses_is_a_usage_error(tmp_path, capfd, project):
    with pytest.raises(SystemExit) as info:
        train_module.main([*TINY, "--wandb", project, "--run-dir", str(tmp_path / "run")])
    usage_error(info.value.code, capfd.readouterr().err, "--wandb")
    assert not (tmp_path / "run").exists()


def test_wandb_names_a_run_for_its_directory_and_groups_it_by_its_experiment_folder(tmp_path):
    assert wandb_names(tmp_path / "sweep" / "trial-3") == ("sweep/trial-3", "sweep")
    assert wandb_names(tmp_path / "runs" / "CartPole-v1-s1") == ("CartPole-v1-s1", None)


# ---------------------------------------------------------------------------- who tracks

def test_a_process_that_does_not_lead_tracks_nothing(tmp_path):
    cfg = TrainConfig(wandb="myproj", tensorboard=True)
    with Trackers.for_run(cfg, tmp_path, lead=False) as trackers:
        trackers.log({"iteration": 1, "env_steps": 32, "sps": 1.0})
    assert trackers.describe() == [] and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_under_torchrun_rank_0_alone_tracks(tmp_path, offline):
    from tests.test_data_parallel import RUN, ranks

    run_dir = tmp_path / "two"
    ranks(2, {**RUN, "total_steps": 8 * 32 * 2, "wandb": "myproj", "run_dir": str(run_dir)})
    [path] = offline_runs(run_dir)
    same_rows(history(wandb_records(path)), metrics_rows(run_dir))


# ---------------------------------------------------------------------------- TensorBoard

class RecordingWriter:
    """``torch.utils.tensorboard.SummaryWriter`` as the tests see it: what was added, and whether it was closed."""

    made: list["RecordingWriter"] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        RecordingWriter.made.append(self)

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.scalars.append((key, value, step))

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_every_number_of_every_row_at_its_env_steps(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=RecordingWriter))
    RecordingWriter.made.clear()
    rows = [{"iteration": 1, "env_steps": 32, "sps": 10.0, "episode_return": None, "env": "CartPole-v1"},
            {"iteration": 2, "env_steps": 64, "sps": 12.5, "episode_return": 9.0}]
    with Trackers.for_run(TrainConfig(tensorboard=True), tmp_path, lead=True) as trackers:
        for row in rows:
            trackers.log(row)
    [writer] = RecordingWriter.made
    assert Path(writer.log_dir) == tmp_path / "tb" and writer.closed
    assert writer.scalars == [("iteration", 1, 32), ("env_steps", 32, 32), ("sps", 10.0, 32),
                              ("iteration", 2, 64), ("env_steps", 64, 64), ("sps", 12.5, 64),
                              ("episode_return", 9.0, 64)]


def test_a_run_writes_every_metrics_row_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="needs the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    run([*TINY, "--total-steps", "128", "--tensorboard", "--run-dir", str(run_dir)])
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    expected = metrics_rows(run_dir)
    for key in ("sps", "loss", "episode_return"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(row["_step"], pytest.approx(row[key])) for row in expected if key in row]
