"""trainer.export: exported files match the trained model in a process that cannot import this package."""

import copy
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import checkpoints
from tests.factories import replace_weights_in_place, settings_file
from tests.messages import exits, names, not_names, raises, usage_error
from trainer import train as train_module
from trainer.evaluate import main as evaluate_main
from trainer.evaluation.policies import trained_model
from trainer.export import main as export_main
from trainer.flags import parse_args
from trainer.ppo import export as export_cli
from trainer.ppo.model import RunningNorm

pytest.importorskip("onnxruntime", reason="needs the export extra")

TINY = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--device", "cpu", "--seed", "3"]
REPO = Path(__file__).resolve().parents[1]

# Run first in every fresh process: this package stays out of reach even though the venv has it installed
# (editable install: a meta-path finder), as on a machine that only has torch / onnxruntime
NO_PACKAGE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "parallel_rollouts" not in getattr(f, "__module__", "")]
sys.path_hooks = [h for h in sys.path_hooks if "parallel_rollouts" not in getattr(h, "__module__", "")]
sys.path_importer_cache.clear()
for name in ("trainer", "envs", "checkpoints", "collectors"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} is importable")
"""

RELOAD = NO_PACKAGE + """
import json
import numpy as np
import onnxruntime
import torch

export, data = sys.argv[1], np.load(sys.argv[2])
obs, results = data["obs"], {}
with torch.no_grad():
    scripted = [t.numpy() for t in torch.jit.load(f"{export}/policy.pt")(torch.from_numpy(obs))]
session = onnxruntime.InferenceSession(f"{export}/policy.onnx", providers=["CPUExecutionProvider"])
for name, (action, probs, value) in {"torchscript": scripted, "onnx": session.run(None, {"obs": obs})}.items():
    results[name] = {"actions_equal": bool(np.array_equal(action, data["action"])),
                     "prob_diff": float(np.abs(probs - data["probs"]).max()),
                     "value_diff": float(np.abs(value - data["value"]).max())}
