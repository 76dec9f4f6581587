"""Around a run directory: flags as typed, TOML types, one run per directory, locks, corruption, full disks."""

import errno
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from unittest import mock

import pytest
import torch

import checkpoints
import trainer.evaluation
import trainer.evaluation.report
from checkpoints import CheckpointError, RunDirLock, RunDirLockedError
from tests.factories import settings_file
from tests.messages import exits, names, not_names, raises, suggestion, usage_error
from trainer import evaluate as evaluate_cli
from trainer import train as train_module
from trainer.flags import parse_args
from trainer.run_files import resume_state

VR = ["--env", "VREdge-v0", "--num-envs", "4", "--num-steps", "16", "--total-steps", str(4 * 16 * 4),
      "--checkpoint-every", "1", "--seed", "5", "--device", "cpu"]


def run(argv, **kw):
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given,
                              overwrite=cli.overwrite, **kw)


@pytest.fixture
def two_iterations(tmp_path):
    run_dir = tmp_path / "run"
    run(VR + ["--run-dir", str(run_dir)], max_iterations=2)
    return run_dir


# ---------------------------------------------------------------------------- flags mean what was typed

def test_a_flag_counts_as_given_whatever_its_value():
    assert parse_args(["--total-steps", "3000000", "--num-envs", "64"]).given == {"total_steps": 3_000_000,
                                                                                  "num_envs": 64}
    assert parse_args([]).given == {}


def test_resume_applies_a_typed_default_value(two_iterations):
    """--total-steps equal to the default still changes a run that was started with another value."""
    cli = parse_args(["--resume", str(two_iterations), "--total-steps", "3000000"])
    cfg, _, _, _ = resume_state(cli.resume, cli.given)
    assert cfg.total_steps == 3_000_000


def test_resume_refuses_a_typed_default_that_would_change_the_run(two_iterations):
    with raises(ValueError, "--num-envs", "64", "4"):  # given, and the run's
        run(["--resume", str(two_iterations), "--num-envs", "64"])


