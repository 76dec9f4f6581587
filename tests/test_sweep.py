"""Sweeps (``python -m trainer.sweep``, issue 42): the TOML search space and its one-line errors, trials sampled as
the space says, pruning through reported validation returns, several processes on one study, a real SIGINT then
the same command again, and a real PostgreSQL server where one is installed."""

import dataclasses
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import psutil
import pytest
import torch
from optuna.trial import TrialState

import checkpoints
from tests.messages import names, not_names, one_line, raises, suggestion, usage_error
from trainer.experiments import study as study_module
from trainer.experiments.space import SearchSpace, SpaceError
from trainer.experiments.study import Sweep, opened_study, run_sweep
from trainer.experiments.study_report import FEW_TRIALS, env_steps_line, few_trials_caveat, report, trials_of
from trainer.flags import parse_args
from trainer.loop import train
from trainer.run_layout import Machine

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
CARTPOLE = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--backend", "sync", "--device", "cpu",
            "--eval-episodes", "2"]
SPACE = "[lr]\nlow = 1e-4\nhigh = 3e-3\nlog = true\n\n[ent-coef]\nlow = 0.0\nhigh = 0.02\n"
EPOCHS_AND_HIDDEN = '[epochs]\nlow = 2\nhigh = 8\nstep = 2\n\n[hidden]\nchoices = ["64,64", "32"]\n\n'
TIMING = {"sps"}


def space_file(tmp_path: Path, text: str, name: str = "space.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def read_space(path: Path, train_flags: list[str] = ()) -> SearchSpace:
    cli = parse_args(["--env", "CartPole-v1", *train_flags])
    return SearchSpace.read(path, cli.config, cli.given)


def sweep_command(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer.sweep", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finished(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def study_trials(folder: Path, name: str | None = None) -> list[optuna.trial.FrozenTrial]:
    storage = study_module.study_storage(f"sqlite:///{(folder / 'study.db').resolve()}")
    return optuna.load_study(study_name=name or folder.name, storage=storage).get_trials()


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def events(stderr: str, what: str) -> list[int]:
    """The trial numbers of the terminal's ``trial N: WHAT ...`` lines, in order."""
    return [int(line.split(":")[0].split()[1]) for line in stderr.splitlines()
            if line.startswith("trial ") and line.split(": ", 1)[1].startswith(what)]


# ---------------------------------------------------------------------------- the search space

def test_a_space_reads_log_ranges_integer_ranges_steps_and_choices(tmp_path):
    path = space_file(tmp_path, SPACE + EPOCHS_AND_HIDDEN + "[anneal-lr]\nchoices = [true, false]\n")
    dims = {d.name: d for d in read_space(path).dimensions}
    assert list(dims) == ["lr", "ent_coef", "epochs", "hidden", "anneal_lr"]
    assert (dims["lr"].low, dims["lr"].high, dims["lr"].log, dims["lr"].kind) == (1e-4, 3e-3, True, float)
    assert (dims["epochs"].low, dims["epochs"].high, dims["epochs"].step, dims["epochs"].kind) == (2, 8, 2, int)
    assert dims["anneal_lr"].choices == (True, False) and dims["hidden"].choices == ("64,64", "32")


BAD_SPACES = [  # (the file, the key its error names, other things it names)
    ("[lrr]\nlow = 1e-4\nhigh = 1e-3\n", "lrr", ()),  # unknown setting (did you mean lr?)
    ("lr = 0.001\n", "lr", ()),  # not a table
    ("[lr]\nlow = 1e-4\n", "lr", ()),  # neither a range nor choices
    ("[lr]\nlow = 1e-4\nhigh = 1e-3\nchoices = [1e-3]\n", "lr", ()),  # both
    ("[lr]\nlow = 1e-4\nhgih = 1e-3\n", "lr", ("hgih",)),  # a key of neither
    ("[lr]\nlow = 3e-3\nhigh = 1e-4\n", "lr", (0.003,)),  # low >= high
    ("[ent-coef]\nlow = 0.0\nhigh = 0.02\nlog = true\n", "ent-coef", ()),  # log with low <= 0
    ("[epochs]\nlow = 2.0\nhigh = 8\n", "epochs", ()),  # a float range for an int setting
    ("[epochs]\nchoices = [2, \"four\"]\n", "epochs", ("four",)),  # a choice of the wrong type
    ("[anneal-lr]\nlow = 0\nhigh = 1\n", "anneal-lr", ()),  # a range for a boolean
    ("[gamma]\nlow = 0.9\nhigh = 1.5\n", "gamma", (1.5,)),  # past the setting's declared limit (<= 1)
    ("[lr]\nlow = 0.0\nhigh = 0.1\n", "lr", (0.0,)),  # at the declared limit (> 0)
    ("[hidden]\nchoices = [\"64,64\", \"64;64\"]\n", "hidden", ("64;64",)),  # a choice the trainer refuses
    ("[n-step]\nlow = 1\nhigh = 5\n", "n-step", ("apex",)),  # a setting PPO does not read
    ("[env]\nchoices = [\"CartPole-v1\"]\n", "env", ()),  # not sampled
    ("[lr]\nlow = 1e-4\nhigh = 1e-3\nlog = true\nstep = 1e-4\n", "lr", ()),  # step and log
    ("[epochs]\nlow = 2\nhigh = 7\nstep = 2\n", "epochs", ()),  # not whole steps
    ("[ent-coef]\nlow = 0.0\nhigh = 0.1\n[ent_coef]\nlow = 0.0\nhigh = 0.2\n", "ent_coef", ()),  # twice
]


@pytest.mark.parametrize("text, key, things", BAD_SPACES, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_SPACES)])
def test_each_bad_space_is_one_line_naming_the_file_and_the_key(tmp_path, text, key, things):
    path = space_file(tmp_path, text)
    with raises(SpaceError, str(path), key, *things) as info:
        read_space(path)
    assert info.value.key == key