print(json.dumps(results))
"""


def fresh_python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def train_tiny(run_dir: Path, env: str, arch: str, *flags: str) -> Path:
    cli = parse_args(["--env", env, "--config", settings_file(f"policy_arch_{arch}"), "--run-dir", str(run_dir), *TINY,
                      *flags])
    train_module.train(cli.config, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("cartpole") / "run", "CartPole-v1", "flat")


# VR-edge with its own arguments (not the env's defaults: another observation size and action space), which the
# export's checks and card must use
VR_ARGUMENTS = {"num_users": 3, "bitrates_mbps": (8, 16, 32, 64)}


@pytest.mark.parametrize("env,arch", [
    pytest.param("CartPole-v1", "flat", marks=pytest.mark.slow),  # (40 s each; quick: per_head)
    ("VREdge-v0", "per_head"),
    pytest.param("VREdge-v0", "set", marks=pytest.mark.slow),  # (quick: per_head; set in the whole suite)
    pytest.param("VREdge-v0", "flat", marks=pytest.mark.slow),
])
def test_exports_match_the_trained_model_in_a_process_without_this_package(tmp_path, cartpole, env, arch):
    env_kwargs = VR_ARGUMENTS if env == "VREdge-v0" else {}
    run_dir = cartpole if env == "CartPole-v1" else train_tiny(tmp_path / "run", env, arch, "--env-kwargs",
                                                               "num_users=3,bitrates_mbps=[8,16,32,64]")
    export_main(["--checkpoint", str(run_dir), "--format", "both"])
    out = run_dir / "export"
    card = json.loads((out / "policy.json").read_text())
    model, cfg, source = trained_model(run_dir)
    assert cfg.policy_arch == arch and model.layout.kind == arch
    obs = export_cli.verification_observations(model, env, seed=11,  # not the seed the command verified on
                                               env_kwargs=env_kwargs)
    parts = [obs]
    if arch == "set":  # and at 5 and 1 slots (trained at 3), users reordered: the files take any slot count
        users, cell = obs[:, :-5].reshape(len(obs), 3, 7), obs[:, -5:]
        parts += [np.concatenate([users[:, [2, 0, 1, 0, 2]].reshape(len(obs), -1), cell], 1),
                  np.concatenate([users[:, 1], cell], 1)]
    for part in parts:
        action, probs, value = export_cli.reference_outputs(model, part)
        np.savez(tmp_path / "expected.npz", obs=part, action=action, probs=probs, value=value)
        done = fresh_python(RELOAD, str(out), str(tmp_path / "expected.npz"), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        for name, r in json.loads(done.stdout).items():
            assert r["actions_equal"], name
            assert r["prob_diff"] <= export_cli.ATOL and r["value_diff"] <= 1e-4, (name, r)
    state = checkpoints.load(source)
    assert card["checkpoint"]["iteration"] == state["iteration"]
    assert card["checkpoint"]["env_steps"] == state["env_steps"]
    assert card["env"]["id"] == env and card["training"]["policy_arch"] == arch
    for fmt, entry in card["files"].items():
        assert entry["sha256"] == checkpoints.content_hash(out / entry["file"]), fmt
        checks = entry["verification"]["slots"] if arch == "set" else {"": entry["verification"]}
        assert all(c["actions_identical"] == c["observations"] for c in checks.values())
        if arch == "set":  # checked at 1, 2, half and all slots, and permuted
            assert list(checks) == ["1 of 3 slots", "2 of 3 slots", "3 of 3 slots", "3 slots permuted"], fmt
    assert card["files"]["onnx"]["opset"] == export_cli.OPSET
    assert sorted(p.name for p in out.iterdir()) == ["policy.json", "policy.onnx", "policy.pt"]  # one file each
    if env == "VREdge-v0":
        assert card["env"]["config"]["num_users"] == 3 and card["env"]["config"]["bitrates_mbps"] == [8, 16, 32, 64]
        trained = gym.make(env, **env_kwargs).observation_space.shape  # not the default env's 61
        assert card["env"]["action_space"]["nvec"] == [4] * 3
        assert card["env"]["observation_space"]["shape"] == [*trained]


def _no_norm(model):
    broken = copy.deepcopy(model)
    broken.norm = nn.Identity()
    return broken


def test_an_export_without_the_normaliser_fails_the_check(tmp_path, cartpole):
    model, cfg, _ = trained_model(cartpole)
    assert isinstance(model.norm, RunningNorm)
    path = tmp_path / "policy.pt"
    export_cli.export_file(export_cli.ExportedPolicy(_no_norm(model)), "torchscript", path, obs_dim=4)
    obs = export_cli.verification_observations(model, cfg.env, seed=0)
    with raises(export_cli.ExportError, "policy.pt", f"{len(obs)} observations", f"/{len(obs)}"):  # how many agree
        export_cli.verify(model, path, obs)


def test_a_failed_check_writes_nothing(tmp_path, cartpole, monkeypatch, capsys):
    class WithoutNormaliser(export_cli.ExportedPolicy):
        def __init__(self, model):
            super().__init__(_no_norm(model))

    monkeypatch.setattr(export_cli, "ExportedPolicy", WithoutNormaliser)
    out = tmp_path / "out"
    with exits(1, "policy.pt") as info:
        export_main(["--checkpoint", str(cartpole), "--format", "torchscript", "--out", str(out / "a" / "b")])
    assert re.search(r"\d+ observations\b.*\b\d+/\d+", info.value.code)  # the numbers, said once
    assert not out.exists()  # the directories it made, left empty, are gone too
    assert "policy.pt:" not in capsys.readouterr().out  # no line that reads as if it had passed
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with exits(1, "policy.pt"):
        export_main(["--checkpoint", str(cartpole), "--format", "torchscript", "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # a directory the user had stays as it was


def test_the_docs_example_runs_without_this_package(tmp_path, cartpole):
    section = (REPO / "docs" / "evaluation.md").read_text().split("## Ship a trained policy", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    vr = train_tiny(tmp_path / "run", "VREdge-v0", "per_head")
    export_main(["--checkpoint", str(vr), "--format", "onnx"])
    example_dir = re.search(r'"(runs/[^"]+/export)"', code).group(1)
    done = fresh_python(NO_PACKAGE + code.replace(example_dir, str(vr / "export")), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"bitrate per user \(Mb/s\): \[(\d+\.\d, ){7}\d+\.\d\]", done.stdout), done.stdout


def test_export_ships_the_checkpoint_evaluate_measured_and_says_when_the_evaluation_is_of_another(
        tmp_path, cartpole, capsys):
    """A run directory's best checkpoint, as trainer.evaluate picks (export took the newest); a pointer file
    passed as the checkpoint is followed; an evaluation of another checkpoint, or of sampled actions, is
    said, and marked so on the card."""
    run = tmp_path / "run"
    cli = parse_args(["--env", "CartPole-v1", "--run-dir", str(run), *TINY, "--checkpoint-every", "1"])
    train_module.train(cli.config, progress=False)
    older, newest = sorted(checkpoints.checkpoint_files(run))
    checkpoints.set_best(run, older, {"val_return": 1.0}, keep=5)

    def exported(*argv: str) -> tuple[str, dict]:
        export_main(["--checkpoint", *argv, "--format", "torchscript"])
        return capsys.readouterr().err, json.loads((run / "export" / "policy.json").read_text())

    err, card = exported(str(run))
    assert card["checkpoint"]["path"] == str(older.resolve())
    names(err, "best", older)  # which pick, which file
    assert exported(str(run), "--pick", "latest")[1]["checkpoint"]["path"] == str(newest.resolve())
    assert exported(str(run / "checkpoints" / "best"))[1]["checkpoint"]["path"] == str(older.resolve())
    assert exported(str(run / "checkpoints" / "latest"))[1]["checkpoint"]["path"] == str(newest.resolve())

    evaluate_main(["--checkpoint", str(run), "--episodes", "2", "--stochastic"])  # the best, sampled
    err, card = exported(str(run))
    assert card["evaluation"]["same_checkpoint"] and card["evaluation"]["actions"] == "sampled"
    names(err, "evaluation.json", "sampled", f"python -m trainer.evaluate --checkpoint {older}", "--stochastic")
    evaluate_main(["--checkpoint", str(run), "--episodes", "3"])
    names(capsys.readouterr().out, run / "evaluation.json", "2 episodes", "sampled", older.name)  # what it was
    err, card = exported(str(run), "--pick", "latest")
    assert not card["evaluation"]["same_checkpoint"] and card["evaluation"]["actions"] == "greedy"
    names(err, "evaluation.json", older.name, f"python -m trainer.evaluate --checkpoint {newest}")
    err, card = exported(str(run))
    assert card["evaluation"]["same_checkpoint"] and "note:" not in err


def test_an_evaluation_of_a_checkpoint_rewritten_since_is_not_of_the_checkpoint_exported(tmp_path, cartpole, capsys):
    """The card and the evaluation name the checkpoint by content, not by path alone: once the file evaluated holds
    other weights under the same name, the card says its evaluation is not of what is exported, and so does the
    command; an evaluation that names no content (an older version's) is not taken for the checkpoint's either."""
    run = tmp_path / "run"
    shutil.copytree(cartpole, run)
    source = checkpoints.checkpoint_files(run)[0]  # the one a run without --eval-every evaluates and exports

    def exported() -> tuple[str, dict]:
        export_main(["--checkpoint", str(run), "--format", "torchscript"])
        return capsys.readouterr().err, json.loads((run / "export" / "policy.json").read_text())

    evaluate_main(["--checkpoint", str(run), "--episodes", "2"])
    evaluated = json.loads((run / "evaluation.json").read_text())
    assert evaluated["checkpoint"] == str(source.resolve())
    assert evaluated["checkpoint_sha256"] == checkpoints.content_hash(source)
    err, card = exported()
    assert card["checkpoint"]["sha256"] == checkpoints.content_hash(source) and card["evaluation"]["same_checkpoint"]
    assert "note:" not in err

    replace_weights_in_place(source)
    err, card = exported()
    assert card["checkpoint"]["path"] == str(source.resolve())  # the same path ...
    assert card["checkpoint"]["sha256"] == checkpoints.content_hash(source) != evaluated["checkpoint_sha256"]
    assert not card["evaluation"]["same_checkpoint"]  # ... other weights: not what was evaluated
    names(err, "evaluation.json", f"python -m trainer.evaluate --checkpoint {source}")

    without_hash = {k: v for k, v in evaluated.items() if k != "checkpoint_sha256"}
    (run / "evaluation.json").write_text(json.dumps({**without_hash, "checkpoint": str(source.resolve())}))
    err, card = exported()
    assert not card["evaluation"]["same_checkpoint"]
    names(err, "evaluation.json", f"python -m trainer.evaluate --checkpoint {source}")


def test_a_pointer_that_names_no_checkpoint_is_not_called_corrupted(tmp_path, cartpole, capsys):
    """Passed as the checkpoint, a run's ``latest`` stands for the run: its newest checkpoint is exported, and a
    pointer that names no file is said in one line that does not call anything corrupted."""
    run = tmp_path / "run"
    shutil.copytree(cartpole, run)
    (run / "checkpoints" / "latest").write_text("ckpt_00000099.pt\n")
    export_main(["--checkpoint", str(run / "checkpoints" / "latest"), "--format", "torchscript"])
    said = [line for line in capsys.readouterr().err.splitlines() if "ckpt_00000099.pt" in line]
    assert len(said) == 1 and "corrupted" not in said[0], said
    newest = checkpoints.checkpoint_files(run)[0]
    assert json.loads((run / "export" / "policy.json").read_text())["checkpoint"]["path"] == str(newest.resolve())


# ---------------------------------------------------------------------------- bad input: one-line errors

def one_line_error(argv) -> str:
    with pytest.raises(SystemExit) as info:
        export_main(argv)
    message = str(info.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_a_checkpoint_of_another_format_version(tmp_path):
    path = tmp_path / "ckpt_00000001.pt"
    torch.save({"format_version": 2, "state": {}}, path)
    names(one_line_error(["--checkpoint", str(path)]), path, "format version 2")


def test_an_unreadable_checkpoint_file_is_one_line_that_lists_what_was_tried(tmp_path, cartpole):
    run = shutil.copytree(cartpole, tmp_path / "run")
    newest = checkpoints.checkpoint_files(run)[0]
    shutil.copy(newest, run / "checkpoints" / "ckpt_00000001.pt")  # an older one that loads
    newest.write_bytes(b"")
    said = one_line_error(["--checkpoint", str(newest)])
    names(said, newest, "empty", run, "1", "ckpt_00000001.pt")  # what is wrong, and the run's others to try


def test_a_run_without_checkpoints(tmp_path):
    (tmp_path / "run").mkdir()
    names(one_line_error(["--checkpoint", str(tmp_path / "run")]), tmp_path / "run")


def test_an_env_not_registered_in_this_process(tmp_path, cartpole):
    source, state, _ = checkpoints.latest_loadable(cartpole)
    state["config"]["env"] = "Unregistered-v0"
    path = checkpoints.save(tmp_path / "ckpt_00000001.pt", state)
    names(one_line_error(["--checkpoint", str(path)]), path, "Unregistered-v0")


def test_an_unwritable_output_directory_is_refused_before_exporting(tmp_path, cartpole, monkeypatch):
    monkeypatch.setattr(export_cli.ExportedPolicy, "forward", lambda *a: pytest.fail("exported before checking"))
    blocker = tmp_path / "file"  # (on the command line, a usage error: test_command_lines)
    blocker.write_text("")
    with raises(ValueError, blocker / "export", os.strerror(errno.ENOTDIR), "--out"):  # the way out
        export_cli.export(cartpole, ["torchscript"], blocker / "export")
    with raises(ValueError, blocker) as info:
        export_cli.export(cartpole, ["torchscript"], blocker)
    not_names(str(info.value), blocker / "export")


def test_onnx_without_the_export_extra(cartpole, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    message = one_line_error(["--checkpoint", str(cartpole), "--format", "onnx"])
    names(message, "onnxruntime", "pip install -e '.[export]'")


def test_a_checkpoint_whose_network_does_not_fit_its_env(tmp_path, cartpole):
    source, state, _ = checkpoints.latest_loadable(cartpole)
    state["config"]["env"] = "Acrobot-v1"  # 6 observations, 3 actions: CartPole's network does not fit
    path = checkpoints.save(tmp_path / "ckpt_00000001.pt", state)
    names(one_line_error(["--checkpoint", str(path)]), path, "Acrobot-v1", "[4]", "[6]")  # the file's, the env's


@pytest.mark.parametrize("flag, value", [(["--atol", "inf"], "inf"), (["--atol", "-1"], "-1.0"),
                                         (["--seed", "-5"], "-5")])
def test_bad_numbers_are_usage_errors(cartpole, flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        export_main(["--checkpoint", str(cartpole), *flag])
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    usage_error(info.value.code, err, flag[0], value)


def test_an_exported_file_passed_as_a_checkpoint_is_named(tmp_path, cartpole):
    export_main(["--checkpoint", str(cartpole), "--format", "torchscript", "--out", str(tmp_path)])
    message = one_line_error(["--checkpoint", str(tmp_path / "policy.pt")])
    not_names(names(message, tmp_path / "policy.pt", "TorchScript"), "weights_only")  # what it is; not torch's words


def test_stage_folders_of_a_killed_export_are_swept(tmp_path, cartpole):
    stale = tmp_path / ".export-killed"
    stale.mkdir()
    (stale / "policy.pt").write_bytes(b"half")
    export_main(["--checkpoint", str(cartpole), "--format", "torchscript", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "policy.pt"]


def test_the_command_line_help_names_the_opset_it_exports():
    from trainer import export as export_command
    assert f"(ONNX opset {export_cli.OPSET}," in " ".join(export_command.__doc__.split())
