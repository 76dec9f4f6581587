"""Bad input as a user meets it, through the command lines: one line that says what was wrong, never a traceback;
nothing is allocated from an unchecked number, and a metrics row is written whole or not at all."""

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.classic_control import CartPoleEnv

import checkpoints
from envs.settings import ConfigError
from tests.factories import FaultyCartPole
from tests.messages import exits, names, not_names, raises, suggestion, usage_error
from trainer import train as train_module
from trainer.config import MAX_SEED, TrainConfig, new_run_config
from trainer.flags import parse_args
from trainer.memory import check_memory
from trainer.metrics import MetricsLog, MetricsWriteError
from trainer.run_layout import Machine

REPO = Path(__file__).resolve().parents[1]
VR = ["--env", "VREdge-v0", "--num-envs", "4", "--num-steps", "16", "--total-steps", str(4 * 16 * 4),
      "--checkpoint-every", "1", "--seed", "5", "--device", "cpu"]
MEMORY_LIMIT = 8 << 30  # address space of the commands: a 14 GB network fails to allocate instead of swapping

# the disk fills part-way through the third row of metrics.jsonl and stays full; then `python -m trainer.train`
FULL_DISK = """
import errno, os, runpy, sys
real, rows = os.write, []
def write(fd, data):
    if fd > 2 and os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
        rows.append(len(data))
        if len(rows) == 3:
            return real(fd, data[: len(data) // 2])
        if len(rows) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd, data)
os.write = write
sys.argv[0] = "trainer.train"
runpy.run_module("trainer.train", run_name="__main__", alter_sys=True)
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def command(args: list[str], status: int, cwd: Path) -> str:
    """Run ``python ARGS`` in a fresh process; check its exit status and that it ends in one error line without
    a traceback (followed, when iterations were completed, by what was saved and how to resume); return that
    line."""
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          preexec_fn=_limit_memory)
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    while lines[-1].startswith(("training failed: ", "resume: ")):
        lines.pop()
    assert "error: " in lines[-1], proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def vr_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vr") / "run"
    cli = parse_args(VR + ["--run-dir", str(run_dir), "--total-steps", str(4 * 16 * 2)])
    train_module.train(cli.config, progress=False)
    return run_dir


def stored(run_dir: Path, copy: Path, **config) -> Path:
    """A copy of ``run_dir`` whose checkpoints' stored config says ``config`` (checksums stay valid)."""
    shutil.copytree(run_dir, copy)
    for path in checkpoints.checkpoint_files(copy):
        state = checkpoints.load(path)
        state["config"].update(config)
        checkpoints.save(path, state)
    return copy


# ---------------------------------------------------------------------------- trainer.train, at config time

# a case on the same path as the one before it, through another file or command (tests/test_traces.py covers each
# file in-process)
SLOW = pytest.mark.slow


@pytest.mark.parametrize("trace, where, facts", [  # the file's line, the number read there, the limit
    (b"0 5\n1e9 6\n", 2, ["1e+09 s", "4194304"]),
    pytest.param(b"1600000000000\n1600000000002\n", 1, ["1.6e+12 ms"], marks=SLOW),
    pytest.param(b"0 5\n1 1e308\n", 2, ["1e+308 Mbit/s", "1e+06 Mbit/s"], marks=SLOW),
    pytest.param(b"\x89PNG\r\n\x1a\n\x00\xff", 1, [], marks=SLOW),
])
def test_a_bad_trace_is_refused_at_once(tmp_path, trace, where, facts):
    path = tmp_path / "trace.log"
    path.write_bytes(trace)
    line = command(["-m", "trainer.train", "--env-kwargs", f"capacity_trace={path}", "--run-dir",
                    str(tmp_path / "run")], 2, tmp_path)
    names(line, f"{path}:{where}", *facts)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, named, suggested", [
    (["--env-kwargs", "segment_s=abc"], ["segment_s", "abc"], None),
    # inf passed every range check (a non-finite loss much later, blamed on --lr), nan failed one with the wrong rule
    (["--env-kwargs", "noise_std=inf"], ["noise_std", "inf"], None),
    (["--env-kwargs", "fade_prob=nan"], ["fade_prob", "nan", ">= 0 and <= 1"], None),
    (["--env-kwargs", "num-users=6"], ["num-users", "num_users=6"], None),  # what to write instead
    (["--env-kwargs", "num_userz=6"], ["num_userz"], "num_users"),
    (["--env-kwargs", "users=²"], ["users", "²"], None),  # a digit to str.isdigit, not to int(): int()'s words
    (["--algo", "apex", "--env", "CartPole-v1", "--learning-starts", "0", "--replay-capacity", "16",
      "--minibatch-size", "128"], ["--minibatch-size", "128", "--replay-capacity", "16"], None),
])
def test_bad_flags_are_refused_at_once(tmp_path, argv, named, suggested):
    line = command(["-m", "trainer.train", *argv, "--run-dir", str(tmp_path / "run")], 2, tmp_path)
    assert suggestion(names(line, *named)) == suggested
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, old, new", [
    (["-m", "trainer.train", "--batch-size", "8"], "--batch-size", "--minibatch-size"),
    (["-m", "trainer.train", "--backend", "ray", "--ray-async", "true"], "--ray-async", "--keep-collecting"),
    (["-m", "trainer.batching", "--n-envs", "8", "--n-steps", "8"], "--n-envs", "--num-envs"),
])
def test_a_flag_of_the_unreleased_version_is_unknown_and_its_new_name_suggested(tmp_path, argv, old, new):
    proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert suggestion(usage_error(proc.returncode, proc.stderr, old)) == new


