"""--eval-every: validation episodes disjoint from training and test seeds, the best checkpoint and its pointer."""

import functools
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import checkpoints
import envs
from collectors.seeding import env_seeds
from tests.messages import mentions, names, printed_lines, raises
from trainer import train as train_cli
from trainer.evaluation import (
    evaluation_seeds,
    paired_difference,
    policy_actions,
    run_episodes,
    summarize,
    validation_seeds,
)
from trainer.evaluation.servable import LOST_IN_MOST_EPISODES, UNSERVABLE
from trainer.flags import parse_args, resumed_config


def test_validation_seeds_are_disjoint_from_training_and_test_seeds():
    for seed in range(5):
        val = set(validation_seeds(seed, 64))
        assert len(val) == 64
        assert not val & set(evaluation_seeds(0, 200)) and not val & set(evaluation_seeds(seed, 200))
        assert not val & set(env_seeds(seed, 256))
    assert validation_seeds(3, 8) == validation_seeds(3, 8) and validation_seeds(3, 8) != validation_seeds(4, 8)


def test_eval_flags_are_checked_and_may_change_on_resume():
    assert parse_args(["--eval-every", "5"]).config.eval_every == 5
    with pytest.raises(SystemExit):
        parse_args(["--eval-every", "-1"])
    with pytest.raises(SystemExit):
        parse_args(["--eval-episodes", "-1"])
    assert parse_args(["--eval-episodes", "0"]).config.eval_episodes == 0  # no validation at the end
    with pytest.raises(SystemExit):
        parse_args(["--eval-every", "2", "--eval-episodes", "0"])  # validation of no episodes
    saved = parse_args([]).config.to_dict()
    assert resumed_config(saved, {"eval_every": 3, "eval_episodes": 4}, "ckpt").eval_every == 3


def test_retention_keeps_the_best_checkpoint_and_a_resume_past_it_drops_the_pointer(tmp_path):
    state = {"x": torch.zeros(1)}
    first = checkpoints.save_in_run_dir(tmp_path, state, 1, keep=1)
    checkpoints.set_best(tmp_path, first, {"iteration": 1, "val_reward_per_step": 0.5}, keep=1)
    for it in (2, 3, 4):
        checkpoints.save_in_run_dir(tmp_path, state, it, keep=1)
    assert first.is_file() and checkpoints.best_checkpoint(tmp_path) == first
    assert [p.name for p in checkpoints.checkpoint_files(tmp_path)] == ["ckpt_00000004.pt", "ckpt_00000001.pt"]
    assert checkpoints.best_info(tmp_path)["val_reward_per_step"] == 0.5
    checkpoints.set_best(tmp_path, checkpoints.checkpoint_files(tmp_path)[0], {"iteration": 4}, keep=2)
    checkpoints.set_aside_newer(tmp_path, 1)  # resuming from iteration 1 abandons iteration 4, best included
    assert checkpoints.best_checkpoint(tmp_path) is None


def _run_with_a_best(run_dir):
    """Checkpoints 1, 2, 3 (``{"it": i}``), the best pointer at 2."""
    saved = [checkpoints.save_in_run_dir(run_dir, {"it": torch.tensor(i)}, i, keep=3) for i in (1, 2, 3)]
    checkpoints.set_best(run_dir, saved[1], {"iteration": 2}, keep=3)
    return saved


@pytest.mark.parametrize("spoil, why, unreadable", [  # why: what the label names (the pointer: {pointer})
    (lambda best, pointer: best.write_bytes(best.read_bytes()[:100]), ["ckpt_00000002.pt"], True),
    (lambda best, pointer: pointer.write_text("garbage{"), ["{pointer}"], False),
    (lambda best, pointer: best.unlink(), ["ckpt_00000002.pt"], False),
    (lambda best, pointer: pointer.unlink(), ["best"], False),
])
def test_a_best_checkpoint_that_cannot_be_had_gives_the_latest_and_says_why(tmp_path, capsys, spoil, why,
                                                                            unreadable):
    """--pick best (evaluate's and export's default) falls back to the newest checkpoint that loads, as a resume
    does, and says why: a corrupted best file made evaluate refuse the run directory, with advice to pass the
    directory it had been given."""
    from trainer.evaluation.policies import picked_checkpoint
    saved = _run_with_a_best(tmp_path)
    assert picked_checkpoint(tmp_path, "best").label == "the best checkpoint (validation)"
    spoil(saved[1], tmp_path / "checkpoints" / "best")
    source, state, label = picked_checkpoint(tmp_path, "best")
    assert source == saved[2] and state["it"] == 3 and label.startswith("the latest checkpoint (")
    names(label, *[w.format(pointer=tmp_path / "checkpoints" / "best") for w in why])
    err = capsys.readouterr().err
    assert sum(mentions(line, saved[1]) for line in err.splitlines()) == unreadable, err  # its problem, said once


