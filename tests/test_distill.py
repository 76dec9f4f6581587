"""Distilling the causal reference into a trained policy (``trainer.ppo.distillation``, ``python -m trainer.distill``,
``--distill-episodes``): the states labelled are the policy's own, the fine-tuning moves the actor toward the
expert's levels and nothing else, a distillation that scores lower on validation is not kept, a round kept is the
run's next checkpoint (the one before stays as it was), and bad runs are one line."""

import functools
import os
import re
import shutil
import signal
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import checkpoints
import envs
from envs.belief_mpc import BeliefMPC
from tests.messages import exits, printed_lines
from trainer import distill as distill_command
from trainer.config import TrainConfig
from trainer.evaluation.episodes import (
    distillation_seeds,
    evaluation_seeds,
    filter_episodes,
    validation_seeds,
)
from trainer.evaluation.policies import trained_model
from trainer.flags import parse_args
from trainer.ppo import distillation as distill
from trainer.train import main as train_main
from trainer.train import train

SMALL = {"num_users": 2, "max_steps": 12}
SMALL_FLAG = "num_users=2,max_steps=12"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A VR-edge run of 2 users and 12-step episodes."""
    run = tmp_path_factory.mktemp("distill") / "run"
    train(parse_args(["--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--env-kwargs", SMALL_FLAG,
                      "--eval-episodes", "0", "--threads", "1", "--device", "cpu", "--run-dir", str(run)]).config,
          progress=False)
    return run


def test_the_labelled_episodes_are_none_of_trainings_validations_or_tests():
    mine = set(distillation_seeds(1, 200))
    assert len(mine) == 200
    assert not mine & set(evaluation_seeds(1, 200)) and not mine & set(validation_seeds(1, 200))


def test_each_state_the_policy_visits_is_labelled_with_what_the_expert_plays_there(small_run):
    model = trained_model(small_run)[0]
    labels = distill.expert_labels(model, "VREdge-v0", SMALL, episodes=3, seed=0)
    assert labels.observations.shape[0] == 36 and labels.levels.shape == (36, 2)  # 3 episodes of 12 steps
    # the same observations in the same order to a fresh expert: the same levels (it reads observations only)
    expert = BeliefMPC(envs.VREdgeConfig(**SMALL))
    rows = labels.observations.numpy().reshape(12, 3, -1)
    assert np.array_equal(np.stack([expert(rows[t]) for t in range(12)]).reshape(36, 2), labels.levels.numpy())
    # and they are the policy's own states: its greedy play of the same episodes sees them
    seen = []

    def greedy(obs):
        seen.append(obs.copy())
        return model.act_deterministic(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    filter_episodes(greedy, functools.partial(gym.make, "VREdge-v0", **SMALL), 3, 0, num_envs=3,
                    seeds=distillation_seeds(0, 3))
    assert np.allclose(np.stack(seen).reshape(36, -1), labels.observations.numpy())


def test_fine_tuning_moves_the_actor_toward_the_levels_and_leaves_the_critic(small_run):
    model = trained_model(small_run)[0]
    labels = distill.expert_labels(model, "VREdge-v0", SMALL, episodes=4, seed=0)
    obs = labels.observations
    value_before, agree_before = model.value(obs).clone(), distill.agreement(model, labels)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    settings, steps = distill.DistillSettings(epochs=100, lr=1e-2, minibatch_size=16), []
    losses = distill.fine_tuned(model, labels, settings, 0.5, lambda: steps.append(1))
    assert losses[-1] < losses[0]
    # the bar moves at every step (an epoch a unit left it at 99% for a minute): whole minibatches of 16 an epoch
    assert len(steps) == distill.fine_tuning_steps(len(obs), settings) == 100 * (len(obs) // 16)
    assert distill.agreement(model, labels) > max(agree_before, 0.9)
    assert torch.equal(model.value(obs), value_before)  # the critic does not move
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())  # nor the observation statistics
    assert not any(p.requires_grad for p in model.parameters())  # frozen again, as it was loaded


def test_a_distillation_that_scores_lower_on_validation_is_not_kept(small_run, monkeypatch):
    model = trained_model(small_run)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.4}] * 4])  # before, after
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    summary = distill.distilled(model, "VREdge-v0", SMALL, 1, distill.DistillSettings(episodes=2, epochs=5, lr=1e-2,
                                                                         validation_episodes=4), 0.5)
    assert not summary["kept"] and summary["difference"]["mean"] == pytest.approx(-0.1)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.slow  # trains, distils, resumes
def test_a_round_kept_is_the_runs_next_checkpoint_and_the_one_before_stays(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    source = checkpoints.checkpoint_files(run)[0]
    before, old = source.read_bytes(), checkpoints.load(source)
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4])  # before, after: kept
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    distill_command.main([str(run), "--episodes", "2", "--validation-episodes", "4", "--epochs", "2", "--lr", "0.01"])
    said = printed_lines(capsys.readouterr().out)
    assert "agreement" in said["distilled"] and "not kept" not in said["distilled"]
    newest = checkpoints.checkpoint_files(run)[0]
    assert said["checkpoint"] == str(newest.resolve()) and newest != source
    assert (run / "checkpoints" / "latest").read_text().strip() == newest.name
    assert source.read_bytes() == before  # the undistilled weights stay, as they were, the checkpoint before
    new = checkpoints.load(newest)
    assert [k["settings"]["seed"] for k in new["distilled"]] == [0]  # the first round: seed 0
    assert new["distilled"][0]["validation_difference"] == pytest.approx(0.1)
    assert new["distilled"][0]["from"] == source.name and "undistilled_model" not in new  # no second copy
    assert not all(torch.equal(new["model"][k], v) for k, v in old["model"].items())
    assert new["iteration"] == old["iteration"] and new["env_steps"] == old["env_steps"]
    assert new["optimizer"].keys() == old["optimizer"].keys()
    from trainer.ppo.export import export
    card = export(run, ["torchscript"], out=tmp_path / "export")
    assert card["checkpoint"]["distilled"] == new["distilled"]  # what is shipped says it was distilled
    train_main(["--resume", str(run), "--total-steps", "192"])  # as a user resumes it
    resumed = checkpoints.load(checkpoints.checkpoint_files(run)[0])
    assert resumed["env_steps"] == 192 and resumed["distilled"] == new["distilled"]  # the record goes on with it


def test_a_round_not_kept_leaves_the_checkpoint_as_it_was(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    before = checkpoints.checkpoint_files(run)[0].read_bytes()
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.4}] * 4])  # before, after: lower
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    distill_command.main([str(run), "--episodes", "2", "--validation-episodes", "4", "--epochs", "1"])
    assert "not kept" in printed_lines(capsys.readouterr().out)["distilled"]
    assert [p.read_bytes() for p in checkpoints.checkpoint_files(run)] == [before]


def test_which_finished_runs_are_distilled():
    vr_edge, no = TrainConfig().to_dict(), (0, 0)
    assert distill.rounds_asked(vr_edge) == (64, 1)  # the defaults: make train
    assert distill.rounds_asked({**vr_edge, "distill_rounds": 2}) == (64, 2)
    assert distill.rounds_asked({**vr_edge, "total_steps": 999_999}) == no  # a short run
    assert distill.rounds_asked({**vr_edge, "distill_episodes": 0}) == no  # turned off
    assert distill.rounds_asked({k: v for k, v in vr_edge.items() if k != "distill_episodes"}) == no
    assert distill.rounds_asked({**vr_edge, "env": "CartPole-v1", "env_kwargs": ""}) == no
    assert distill.rounds_asked({**vr_edge, "env_kwargs": "capacity_trace=pensieve"}) == no
    apex = TrainConfig.from_dict({"algo": "apex", "total_steps": 3_000_000}).to_dict()
    assert distill.rounds_asked(apex) == no


@pytest.mark.slow  # trains, distils (twice), resumes
def test_a_finished_run_that_asks_is_distilled_and_says_so(tmp_path, capsys, monkeypatch):
    run, config = tmp_path / "run", tmp_path / "distil.toml"
    config.write_text("distill_episodes = 2\ndistill_rounds = 2\n")
    monkeypatch.setattr(distill, "DISTILL_AFTER_STEPS", 64)  # (a test run: as long as a real one)
    train_main(["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--env-kwargs", SMALL_FLAG,
                "--eval-episodes", "4", "--config", str(config), "--threads", "1", "--device", "cpu",
                "--run-dir", str(run)])
    out = capsys.readouterr().out
    rounds = [line for line in out.splitlines() if line.startswith("distilled:")]
    assert len(rounds) == 2 and "round 2 of 2" in rounds[1] and "2 episodes" in rounds[0]
    assert "quality" in printed_lines(out)
    newest = checkpoints.load(checkpoints.checkpoint_files(run)[0])
    assert newest["config"]["distill_episodes"] == 2
    kept = newest.get("distilled", [])
    assert len(kept) == sum("not kept" not in line for line in rounds)
    assert [k["settings"]["seed"] for k in kept] == [r for r, line in enumerate(rounds) if "not kept" not in line]
    files = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    train_main(["--resume", str(run)])  # nothing to train: nothing distilled, no file changed
    out = capsys.readouterr().out
    assert "distilled" not in printed_lines(out) and "quality" in printed_lines(out)
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == files
    train_main(["--resume", str(run), "--total-steps", "128"])  # a resume that trains ends as the run did
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("distilled:")] and "quality" in printed_lines(out)


@pytest.mark.slow  # trains two seeds, distils each
def test_each_seed_of_a_seeds_run_ends_as_a_run_does(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(distill, "DISTILL_AFTER_STEPS", 64)
    config = tmp_path / "distil.toml"
    config.write_text("distill_episodes = 1\n")
    with pytest.raises(SystemExit) as ended:
        train_main(["--seeds", "1-2", "--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--env-kwargs",
                    SMALL_FLAG, "--eval-episodes", "2", "--config", str(config), "--threads", "1", "--device", "cpu",
                    "--run-dir", str(tmp_path / "seeds")])
    out, err = capsys.readouterr()
    err = err.splitlines()
    assert ended.value.code == 0
    said = printed_lines(out)  # and how to go on: evaluate a seed, compare the seeds with another setup
    assert "trainer.evaluate" in said["evaluate"] and str(tmp_path / "seeds" / "s1") in said["evaluate"]
    assert "trainer.compare" in said["compare"]
    for seed in (1, 2):  # each seed's rounds, the checkpoint it ends with, how good it is
        for label in ("distilled", "checkpoint", "quality"):
            assert any(line.startswith(f"seed {seed}: {label}: ") for line in err), (seed, label, err)


def test_runs_that_cannot_be_distilled_are_one_line(tmp_path, capsys):
    cartpole = tmp_path / "cartpole"
    train(parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "16",
                      "--threads", "1", "--run-dir", str(cartpole)]).config, progress=False)
    with exits(2, "CartPole-v1", capsys=capsys):
        distill_command.main([str(cartpole)])
    with exits(2, "nowhere", capsys=capsys):
        distill_command.main([str(tmp_path / "nowhere")])
    with exits(2, "--epochs", capsys=capsys):
        distill_command.main([str(cartpole), "--epochs", "-1"])
    with exits(2, "--lr", capsys=capsys):
        distill_command.main([str(cartpole), "--lr", "-1"])


def test_each_round_of_the_command_labels_episodes_of_its_own(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4] * 2)  # each round: better
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    for _ in range(2):
        distill_command.main([str(run), "--episodes", "2", "--validation-episodes", "4", "--epochs", "1"])
    kept = checkpoints.load(checkpoints.checkpoint_files(run)[0])["distilled"]
    assert [k["settings"]["seed"] for k in kept] == [0, 1]


def test_the_runs_checkpoints_folder_stands_for_the_run_and_a_file_or_an_empty_run_is_one_line(small_run, tmp_path,
                                                                                                capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    distill_command.main([str(run / "checkpoints"), "--episodes", "1", "--validation-episodes", "2", "--epochs", "1"])
    said = printed_lines(capsys.readouterr().out)
    assert said["checkpoint"].startswith(str((run / "checkpoints").resolve()) + "/ckpt_")  # the run's own folder
    assert not (run / "checkpoints" / "checkpoints").exists()
    newest = str(checkpoints.checkpoint_files(run)[0])
    with exits(2, newest, "run directory", capsys=capsys):
        distill_command.main([newest])
    (tmp_path / "empty").mkdir()
    with exits(2, "empty", "train", capsys=capsys):
        distill_command.main([str(tmp_path / "empty")])


def _round_kept(monkeypatch) -> None:
    """Every round scores higher on validation (so it is kept), whatever it learnt."""
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4] * 10)
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))


ROUND = ["--episodes", "1", "--validation-episodes", "4", "--epochs", "1"]


@pytest.mark.slow  # trains, distils, resumes
def test_a_torn_newest_checkpoint_is_set_aside_and_the_round_never_removes_the_runs_last_good_one(
        tmp_path, monkeypatch, capsys):
    """The issue's reproducer: with --keep-checkpoints 1 and the newest file torn, the round distils the good one,
    sets the torn one aside as a resume does, and retention keeps what it wrote and the trained weights it came
    from (never removed by a round): the run resumes."""
    run = tmp_path / "k1"
    train_main(["--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--env-kwargs", SMALL_FLAG,
                "--eval-episodes", "0", "--threads", "1", "--device", "cpu", "--keep-checkpoints", "1",
                "--run-dir", str(run)])
    (good,) = checkpoints.checkpoint_files(run)
    torn = good.with_name(checkpoints.checkpoint_name(checkpoints.checkpoint_iteration(good) + 1))
    torn.write_bytes(good.read_bytes()[:20_000])
    _round_kept(monkeypatch)
    capsys.readouterr()
    distill_command.main([str(run), *ROUND])
    out, err = capsys.readouterr()
    written = Path(printed_lines(out)["checkpoint"])
    assert written.is_file() and checkpoints.checkpoint_files(run) == [written, good]  # kept 1: the round's
    assert torn.name in err and torn.with_name(torn.name + ".orphaned").is_file()  # set aside, and said
    assert checkpoints.latest_loadable(run)[0] == written
    train_main(["--resume", str(run), "--total-steps", "192"])  # the run goes on from it
    assert checkpoints.load(checkpoints.checkpoint_files(run)[0])["env_steps"] == 192


def _stop_once_saved(monkeypatch) -> list[Path]:
    """A SIGINT sent the moment a checkpoint save has put its file and pointer in place; the files saved."""
    saved, save = [], checkpoints.save_in_run_dir

    def save_then_stop(*args, **kwargs):
        saved.append(save(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)
        return saved[-1]

    monkeypatch.setattr(checkpoints, "save_in_run_dir", save_then_stop)
    return saved


def test_a_stop_as_the_round_is_saved_says_the_file_it_saved(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    _round_kept(monkeypatch)
    saved = _stop_once_saved(monkeypatch)
    with pytest.raises(SystemExit) as info:
        distill_command.main([str(run), *ROUND])
    err = capsys.readouterr().err
    assert info.value.code == 130 and saved and str(saved[0].resolve()) in err and "nothing was written" not in err
    assert checkpoints.latest_loadable(run)[0] == saved[0]  # what it said is what is on disk
    assert not (run / "lock").exists()


def test_a_stop_as_a_round_after_training_is_saved_says_the_file_it_saved(small_run, tmp_path, monkeypatch):
    from trainer import interrupts

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    monkeypatch.setattr(interrupts, "_NOTED", [])  # (the signal is noted: not for the tests after this one)
    monkeypatch.setattr(distill, "DISTILL_AFTER_STEPS", 64)
    _round_kept(monkeypatch)
    saved = _stop_once_saved(monkeypatch)
    config = {**checkpoints.load(checkpoints.checkpoint_files(run)[0])["config"], "distill_episodes": 1,
              "distill_rounds": 2}
    said = []
    distill.rounds_after_training(run, config, lambda label, line: said.append(line) if label == "distilled" else None)
    assert len(saved) == 1 and len(said) == 1  # the second round never started
    assert saved[0].name in said[0] and "SIGINT" in said[0] and "nothing was written" not in said[0]
    assert checkpoints.checkpoint_files(run)[0] == saved[0]


def test_a_tampered_record_of_rounds_or_a_seed_torch_cannot_take_is_one_line(small_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    with exits(2, "--seed", capsys=capsys):
        distill_command.main([str(run), "--seed", str(2**64)])  # at once, not after the labels
    newest = checkpoints.checkpoint_files(run)[0]
    for record in (7, torch.zeros(2)):
        checkpoints.save(newest, {**checkpoints.load(newest), "distilled": record})
        with exits(1, newest, "distilled"):
            distill_command.main([str(run), *ROUND])
        from trainer.ppo.export import export
        with pytest.raises(checkpoints.CheckpointError, match="distilled"):
            export(run, ["torchscript"], out=tmp_path / "export")


@pytest.mark.slow  # trains, distils
@pytest.mark.parametrize("better", [True, False])
def test_a_round_becomes_best_where_it_scores_no_lower_than_best_on_its_validation_episodes(
        tmp_path, monkeypatch, capsys, better):
    from trainer.evaluation.validation import Validator

    run = tmp_path / "run"
    train(parse_args(["--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--env-kwargs", SMALL_FLAG,
                      "--eval-every", "1", "--eval-episodes", "2", "--threads", "1", "--device", "cpu",
                      "--run-dir", str(run)]).config, progress=False)
    best = checkpoints.best_checkpoint(run)
    assert best is not None
    play, shift = Validator._play, 1000.0 if better else -1000.0
    monkeypatch.setattr(Validator, "_play", lambda self, act: [{**r, "return": r["return"] + shift}
                                                               for r in play(self, act)])
    _round_kept(monkeypatch)
    distill_command.main([str(run), *ROUND])
    written = Path(printed_lines(capsys.readouterr().out)["checkpoint"])
    assert checkpoints.best_checkpoint(run) == (written if better else best)
    if better:  # what evaluates, exports and loads a run's policy takes it, with the score it was chosen on
        from trainer.evaluation.policies import picked_checkpoint
        assert picked_checkpoint(run, "best").source == written
        assert checkpoints.best_info(run)["val_return"] > 500


def test_a_stop_signal_once_the_round_is_done_is_said_and_stops_nothing(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    _round_kept(monkeypatch)
    line = distill.summary_line

    def said_with_a_signal(summary):  # a Ctrl-C as the command says what it did
        os.kill(os.getpid(), signal.SIGINT)
        return line(summary)

    monkeypatch.setattr(distill, "summary_line", said_with_a_signal)
    distill_command.main([str(run), *ROUND])  # returns: the work is done
    out, err = capsys.readouterr()
    assert Path(printed_lines(out)["checkpoint"]).is_file() and "SIGINT" in err and "nothing to stop" in err


def test_a_round_says_what_it_will_do_then_shows_each_phase_on_a_bar(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    shown, progress = [], distill.RoundProgress

    def on_a_terminal(*args, **kwargs):  # (the test's stderr is no terminal: the bar drawn all the same)
        shown.append(progress(*args, shown=True))
        return shown[-1]

    monkeypatch.setattr(distill, "RoundProgress", on_a_terminal)
    distill_command.main([str(run), *ROUND])
    err = capsys.readouterr().err
    start = [line for line in err.splitlines() if line.startswith("distilling: ") and "fine-tuned" in line]
    assert len(start) == 1 and "1 episode" in start[0] and "4 validation episodes" in start[0]
    bar = shown[0].bar
    assert bar.n == bar.total  # every phase moved it to its end
    for phase in ("labels the states", "validation before", "fine-tuning", "validation after"):
        assert phase in err, phase


@pytest.mark.parametrize("heartbeat_s, expert", [(0.0, "reference"), (0.0, "rollout"), (3600.0, "reference")])
def test_a_round_in_a_pipe_says_how_far_it_got_in_lines_once_it_runs_long(small_run, tmp_path, monkeypatch, capsys,
                                                                          heartbeat_s, expert):
    """Where standard error is no terminal (``make train | tee log``, CI), the bar's state comes as lines, the first
    once the round has run ``HEARTBEAT_S`` (0 here: every update is late enough), each with how far it got (an
    expert's name too long for the line once cut the numbers off); a round shorter than that adds nothing to what
    it printed before."""
    from trainer.common import progress
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    monkeypatch.setattr(progress, "HEARTBEAT_S", heartbeat_s)
    distill_command.main([str(run), *ROUND, "--expert", expert])
    err = capsys.readouterr().err
    states = [line for line in err.splitlines() if re.fullmatch(r"distilling: .*\d+%\|[#0-9 ]+\| .*", line)]
    assert "\r" not in err
    if heartbeat_s:
        assert states == [], states
    else:
        for phase in ("labels the states", "validation before", "fine-tuning", "validation after"):
            assert any(phase in line for line in states), (phase, states)


def test_a_run_too_short_for_the_rounds_it_asks_for_says_so(tmp_path, capsys):
    config = tmp_path / "recipe.toml"
    config.write_text("distill_rounds = 2\n")
    run = tmp_path / "run"
    train_main(["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--env-kwargs", SMALL_FLAG,
                "--eval-episodes", "0", "--config", str(config), "--threads", "1", "--device", "cpu",
                "--run-dir", str(run)])
    said = printed_lines(capsys.readouterr().out)["distilled"]
    assert "not done" in said and "64" in said and f"{distill.DISTILL_AFTER_STEPS:,}" in said and "2 rounds" in said
    assert "trainer.distill" in said and str(run) in said
    assert len(checkpoints.checkpoint_files(run)) == 1  # nothing distilled


def test_the_rollout_expert_labels_with_the_rollout_on_the_policy_as_it_was_ending_on_its_critic(small_run):
    from envs.belief_mpc import ON_CRITIC, TerminalValue
    from trainer.evaluation.episodes import policy_actions
    from trainer.evaluation.policies import critic_values

    model, cfg, _ = trained_model(small_run)
    gamma = cfg.gamma
    twin = {k: v.clone() for k, v in model.state_dict().items()}
    rollout = distill.teacher(model, "VREdge-v0", SMALL, distill.ROLLOUT_EXPERT, gamma=gamma)
    with torch.no_grad():  # the model moves after the expert is built (as the fine-tuning moves it): the expert not
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    labels = distill.expert_labels(model, "VREdge-v0", SMALL, episodes=2, seed=3, expert=rollout)
    # by hand: the moved model plays; BeliefMPC on the policy before it, ending on that policy's critic, says
    before = trained_model(small_run)[0]
    assert all(torch.equal(v, twin[k]) for k, v in before.state_dict().items())
    expert = BeliefMPC(envs.VREdgeConfig(**SMALL), base=policy_actions(before, deterministic=True),
                       terminal_value=TerminalValue(critic_values(before), gamma), seed=3, **ON_CRITIC)
    seen, said = [], []
    act = policy_actions(model, deterministic=True)

    def labelled(obs):
        seen.append(obs.copy())
        said.append(expert(obs))
        return act(obs)

    records = filter_episodes(labelled, functools.partial(gym.make, "VREdge-v0", **SMALL), 2, 0, num_envs=2,
                              seeds=distillation_seeds(3, 2))
    live = np.arange(len(seen))[:, None] < np.array([int(r["length"]) for r in records])[None, :]
    np.testing.assert_array_equal(labels.observations.numpy(), np.stack(seen)[live].astype(np.float32))
    np.testing.assert_array_equal(labels.levels.numpy(), np.stack(said)[live])
    reference = distill.expert_labels(model, "VREdge-v0", SMALL, episodes=2, seed=3)
    assert not torch.equal(reference.levels, labels.levels)  # another expert: on these states it says otherwise


def test_rounds_go_on_while_each_is_kept_and_stop_at_the_first_not(small_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    better, worse = [[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4], \
        [[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.4}] * 4]
    scores = iter(better + better + worse + better)  # before, after of each round: the third is not kept
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    experts = []
    teacher = distill.teacher
    monkeypatch.setattr(distill, "teacher", lambda *a, **k: experts.append(a[3] if len(a) > 3 else k.get("kind"))
                        or teacher(*a, **k))
    distill_command.main([str(run), "--episodes", "1", "--validation-episodes", "4", "--epochs", "1",
                          "--expert", "rollout", "--rounds", "5"])
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("distilled:")]
    assert len(lines) == 3 and "not kept" in lines[2] and all("not kept" not in line for line in lines[:2])
    assert all(re.search(f"round {r} of 5", line) for r, line in zip((1, 2, 3), lines))
    kept = checkpoints.load(checkpoints.checkpoint_files(run)[0])["distilled"]
    assert [k["settings"]["seed"] for k in kept] == [0, 1]  # each round's episodes its own; the third wrote nothing
    assert {k["settings"]["expert"] for k in kept} == {"rollout"} and set(experts) == {"rollout"}
    assert {k["settings"]["lr"] for k in kept} == {distill.FINE_TUNING["rollout"]["lr"]}  # the rollout's, not given
    assert printed_lines(out)["checkpoint"] == str(checkpoints.checkpoint_files(run)[0].resolve())
    assert "BeliefMPC on the policy" in err  # what labels, in the line each round starts with


def test_the_rollout_expert_refuses_a_critic_of_other_units_and_bad_rounds_in_one_line(small_run, tmp_path, capsys):
    scaled = tmp_path / "scaled"
    (tmp_path / "scaled.toml").write_text("scale_rewards = true\n")  # (no flag: a TOML key)
    train(parse_args(["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--env-kwargs", SMALL_FLAG,
                      "--config", str(tmp_path / "scaled.toml"), "--eval-episodes", "0", "--threads", "1",
                      "--run-dir", str(scaled)]).config, progress=False)
    with exits(2, "scale_rewards", capsys=capsys):
        distill_command.main([str(scaled), "--expert", "rollout"])
    with exits(2, "--expert", capsys=capsys):
        distill_command.main([str(small_run), "--expert", "oracle"])
    with exits(2, "--rounds", capsys=capsys):
        distill_command.main([str(small_run), "--rounds", "0"])


def test_however_many_rounds_are_kept_the_trained_checkpoint_they_came_from_stays(small_run, tmp_path, monkeypatch,
                                                                                    capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    trained = checkpoints.checkpoint_files(run)[0]
    before = trained.read_bytes()
    keep = TrainConfig().keep_checkpoints  # (the run's: it was trained with the default)
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4] * (keep + 2))
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    distill_command.main([str(run), *ROUND, "--rounds", str(keep + 1)])  # more rounds than files retention keeps
    distill_command.main([str(run), *ROUND])  # and one more later
    files = checkpoints.checkpoint_files(run)
    assert trained in files and trained.read_bytes() == before, [f.name for f in files]  # to go back to
    assert len(files) == keep + 1 and files[0].name.endswith(f"_{keep + 2}.pt")  # the newest rounds, and it


def test_the_fine_tuning_runs_on_one_thread_unless_told_and_leaves_the_count_as_it_was(small_run, monkeypatch):
    model = trained_model(small_run)[0]
    labels = distill.expert_labels(model, "VREdge-v0", SMALL, episodes=1, seed=0)
    seen, evaluate = [], model.evaluate

    def counted(*args):
        seen.append(torch.get_num_threads())
        return evaluate(*args)

    monkeypatch.setattr(model, "evaluate", counted)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        distill.fine_tuned(model, labels, distill.DistillSettings(epochs=1, minibatch_size=4), 0.5)
        distill.fine_tuned(model, labels, distill.DistillSettings(epochs=1, minibatch_size=4), 0.5, threads=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    steps = len(seen) // 2
    assert steps and set(seen[:steps]) == {1} and set(seen[steps:]) == {2}


def test_the_fine_tuning_benchmark_times_one_thread_and_two_side_by_side(small_run, capsys):
    from benchmarks import fine_tuning

    fine_tuning.main([str(small_run), "--episodes", "1", "--epochs", "1", "--repeats", "1", "--busy", "0,1"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "busy loop" in line]
    assert len(lines) == 2 and all("1 thread" in line and "2 threads" in line and "x" in line for line in lines)
    assert "cpu:" in out  # the machine it ran on