def test_an_unknown_setting_gets_the_closest_one_and_a_sampled_flag_may_not_be_given_too(tmp_path):
    with raises(SpaceError, "lrr") as info:
        read_space(space_file(tmp_path, "[lrr]\nlow = 1e-4\nhigh = 1e-3\n"))
    assert suggestion(str(info.value)) == "lr"
    with raises(SpaceError, "learning-rate") as info:  # CleanRL's name: ours, not Ape-X's learning-starts
        read_space(space_file(tmp_path, "[learning-rate]\nlow = 1e-4\nhigh = 1e-3\n"))
    assert suggestion(str(info.value)) == "lr"
    with raises(SpaceError, "replay-capacty") as info:  # Ape-X's replay-capacity: no help to PPO's trials
        read_space(space_file(tmp_path, "[replay-capacty]\nlow = 1000\nhigh = 10000\n"))
    assert suggestion(str(info.value)) is None
    with raises(SpaceError, "lr") as info:
        read_space(space_file(tmp_path, SPACE), ["--lr", "0.001"])
    assert info.value.key == "lr"


@pytest.mark.parametrize("text", ["", "[lr\nlow = 1"])
def test_an_empty_or_broken_file_is_one_line_naming_it(tmp_path, text):
    path = space_file(tmp_path, text)
    with raises(SpaceError, str(path)) as info:
        read_space(path)
    assert info.value.key == ""