def test_latest_and_a_file_are_labelled_as_such_and_a_bad_file_is_an_error(tmp_path):
    from trainer.evaluation.policies import picked_checkpoint
    saved = _run_with_a_best(tmp_path)
    assert picked_checkpoint(tmp_path, "latest")[::2] == (saved[2], "the latest checkpoint")
    saved[2].write_bytes(b"PK")  # the newest does not load: the one before it is not "the latest"
    assert picked_checkpoint(tmp_path, "latest")[::2] == (saved[1], "the newest checkpoint that loads")
    assert picked_checkpoint(saved[0], "best")[::2] == (saved[0], "the checkpoint file")
    saved[0].write_bytes(b"PK")
    with raises(checkpoints.CheckpointError, saved[0], lines=None):  # and its run's other checkpoints
        picked_checkpoint(saved[0])


def test_a_directory_without_checkpoints_says_what_to_pass(tmp_path):
    """``--checkpoint runs`` (the runs' parent) names a run in it; another directory says what is expected."""
    from trainer.evaluation.policies import picked_checkpoint
    with raises(checkpoints.CheckpointError, tmp_path, "--run-dir"):  # what to pass
        picked_checkpoint(tmp_path)
    _run_with_a_best(tmp_path / "VREdge-v0-s1")
    with raises(checkpoints.CheckpointError, "1", tmp_path / "VREdge-v0-s1"):  # how many runs, and one to pass
        picked_checkpoint(tmp_path, "best")
    (tmp_path / "stopped").mkdir()  # a run stopped before its first iteration completed: its config, no checkpoint
    (tmp_path / "stopped" / "config.json").write_text("{}")
    with raises(checkpoints.CheckpointError, tmp_path / "stopped", "first iteration"):  # when it stopped
        picked_checkpoint(tmp_path / "stopped")


@pytest.mark.parametrize("keep, former, left", [(1, 1, [4]), (2, 1, [4, 3]),
                                                 (2, 3, [4, 3])])  # (a former best among the newest stays)
def test_a_new_best_lets_retention_have_the_former_one(tmp_path, keep, former, left):
    """The former best, kept only as best, goes once another is best: --keep-checkpoints N leaves N files (and
    the best among them), not N + 1."""
    for it in (1, 2, 3, 4):
        saved = checkpoints.save_in_run_dir(tmp_path, {"x": torch.zeros(1)}, it, keep=keep)
        if it in (former, 4):
            checkpoints.set_best(tmp_path, saved, {"iteration": it}, keep=keep)
    assert [p.name for p in checkpoints.checkpoint_files(tmp_path)] == [f"ckpt_{i:08d}.pt" for i in left]
    assert checkpoints.best_checkpoint(tmp_path) == saved


@pytest.mark.slow
def test_training_with_eval_every_logs_validation_and_evaluate_loads_the_best(tmp_path, capsys):
    from trainer.evaluate import main as evaluate
    from trainer.train import train
    run = tmp_path / "run"
    cfg = parse_args(["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--eval-every", "2",
                      "--eval-episodes", "2", "--keep-checkpoints", "1", "--checkpoint-every", "100",
                      "--run-dir", str(run), "--device", "cpu"]).config
    train(cfg, progress=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in rows if "val_reward_per_step" in r]
    assert [r["iteration"] for r in validated] == [2, 4]
    assert all(r["val_baseline"] in ("fair_share", "robust_mpc", "buffer", "throughput", "bola") for r in validated)
    best_row = max(reversed(validated), key=lambda r: r["val_return"])  # the last of equals
    info = checkpoints.best_info(run)
    assert info["iteration"] == best_row["iteration"] and info["val_return"] == best_row["val_return"]
    assert checkpoints.best_checkpoint(run).is_file()  # kept although --keep-checkpoints 1
    evaluate(["--checkpoint", str(run), "--episodes", "2", "--baselines", "fair_share,bola"])
    out, err = capsys.readouterr()
    names(err, "best", checkpoints.best_checkpoint(run))
    payload = json.loads((run / "evaluation.json").read_text())
    assert payload["checkpoint_kind"] == "the best checkpoint (validation)"
    reference, best = payload["reference"]["clairvoyant"], payload["best_baseline"]
    assert best in ("fair_share", "bola") and "qoe_lin" in reference and 0 < reference["fairness"] <= 1
    # the best baseline is picked on 16 validation episodes, not on the test episodes it is compared on
    seeds, vr_fn = validation_seeds(1, 16), functools.partial(gym.make, "VREdge-v0")
    picked = {n: summarize(run_episodes(envs.make_baseline(n, envs.VREdgeConfig()), vr_fn, 16, 0, seeds=seeds))
              for n in ("fair_share", "bola")}
    assert best == max(picked, key=lambda n: picked[n]["reward_per_step"])
    assert payload["best_baseline_picked_on"] == "16 validation episodes"
    gap = reference["reward_per_step"] - payload["baselines"][best]["reward_per_step"]
    assert payload["gap_closed"]["gap"] == pytest.approx(gap) and "gap closed" in out and "clairvoyant" in out
    evaluate(["--checkpoint", str(run), "--episodes", "2", "--baselines", "none", "--reference", "none",
              "--pick", "latest"])
    names(capsys.readouterr().err, "latest", checkpoints.checkpoint_files(run)[0])
    assert json.loads((run / "evaluation.json").read_text())["checkpoint_kind"] == "the latest checkpoint"


