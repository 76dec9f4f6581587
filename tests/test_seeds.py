"""``trainer.train --seeds LIST [--jobs J]`` (trainer.experiments.seeds) and the jobs that run trainings side by
side (trainer.experiments.jobs): the folder's layout, skipping finished seeds, resuming the others after a real
SIGINT exactly, each job's share of the cores, and bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import checkpoints
from envs.settings import ConfigError
from tests.messages import exits, mentions, raises, usage_error
from trainer.experiments.jobs import output_to, run_jobs
from trainer.experiments.seeds import folder_of, seed_runs, train_seeds
from trainer.flags import parse_args
from trainer.run_layout import Machine

REPO = Path(__file__).resolve().parents[1]
TINY = ["--env", "VREdge-v0", "--backend", "sync", "--num-envs", "2", "--num-steps", "16", "--total-steps", "160"]
NOT_COMPARED = {"sps", "collect_threads", "learn_threads"}  # timing, and the threads of the machine's share


def _cli(tmp_path: Path, *extra: str):
    return parse_args([*TINY, "--run-dir", str(tmp_path / "group"), *extra])


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NOT_COMPARED} for r in rows]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoints.latest_loadable(run_dir)[1]["model"]


def _same_run(a: Path, b: Path) -> None:
    assert _rows(a) == _rows(b)
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_each_seed_is_an_ordinary_run_directory_in_one_folder_and_a_rerun_skips_finished_ones(tmp_path, capsys):
    cli = _cli(tmp_path, "--seeds", "1-2,5")
    assert train_seeds(cli, []) == 0
    group = tmp_path / "group"
    assert sorted(p.name for p in group.iterdir()) == ["s1", "s2", "s5", "seeds.json"]
    for seed in (1, 2, 5):
        stored = json.loads((group / f"s{seed}" / "config.json").read_text())["config"]
        assert stored["seed"] == seed and stored["run_dir"] == str(group / f"s{seed}")
        assert checkpoints.checkpoint_files(group / f"s{seed}")
    assert [r.todo for r in seed_runs(group, cli.config, cli.seeds)] == ["finished"] * 3
    # seeds differ: not one run copied three times
    assert not torch.equal(*(next(iter(_weights(group / s).values())) for s in ("s1", "s2")))
    stamps = {p: p.stat().st_mtime_ns for p in group.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train_seeds(cli, []) == 0  # the same command again: nothing to do, no file touched
    assert {p: p.stat().st_mtime_ns for p in group.rglob("*") if p.is_file()} == stamps
    assert "starts" not in capsys.readouterr().err


def test_a_longer_rerun_resumes_every_seed_from_its_checkpoint(tmp_path, capsys):
    """--total-steps may grow on a rerun (a resume may change it): every seed goes on from its checkpoint."""
    assert train_seeds(_cli(tmp_path, "--seeds", "3-4"), []) == 0
    first = _rows(tmp_path / "group" / "s3")
    longer = parse_args([*TINY[:-1], "320", "--run-dir", str(tmp_path / "group"), "--seeds", "3-4"])
    capsys.readouterr()
    assert train_seeds(longer, []) == 0
    assert capsys.readouterr().err.count("resumes from iteration 5") == 2
    rows = _rows(tmp_path / "group" / "s3")
    assert [r["iteration"] for r in rows] == list(range(1, 11)) and rows[:5] == first
    assert train_seeds(_cli(tmp_path, "--seeds", "3-4"), []) == 0  # the first, shorter command again: nothing to do
    said = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith(("s3:", "s4:"))]
    assert len(said) == 2 and all("iteration 10" in line and "--total-steps 160" in line for line in said), said
    assert len(_rows(tmp_path / "group" / "s3")) == 10


def test_a_folder_holding_another_setup_is_refused_naming_the_setting(tmp_path):
    assert train_seeds(_cli(tmp_path, "--seeds", "1"), []) == 0
    with raises(ConfigError, "--lr", tmp_path / "group", key="lr"):
        train_seeds(_cli(tmp_path, "--seeds", "1", "--lr", "0.01"), [])
    single = tmp_path / "single"  # an ordinary run's directory is not a folder of seeds
    from trainer.train import train
    cli = parse_args([*TINY, "--run-dir", str(single)])
    train(cli.config, progress=False, given=cli.given)
    with raises(ConfigError, "--run-dir", single):
        train_seeds(parse_args([*TINY, "--run-dir", str(single), "--seeds", "1"]), [])


def test_the_default_folder_is_named_by_the_env_and_the_seeds_without_a_time():
    cfg = parse_args(["--env", "CartPole-v1", "--seeds", "1-3,7"]).config
    assert folder_of(cfg, (1, 2, 3, 7)) == Path("runs/CartPole-v1-seeds-1-3,7")
    assert folder_of(parse_args(["--seeds", "2", "--run-dir", "x"]).config, (2,)) == Path("x")


@pytest.mark.parametrize("argv, flag", [
    (["--seeds", "3-1"], "--seeds"),
    (["--seeds", "1,x"], "--seeds"),
    (["--seeds", "1,1"], "--seeds"),
    (["--seeds", "1-3", "--seed", "4"], "--seed"),
    (["--seeds", "1-3", "--overwrite"], "--overwrite"),
    (["--jobs", "2"], "--jobs"),
    (["--seeds", "1-3", "--jobs", "0"], "--jobs"),
])
def test_bad_seeds_and_jobs_are_one_line_usage_errors(argv, flag, capsys):
    with exits(2, flag, capsys=capsys):
        parse_args([*TINY, *argv])


def test_seeds_and_jobs_are_no_keys_of_a_config_file(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text("seeds = 5\n")
    with exits(2, "seeds", toml, capsys=capsys):
        parse_args([*TINY, "--config", str(toml)])


@pytest.mark.slow
def test_a_folder_of_another_setup_is_a_usage_error_of_the_command(tmp_path):
    group = tmp_path / "group"
    argv = [sys.executable, "-m", "trainer.train", *TINY, "--run-dir", str(group), "--seeds", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode == 0
    other = subprocess.run([*argv, "--gamma", "0.5"], env=env, capture_output=True, text=True, timeout=120)
    usage_error(other.returncode, other.stderr, "--gamma", group)


def _layout_cores(work_index: int, share: Machine) -> int:
    return share.cores


@pytest.mark.slow  # spawned processes importing torch
def test_each_job_gets_its_share_of_the_machine():
    """A 16-core machine split 3 ways: every job (in its own process) gets 5 cores; one job runs here, with all;
    more jobs than cores get one each."""
    assert run_jobs(_layout_cores, 3, Machine(cores=16, memory=64 << 30)) == [5, 5, 5]
    assert run_jobs(_layout_cores, 1, Machine(cores=16)) == [16]
    assert Machine(cores=2, memory=6).split(3) == Machine(cores=1, memory=2)


@pytest.mark.parametrize("alone", [False, True], ids=["one of several jobs", "alone"])
def test_a_jobs_run_ends_on_its_share_of_the_cores(tmp_path, monkeypatch, alone):
    """Distillation's labels and the quality line run after training, outside its thread plan: in one of several
    jobs they keep to the job's cores (torch's own count in each job oversubscribes the machine); alone, torch's
    count is left as it is. The count is restored after."""
    import trainer.loop as loop
    import trainer.run_end as run_end
    from trainer.experiments.seeds import SeedRun, _trained

    before, seen = torch.get_num_threads(), []
    monkeypatch.setattr(loop, "train", lambda cfg, **kw: {"iterations": 1, "env_steps": 32, "late_signal": 0})
    monkeypatch.setattr(run_end, "end_of_run", lambda summary, said: seen.append(torch.get_num_threads()))
    run = SeedRun(1, tmp_path / "s1", done=0, iterations=1)
    share = Machine(cores=before + 1 if alone else 1)  # (alone: a share unlike torch's count, left alone)
    assert _trained(run, _cli(tmp_path), share, alone=alone) == 0
    assert seen == [before if alone else 1] and torch.get_num_threads() == before


@pytest.mark.slow
def test_jobs_train_their_seeds_with_their_share_and_their_output_in_the_run_directories(tmp_path, capfd):
    cli = _cli(tmp_path, "--seeds", "1-3", "--jobs", "2")
    assert train_seeds(cli, [], machine=Machine(cores=16, memory=64 << 30)) == 0
    group = tmp_path / "group"
    for seed in (1, 2, 3):
        layout = json.loads((group / f"s{seed}" / "config.json").read_text())["layout"]
        assert layout["learn_threads"] <= 8  # a 16-core machine halved
        assert "layout:" in (group / f"s{seed}" / "train.log").read_text()
    alone = _cli(tmp_path / "alone", "--seeds", "2")
    assert train_seeds(alone, [], machine=Machine(cores=8, memory=64 << 30)) == 0
    _same_run(group / "s2", tmp_path / "alone" / "group" / "s2")  # the same seed: the same run, whichever job
    err = capfd.readouterr().err  # (the jobs' processes write to the file descriptor)
    assert all(f"seed {s}: finished" in err for s in (1, 2, 3))


def test_output_to_sends_this_processs_output_and_its_childrens_to_the_file(tmp_path):
    log = tmp_path / "out" / "train.log"
    with output_to(log):
        os.write(2, b"from python\n")  # (under pytest, sys.stdout is not the file descriptor)
        subprocess.run([sys.executable, "-c", "import sys; print('from a child', file=sys.stderr)"], check=True)
    print("back")
    assert log.read_text().split() == ["from", "python", "from", "a", "child"]


@pytest.mark.slow
def test_sigint_stops_every_seed_and_the_same_command_resumes_them_exactly(tmp_path):
    """A real Ctrl-C (SIGINT to the command's process group, as a terminal sends it) while two jobs train: it exits
    with 130, leaves no process behind and loses no completed iteration; the same command again finishes every
    seed, each as an uninterrupted run of its seed."""
    argv = [sys.executable, "-m", "trainer.train", "--env", "VREdge-v0", "--backend", "sync", "--num-envs", "4",
            "--num-steps", "32", "--total-steps", str(4 * 32 * 40), "--threads", "1", "--seeds", "1-2", "--jobs", "2",
            "--run-dir", str(tmp_path / "group")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    first = tmp_path / "group" / "s1"
    deadline = time.monotonic() + 120
    while not checkpoints.checkpoint_files(first) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)
    descendants = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, err.decode()[-3000:]
    # every job and what it started ends with the command (multiprocessing's resource tracker a moment after it:
    # it exits once the pipe its last holder held is closed)
    left = []
    for pid in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            left.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(left, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in alive]
    assert "resume:" in out.decode()
    cli = parse_args(argv[3:])
    stopped = seed_runs(tmp_path / "group", cli.config, cli.seeds)
    assert any(r.todo != "finished" for r in stopped)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    straight = subprocess.run([*argv[:-3], "1", "--run-dir", str(tmp_path / "straight")], cwd=tmp_path, env=env,
                              capture_output=True, timeout=300)
    assert straight.returncode == 0, straight.stderr.decode()[-3000:]
    for seed in (1, 2):
        _same_run(tmp_path / "group" / f"s{seed}", tmp_path / "straight" / f"s{seed}")


def test_a_stop_signal_as_a_seeds_run_closes_stops_before_the_next_seed(tmp_path, monkeypatch, capsys):
    """A Ctrl-C while a finished run closes (its collector) stops nothing of that run, but the seeds after it
    must not start: the run's summary carries it (``late_signal``)."""
    import trainer.loop as loop

    ended = loop._ended

    def signalled_as_it_closes(*args, **kwargs):
        summary = ended(*args, **kwargs)  # (finished: the signal is noted, not raised)
        os.kill(os.getpid(), signal.SIGINT)
        return summary
    monkeypatch.setattr(loop, "_ended", signalled_as_it_closes)
    assert train_seeds(_cli(tmp_path, "--seeds", "1-2"), []) == 128 + signal.SIGINT
    assert [r.todo for r in seed_runs(tmp_path / "group", _cli(tmp_path).config, (1, 2))] == ["finished", "starts"]
    assert mentions(capsys.readouterr().out, "s2: not started")
