"""What a newcomer types (issue 25): each algorithm's own defaults, printed commands that run from anywhere, JSON
that pipes, a resume with nothing to do, typos answered before torch loads."""

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoints
from envs.make_traces import write_traces
from tests.factories import settings_file
from tests.messages import exits, mentions, names, not_names, printed_lines, raises, suggestion, usage_error
from trainer import evaluate as evaluate_cli
from trainer import train as train_cli
from trainer.config import new_run_config
from trainer.flags import parse_args

REPO = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}, "PATH": "/usr/bin:/bin"}


def command(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m ...`` with this interpreter (absolute), run in ``cwd`` from a fresh shell's environment."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------- each algorithm owns its defaults

def docs_command(page: str, start: str) -> list[str]:
    """The flags of the command of ``docs/<page>`` that starts with ``start`` (continuation lines joined)."""
    text = (REPO / "docs" / page).read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(start))
    return shlex.split(line)[3:]  # after `.venv/bin/python -m trainer.train`


def test_bare_apex_on_cartpole_runs_the_documented_command():
    documented = docs_command("apex.md", ".venv/bin/python -m trainer.train --algo apex --env CartPole-v1")
    assert "--total-steps" in documented and "--n-step" in documented
    bare = parse_args(["--algo", "apex", "--env", "CartPole-v1"]).config
    assert bare == parse_args(documented).config
    assert (bare.backend, bare.num_envs, bare.num_steps, bare.gamma, bare.algo_settings.n_step) == (
        "async", 8, 16, 0.99, 5)