def test_validation_ranks_by_return_so_constant_reward_envs_still_pick_the_best(tmp_path):
    from trainer.evaluation.policies import make_model
    from trainer.evaluation.validation import Validator
    cfg = parse_args(["--env", "CartPole-v1", "--eval-every", "1", "--eval-episodes", "2"]).config
    v = Validator(cfg, tmp_path, iteration=0)
    model = make_model(cfg)
    episodes = iter([[{"return": 10.0, "length": 10, "reward_per_step": 1.0}] * 2,
                     [{"return": 200.0, "length": 200, "reward_per_step": 1.0}] * 2,
                     [{"return": 50.0, "length": 50, "reward_per_step": 1.0}] * 2,
                     [{"return": 200.0, "length": 200, "reward_per_step": 1.0}] * 2])
    v._play = lambda act: next(episodes)  # CartPole: reward per step is 1 whatever the policy does
    improved = []
    for it in (1, 2, 3, 4):
        row = v.evaluate(it, model)
        improved.append(v.improved)
    # a tie with the best (iteration 4) moves the pointer to the later, longer-trained checkpoint
    assert improved == [True, True, False, True] and row["val_return"] == 200.0 and row["val_reward_per_step"] == 1.0


# ------------------------------------------------------------------- the end of a run: one line of how good it is

def _finished_run(tmp_path, *flags: str) -> Path:
    run = tmp_path / "run"
    train_cli.main(["--env-kwargs", "num_users=3,max_steps=40", "--num-envs", "4", "--num-steps", "16",
                    "--total-steps", "128", "--device", "cpu", "--run-dir", str(run), *flags])
    return run


def test_the_final_validation_is_the_policy_against_the_best_baseline_on_the_validation_episodes(tmp_path, capsys):
    from trainer.evaluation.policies import trained_model
    from trainer.evaluation.validation import final_validation
    run = _finished_run(tmp_path, "--eval-episodes", "6")
    lines = printed_lines(capsys.readouterr().out)
    model, cfg, _ = trained_model(run)
    result = final_validation(cfg, model)
    # recomputed from the pieces: the validation seeds (not the test seeds), the greedy policy, every baseline
    seeds, env_fn = validation_seeds(cfg.seed, 6), functools.partial(gym.make, "VREdge-v0", **cfg.env_options)
    policy = run_episodes(policy_actions(model, deterministic=True), env_fn, 6, 0, seeds=seeds)
    config = envs.VREdgeConfig(**cfg.env_options)
    played = {n: run_episodes(envs.make_baseline(n, config), env_fn, 6, 0, seeds=seeds) for n in envs.BASELINES}
    best = max(played, key=lambda n: summarize(played[n])["reward_per_step"])
    assert result["baseline"] == best and result["episodes"] == 6
    assert result["difference"] == paired_difference(policy, played[best])
    assert result["policy"]["reward_per_step"] == summarize(policy)["reward_per_step"]
    # what the run printed is that result, between the checkpoint and the commands that go on from it
    assert list(lines).index("quality") == list(lines).index("checkpoint") + 1 < list(lines).index("evaluate")
    assert best in lines["quality"] and f"{result['difference']['mean']:+.3f}" in lines["quality"]
    assert re.search(r"\(better in \d+\); took \d+ s$", lines["quality"])  # the time it took, labelled as one
    assert UNSERVABLE not in lines["quality"] and "unservable" not in result  # a cell the baselines serve


def test_the_final_validation_of_another_env_is_its_mean_return_and_it_can_be_turned_off(tmp_path, capsys):
    cartpole = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16", "--total-steps", "64",
                "--device", "cpu", "--eval-episodes", "3"]
    train_cli.main([*cartpole, "--run-dir", str(tmp_path / "on")])
    from trainer.evaluation.policies import trained_model
    model, cfg, _ = trained_model(tmp_path / "on")
    returns = summarize(run_episodes(policy_actions(model, True), functools.partial(gym.make, "CartPole-v1"), 3, 0,
                                     seeds=validation_seeds(1, 3)))["mean_return"]
    line = printed_lines(capsys.readouterr().out)["quality"]
    assert f"{returns:.2f}" in line and re.search(r"validation episodes; took \d+ s$", line)
    train_cli.main([*cartpole, "--run-dir", str(tmp_path / "off"), "--eval-episodes", "0"])
    assert "quality" not in printed_lines(capsys.readouterr().out)