def test_trials_sample_log_ranges_integers_and_choices_and_run_with_them(tmp_path):
    path = space_file(tmp_path, SPACE + EPOCHS_AND_HIDDEN)
    train_cli = parse_args(CARTPOLE + ["--total-steps", "320"])
    space = SearchSpace.read(path, train_cli.config, train_cli.given)
    sweep = Sweep(tmp_path / "sweep", "sqlite://", "s", 200, space, train_cli, eval_every=5)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    sampled = [space.sample(study.ask()) for _ in range(200)]
    lrs = [s["lr"] for s in sampled]
    assert all(1e-4 <= lr <= 3e-3 for lr in lrs)
    # log-uniform: half below the geometric mean of the ends (uniform would put 14% there)
    below = sum(lr < math.sqrt(1e-4 * 3e-3) for lr in lrs) / len(lrs)
    assert 0.4 < below < 0.6, below
    assert {s["epochs"] for s in sampled} == {2, 4, 6, 8} and all(type(s["epochs"]) is int for s in sampled)
    assert {s["hidden"] for s in sampled} == {"64,64", "32"}
    assert all(0.0 <= s["ent_coef"] <= 0.02 for s in sampled)
    cfg = sweep.trial_config(7, sampled[0])
    assert {k: cfg.to_dict()[k] for k in sampled[0]} == sampled[0]
    assert (cfg.run_dir, cfg.eval_every, cfg.env) == (str(tmp_path / "sweep" / "trial-0007"), 5, "CartPole-v1")


# ---------------------------------------------------------------------------- the command line

def sweep_usage(tmp_path: Path, args: list[str]) -> str:
    proc = sweep_command(args, tmp_path)
    status, _, err = finished(proc, 60)
    return usage_error(status, err)


def test_command_line_errors_are_one_line_before_anything_runs(tmp_path):
    space_file(tmp_path, "[lrr]\nlow = 1e-4\nhigh = 1e-3\n", "typo.toml")
    space_file(tmp_path, SPACE)
    line = names(sweep_usage(tmp_path, ["--space", "typo.toml", "--trials", "2", "--", *CARTPOLE]), "typo.toml", "lrr")
    assert suggestion(line) == "lr"
    sweep = ["--space", "space.toml", "--trials", "2", "--", *CARTPOLE]  # (CartPole: no VR-edge to import)
    names(sweep_usage(tmp_path, [*sweep, "--num-envs", "0"]), "--num-envs", 0)
    names(sweep_usage(tmp_path, [*sweep, "--run-dir", "x"]), "--run-dir", "--dir")
    names(sweep_usage(tmp_path, [*sweep, "--eval-every", "0"]), "--eval-every")
    names(sweep_usage(tmp_path, [*sweep, "--lr", "0.01"]), "space.toml", "lr")
    names(sweep_usage(tmp_path, ["--space", "space.toml", "--", *CARTPOLE]), "--trials")
    names(sweep_usage(tmp_path, ["--report", "--dir", "nowhere"]), "nowhere")
    # a train flag before the --: named, with where it goes
    line = names(sweep_usage(tmp_path, ["--space", "space.toml", "--trials", "2", "--total-steps", "256"]),
                 "--total-steps", "--")
    assert suggestion(line) is None
    # a typo of the sweep's own flag (Optuna's name): the sweep's flag, not "goes after --"
    line = names(sweep_usage(tmp_path, ["--space", "space.toml", "--n-trials", "2", "--", *CARTPOLE]), "--n-trials")
    assert suggestion(line) == "--trials"
    not_names(line, "--space")  # (it suggested "--trials --space --trials --trials" from an example command)
    assert not (tmp_path / "runs").exists()  # nothing written


# ---------------------------------------------------------------------------- the hook in train(), pruning

def test_on_iteration_true_ends_the_run_with_that_iteration_saved(tmp_path):
    cli = parse_args(CARTPOLE + ["--total-steps", "320", "--run-dir", str(tmp_path / "run")])
    seen = []
    summary = train(cli.config, progress=False, on_iteration=lambda row: seen.append(row["iteration"]) or
                    row["iteration"] == 3)
    assert seen == [1, 2, 3]
    assert (summary["iterations"], summary["finished"]) == (3, False)
    assert checkpoints.checkpoint_iteration(checkpoints.checkpoint_files(tmp_path / "run")[0]) == 3
    assert [r["iteration"] for r in metrics(tmp_path / "run")] == [1, 2, 3]