def test_flags_and_toml_win_over_the_algorithm_defaults(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('algo = "apex"\nenv = "CartPole-v1"\nnum-envs = 4\n')  # a flag's spelling, hyphenated
    cli = parse_args(["--config", str(toml), "--gamma", "0.95", "--backend", "sync"])
    assert (cli.config.num_envs, cli.config.gamma, cli.config.backend, cli.config.algo_settings.n_step) == (
        4, 0.95, "sync", 5)
    ppo_vr = parse_args([]).config  # PPO on VR-edge keeps the defaults its benchmarks measured
    assert (ppo_vr.num_envs, ppo_vr.num_steps, ppo_vr.gamma, ppo_vr.max_grad_norm) == (64, 128, 0.9, 0.5)
    apex_vr = new_run_config({"algo": "apex"})  # the Python API gives what the command line gives
    assert (apex_vr.max_grad_norm, apex_vr.gamma) == (10.0, 0.9)
    # on VR-edge, Ape-X runs what benchmarks.apex vr-edge measured
    assert (apex_vr.num_envs, apex_vr.num_steps, apex_vr.lr, apex_vr.anneal_lr, apex_vr.algo_settings.learning_starts,
            apex_vr.algo_settings.replay_capacity) == (16, 16, 5e-4, False, 5000, 200_000)


def test_help_says_which_defaults_depend_on_the_algorithm_and_torch_is_not_imported(tmp_path):
    done = command(["-X", "importtime", "-m", "trainer.train", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "(default: ppo 'sync', 'device' on VREdge-v0 with a GPU; apex 'sync' on VREdge-v0, 'async' on other " \
           "envs)" in text
    assert "(default: ppo 64 on VREdge-v0, 8 on other envs, 4096 on VREdge-v0 with a GPU; apex 16 on VREdge-v0, 8 " \
           "on other envs)" in text
    assert "n-step return (>= 1) (default: apex 3 on VREdge-v0, 5 on other envs)" in text  # PPO reads no --n-step
    assert "(default: ppo 0; apex 128)" in text  # one flag, each algorithm's own default
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "trainer.flags" in imported and not imported & {"torch", "tensordict", "ray"}


def test_a_new_run_prints_the_defaults_it_uses_and_a_resume_keeps_its_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train_cli.main(["--algo", "apex", "--env", "CartPole-v1", "--total-steps", "256", "--learning-starts", "64",
                    "--backend", "sync", "--device", "cpu", "--run-dir", str(run_dir)])
    printed = capsys.readouterr()
    # what was typed (--learning-starts, --backend) is not listed
    assert ("defaults for --algo apex on CartPole-v1: --num-envs 8 --num-steps 16 --lr 0.001 --anneal-lr true "
            "--gamma 0.99 --max-grad-norm 10.0 --minibatch-size 128 --replay-capacity 100000 --n-step 5\n"
            ) in printed.err
    stored = json.loads((run_dir / "config.json").read_text())["config"]
    assert {k: stored[k] for k in ("num_envs", "num_steps", "n_step", "learning_starts")} == {
        "num_envs": 8, "num_steps": 16, "n_step": 5, "learning_starts": 64}
    train_cli.main(shlex.split(printed_lines(printed.out)["train longer"])[3:])  # the line, less the interpreter
    assert "defaults for" not in capsys.readouterr().err  # a resume runs the stored config, whatever the defaults
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["env_steps"] == 512 and state["config"]["learning_starts"] == 64


# ---------------------------------------------------------------------------- printed commands, JSON, traces

@pytest.mark.slow  # quick: test_run_dirs' printed commands from a fresh shell
def test_printed_commands_of_a_trace_run_work_from_another_directory(tmp_path, monkeypatch, capsys):
    write_traces(tmp_path / "traces", files=6, seconds=60, mean_mbps=4.0, seed=1)
    small = ["--num-envs", "2", "--num-steps", "8", "--total-steps", "16", "--device", "cpu", "--run-dir", "run"]
    done = command(["-m", "trainer.train", "--env-kwargs", "capacity_trace=traces/,trace_split=train,num_users=2",
                    *small], tmp_path)
    assert done.returncode == 0, done.stderr
    stored = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["env_kwargs"]
    assert stored == f"capacity_trace={tmp_path / 'traces'},trace_split=train,num_users=2"  # absolute
    printed = printed_lines(done.stdout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    evaluate = shlex.split(printed["evaluate"]) + ["--episodes", "1", "--baselines", "fair_share", "--reference",
                                                   "none", "--json"]
    scored = subprocess.run(evaluate, cwd=elsewhere, env=ENV, capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr
    payload = json.loads(scored.stdout)  # `--json > f` is valid JSON: the table went to stderr
    assert payload["env_kwargs"]["trace_split"] == "test" and "fair_share" in scored.stderr
    longer = subprocess.run(shlex.split(printed["train longer"]), cwd=elsewhere, env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert printed["train longer"].endswith("--total-steps 32") and longer.returncode == 0, longer.stderr

    (tmp_path / "traces").rename(tmp_path / "moved")  # the stored path is gone: an explicit one wins
    run = str(tmp_path / "run")
    monkeypatch.chdir(elsewhere)  # relative paths on the command line are the caller's
    with exits(1, tmp_path / "traces", "--capacity-trace"):  # the stored path, and the flag that replaces it
        evaluate_cli.main(["--checkpoint", run, "--episodes", "1", "--baselines", "none"])
    with exits(2, tmp_path / "traces", "--env-kwargs", "capacity_trace", capsys=capsys):  # a usage error, as the
        train_cli.main(["--resume", run, "--total-steps", "48"])                        # same flag's on a new run
    evaluate_cli.main(["--checkpoint", run, "--episodes", "1", "--baselines", "none", "--reference", "none",
                       "--capacity-trace", "../moved"])
    train_cli.main(["--resume", run, "--total-steps", "48", "--env-kwargs", "capacity_trace=../moved"])
    with exits(2, "--env-kwargs", "num_users=3", "num_users=2", capsys=capsys):  # a usage error, as a resume's
        train_cli.main(["--resume", run, "--env-kwargs", "num_users=3"])           # other changes are
    state = checkpoints.latest_loadable(run)[1]
    assert state["iteration"] == 3
    assert state["config"]["env_kwargs"] == f"capacity_trace={tmp_path / 'moved'},trace_split=train,num_users=2"


# ---------------------------------------------------------------------------- a resume with nothing to do

def test_a_run_on_a_module_id_env_evaluates_exports_and_resumes_where_its_module_imports(tmp_path, monkeypatch,
                                                                                           capsys):
    """--env module:Env-v0: the module registers the id when imported; evaluate and export import it too
    (they asked gymnasium for the spec of 'module:Env-v0', which is never registered under that name)."""
    from trainer import export as export_cli
    (tmp_path / "trialenvs.py").write_text(
        "import gymnasium as gym\n"
        "if 'TrialCart-v0' not in gym.registry:\n"
        "    gym.register(id='TrialCart-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',\n"
        "                 max_episode_steps=50)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    train_cli.main(["--env", "trialenvs:TrialCart-v0", "--num-envs", "2", "--num-steps", "32", "--total-steps",
                    "128"])
    [run] = (tmp_path / "runs").iterdir()  # named by the id alone: no colon in a path (Windows)
    assert run.name.startswith("TrialCart-v0-s1-")
    capsys.readouterr()
    evaluate_cli.main(["--checkpoint", str(run), "--episodes", "2", "--json"])
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    export_cli.main(["--checkpoint", str(run), "--format", "torchscript", "--out", str(tmp_path / "shipped")])
    assert (tmp_path / "shipped" / "policy.pt").is_file()
    # elsewhere, where the module does not import: one line naming it, for each command
    monkeypatch.delitem(sys.modules, "trialenvs")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.delitem(__import__("gymnasium").registry, "TrialCart-v0")
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train_cli.main(["--resume", str(run), "--total-steps", "256"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    usage_error(info.value.code, err[0], "'trialenvs'", "--env", "stored")  # the module; the run's stored setting
    with exits(1, "trialenvs:TrialCart-v0", "'trialenvs'"):
        evaluate_cli.main(["--checkpoint", str(run), "--episodes", "2"])


def test_a_resume_with_nothing_to_do_changes_no_file(tmp_path, capsys):
    run_dir = tmp_path / "run"
    small = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--device", "cpu", "--checkpoint-every",
             "1", "--backend", "sync"]
    train_cli.main([*small, "--total-steps", "32", "--run-dir", str(run_dir)])
    train_cli.main(["--resume", str(run_dir), "--total-steps", "48"])  # ckpt 3 holds the larger total, 2 the first

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    before = files()
    assert "not identical to an uninterrupted one" in capsys.readouterr().err  # CartPole has no env state to save
    older = run_dir.resolve() / "checkpoints" / "ckpt_00000002.pt"
    train_cli.main(["--resume", str(older)])
    out, err = capsys.readouterr()
    assert "nothing to do" in err and "set aside" not in err and "dropped" not in err
    assert "not identical" not in err  # how a resumed run would differ: no run, no difference
    threads = [line for line in err.splitlines() if line.startswith(("threads:", "thread limits:"))]
    assert len(threads) == 1 and threads[0].startswith("thread limits:"), threads  # the layout's; no iteration to
    # plan threads for
    assert files() == before
    # what it printed goes on from the checkpoint it described, not from the run's newest
    lines = printed_lines(out)
    assert "(2 iterations" in lines["run directory"] and lines["checkpoint"] == str(older)
    assert shlex.split(lines["evaluate"])[-1] == str(older)
    assert shlex.split(lines["train longer"])[-3:] == [str(older), "--total-steps", "64"]
    train_cli.main(["--resume", str(run_dir), "--total-steps", "16"])  # fewer steps than the run has made
    err = capsys.readouterr().err
    names(err, "iteration 3", "--total-steps 16", "nothing to do")  # where it is, and the total asked for
    assert "it/s" not in err and "3it" not in err  # no progress bar for no progress
    train_cli.main(["--resume", str(run_dir)])  # the newest: the run directory stands for it
    assert shlex.split(printed_lines(capsys.readouterr().out)["evaluate"])[-1] == str(run_dir.resolve())
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "ckpt_00000003.pt"


@pytest.mark.parametrize("empty", ["", "  "])
def test_resume_of_an_empty_string_is_refused_not_a_new_run(tmp_path, empty, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a new run's directory would go
    with exits(2, "--resume", capsys=capsys):
        parse_args(["--resume", empty, "--total-steps", "64"])
    assert not list(tmp_path.iterdir())


def test_setting_checkpoints_aside_keeps_the_pointers_true(tmp_path):
    for i in (1, 2, 3):
        checkpoints.save_in_run_dir(tmp_path, {"iteration": i}, i, keep=3)
    checkpoints.set_best(tmp_path, tmp_path / "checkpoints" / "ckpt_00000003.pt", {"val_return": 1.0}, keep=3)
    moved = checkpoints.set_aside_newer(tmp_path, 1)
    assert [p.name for p in moved] == ["ckpt_00000003.pt.orphaned", "ckpt_00000002.pt.orphaned"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt_00000001.pt"
    assert checkpoints.best_checkpoint(tmp_path) is None and not (tmp_path / "checkpoints" / "best").exists()
    checkpoints.set_aside_newer(tmp_path, 0)
    assert not (tmp_path / "checkpoints" / "latest").exists()  # nothing left to name


# ---------------------------------------------------------------------------- typos and TOML keys

@pytest.mark.parametrize("args, named, suggested", [
    (["-m", "trainer.train", "--num-evns", "8"], ["--num-evns", "8"], "--num-envs"),
    (["-m", "trainer.train", "--algo", "apx"], ["--algo", "apx", "ppo"], "apex"),  # and the choices
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--pick", "bset"], ["--pick", "bset"], "best"),
    (["-m", "trainer.export", "--checkpoint", "x", "--format", "onxx"], ["--format", "onxx"], "onnx"),
    (["-m", "trainer.evaluate", "--chekpoint", "x"], ["--chekpoint"], "--checkpoint"),  # the required flag
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--baselines", "lowest,fair_shre"], ["--baselines", "fair_shre",
                                                                                          "all", "none"], "fair_share"),
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--baselines", "fair_shre"], ["--baselines", "fair_shre"],
     "fair_share"),
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--episodes", "0"], ["--episodes", "0", "1"], None),
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--seed", "-1"], ["--seed", "-1", "0"], None),
    (["-m", "trainer.export", "--checkpoint", "x", "--atol", "0"], ["--atol", "0.0"], None),
    (["-m", "trainer.train", "--device", "cdua"], ["--device", "cdua", "cuda:N"], "cuda"),
    (["-m", "trainer.train", "--device", "gpu"], ["--device", "gpu", "cuda:N"], "cuda"),
    (["-m", "trainer.train", "--backend", "sycn"], ["--backend", "sycn", "serial", "ray"], "sync"),
    (["-m", "trainer.train", "--backend", "Async"], ["--backend", "Async"], "async"),  # case counts: not "sync"
    (["-m", "trainer.train", "--compile", "auot"], ["--compile", "auot", "off"], "auto"),
    (["-m", "trainer.train", "--config", settings_file("start_method_typo")], ["start_method", "spwan", "forkserver"],
     "spawn"),  # a key without a flag: named as its TOML file spells it
    (["-m", "trainer.train", "--backend", "device", "--overlap", "true"], ["--overlap", "true"], None),
    # no abbreviations: --envs would be taken as an abbreviation, and --total silently as --total-steps
    (["-m", "trainer.train", "--envs", "CartPole-v1"], ["--envs", "CartPole-v1"], "--env"),
    (["-m", "trainer.train", "--total", "4096"], ["--total", "4096"], "--total-steps"),
    (["-m", "trainer.evaluate", "--check", "x"], ["--check"], "--checkpoint"),
    (["-m", "trainer.evaluate", "--checkpoint", "x", "--epi", "2"], ["--epi", "2"], "--episodes"),
    # CleanRL's and Stable-Baselines3's names: ours, not the closest spelling (--learning-starts, an Ape-X setting)
    (["-m", "trainer.train", "--learning-rate", "3e-4"], ["--learning-rate"], "--lr"),
    (["-m", "trainer.train", "--total-timesteps", "4096"], ["--total-timesteps"], "--total-steps"),
    (["-m", "trainer.train", "--config", settings_file("n_envs")], ["n_envs"], "num_envs"),
    # another algorithm's setting is named as such, not checked against this one's defaults first
    (["-m", "trainer.train", "--replay-capacity", "1000"], ["--replay-capacity", "--algo apex"], None),
    (["-m", "trainer.train", "--backend", "ray", "--ray-address", "nonsense"], ["--ray-address", "nonsense",
                                                                               "HOST:PORT", "auto"], None),
])
def test_typos_get_a_did_you_mean_before_torch_loads(tmp_path, args, named, suggested):
    done = command(["-X", "importtime", *args], tmp_path)
    line = usage_error(done.returncode, done.stderr, *named)
    assert suggestion(line) == suggested and line.count("--help") == 1  # pointed to --help, once
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "tensordict", "ray"}


@pytest.mark.parametrize("module", ["trainer.evaluate", "trainer.export"])
@pytest.mark.parametrize("out, which", [("a_file", "it"), ("a_file/sub", "a_file")])
def test_an_output_directory_that_is_a_file_is_a_usage_error_before_torch_loads(tmp_path, module, out, which):
    (tmp_path / "a_file").write_text("")
    done = command(["-X", "importtime", "-m", module, "--checkpoint", ".", "--out", out], tmp_path)
    line = usage_error(done.returncode, done.stderr, "--out", out)
    if which != "it":  # the file in the way, named apart from the path given
        names(line.replace(out, "", 1), which)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "tensordict", "ray"}




def test_toml_keys_unknown_or_twice_are_one_line_errors(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("num-env = 8\n")
    done = command(["-m", "trainer.train", "--config", str(toml)], tmp_path)
    line = usage_error(done.returncode, done.stderr, toml, "num-env")
    assert suggestion(line) == "num-envs" and done.stderr.count("--help") == 1
    toml.write_text("num-envs = 8\nnum_envs = 4\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(toml)])
    for body, named in [('resume = "runs/x"\n', ["resume", "--resume"]),  # a key that is a flag only
                        ("total-steps = 1e6\n", ["total_steps", "1000000.0", "1_000_000"])]:  # the example is the
        toml.write_text(body)                                                               # value, as TOML
        done = command(["-m", "trainer.train", "--config", str(toml)], tmp_path)           # writes an integer
        usage_error(done.returncode, done.stderr, toml, *named)


def test_an_env_kwargs_table_in_toml_is_the_env_kwargs_flag(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('num_envs = 8\n[env_kwargs]\nnum_users = 6\nnoise_std = 0.25\ntrace_split = "all"\n'
                    'reveal_hidden_state = true\nbitrates_mbps = [5, 10, 20.5]\n')
    table = parse_args(["--config", str(toml)]).config
    flags = parse_args(["--num-envs", "8", "--env-kwargs", "num_users=6,noise_std=0.25,trace_split=all,"
                        "reveal_hidden_state=true,bitrates_mbps=[5,10,20.5]"]).config
    assert dataclasses.replace(table, config="") == flags
    assert table.env_options == {"num_users": 6, "noise_std": 0.25, "trace_split": "all",
                                 "reveal_hidden_state": True, "bitrates_mbps": (5, 10, 20.5)}
    # --env-kwargs over the file's table: key by key, the flag's winning, the file's others kept
    over = parse_args(["--config", str(toml), "--env-kwargs", "num_users=4,churn=0.05"]).config
    assert over.env_options == {**table.env_options, "num_users": 4, "churn": 0.05}
    for body, named in [("[env_kwargs]\nnum_users = 6\ntotal_steps = 64\n",  # a key meant for the trainer
                         ["[env_kwargs]", "total_steps"]),
                        ('[env_kwargs]\ntrace_split = "a,b"\n',  # what the key=value text cannot hold
                         ["[env_kwargs]", 'trace_split = "a,b"']),
                        ("[env_kwargs]\nbitrates_mbps = [[6]]\n", ["[env_kwargs]", "bitrates_mbps = [[6]]"]),
                        ('[env_kwargs]\nnum_users = "4"\n',  # TOML's text stays text: no silent number
                         ["--env-kwargs", 'num_users="4"']),
                        ("[env_kwargs]\nnum_users = [6]\n",  # an array where the env takes a number: the env says
                         ["--env-kwargs", "num_users=[6]"])]:
        toml.write_text(body)
        with exits(2, toml, *named, capsys=capsys):
            parse_args(["--config", str(toml)])


def test_a_resume_checks_new_env_arguments_against_the_run_before_reading_their_files(tmp_path, capsys):
    """``--resume RUN --env-kwargs capacity_trace=/tmp`` on a run without traces would change the run: said so,
    not a parse error of some file in /tmp; a syntax error is still the flag's."""
    run_dir = tmp_path / "run"
    train_cli.main(["--num-envs", "2", "--num-steps", "16", "--total-steps", "32", "--device", "cpu", "--run-dir",
                    str(run_dir)])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a trace\n")
    capsys.readouterr()
    for given in [f"capacity_trace={tmp_path / 'notes'}", "bitrates_mbps=[5,10"]:
        with pytest.raises(SystemExit) as refused:
            train_cli.main(["--resume", str(run_dir), "--env-kwargs", given])
        line = usage_error(refused.value.code, capsys.readouterr().err, "--env-kwargs", given)
        if given.startswith("capacity_trace"):  # what the run has (the env's default), not a file under notes/
            not_names(names(line, "default"), "todo.txt")


def test_a_resume_may_restate_the_runs_env_arguments_but_not_change_them():
    from envs.settings import ConfigError
    from trainer.config import moved_env_files
    assert moved_env_files("num_users=6", "num_users=6") == "num_users=6"
    assert moved_env_files("", "num_users=8", {"num_users": 8}) == "num_users=8"  # VR-edge's default, restated
    ladder = {"bitrates_mbps": (5.0, 10.0)}
    assert moved_env_files("", "bitrates_mbps=[5,10]", ladder) == "bitrates_mbps=[5,10]"  # a list, restated
    for stored, given, has in [("num_users=6", "num_users=5", "num_users=6"),
                               ("", "num_users=5", "default"),  # the env's default
                               ("bitrates_mbps=[5,10]", "bitrates_mbps=[5,20]", "bitrates_mbps=[5,10]")]:
        with raises(ConfigError, "--env-kwargs", given, has, key="env_kwargs"):
            moved_env_files(stored, given, {"num_users": 8, **ladder})


def test_batching_takes_the_trainer_spelling(tmp_path):
    plan = command(["-m", "trainer.batching", "--num-envs", "64", "--num-steps", "2048", "--minibatch-size", "4096"],
                   tmp_path).stdout
    assert plan == "131072 transitions per rollout -> 32 minibatches of 4096\n"
    planned = [command(["-m", "trainer.batching", "--num-envs", "1", "--num-steps", "64", *size], tmp_path).stdout
               for size in ([], ["--minibatch-size", "0"])]  # 0: the planner picks
    assert planned[0] == planned[1] == "64 transitions per rollout -> 1 minibatch of 64\n"
    refused = command(["-m", "trainer.batching", "--num-envs", "0", "--num-steps", "8"], tmp_path)
    usage_error(refused.returncode, refused.stderr, "--num-envs", "0", "1")


def test_a_total_that_is_not_whole_iterations_is_said_not_silently_rounded(tmp_path, capsys):
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "16", "--total-steps", "150",
                    "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    printed = capsys.readouterr()
    names(printed.err, "--total-steps 150", "64 env steps", "128 env steps")  # asked, an iteration's, made
    assert "(2 iterations, 128 env steps)" in printed.out
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "4", "--num-steps", "16", "--total-steps", "128",
                    "--device", "cpu", "--run-dir", str(tmp_path / "whole")])
    not_names(capsys.readouterr().err, "--total-steps")  # a whole number: no note


# ---------------------------------------------------------------------------- Ctrl-C while starting

@pytest.mark.parametrize("delay", [0.2, 0.6, 1.2])
def test_ctrl_c_while_torch_loads_is_one_line(tmp_path, delay):
    """A Ctrl-C during the first seconds (the command line checked, torch and the rest loading) says one line and
    exits 130, with no import traceback; the moment is the test's, not the trainer's."""
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "trainer.train", "--run-dir", str(tmp_path / "run"),
                                "--total-steps", "8192"], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    if process.returncode == 0:
        pytest.skip("the run finished before the signal (a fast machine)")
    assert process.returncode == 130 and "Traceback" not in err, err[-2000:]
    said = [line for line in err.splitlines() if "SIGINT" in line or "interrupted" in line]
    assert len(said) == 1 and ("nothing to save" in said[0] or "stopped by SIGINT" in said[0]), err[-2000:]


EXPORT_STOPPED = "nothing was written (the previous export, if any, is unchanged)"


@pytest.mark.parametrize("command_line, delay, said", [
    ("export", None, EXPORT_STOPPED), pytest.param("export", 0.8, EXPORT_STOPPED, marks=pytest.mark.slow),
    # raised inside torch's C++ initialisation, the signal aborted the process (SIGABRT, a pybind11 trace)
    ("evaluate", None, "nothing was evaluated; run the same command again"),
    ("distill", None, "nothing was written; run the same command again"),
])
def test_ctrl_c_while_a_command_loads_torch_is_one_line(tmp_path, command_line, delay, said):
    """``trainer.export``, ``trainer.evaluate`` or ``trainer.distill`` stopped while torch and the rest load
    (``delay`` None: as soon as torch's library is mapped, whatever the machine's speed; else after ``delay``
    seconds): one line, exit status 130, no import traceback, nothing written."""
    import signal
    import time

    run_dir = tmp_path / "run"
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--total-steps", "32",
                    "--device", "cpu", "--run-dir", str(run_dir)])
    where = [str(run_dir)] if command_line == "distill" else ["--checkpoint", str(run_dir)]
    process = subprocess.Popen([sys.executable, "-m", f"trainer.{command_line}", *where],
                               cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if delay is None:
        _wait_until_torch_loads(process)
    else:
        time.sleep(delay)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 130 and "Traceback" not in err, err[-2000:]
    last = err.rstrip().splitlines()[-1]
    assert last.startswith(("SIGINT while starting: ", "stopped by SIGINT: ")) and last.endswith(said), err[-2000:]
    assert not (run_dir / "export").exists() and not (run_dir / "evaluation.json").exists()


def _wait_until_torch_loads(process: subprocess.Popen) -> None:
    """Return once ``process`` has mapped torch's C++ library (its import has begun, and lasts about a second);
    polled every 2 ms, for up to 60 s."""
    import time

    maps, deadline = Path(f"/proc/{process.pid}/maps"), time.monotonic() + 60
    while "libtorch" not in maps.read_text():
        assert process.poll() is None and time.monotonic() < deadline, "torch did not load"
        time.sleep(0.002)


def _signals_after(process: subprocess.Popen, line_start: str) -> int:
    """Read ``process``'s output up to the line that begins with ``line_start``, then send it SIGINT every 5 ms
    until it exits; return how many were sent. A process that hangs is killed after 120 s (the test then fails
    on its exit status)."""
    import signal
    import threading
    import time

    watchdog = threading.Timer(120, process.kill)
    watchdog.start()
    try:
        for line in process.stdout:
            if line.lstrip().startswith(line_start):
                break
        sent = 0
        while process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
                sent += 1
            time.sleep(0.005)
        return sent
    finally:
        watchdog.cancel()


@pytest.mark.parametrize("command_line", ["export", pytest.param("evaluate", marks=pytest.mark.slow)])
def test_stop_signals_once_a_command_wrote_its_files_leave_its_exit_status_0(tmp_path, command_line):
    """Signals every 5 ms from the ``wrote ...`` line to the end: the files are there, so there is nothing to
    stop and ``evaluate && export`` must go on (it said "nothing was written" and exited 130, or printed a
    traceback)."""
    run_dir = tmp_path / "run"
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--total-steps", "32",
                    "--device", "cpu", "--run-dir", str(run_dir)])
    extra = ["--format", "torchscript"] if command_line == "export" else ["--episodes", "2", "--reference", "none"]
    process = subprocess.Popen([sys.executable, "-m", f"trainer.{command_line}", "--checkpoint", str(run_dir),
                                *extra], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    sent = _signals_after(process, "wrote ")  # evaluate's and export's last lines name what they wrote
    rest = process.communicate(timeout=60)[0]
    assert sent > 0 and process.returncode == 0, (sent, process.returncode, rest[-2000:])
    assert "Traceback" not in rest and "Exception ignored" not in rest and "nothing was written" not in rest, rest


def test_stop_signals_while_a_finished_run_exits_leave_its_exit_status_0(tmp_path):
    """A scheduler's SIGTERM or a late Ctrl-C after the run finished has nothing to stop, even during the
    interpreter's exit, when Python has put the default handlers back: signals every 5 ms from the last printed
    line to the end must not turn a finished run into a failure (exit status 130) for ``train && evaluate``."""
    process = subprocess.Popen([sys.executable, "-m", "trainer.train", "--env", "CartPole-v1", "--num-envs", "2",
                                "--num-steps", "16", "--total-steps", "64", "--device", "cpu", "--run-dir",
                                str(tmp_path / "run")], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    sent = _signals_after(process, "train longer:")  # the last line a finished run prints
    err = process.communicate(timeout=60)[1]
    assert sent > 0 and process.returncode == 0 and "Traceback" not in err, (sent, process.returncode, err[-2000:])


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_one_episode_has_no_interval_and_its_json_is_still_json(tmp_path, capsys):
    """A single episode gives no confidence interval: ``null`` in the JSON (NaN is not JSON: ``jq`` refuses it),
    nothing after the mean in the table."""
    run_dir = tmp_path / "run"
    train_cli.main(["--num-envs", "2", "--num-steps", "16", "--total-steps", "32", "--device", "cpu", "--run-dir",
                    str(run_dir)])
    capsys.readouterr()
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "1", "--baselines", "fair_share", "--json"])
    out, table = capsys.readouterr()
    payload = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert payload["policy"]["reward_per_step_ci95"] is None and payload["gap_closed"]["ci95"] is None
    assert json.loads((run_dir / "evaluation.json").read_text(), parse_constant=pytest.fail) == payload
    assert "nan" not in table and "1 episode on held-out seeds" in table and "95% CI) of the gap" not in table, table


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_stop_says_the_same_before_and_in_the_first_iteration_and_names_paths_in_full(tmp_path, monkeypatch,
                                                                                      capsys, checkpoint):
    """Stopped before the first iteration or in it: one wording (SIGTERM and SIGINT said it two ways); after one:
    the checkpoint as an absolute path, as the resume command next to it (a relative --run-dir gave one of each)."""
    import signal

    monkeypatch.chdir(tmp_path)
    saved = Path("run/checkpoints/ckpt_00000001.pt") if checkpoint else None

    def stopped(*args, **kwargs):
        raise train_cli.TrainingStopped(signal.SIGTERM, Path("run"), 1 if checkpoint else 0, saved)

    monkeypatch.setattr(train_cli, "train", stopped)
    with pytest.raises(SystemExit) as exited:
        train_cli.main(["--run-dir", "run"])
    said = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 128 + signal.SIGTERM
    if checkpoint:
        assert said == [f"stopped by SIGTERM after iteration 1; checkpoint: {tmp_path / saved}",
                        f"resume:        {shlex.join([sys.executable, '-m', 'trainer.train', '--resume'])} "
                        f"{tmp_path / 'run'}"], said
    else:
        assert said == ["stopped by SIGTERM before the first iteration completed: nothing to save; run the same "
                        "command again"], said

    def interrupted(*args, **kwargs):  # before the first iteration
        raise KeyboardInterrupt("stopped by SIGINT")

    monkeypatch.setattr(train_cli, "train", interrupted)
    with pytest.raises(SystemExit):
        train_cli.main(["--run-dir", "run"])
    assert capsys.readouterr().err.strip() == "stopped by SIGINT " + train_cli.NOTHING_TO_SAVE