@pytest.mark.parametrize("flags", [(), ("--eval-every", "2")])  # the final validation's line; the best's
def test_the_quality_line_says_when_nobody_serves_the_cell(tmp_path, capsys, flags):
    """A cell of 1 Mbit/s per user (the ladder starts at 5): the policy and every baseline lose their users."""
    run = tmp_path / "run"
    train_cli.main(["--env-kwargs", "num_users=2,max_steps=20,capacity_per_user_mbps=1", "--num-envs", "2",
                    "--num-steps", "8", "--total-steps", "16", "--device", "cpu", "--threads", "1",
                    "--eval-episodes", "2", "--run-dir", str(run), *flags])
    line = printed_lines(capsys.readouterr().out)["quality"]
    from trainer.evaluation.policies import trained_model
    model, cfg, _ = trained_model(run)
    seeds, env_fn = validation_seeds(cfg.seed, 2), functools.partial(gym.make, "VREdge-v0", **cfg.env_options)
    config = envs.VREdgeConfig(**cfg.env_options)
    lost = [summarize(run_episodes(envs.make_baseline(n, config), env_fn, 2, 0, seeds=seeds))["abandoned"]
            for n in envs.BASELINES]
    assert min(lost) > LOST_IN_MOST_EPISODES  # (the cell as built: every baseline, the best whichever it is)
    assert f"; {UNSERVABLE}: the policy and " in line, line


def test_a_run_that_validated_says_its_best_without_playing_again(tmp_path, capsys, monkeypatch):
    import trainer.evaluation.validation as validation
    monkeypatch.setattr(validation, "final_validation", lambda *a: pytest.fail("played again"))
    run = _finished_run(tmp_path, "--eval-every", "2", "--eval-episodes", "2")
    best = checkpoints.best_info(run)
    line = printed_lines(capsys.readouterr().out)["quality"]
    assert f"iteration {best['iteration']}" in line and best["val_baseline"] in line
    assert f"{best['val_vs_baseline']:+.3f}" in line


@pytest.mark.parametrize("delay", [0.0, 1.0])  # at once: while the policy loads (a loader once swallowed it)
def test_a_stop_signal_during_the_final_validation_skips_it_and_the_run_ends_as_finished(tmp_path, delay):
    """Ctrl-C while the finished run measures itself, from the moment it says where its checkpoint is (a user who
    wants to skip it presses at once; the policy is still loading): the line says it was not measured, the commands
    that go on from the run follow, exit status 0 (``train && evaluate`` goes on), no traceback."""
    process = subprocess.Popen([sys.executable, "-m", "trainer.train", "--num-envs", "4", "--num-steps", "16",
                                "--total-steps", "64", "--eval-episodes", "200", "--device", "cpu", "--run-dir",
                                str(tmp_path / "run")], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if line.startswith("checkpoint:"):
                break
        time.sleep(delay)  # inside the validation: 200 episodes of 8 users take a minute
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    lines = printed_lines(out)
    assert process.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "reward/step" not in lines["quality"] and "SIGINT" in lines["quality"]  # skipped, not failed
    assert "evaluate" in lines and "train longer" in lines
    assert checkpoints.checkpoint_files(tmp_path / "run")  # the run is saved


def test_a_stop_signal_noted_as_the_run_ended_skips_the_final_validation_before_it_begins():
    from trainer.interrupts import Skipped, ignore_late_signals, skippable
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ignore_late_signals()
        with skippable():  # nothing noted: the block runs
            pass
        signal.raise_signal(signal.SIGINT)  # noted ("nothing to stop"), a moment before the block
        with pytest.raises(Skipped), skippable():
            pytest.fail("the block ran")
        ignore_late_signals()  # the next run of this process starts afresh
        with skippable():
            pass
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_stop_signal_that_skips_one_block_after_the_run_skips_the_next_too():
    """A Ctrl-C during the end-of-run distillation skips the quality line after it as well."""
    from trainer.interrupts import Skipped, ignore_late_signals, noted_signals, skippable
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ignore_late_signals()
        with pytest.raises(Skipped), skippable():
            signal.raise_signal(signal.SIGTERM)  # inside the first block (the distillation)
            pytest.fail("the signal did not skip the block")
        assert noted_signals() == (signal.SIGTERM,)
        with pytest.raises(Skipped), skippable():  # the quality line: skipped at once
            pytest.fail("the block ran")
        ignore_late_signals()
        assert noted_signals() == ()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