def test_flags_win_over_the_toml_file_even_at_their_default_value(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("num_envs = 8\nlr = 3e-4\n")
    cfg = parse_args(["--config", str(toml), "--num-envs", "64"]).config
    assert cfg.num_envs == 64 and cfg.lr == 3e-4


@pytest.mark.parametrize("line, named", [  # the key as the file writes it, the kind found, the kind expected
    ('anneal_lr = "false"', ['anneal_lr = "false"', "string"]),
    ('num_envs = "4"', ['num_envs = "4"', "string", "integer"]),
    ("num_envs = 4.5", ["num_envs = 4.5", "float", "integer"]),
    ("num_envs = true", ["num_envs = true", "boolean", "integer"]),
    ("hidden = [64, 64]", ["hidden = [64, 64]", "array", 'hidden = "64,64"']),  # and the value as it is written
    ("device = 3", ["device = 3", "integer", "string"]),
    ("no_such_key = 1", ["no_such_key"]),
])
def test_toml_values_are_type_checked_before_anything_is_written(tmp_path, capsys, line, named):
    toml = tmp_path / "run.toml"
    toml.write_text(line + "\n")
    with exits(2, toml, *named, capsys=capsys):
        train_module.main(["--config", str(toml), "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, named, suggested", [
    (["--lr", "inf"], ["--lr", "inf", "0"], None),  # with its range, as for --lr 0
    (["--gamma", "nan"], ["--gamma", "nan", "0", "1"], None),
    (["--ent-coef", "inf"], ["--ent-coef", "inf"], None),  # a float with no range
    (["--gae-lambda", "nan"], ["--gae-lambda", "nan"], None),  # named: not --clip-coef=0.2
    (["--seed", "-1"], ["--seed", "-1", "0"], None),
    (["--hidden", "64,,64"], ["--hidden", "'64,,64'"], None),
    (["--num-envs", "abc"], ["--num-envs", "'abc'"], None),
    (["--env", "CartPole-v1", "--config", settings_file("policy_arch_per_head")],
     ["policy_arch", "'per_head'", "CartPole-v1"], None),
    # found once the run's layout or its first env is built: usage errors all the same
    (["--env", "CartPol-v1"], ["'CartPol-v1'"], "CartPole-v1"),
    (["--algo", "apex", "--env", "Pendulum-v1"], ["--algo apex", "Box", "--algo ppo"], None),
    (["--env", "CartPole-v1", "--env-kwargs", "num_users=3"], ["--env-kwargs", "CartPole-v1", "num_users",
                                                               "sutton_barto_reward"], None),  # the arguments it has
    (["--env", "CartPole-v1", "--minibatch-size", "100000"], ["--minibatch-size", "100000", "1024"], None),  # its size
    (["--env", "CartPole-v1", "--env-kwargs", "render_mode=human"], ["--env-kwargs", "render_mode"], None),
    (["--env", "CartPole-v1", "--backend", "async", "--num-workers", "99"], ["--num-workers", "99", "--num-envs",
                                                                             "8"], None),
])
def test_bad_values_are_one_line_errors_and_write_nothing(tmp_path, capfd, argv, named, suggested):
    with pytest.raises(SystemExit) as info:
        train_module.main(argv + ["--run-dir", str(tmp_path / "run")])
    err = capfd.readouterr().err.strip()
    # one line: the defaults and layout lines come once the run can start, not before an error of the layout or env
    assert len(err.splitlines()) == 1, err
    assert suggestion(usage_error(info.value.code, err, *named)) == suggested  # a usage error, as a bad flag's
    assert not (tmp_path / "run").exists()


def test_tensorboard_without_its_extra_is_refused_before_the_run_starts(tmp_path, capfd, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else
                        find_spec(name, *a))
    with pytest.raises(SystemExit) as info:
        train_module.main(["--env", "CartPole-v1", "--tensorboard", "true", "--run-dir", str(tmp_path / "run")])
    err = capfd.readouterr().err
    usage_error(info.value.code, err, "--tensorboard", "true")
    assert "layout:" not in err and not (tmp_path / "run").exists()  # it used to leave a run directory behind


def test_a_toml_value_found_wrong_by_the_run_layout_names_the_file(tmp_path, capfd):
    toml = tmp_path / "run.toml"
    toml.write_text('env = "CartPole-v1"\nbackend = "async"\nnum_workers = 99\n')
    with pytest.raises(SystemExit) as info:
        train_module.main(["--config", str(toml), "--run-dir", str(tmp_path / "run")])
    last = capfd.readouterr().err.strip().splitlines()[-1]
    usage_error(info.value.code, last, "--num-workers", "99", "--num-envs", "8", toml, "num_workers = 99")  # + where
    with pytest.raises(SystemExit):  # a flag wins over the file, and is named as a flag
        train_module.main(["--config", str(toml), "--num-workers", "98", "--run-dir", str(tmp_path / "run")])
    last = capfd.readouterr().err.strip().splitlines()[-1]
    not_names(names(last, "--num-workers", "98"), toml)


def test_a_resume_with_a_toml_key_of_another_algorithm_names_the_file(two_iterations, tmp_path, capfd):
    toml = tmp_path / "more.toml"
    toml.write_text("save_replay = true\n")
    with pytest.raises(SystemExit) as info:
        train_module.main(["--resume", str(two_iterations), "--config", str(toml)])
    last = capfd.readouterr().err.strip().splitlines()[-1]
    usage_error(info.value.code, last, toml, "save_replay = true", "apex", "ppo")  # whose key, and this run's


def test_a_bad_toml_value_names_the_file_and_key(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text("num_envs = -3\n")
    with exits(2, toml, "num_envs = -3", "1", capsys=capsys):
        parse_args(["--config", str(toml)])


def test_toml_integers_are_accepted_for_float_keys(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("lr = 1\nclip_coef = 0.1\n")
    cfg = parse_args(["--config", str(toml)]).config
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.algo_settings.clip_coef == 0.1


# ---------------------------------------------------------------------------- one run per directory

def test_a_new_run_refuses_a_directory_holding_another_run(two_iterations):
    before = sorted(p.name for p in checkpoints.checkpoint_files(two_iterations))
    with raises(ValueError, two_iterations, f"--resume {two_iterations}", "--overwrite"):  # the ways out
        run(VR + ["--run-dir", str(two_iterations), "--seed", "6"])
    assert sorted(p.name for p in checkpoints.checkpoint_files(two_iterations)) == before
    assert json.loads((two_iterations / "config.json").read_text())["config"]["seed"] == 5


def test_a_directory_without_checkpoints_is_free_for_a_new_run(tmp_path, capsys):
    """A run stopped before its first checkpoint leaves config.json and metrics rows, nothing to resume."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
    (run_dir / "checkpoints").write_text("")  # even a file where the checkpoints should go
    assert run(VR + ["--run-dir", str(run_dir)], max_iterations=2)["iterations"] == 2
    names(capsys.readouterr().err, "checkpoints", "metrics.jsonl", "config.json")  # what it cleared
    assert [json.loads(r)["iteration"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_overwrite_replaces_the_previous_run(two_iterations):
    (two_iterations / "evaluation.json").write_text("{}")
    run(VR + ["--run-dir", str(two_iterations), "--seed", "6", "--overwrite"], max_iterations=1)
    assert [p.name for p in checkpoints.checkpoint_files(two_iterations)] == ["ckpt_00000001.pt"]
    rows = (two_iterations / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and not (two_iterations / "evaluation.json").exists()
    assert checkpoints.latest_loadable(two_iterations)[1]["config"]["seed"] == 6


def test_overwrite_and_resume_do_not_mix(two_iterations):
    with pytest.raises(SystemExit):
        parse_args(["--resume", str(two_iterations), "--overwrite"])


def test_resuming_a_copied_run_writes_into_the_copy(two_iterations, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(two_iterations, copy)
    original = sorted(p.name for p in (two_iterations / "checkpoints").iterdir())
    summary = run(["--resume", str(copy)])
    assert summary["run_dir"] == str(copy) and summary["iterations"] == 4
    assert sorted(p.name for p in (two_iterations / "checkpoints").iterdir()) == original
    assert checkpoints.latest_loadable(copy)[1]["iteration"] == 4
    assert json.loads((copy / "config.json").read_text())["config"]["run_dir"] == str(copy)
    with raises(ValueError, "--resume", copy, "--run-dir"):
        run(["--resume", str(copy), "--run-dir", str(two_iterations)])


@pytest.mark.parametrize("argv, named", [
    (lambda run, tmp: ["--resume", str(tmp / "no-such-run")], lambda run, tmp: ["--resume", tmp / "no-such-run"]),
    (lambda run, tmp: ["--resume", str(run), "--run-dir", str(tmp / "other")],
     lambda run, tmp: ["--resume", run, "--run-dir"]),
    (lambda run, tmp: VR + ["--run-dir", str(run)], lambda run, tmp: [run, f"--resume {run}"]),
])
def test_run_directory_mistakes_are_usage_errors(two_iterations, tmp_path, capfd, argv, named):
    before = sorted(p.name for p in (two_iterations / "checkpoints").iterdir())
    with pytest.raises(SystemExit) as info:
        train_module.main(argv(two_iterations, tmp_path))
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # the one line, not the layout's first
    usage_error(info.value.code, err, *named(two_iterations, tmp_path))
    assert sorted(p.name for p in (two_iterations / "checkpoints").iterdir()) == before
    assert not (tmp_path / "other").exists()


def test_resume_from_an_older_checkpoint_sets_newer_ones_aside(two_iterations, capsys):
    run(["--resume", str(two_iterations / "checkpoints" / "ckpt_00000001.pt")], max_iterations=3)
    files = sorted(p.name for p in (two_iterations / "checkpoints").iterdir())
    assert "ckpt_00000002.pt.orphaned" in files and "ckpt_00000003.pt" in files
    assert checkpoints.latest_loadable(two_iterations)[1]["iteration"] == 3
    assert [json.loads(r)["iteration"] for r in (two_iterations / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2, 3]
    names(capsys.readouterr().err, "ckpt_00000002.pt")  # the checkpoint set aside


def test_a_second_trainer_on_a_run_directory_is_refused(two_iterations, capfd):
    with RunDirLock(two_iterations):  # as if another trainer of this host were running
        with raises(RunDirLockedError, two_iterations, f"pid {os.getpid()}"):  # which run, held by whom
            run(["--resume", str(two_iterations)])
        with raises(RunDirLockedError, two_iterations, f"pid {os.getpid()}"):
            run(VR + ["--run-dir", str(two_iterations), "--overwrite"])
        capfd.readouterr()
        with pytest.raises(SystemExit) as refused:
            train_module.main(["--resume", str(two_iterations)])
        said = [*capfd.readouterr().err.strip().splitlines(), str(refused.value.code)]  # (the exit's, Python's)
        assert len(said) == 1, said  # the one line
        names(said[0], f"pid {os.getpid()}")
    assert not (two_iterations / "lock").exists()
    assert run(["--resume", str(two_iterations)])["iterations"] == 4  # free again


def test_a_stale_lock_of_a_dead_process_is_taken_over(two_iterations, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (two_iterations / "lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                                     "started": 0, "process_start": None}))
    run(["--resume", str(two_iterations)])
    names(capsys.readouterr().err, two_iterations / "lock", f"pid {dead.pid}")  # the lock removed, and whose
    assert not (two_iterations / "lock").exists()


def test_a_lock_copied_with_its_run_directory_does_not_block_the_copy(two_iterations, tmp_path):
    with RunDirLock(two_iterations):  # the original is running while it is copied
        copy = tmp_path / "copy"
        shutil.copytree(two_iterations, copy)
        assert (copy / "lock").is_file()
        assert run(["--resume", str(copy)])["iterations"] == 4


def test_a_lock_from_another_host_is_respected(two_iterations):
    (two_iterations / "lock").write_text(json.dumps({"pid": 1, "host": "other-node", "started": 0}))
    with raises(RunDirLockedError, "pid 1", "other-node", two_iterations / "lock"):  # whose, and what to delete
        run(["--resume", str(two_iterations)])


def test_a_requeued_slurm_job_takes_over_the_lock_of_its_earlier_run_on_another_node(two_iterations,
                                                                                     monkeypatch):
    (two_iterations / "lock").write_text(json.dumps({"pid": 1, "host": "node-17", "started": 0,
                                                     "slurm_job": "4242", "slurm_restart": "0"}))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert run(["--resume", str(two_iterations)])["iterations"] == 4
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job's lock on another node is respected
    (two_iterations / "lock").write_text(json.dumps({"pid": 1, "host": "node-17", "started": 0,
                                                     "slurm_job": "4242", "slurm_restart": "0"}))
    with raises(RunDirLockedError, "node-17"):
        run(["--resume", str(two_iterations)])


@pytest.mark.slow  # (processes racing: 21 s)
def test_contenders_racing_over_a_stale_lock_never_both_hold_it(tmp_path):
    """Four processes take over the same stale lock at the same moment, 40 times: exactly one holds it each time."""
    import multiprocessing

    from tests.factories import contend_for_lock
    contenders, trials = 4, 40
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(contenders + 1, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=contend_for_lock, args=(str(tmp_path), trials, barrier, results))
             for _ in range(contenders)]
    for p in procs:
        p.start()
    # this process's pid with another start time: a holder whose pid was reused, stale on this host
    stale = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "started": 0, "process_start": 1.0,
                        "run_dir": str(tmp_path.resolve())})
    try:
        winners = []
        for _ in range(trials):
            (tmp_path / "lock").write_text(stale)
            for _ in range(3):
                barrier.wait()
            winners.append(sum(results.get(timeout=60)[1] for _ in range(contenders)))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert winners == [1] * trials
    assert all(p.exitcode == 0 for p in procs)
    assert not (tmp_path / "lock").exists()


# ---------------------------------------------------------------------------- corrupted and unwritable files

def test_a_bit_flip_anywhere_is_detected_or_harmless(tmp_path):
    state = {"model": {"w": torch.arange(4096, dtype=torch.float32)}, "iteration": 7}
    path = checkpoints.save(tmp_path / "c.pt", state)
    data = path.read_bytes()
    marker = data.find(torch.arange(4096, dtype=torch.float32)[1000:1004].numpy().tobytes())
    assert marker > 0  # the tensor data itself: a flip here must be caught by the checksum
    positions = [marker + 2] + list(range(0, len(data), max(1, len(data) // 97)))
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        path.write_bytes(bytes(flipped))
        try:
            loaded = checkpoints.load(path)
        except CheckpointError:
            continue
        assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["iteration"] == 7, pos
    flipped = bytearray(data)
    flipped[marker + 2] ^= 0x10
    path.write_bytes(bytes(flipped))
    with raises(CheckpointError, path, "checksum"):
        checkpoints.load(path)


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_one(two_iterations, capsys):
    newest = checkpoints.checkpoint_files(two_iterations)[0]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    summary = run(["--resume", str(two_iterations)])
    err = capsys.readouterr().err
    names(err, newest.name, "ckpt_00000001.pt")  # the one skipped, the one resumed from
    assert summary["iterations"] == 4


def test_disk_full_is_a_one_line_error_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    real, calls = os.fsync, []

    def full(fd):
        calls.append(1)
        if len(calls) >= 4:  # from the second checkpoint's file on, the disk stays full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit) as info:
        train_module.main(VR + ["--run-dir", str(tmp_path)])
    monkeypatch.undo()
    message, *notes = str(info.value).splitlines()  # one error line, then what was saved and how to resume
    names(message, tmp_path / "checkpoints", os.strerror(errno.ENOSPC))
    assert [n.split(":")[0] for n in notes] == ["training failed", "resume"], notes
    path, state, problems = checkpoints.latest_loadable(tmp_path)
    assert state["iteration"] == 1 and not problems
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def test_a_file_where_the_checkpoints_directory_should_be_is_named(tmp_path):
    (tmp_path / "checkpoints").write_text("")
    with raises(CheckpointError, tmp_path / "checkpoints"):
        checkpoints.save_in_run_dir(tmp_path, {"x": 1}, 1, keep=1)


def test_resuming_a_finished_run_says_so(two_iterations, capsys):
    run(["--resume", str(two_iterations)])
    capsys.readouterr()
    summary = run(["--resume", str(two_iterations)])
    assert summary["iterations"] == 4 and summary["env_steps"] == 4 * 64 and summary["checkpoint"]
    names(capsys.readouterr().err, "--total-steps")  # how to make it do more


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_a_stop_signal_after_the_run_finished_is_ignored(tmp_path, capsys):
    import signal
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        train_module.main(VR + ["--run-dir", str(tmp_path), "--total-steps", str(64)])
        os.kill(os.getpid(), signal.SIGUSR1)  # a scheduler's early warning, a moment too late
        names(capsys.readouterr().err, "SIGUSR1")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_version_2_checkpoints_are_refused_with_a_clear_message(tmp_path):
    torch.save({"format_version": 2, "state": {}}, tmp_path / "old.pt")
    with raises(CheckpointError, tmp_path / "old.pt", "format version 2"):
        checkpoints.load(tmp_path / "old.pt")


def test_evaluate_checks_that_it_can_write_before_it_computes(two_iterations, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer.evaluation, "run_episodes", lambda *a, **k: pytest.fail("computed before checking"))
    denied = OSError(errno.EACCES, os.strerror(errno.EACCES))  # (chmod would not stop root)
    monkeypatch.setattr(trainer.evaluation.report.tempfile, "NamedTemporaryFile", mock.Mock(side_effect=denied))
    with exits(1, tmp_path / "out", os.strerror(errno.EACCES), "--out"):  # (a file in the way is a usage error:
        evaluate_cli.main(["--checkpoint", str(two_iterations), "--out", str(tmp_path / "out")])  # test_command_lines)


# ---------------------------------------------------------------------------- resume on another device

def test_a_checkpoint_holds_nothing_tied_to_a_device(two_iterations):
    state = checkpoints.latest_loadable(two_iterations)[1]

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from tensors(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from tensors(v)
    assert all(t.device.type == "cpu" for t in tensors(state))
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda", "acting"}  # the acting sampler is CPU-only


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_resume_on_another_device(tmp_path, first, then):
    run(VR + ["--run-dir", str(tmp_path), "--device", first], max_iterations=2)
    assert run(["--resume", str(tmp_path), "--device", then])["iterations"] == 4


# ---------------------------------------------------------------------------- commands that work as printed

@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_printed_commands_run_as_printed_from_a_fresh_shell(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # a fresh shell: no venv on the PATH
    args = VR[:-4] + ["--device", "cpu", "--total-steps", str(4 * 16 * 2), "--run-dir", "run"]
    done = subprocess.run([sys.executable, "-m", "trainer.train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
               if ":" in line}
    evaluate = shlex.split(printed["evaluate"]) + ["--episodes", "1", "--baselines", "none"]
    longer = printed["train longer"]
    assert longer.endswith(f"--total-steps {2 * 4 * 16 * 2}")  # a value to paste: twice the run's steps
    elsewhere = tmp_path / "elsewhere"  # pasted in another directory than the one training ran in
    elsewhere.mkdir()
    assert subprocess.run(evaluate, cwd=elsewhere, env=env, capture_output=True, timeout=300).returncode == 0
    again = subprocess.run(longer, shell=True, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert checkpoints.latest_loadable(tmp_path / "run")[1]["iteration"] == 4