def tiny_sweep(tmp_path: Path, trials: int, pruner: str = "median", total_steps: int = 320,
               env: str = "CartPole-v1") -> Sweep:
    """CartPole trials of 20 iterations of 16 env steps, validated every 2 (at 32, 64, ... env steps)."""
    train_cli = parse_args(["--env", env, "--num-envs", "2", "--num-steps", "8"] + CARTPOLE[6:] +
                           ["--total-steps", str(total_steps), "--seed", "3"])
    space = SearchSpace.read(space_file(tmp_path, SPACE), train_cli.config, train_cli.given)
    folder = tmp_path / "sweep"
    return Sweep(folder, f"sqlite:///{folder / 'study.db'}", "tiny", trials, space, train_cli, eval_every=2,
                 pruner=pruner)


def test_a_trial_below_the_median_of_the_finished_ones_is_pruned_with_its_checkpoint(tmp_path):
    """Four finished trials that scored 1000 at every validation (CartPole's greedy policy scores tens early on):
    the fifth, real, trial is pruned at its second validation (the first the median pruner judges), its run
    stopped there with a checkpoint, and told PRUNED."""
    sweep = tiny_sweep(tmp_path, trials=5)
    study = opened_study(sweep)
    lr = optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)
    ent = optuna.distributions.FloatDistribution(0.0, 0.02)
    for _ in range(4):
        study.add_trial(optuna.trial.create_trial(
            params={"lr": 1e-3, "ent_coef": 0.01}, distributions={"lr": lr, "ent_coef": ent}, value=1000.0,
            intermediate_values={32 * k: 1000.0 for k in range(1, 11)}, user_attrs={"budget": 320, "env_steps": 320}))
    assert run_sweep(sweep, Machine(cores=1)) == 0
    said = io.StringIO()
    report(opened_study(sweep), sweep.dir, out=said)
    importances = next(line for line in said.getvalue().splitlines() if "importances.png" in line)
    # 4 completed trials (and 1 pruned)
    assert few_trials_caveat(4) in importances and few_trials_caveat(4) and not few_trials_caveat(FEW_TRIALS)
    trials = trials_of(opened_study(sweep))
    pruned = trials[4]
    assert pruned.state == TrialState.PRUNED
    assert sorted(pruned.intermediate_values) == [32, 64]  # reported at both validations, pruned at the second
    assert pruned.user_attrs["env_steps"] == 64
    run_dir = sweep.trial_dir(4)
    assert checkpoints.checkpoint_iteration(checkpoints.checkpoint_files(run_dir)[0]) == 4
    assert [r["iteration"] for r in metrics(run_dir)] == [1, 2, 3, 4]
    assert names(env_steps_line(opened_study(sweep)), "1,344", "1,600")  # 4 x 320 + 64 of 5 x 320
    best = parse_args(["--config", str(sweep.dir / "best.toml")]).config  # a fake trial: lr 1e-3
    assert (best.lr, best.algo_settings.ent_coef, best.env, best.num_steps, best.seed) == (1e-3, 0.01, "CartPole-v1",
                                                                                           8, 3)
    assert (sweep.dir / "history.png").stat().st_size > 0 and (sweep.dir / "importances.svg").stat().st_size > 0


def test_a_trial_that_fails_is_told_fail_and_named_and_the_sweep_goes_on(tmp_path, capsys):
    sweep = tiny_sweep(tmp_path, trials=2, env="tests.factories:Exploding-v0")  # each env raises on its 40th step
    assert run_sweep(sweep, Machine(cores=1)) == 1
    trials = trials_of(opened_study(sweep))
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all(names(t.user_attrs["error"], "simulator exploded") for t in trials)
    said = capsys.readouterr().err
    assert events(said, "failed") == [0, 1] and events(said, "starts") == [0, 1]