def test_the_evaluation_header_names_the_run_env_arguments(tmp_path, capsys):
    """The episodes are played with the run's env arguments: the table's header says which (it named the env
    alone, as if its defaults were played)."""
    run_dir = tmp_path / "run"
    train_cli.main(["--num-envs", "2", "--num-steps", "16", "--total-steps", "32", "--device", "cpu", "--run-dir",
                    str(run_dir), "--env-kwargs", "num_users=3,bitrates_mbps=[8,16,32,64]"])
    capsys.readouterr()
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "1", "--baselines", "none", "--reference", "none"])
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("VREdge-v0 (num_users=3,bitrates_mbps=[8,16,32,64]): 1 episode on held-out seeds"), \
        header


@pytest.mark.parametrize("delay, signum", [pytest.param(0.0, 2, marks=pytest.mark.slow), (1.5, 2),
                                           pytest.param(1.5, 15, marks=pytest.mark.slow)])  # first episodes; later
def test_ctrl_c_during_an_evaluation_is_one_line(tmp_path, delay, signum):
    """``trainer.evaluate`` stopped by Ctrl-C or SIGTERM once the policy is loaded: one line, exit status 128 + the
    signal, no traceback, no results written, nor the ``--out`` folder it would have made. (A signal during torch's
    import is another test's subject; the signal waits for the "loaded" line, whose time a loaded machine
    stretches.)"""
    import signal
    import time

    run_dir = tmp_path / "run"
    train_cli.main(["--num-envs", "2", "--num-steps", "16", "--total-steps", "32", "--device", "cpu", "--run-dir",
                    str(run_dir)])
    out = ["--out", str(tmp_path / "new" / "out")] if signum == 2 else []  # (SIGTERM: into the run, as by default)
    process = subprocess.Popen([sys.executable, "-m", "trainer.evaluate", "--checkpoint", str(run_dir), "--episodes",
                                "500", *out], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    before = []
    while (line := process.stderr.readline()) and not line.startswith("loaded "):
        before.append(line)
    time.sleep(delay)
    process.send_signal(signum)
    err = "".join(before) + process.communicate(timeout=120)[1]
    assert process.returncode == 128 + signum and "Traceback" not in err, err[-2000:]
    assert err.rstrip().splitlines()[-1] == (f"stopped by {signal.Signals(signum).name}: the evaluation did not "
                                             "finish (its results are written once every episode is played)"), \
        err[-2000:]
    assert not (run_dir / "evaluation.json").exists() and not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------- a reader of stdout that has gone

def _with_stdout_closed(args: list[str], cwd: Path, buffered: bool) -> subprocess.CompletedProcess:
    """``python ARGS`` whose standard output is a pipe closed before it writes a byte (``| head -1`` once head has
    its line); ``buffered``: stdout buffered as Python buffers a pipe (a closed reader is met at exit, or once the
    buffer fills), else every write met at once (``PYTHONUNBUFFERED``, set in some shells and CI). The environment
    is this process's otherwise (its PYTHONPATH: the code under test)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | ({} if buffered else
                                                                             {"PYTHONUNBUFFERED": "1"})
    process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.communicate(timeout=300)[1]
    return subprocess.CompletedProcess(process.args, process.returncode, "", err)


def _quiet(done: subprocess.CompletedProcess) -> None:
    """The command ended as a closed pipe ends a tool: exit status 141 (128 + SIGPIPE), no traceback, nor Python's
    "Exception ignored" at exit."""
    assert done.returncode == 141, (done.returncode, done.stderr[-2000:])
    assert not mentions(done.stderr, "Traceback") and not mentions(done.stderr, "BrokenPipeError"), done.stderr


@pytest.mark.parametrize("buffered", [True, False])
def test_a_closed_stdout_ends_training_quietly_with_the_run_saved(tmp_path, buffered):
    """Issue 61: ``python -m trainer.train ... | head -1`` ended in a BrokenPipeError traceback (exit status 1),
    or, stdout buffered, Python's "Exception ignored" (120)."""
    run_dir = tmp_path / "run"
    _quiet(_with_stdout_closed(["-m", "trainer.train", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps",
                                "16", "--total-steps", "32", "--device", "cpu", "--run-dir", str(run_dir)], tmp_path,
                               buffered))
    assert checkpoints.checkpoint_files(run_dir)  # saved before a word was said


@pytest.mark.parametrize("buffered", [True, False])
def test_a_closed_stdout_ends_an_evaluation_quietly_its_json_and_plot_of_one_evaluation(tmp_path, buffered):
    """Issue 61: a closed stdout was a BrokenPipeError traceback, and where it was met after evaluation.json was
    replaced (the "replaced the previous" line), the new JSON stood beside the old plot. Now both are written
    before a word is said: buffered, the command meets the closed pipe at its end, both files new; unbuffered, at
    the table's first line, both files the earlier evaluation's."""
    pytest.importorskip("matplotlib")  # (without it there is no plot to keep beside the JSON)
    run_dir = tmp_path / "run"
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--total-steps", "32",
                    "--device", "cpu", "--run-dir", str(run_dir)])
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "1"])
    files = [run_dir / "evaluation.json", run_dir / "evaluation.png"]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    _quiet(_with_stdout_closed(["-m", "trainer.evaluate", "--checkpoint", str(run_dir), "--episodes", "2"], tmp_path,
                               buffered))
    replaced = [(f.stat().st_ino, f.stat().st_mtime_ns) != was for f, was in zip(files, before)]
    assert replaced == [buffered, buffered]
    assert json.loads(files[0].read_text())["episodes"] == (2 if buffered else 1)