class PickyEnv(FaultyCartPole):
    """A constructor that names its arguments and refuses a value of one (a TypeError of its own)."""

    def __init__(self, fail_at: int = 5, *, level: int = 1, name: str = "x") -> None:
        if level > 9:
            raise TypeError("level must be at most 9")
        super().__init__(fail_at)


class AnyArgumentEnv(FaultyCartPole):
    def __init__(self, **options) -> None:  # it cannot say which names it takes
        if options:
            raise TypeError(f"unexpected options {sorted(options)}")
        super().__init__()


@pytest.mark.parametrize("entry_point, env_kwargs, named, suggested", [
    (PickyEnv, "levl=2", ["levl", "fail_at", "level", "name"], "level"),  # and the arguments it has
    (PickyEnv, "level=12", ["level must be at most 9"], None),  # the constructor's own words
    # a value of another kind than the default's, which the constructor would take as it is: the default named
    (PickyEnv, "level=2.5", ["level=2.5", "1"], None),
    (PickyEnv, "level=true", ["level=true", "1"], None),
    (PickyEnv, "name=3", ["name=3", '"x"'], None),
    (CartPoleEnv, "sutton_barto_reward=abc", ['sutton_barto_reward="abc"', "false"], None),
    (AnyArgumentEnv, "x=1", ["unexpected options ['x']"], None),
])
def test_env_arguments_the_constructor_does_not_take_are_named(monkeypatch, entry_point, env_kwargs, named,
                                                               suggested):
    from envs.settings import ConfigError
    from trainer.common.spaces import model_spaces
    from trainer.config import TrainConfig
    monkeypatch.setitem(gym.registry, "Picky-v0", gym.envs.registration.EnvSpec("Picky-v0", entry_point))
    with raises(ConfigError, "--env-kwargs", "Picky-v0", *named, key="env_kwargs") as info:
        model_spaces(TrainConfig(env="Picky-v0", env_kwargs=env_kwargs))
    assert suggestion(str(info.value)) == suggested


# ---------------------------------------------------------------------------- a checkpoint's stored config

@pytest.mark.parametrize("args", [["trainer.evaluate", "--episodes", "1", "--checkpoint"],
                                  pytest.param(["trainer.export", "--format", "torchscript", "--checkpoint"],
                                               marks=SLOW),
                                  pytest.param(["trainer.train", "--resume"], marks=SLOW)])
def test_a_stored_network_size_that_does_not_fit_the_weights_allocates_nothing(vr_run, tmp_path, args):
    copy = stored(vr_run, tmp_path / "run", hidden="60000,60000")  # 14.4 GB for its middle layer
    line = command(["-m", *args, str(copy)], 1, tmp_path)
    names(line, "VREdge-v0", "hidden", "60000,60000", "[64, 12]", "[60000, 12]")  # the shapes: file's, config's


def test_a_stored_env_count_that_does_not_fit_the_collector_state_allocates_nothing(vr_run, tmp_path):
    copy = stored(vr_run, tmp_path / "run", num_envs=10**9)  # 244 GB of VR-edge observations
    line = command(["-m", "trainer.train", "--resume", str(copy)], 1, tmp_path)
    names(line, "num_envs", "1,000,000,000", "4")  # the stored setting, and the envs the state holds