def test_a_trial_left_running_is_taken_over_only_when_its_claim_is_stale(tmp_path, capsys):
    """A trial RUNNING in the study whose claim is held by a live process (here, this one) is that process's: the
    sweep leaves it, and stops, the study holding --trials trials. Once its claim's process is gone (a kill -9),
    the same sweep takes the trial over: the same trial number, run once, complete."""
    sweep = tiny_sweep(tmp_path, trials=1, total_steps=64)
    study = opened_study(sweep)
    left = study.ask()
    sweep.space.sample(left)
    claim = sweep.dir / study_module.CLAIMS / "trial-0000"
    with checkpoints.RunDirLock(claim):  # a live holder
        assert run_sweep(sweep, Machine(cores=1)) == 0
        assert [t.state for t in trials_of(opened_study(sweep))] == [TrialState.RUNNING]
    code = f"import checkpoints, os; checkpoints.RunDirLock({str(claim)!r}).acquire(); os._exit(9)"
    assert subprocess.run([sys.executable, "-c", code], env=ENV).returncode == 9  # killed: its lock stays, stale
    capsys.readouterr()
    assert run_sweep(sweep, Machine(cores=1)) == 0
    assert [(t.number, t.state) for t in trials_of(opened_study(sweep))] == [(0, TrialState.COMPLETE)]
    assert events(capsys.readouterr().err, "starts") == [0]  # (no checkpoint to resume from: started afresh)


@pytest.mark.parametrize("storage_in_the_folder", [True, False])
def test_a_trial_asked_but_never_claimed_is_taken_over_where_every_asker_shares_the_folder(tmp_path, capsys,
                                                                                          storage_in_the_folder):
    """A sweep killed (kill -9) between asking the study for a trial and claiming it leaves the trial RUNNING with no
    claim. With the study's SQLite file in the sweep's folder, every asker asks under the folder's lock, so the
    same command takes the trial over; a study stored elsewhere may have an asker in that moment on another
    machine, so its unclaimed trial is left alone."""
    sweep = tiny_sweep(tmp_path, trials=1, total_steps=64)
    if not storage_in_the_folder:
        sweep = dataclasses.replace(sweep, storage=f"sqlite:///{tmp_path / 'elsewhere.db'}")
    opened_study(sweep).ask()  # the asker is gone before its claim
    assert run_sweep(sweep, Machine(cores=1)) == 0
    trials = trials_of(opened_study(sweep))
    if storage_in_the_folder:
        assert [(t.number, t.state) for t in trials] == [(0, TrialState.COMPLETE)]
        assert trials[0].user_attrs["run_dir"] == str(sweep.trial_dir(0).resolve())
        assert events(capsys.readouterr().err, "starts") == [0]
        (tmp_path / "plain").mkdir()
        uninterrupted = tiny_sweep(tmp_path / "plain", trials=1, total_steps=64)
        assert run_sweep(uninterrupted, Machine(cores=1)) == 0
        assert trials[0].params == trials_of(opened_study(uninterrupted))[0].params  # sampled as it would have been
    else:
        assert [(t.number, t.state) for t in trials] == [(0, TrialState.RUNNING)]
        assert not sweep.trial_dir(0).exists()


def test_a_validation_checkpointed_but_never_reported_reaches_the_study_on_resume(tmp_path):
    """Killed between a validation's checkpoint and its report to the study, a trial resumes past that validation:
    the resume reports it from the run's metrics (the trial's value is the best of them all, the pruner sees it)."""
    sweep = tiny_sweep(tmp_path, trials=1, total_steps=64)  # validations at 32 and 64 env steps
    trial = opened_study(sweep).ask()
    cfg = sweep.trial_config(0, sweep.space.sample(trial))
    train(cfg, progress=False, machine=Machine(cores=1), on_iteration=lambda row: row["iteration"] == 2)  # (killed)
    assert [r["env_steps"] for r in metrics(sweep.trial_dir(0)) if "val_return" in r] == [32]
    assert run_sweep(sweep, Machine(cores=1)) == 0
    [done] = trials_of(opened_study(sweep))
    assert done.state == TrialState.COMPLETE and sorted(done.intermediate_values) == [32, 64]
    validated = {r["env_steps"]: r["val_return"] for r in metrics(sweep.trial_dir(0)) if "val_return" in r}
    assert done.intermediate_values == validated and done.value == max(validated.values())