def test_an_evaluation_whose_stdout_closes_after_the_table_leaves_its_json_and_plot_together(tmp_path, monkeypatch,
                                                                                            capsys):
    """Where exactly the closed pipe is met: at the "replaced the previous evaluation.json" line, which came between
    the JSON and the plot (a new JSON beside an old plot); now after both."""
    pytest.importorskip("matplotlib")
    run_dir = tmp_path / "run"
    train_cli.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--total-steps", "32",
                    "--device", "cpu", "--run-dir", str(run_dir)])
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "1"])
    png = run_dir / "evaluation.png"
    was = (png.stat().st_ino, png.stat().st_mtime_ns)

    class ClosedAtReplaced:  # a pipe whose reader goes once the table is read
        def write(self, text: str) -> int:
            if "replaced the previous" in text:
                raise BrokenPipeError(32, "Broken pipe")
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("sys.stdout", ClosedAtReplaced())
    with pytest.raises(SystemExit) as ended:
        evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "2"])
    assert ended.value.code == 141
    assert json.loads((run_dir / "evaluation.json").read_text())["episodes"] == 2
    assert (png.stat().st_ino, png.stat().st_mtime_ns) != was  # the plot of these results, beside them


def test_a_broken_pipe_that_is_not_stdouts_is_still_an_error(tmp_path):
    """A worker's pipe that breaks is a failure to say, not a reader of stdout that has gone: stdout open, the
    error goes on as it was."""
    program = ("from trainer.arguments import ending_quietly_when_stdout_closes as quiet\n"
               "@quiet()\n"
               "def main():\n"
               "    print('a line')\n"
               "    raise BrokenPipeError(32, 'a worker has gone')\n"
               "main()\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and done.stdout == "a line\n", done
    assert "BrokenPipeError: [Errno 32] a worker has gone" in done.stderr, done.stderr