def test_a_stored_setting_this_machine_cannot_run_is_a_usage_error_that_says_where_it_came_from(vr_run, tmp_path):
    """A GPU run resumed on a machine without one: exit status 2 as for the flag, naming the stored setting."""
    copy = stored(vr_run, tmp_path / "run", device="cuda")
    line = command(["-m", "trainer.train", "--resume", str(copy)], 2, tmp_path)
    names(line, "--device", "cuda", "stored")  # where the setting came from
    line = command(["-m", "trainer.train", "--resume", str(copy), "--cuda-graphs", "true", "--device", "cpu"], 2,
                   tmp_path)
    not_names(names(line, "--cuda-graphs", "true"), "stored")


def test_a_flag_that_would_change_the_resumed_run_is_a_usage_error(vr_run, tmp_path):
    line = command(["-m", "trainer.train", "--resume", str(vr_run), "--num-envs", "8"], 2, tmp_path)
    names(line, "--num-envs", "8", "4")  # given, and the run's


def test_a_stored_value_of_the_wrong_type_is_named(vr_run, tmp_path):
    copy = stored(vr_run, tmp_path / "run", num_envs="4")  # it was '>=' not supported between 'str' and 'int'
    line = command(["-m", "trainer.train", "--resume", str(copy)], 1, tmp_path)
    names(line, "num_envs", "'4'", "str")


# ---------------------------------------------------------------------------- sizes, before anything is allocated

@pytest.mark.parametrize("argv, named", [
    (["--num-steps", "1000000000"], ["--num-steps", "1000000000"]),  # 65 TiB of VR-edge rollout
    (["--env-kwargs", "num_users=1000000000"], ["--env-kwargs", "num_users=1000000000"]),  # 28 GB an observation
    (["--seed", "99999999999999999999999"], ["--seed", "99999999999999999999999", MAX_SEED]),  # what torch takes
])
def test_a_size_no_machine_holds_is_one_line_before_anything_is_allocated_or_written(tmp_path, argv, named):
    """Issue 43: these were tracebacks (exit status 1), the first after config.json and metrics.jsonl were written,
    the second after an allocation of 26 GiB; the address space is limited to 8 GB here, so that what is
    allocated before the check fails as an allocation. (The memory limits are this box's:
    test_a_run_larger_than_the_memory_... simulates a machine to check them.)"""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "trainer.train", *argv, "--run-dir", str(run_dir)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_memory)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    usage_error(proc.returncode, proc.stderr, *named)
    assert not run_dir.exists()


def test_the_largest_seed_is_the_largest_torch_takes(tmp_path):
    """The seed's limit is the real one: torch seeds a generator with a 64-bit unsigned integer, and PPO's sampling
    generator takes seed + 1. The largest seed runs; one more is refused, naming --seed."""
    import torch
    torch.Generator().manual_seed(MAX_SEED + 1)
    with pytest.raises(ValueError):  # "Overflow when unpacking long long"
        torch.Generator().manual_seed(MAX_SEED + 2)
    with pytest.raises(ConfigError) as info:
        TrainConfig(seed=MAX_SEED + 1).validate()
    assert info.value.key == "seed"
    cli = parse_args(VR + ["--seed", str(MAX_SEED), "--run-dir", str(tmp_path / "run")])
    assert train_module.train(cli.config, progress=False, max_iterations=1)["iterations"] == 1


def test_a_run_larger_than_the_memory_names_the_setting_and_the_most_of_it_that_fits(tmp_path):
    """The memory is the machine's that the run may use (simulated here, not this box's): 128 VR-edge envs x 1,024
    steps (two copies of a 73 MB rollout) do not fit in 100 MiB. Refused before anything is written, naming
    --num-steps (back at its default, it would save more than --num-envs would) with the most steps that fit."""
    cfg = parse_args(VR + ["--num-envs", "128", "--num-steps", "1024", "--run-dir", str(tmp_path / "run")]).config
    small = Machine(cores=2, memory=100 << 20)
    with pytest.raises(ConfigError) as info:
        train_module.train(cfg, progress=False, machine=small)
    assert info.value.key == "num_steps" and not (tmp_path / "run").exists()

    def fits(steps: int) -> bool:
        try:
            check_memory(cfg.replaced(num_steps=steps), small)
        except ConfigError:
            return False
        return True
    most = max(steps for steps in range(1, 1024) if fits(steps))
    assert f"{most:,}" in str(info.value)  # the limit, in the message
    wide = cfg.replaced(num_envs=8192, num_steps=16)  # --num-envs, this time
    with pytest.raises(ConfigError) as info:
        train_module.train(wide, progress=False, machine=small)
    assert info.value.key == "num_envs" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("algo", ["ppo", "apex"])