@pytest.mark.slow
def test_with_no_pruner_every_trial_runs_to_its_end(tmp_path):
    sweep = tiny_sweep(tmp_path, trials=5, pruner="none", total_steps=128)
    study = opened_study(sweep)
    lr = optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)
    for _ in range(4):
        study.add_trial(optuna.trial.create_trial(params={"lr": 1e-3}, distributions={"lr": lr}, value=1000.0,
                                                  intermediate_values={32 * k: 1000.0 for k in range(1, 5)}))
    assert run_sweep(sweep, Machine(cores=1)) == 0
    last = trials_of(opened_study(sweep))[4]
    assert last.state == TrialState.COMPLETE and sorted(last.intermediate_values) == [32, 64, 96, 128]
    assert last.value == max(last.intermediate_values.values())


# ---------------------------------------------------------------------------- several processes, one study

@pytest.mark.slow
def test_two_processes_on_one_sqlite_study_run_exactly_n_trials_none_twice(tmp_path):
    space_file(tmp_path, SPACE)
    args = ["--space", "space.toml", "--trials", "4", "--dir", "sweep", "--", *CARTPOLE, "--total-steps", "320"]
    procs = [sweep_command(args, tmp_path) for _ in range(2)]
    ended = [finished(p) for p in procs]
    assert [status for status, _, _ in ended] == [0, 0], [err[-2000:] for _, _, err in ended]
    started = sorted(n for _, _, err in ended for n in events(err, "starts"))
    assert started == [0, 1, 2, 3]  # each trial started by one process, once
    trials = study_trials(tmp_path / "sweep")
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(4)]
    assert sorted(p.name for p in (tmp_path / "sweep").glob("trial-*")) == [f"trial-{n:04d}" for n in range(4)]
    for n in range(4):  # trained once: each iteration logged once
        assert [r["iteration"] for r in metrics(tmp_path / "sweep" / f"trial-{n:04d}")] == list(range(1, 11))
    status, out, err = finished(sweep_command(["--report", "--dir", "sweep"], tmp_path), 120)
    assert status == 0, err
    assert len([line for line in out.splitlines() if "COMPLETE" in line]) == 4


@pytest.mark.slow
def test_jobs_run_trials_side_by_side_with_their_output_in_each_trial_log(tmp_path):
    space_file(tmp_path, SPACE)
    proc = sweep_command(["--space", "space.toml", "--trials", "3", "--jobs", "2", "--dir", "sweep", "--", *CARTPOLE,
                          "--total-steps", "320"], tmp_path)
    status, out, err = finished(proc)
    assert status == 0, err[-2000:]
    assert sorted(events(err, "starts")) == [0, 1, 2] and sorted(events(err, "finished")) == [0, 1, 2]
    assert "layout:" not in err  # each training's own lines are in its log
    for n in range(3):
        assert names((tmp_path / "sweep" / f"trial-{n:04d}" / "train.log").read_text(), "layout:")
    assert [t.state for t in study_trials(tmp_path / "sweep")] == [TrialState.COMPLETE] * 3


# ---------------------------------------------------------------------------- Ctrl-C, then the same command

VR_SWEEP = ["--space", "space.toml", "--trials", "3", "--dir", "sweep", "--", "--env", "VREdge-v0", "--num-envs", "4",
            "--num-steps", "16", "--total-steps", str(4 * 16 * 12), "--eval-every", "3", "--eval-episodes", "2",
            "--device", "cpu", "--seed", "5", "--env-kwargs", "num_users=3,max_steps=40"]


def final_weights(run_dir: Path) -> dict:
    _, state, _ = checkpoints.latest_loadable(run_dir)
    return state["model"]


