"""Training with ``--backend device``: the run layout, refusals, and exact resume through the command line."""

import signal
from pathlib import Path

import pytest
import torch

from envs.make_traces import write_traces
from envs.settings import ConfigError
from tests.messages import exits, names, raises, usage_error
from tests.test_durability import cli_matrix_case
from trainer import train as train_module
from trainer.config import TrainConfig
from trainer.flags import parse_args
from trainer.run_layout import Machine, run_layout

RECIPE = Path(__file__).resolve().parents[1] / "docs" / "cells.toml"  # issue 49: a set policy, users come and go


def test_layout_builds_one_torch_env_and_says_so():
    layout = run_layout(TrainConfig(env="VREdge-v0", backend="device", num_envs=32, device="cpu"), Machine(cores=8))
    (factory,) = layout.env_factories()
    env = factory()
    assert type(env).__name__ == "VREdgeTorchEnv" and env.num_envs == 32 and env._compile is True  # --compile auto
    assert layout.workers == 0 and layout.collect_threads == 8
    assert layout.collector_kwargs() == {"num_threads": 8, "compile_policy": True}
    assert "1 x VREdgeTorchEnv(32); device: this process, env stepped as torch tensors" in layout.describe()


@pytest.mark.parametrize("argv, key, named", [
    (["--env", "CartPole-v1"], "backend", ["--backend device", "CartPole-v1", "VREdge-v0"]),  # and an env it runs
    (["--env-kwargs", "step_cost_us=5"], "env_kwargs", ["--backend device", "step_cost_us"]),
])
def test_what_the_device_backend_cannot_run_is_a_one_line_error(argv, key, named, tmp_path, capsys):
    cfg = TrainConfig(backend="device", **{argv[0].removeprefix("--").replace("-", "_"): argv[1]})
    with raises(ConfigError, *named, key=key):  # named by its flag: a usage error on the command line
        cfg.validate()  # (env arguments the torch env refuses: here, before trace files are read)
        run_layout(cfg, Machine(cores=2))
    with exits(2, *named, capsys=capsys):
        train_module.main(["--backend", "device", *argv, "--run-dir", str(tmp_path / "run")])


def test_overlap_is_refused_naming_the_backends_it_works_with():
    with raises(ValueError, "--overlap", "serial", "sync", "async", "device", key="overlap"):
        TrainConfig(backend="device", overlap=True).validate()


def test_the_device_backend_trains_on_traces_as_sync_does(tmp_path):
    """The cell and every user on recorded traces, stepped as torch tensors: a run started on sync and resumed on
    the device backend has the numbers of one that stayed on it (the same files, windows and rewards)."""
    write_traces(tmp_path / "links", files=4, seconds=30, seed=3)
    flags = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--device", "cpu", "--seed", "5",
             "--compile", "off", "--env-kwargs", f"num_users=3,capacity_trace=pensieve,user_traces={tmp_path / 'links'}"
             ",trace_split=train,max_steps=20"]
    a, b = _moved_and_stayed(tmp_path, flags)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    assert "capacity_trace=pensieve" in a["config"]["env_kwargs"]  # a shipped set is stored by its name


@pytest.mark.slow  # compiled (--compile auto); tests/test_compile.py resumes a device run quickly
def test_command_line_signal_then_resume_is_exact_on_the_device_backend(tmp_path):
    cli_matrix_case(tmp_path, "device", signal.SIGTERM, seed=1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_backend_on_cuda_resumes_exactly(tmp_path):
    from benchmarks.device_check import resume_matches
    assert resume_matches("cuda", num_envs=8, n=1, num_steps=16, root=tmp_path, backend="device")


def _trained(argv: list[str], **kw) -> dict:
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given, **kw)


def _numbers(run_dir) -> list[dict]:
    """metrics.jsonl without its timings."""
    import json
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(("_s", "sps"))} for r in rows]


@pytest.mark.parametrize("first, then", [("sync", "device"), ("device", "async"), ("serial", "sync")])
def test_a_run_moves_between_backends_on_resume_with_the_same_numbers(tmp_path, first, then):
    """Started on one backend and resumed on another (a CPU run continued on the GPU's device backend): the same
    envs, seeds and state, so the same numbers as a run that never moved (eager: a compiled step rounds in its
    own way)."""
    import checkpoints
    flags = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--device", "cpu", "--seed", "5",
             "--compile", "off", "--num-workers", "2"]
    moved, stayed = tmp_path / "moved", tmp_path / "stayed"
    _trained([*flags, "--backend", first, "--run-dir", str(moved)], max_iterations=2)
    _trained(["--resume", str(moved), "--backend", then])
    _trained([*flags, "--backend", then, "--run-dir", str(stayed)])
    assert [r["iteration"] for r in _numbers(moved)] == [1, 2, 3, 4] and _numbers(moved) == _numbers(stayed)
    a, b = (checkpoints.latest_loadable(d)[1] for d in (moved, stayed))
    assert a["config"]["backend"] == then and all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


def test_a_cell_whose_users_come_and_go_trains_on_the_device_backend_as_on_sync(tmp_path):
    """The recipe's cell (users and churn drawn per episode; a set policy: docs/cells.toml) stepped as torch tensors:
    a run started on sync and resumed on the device backend has the numbers of one that stayed on it."""
    flags = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--device", "cpu", "--seed", "5",
             "--compile", "off", "--config", str(RECIPE), "--env-kwargs", "num_users=6,users=2-6,churn=0-0.2"]
    a, b = _moved_and_stayed(tmp_path, flags)
    assert a["config"]["policy_arch"] == "set" and all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


def test_a_resume_does_not_move_a_run_to_or_from_ray(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _trained(["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--device", "cpu", "--run-dir",
              str(run_dir)])
    with pytest.raises(SystemExit) as refused:
        train_module.main(["--resume", str(run_dir), "--backend", "ray"])
    line = usage_error(refused.value.code, capsys.readouterr().err, "--backend", "'ray'", "'sync'")  # given, run's
    names(line, "serial", "async", "device")  # the backends a resume may move between


def _moved_and_stayed(tmp_path, flags: list[str]) -> tuple[dict, dict]:
    """A run of ``flags`` started on sync and resumed on the device backend, and one that stayed on the device
    backend: their metrics are asserted equal; their last checkpoints' states returned."""
    import checkpoints
    moved, stayed = tmp_path / "moved", tmp_path / "stayed"
    _trained([*flags, "--backend", "sync", "--run-dir", str(moved)], max_iterations=2)
    _trained(["--resume", str(moved), "--backend", "device"])
    _trained([*flags, "--backend", "device", "--run-dir", str(stayed)])
    assert [r["iteration"] for r in _numbers(moved)] == [1, 2, 3, 4] and _numbers(moved) == _numbers(stayed)
    return tuple(checkpoints.latest_loadable(d)[1] for d in (moved, stayed))