@pytest.mark.parametrize("env", ["VREdge-v0", "CartPole-v1"])
@pytest.mark.parametrize("gpus", [0, 1])
def test_the_defaults_fit_a_128_gib_server(algo, env, gpus):
    """Each algorithm's defaults, on a machine with or without a GPU: not refused for memory where it is plenty."""
    cfg = new_run_config({"algo": algo, "env": env}, gpu=bool(gpus))
    check_memory(cfg, Machine(cores=128, gpus=gpus, memory=128 << 30))


REPLAY = ["--algo", "apex", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "64",
          "--learning-starts", "16", "--device", "cpu", "--backend", "sync"]


@pytest.mark.parametrize("resumed", [False, pytest.param(True, marks=SLOW)])
def test_a_replay_larger_than_the_memory_is_refused_before_it_is_allocated(tmp_path, resumed):
    big = str(3 * 10**9)  # 223 GiB of CartPole transitions
    run_dir = tmp_path / "run"
    if resumed:  # a checkpoint whose stored config was edited
        train_module.main([*REPLAY, "--replay-capacity", "1000", "--run-dir", str(run_dir)])
        line = command(["-m", "trainer.train", "--resume", str(stored(run_dir, tmp_path / "copy",
                                                                      replay_capacity=int(big)))], 2, tmp_path)
        names(line, "stored")  # where the setting came from
    else:
        line = command(["-m", "trainer.train", *REPLAY, "--replay-capacity", big, "--run-dir", str(run_dir)], 2,
                       tmp_path)
        assert not run_dir.exists()
    names(line, "--replay-capacity", big, "223.3 GiB", "79 bytes")  # what it would take, and per transition


def test_a_stored_trace_path_is_named_but_its_file_is_not_quoted(vr_run, tmp_path):
    private = tmp_path / "private"
    private.write_text("root:x:0:0:secret:/root:/bin/bash\n")
    copy = stored(vr_run, tmp_path / "run", env_kwargs=f"capacity_trace={private}")
    line = command(["-m", "trainer.evaluate", "--episodes", "1", "--checkpoint", str(copy)], 1, tmp_path)
    names(line, f"{private}:1")
    assert "secret" not in line.replace(str(tmp_path), "")


def test_evaluate_names_its_own_capacity_trace_when_that_is_what_is_wrong(vr_run, tmp_path):
    missing = tmp_path / "nowhere"
    line = command(["-m", "trainer.evaluate", "--checkpoint", str(vr_run), "--capacity-trace", str(missing)], 2,
                   tmp_path)  # a usage error, before torch loads
    names(line, "--capacity-trace", missing)
    bad = tmp_path / "trace.log"
    bad.write_bytes(b"0 5\n1e9 6\n")
    line = command(["-m", "trainer.evaluate", "--checkpoint", str(vr_run), "--capacity-trace", str(bad)], 1,
                   tmp_path)  # the given trace is wrong, not the run's stored config
    names(line, f"capacity_trace={bad},trace_split=all", f"{bad}:2")  # the env arguments played, the bad line
    not_names(line, "stored")


def test_evaluate_refuses_a_capacity_trace_or_a_guard_for_an_env_without_one(tmp_path):
    run_dir = tmp_path / "run"
    train_module.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "16",
                       "--device", "cpu", "--run-dir", str(run_dir)])
    (tmp_path / "trace.log").write_text("0 5\n1 6\n")
    line = command(["-m", "trainer.evaluate", "--checkpoint", str(run_dir), "--capacity-trace",
                    str(tmp_path / "trace.log")], 2, tmp_path)  # it was a TypeError traceback from gym.make
    names(line, "--capacity-trace", "VREdge-v0", "CartPole-v1")
    line = command(["-m", "trainer.evaluate", "--checkpoint", str(run_dir), "--guard", "volatility"], 2, tmp_path)
    names(line, "--guard volatility", "CartPole-v1", "no guard")


@pytest.mark.parametrize("argv,named", [(["--guard", "calm"], ["--guard calm", "volatility"]),
                                        (["--guard", "volatility", "--users", "2"], ["--guard", "--users"])])
def test_evaluate_refuses_a_guard_its_env_does_not_declare_or_across_cells(vr_run, tmp_path, argv, named):
    line = command(["-m", "trainer.evaluate", "--checkpoint", str(vr_run), *argv], 2, tmp_path)
    names(line, *named)


# ---------------------------------------------------------------------------- evaluation.json, as export reads it