@pytest.mark.slow
def test_a_sigint_keeps_finished_trials_and_the_same_command_resumes_the_stopped_one_exactly(tmp_path):
    space_file(tmp_path, SPACE)
    reference = tmp_path / "reference"
    reference.mkdir()
    space_file(reference, SPACE)
    status, _, err = finished(sweep_command(VR_SWEEP, reference))
    assert status == 0, err[-2000:]

    proc = sweep_command(VR_SWEEP, tmp_path, start_new_session=True)
    second = tmp_path / "sweep" / "trial-0001" / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not second.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    status, out, err = finished(proc)
    assert status == 128 + signal.SIGINT, err[-2000:]
    assert "Traceback" not in err and "resume:" in out
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    states = [t.state for t in study_trials(tmp_path / "sweep")]
    assert states == [TrialState.COMPLETE, TrialState.RUNNING], states
    first_rows = (tmp_path / "sweep" / "trial-0000" / "metrics.jsonl").read_bytes()

    status, _, err = finished(sweep_command(VR_SWEEP, tmp_path))
    assert status == 0, err[-2000:]
    assert events(err, "resumes") == [1] and events(err, "starts") == [2]  # trial 0 is not run again
    assert (tmp_path / "sweep" / "trial-0000" / "metrics.jsonl").read_bytes() == first_rows
    ours, theirs = study_trials(tmp_path / "sweep"), study_trials(reference / "sweep")
    assert [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in ours] == \
           [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in theirs]
    for n in range(3):
        run_dir = f"sweep/trial-{n:04d}"
        assert metrics(tmp_path / run_dir) == metrics(reference / run_dir), run_dir
        a, b = final_weights(tmp_path / run_dir), final_weights(reference / run_dir)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), run_dir


# ---------------------------------------------------------------------------- PostgreSQL, a real server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    """A throwaway PostgreSQL server on 127.0.0.1 (initdb, pg_ctl and postgres on the PATH), its URL; run as the
    ``postgres`` user where the tests run as root (initdb refuses root). Skipped, with the reason, where none
    can be started."""
    tools = [t for t in ("initdb", "pg_ctl", "postgres") if shutil.which(t) is None]
    if tools:
        pytest.skip(f"no PostgreSQL server here ({', '.join(tools)} not on the PATH)")
    as_user = []
    base = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root, and no runuser to start PostgreSQL as another user (initdb refuses root)")
        try:
            shutil.chown(base, "postgres")
        except (LookupError, OSError) as e:
            pytest.skip(f"running as root, and no postgres user to start PostgreSQL as: {e}")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", _free_port()
    made = subprocess.run([*as_user, "initdb", "-D", str(data), "-U", "sweep", "--auth=trust"], capture_output=True,
                          text=True)
    if made.returncode:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"initdb failed: {made.stderr.strip().splitlines()[-1:]}")
    started = subprocess.run([*as_user, "pg_ctl", "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                              f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start"],
                             capture_output=True, text=True)
    if started.returncode:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"the PostgreSQL server did not start: {started.stderr.strip()[-300:]}")
    try:
        yield f"postgresql://sweep@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, "pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_sweep_on_a_postgresql_study(tmp_path, postgres_url):
    space_file(tmp_path, SPACE)
    args = ["--space", "space.toml", "--trials", "2", "--dir", "sweep", "--storage", postgres_url, "--study", "pg",
            "--", *CARTPOLE, "--total-steps", "320"]
    status, out, err = finished(sweep_command(args, tmp_path))
    assert status == 0, err[-2000:]
    assert not (tmp_path / "sweep" / "study.db").exists()  # the study is in the server
    trials = optuna.load_study(study_name="pg", storage=study_module.study_storage(postgres_url)).get_trials()
    assert [(t.number, t.state) for t in trials] == [(0, TrialState.COMPLETE), (1, TrialState.COMPLETE)]
    status, out, err = finished(sweep_command(["--report", "--dir", "sweep", "--storage", postgres_url, "--study",
                                               "pg"], tmp_path), 120)
    assert status == 0 and len([line for line in out.splitlines() if "COMPLETE" in line]) == 2, err


def test_a_database_that_cannot_be_opened_is_one_line_naming_it_without_its_password(tmp_path):
    url = f"postgresql://sweep:secret@127.0.0.1:{_free_port()}/postgres"
    with raises(study_module.StorageError, "127.0.0.1") as info:
        study_module.study_storage(url)
    assert "secret" not in str(info.value)
    one_line(str(info.value))