@pytest.mark.parametrize("payload", ["[]", pytest.param('{"checkpoint": 5}', marks=SLOW),
                                     pytest.param("{not json", marks=SLOW)])
def test_export_names_a_malformed_evaluation_json(vr_run, tmp_path, payload):
    copy = stored(vr_run, tmp_path / "run")
    (copy / "evaluation.json").write_text(payload)
    line = command(["-m", "trainer.export", "--format", "torchscript", "--checkpoint", str(copy)], 1, tmp_path)
    names(line, copy / "evaluation.json")
    assert not (copy / "export" / "policy.pt").exists()


# ---------------------------------------------------------------------------- a full disk under metrics.jsonl

def _full_after(rows: int, monkeypatch) -> None:
    """``os.write`` to ``metrics.jsonl``: row ``rows + 1`` is cut half-way, and every later write fails."""
    real, seen = os.write, []

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
            seen.append(1)
            if len(seen) == rows + 1:
                return real(fd, data[: len(data) // 2])
            if len(seen) > rows + 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)
    monkeypatch.setattr(os, "write", write)


def test_a_row_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    _full_after(2, monkeypatch)
    with MetricsLog(path) as log:
        log.append({"iteration": 1})
        log.append({"iteration": 2})
        with raises(MetricsWriteError, path, os.strerror(errno.ENOSPC), "row 3"):
            log.append({"iteration": 3, "sps": 1.5})
        with raises(MetricsWriteError, "row 3"):  # still full: the file stays as it was
            log.append({"iteration": 3, "sps": 1.5})
    monkeypatch.undo()
    assert path.read_text() == '{"iteration": 1}\n{"iteration": 2}\n'


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the metrics file through /proc")
def test_a_full_disk_under_metrics_stops_the_run_with_one_line_and_the_last_row_saved(tmp_path):
    run_dir = tmp_path / "run"
    line = command(["-c", FULL_DISK, *VR, "--run-dir", str(run_dir)], 1, REPO)
    names(line, run_dir / "metrics.jsonl", os.strerror(errno.ENOSPC), "row 3")
    rows = [json.loads(r)["iteration"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2]  # the torn third row was cut off
    assert checkpoints.latest_loadable(run_dir)[1]["iteration"] == 2  # iteration 3 has no row: not completed
    cli = parse_args(["--resume", str(run_dir)])
    assert train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given)["iterations"] == 4
    assert [json.loads(r)["iteration"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------- a Ray cluster that is not there

def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the with ends: nothing listens there


def test_a_ray_address_where_nothing_listens_is_one_line_not_a_wait_for_ever(tmp_path, capsys):
    """ray.init retries an address where nothing answers without a bound (and logs every 40 s)."""
    pytest.importorskip("ray")
    port = _closed_port()
    with exits(1, f"127.0.0.1:{port}", "Connection refused", f"ray start --head --port={port}", "--ray-address"):
        train_module.main(["--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--env", "CartPole-v1",
                           "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("auth_mode", [None, "token"])
def test_a_ray_cluster_that_refuses_this_process_names_token_authentication(monkeypatch, auth_mode):
    """What a cluster started by `ray start` (token authentication on, Ray >= 2.59) does to a client without
    RAY_AUTH_MODE=token: it answers, and ray.init fails with a ConnectionError that does not say why."""
    import socket
    ray = pytest.importorskip("ray")
    from collectors.backends import ray_
    if auth_mode:
        monkeypatch.setenv("RAY_AUTH_MODE", auth_mode)
    else:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    def refused(address, **kw):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refused)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(ConnectionError) as info:
            ray_.connect(address)
    if auth_mode:  # it had the token: Ray's own error, as it was
        assert type(info.value) is ConnectionError
    else:
        assert isinstance(info.value, ray_.RayConnectError)
        names(str(info.value), address, "RAY_AUTH_MODE=token")  # where, and what to set


def test_the_ray_backend_without_its_extra_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    with exits(2, "--backend", "ray", "pip install -e '.[ray]'", capsys=capsys):
        train_module.main(["--backend", "ray", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_an_env_whose_package_is_missing_is_one_line_naming_what_to_install(tmp_path, capsys):
    """As LunarLander without Box2D: gymnasium's words on what to install, and this interpreter's pip, no
    traceback and no run directory."""
    with exits(2, "NeedsSim3D-v0", "gymnasium[sim3d]", f"{sys.executable} -m pip", capsys=capsys):
        train_module.main(["--env", "tests.factories:NeedsSim3D-v0", "--total-steps", "64",
                           "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()
