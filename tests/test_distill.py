"""Distilling the causal ceiling into a trained policy (``trainer.ppo.distill``, ``python -m trainer.distill``,
``--distill-episodes``): the states labelled are the policy's own, the fine-tuning moves the actor toward the
expert's levels and nothing else, a distillation that scores lower on validation is not kept, the checkpoint keeps
what it replaced, and bad runs are one line."""

import functools
import shutil

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
from trainer.evaluation.episodes import distillation_seeds, evaluation_seeds, run_episodes, validation_seeds
from trainer.evaluation.policies import trained_model
from trainer.flags import parse_args
from trainer.ppo import distill
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
    labels = distill.expert_labels(model, SMALL, episodes=3, seed=0)
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

    run_episodes(greedy, functools.partial(gym.make, "VREdge-v0", **SMALL), 3, 0, num_envs=3,
                 seeds=distillation_seeds(0, 3), whole_batch=True)
    assert np.allclose(np.stack(seen).reshape(36, -1), labels.observations.numpy())


def test_fine_tuning_moves_the_actor_toward_the_levels_and_leaves_the_critic(small_run):
    model = trained_model(small_run)[0]
    labels = distill.expert_labels(model, SMALL, episodes=4, seed=0)
    obs = labels.observations
    value_before, agree_before = model.value(obs).clone(), distill._agreement(model, labels)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    losses = distill.fine_tuned(model, labels, distill.DistillSettings(epochs=100, lr=1e-2, minibatch_size=16), 0.5)
    assert losses[-1] < losses[0]
    assert distill._agreement(model, labels) > max(agree_before, 0.9)
    assert torch.equal(model.value(obs), value_before)  # the critic does not move
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())  # nor the observation statistics
    assert not any(p.requires_grad for p in model.parameters())  # frozen again, as it was loaded


def test_a_distillation_that_scores_lower_on_validation_is_not_kept(small_run, monkeypatch):
    model = trained_model(small_run)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.4}] * 4])  # before, after
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    summary = distill.distilled(model, SMALL, 1, distill.DistillSettings(episodes=2, epochs=5, lr=1e-2,
                                                                         validation_episodes=4), 0.5)
    assert not summary["kept"] and summary["difference"]["mean"] == pytest.approx(-0.1)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.slow  # trains, distils (twice), resumes
def test_the_command_rewrites_the_newest_checkpoint_keeping_what_it_replaced(small_run, tmp_path, monkeypatch,
                                                                             capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    source = checkpoints.checkpoint_files(run)[0]
    old = checkpoints.load(source)
    scores = iter([[{"reward_per_step": 0.5}] * 4, [{"reward_per_step": 0.6}] * 4])  # before, after: kept
    monkeypatch.setattr(distill, "validation_score", lambda *a, **k: next(scores))
    distill_command.main([str(run), "--episodes", "2", "--validation-episodes", "4", "--epochs", "2", "--lr", "0.01"])
    said = printed_lines(capsys.readouterr().out)
    assert "agreement" in said["distilled"] and "not kept" not in said["distilled"]
    new = checkpoints.load(source)
    assert [k["settings"]["seed"] for k in new["distilled"]] == [0]  # the first round: seed 0
    assert new["distilled"][0]["validation_difference"] == pytest.approx(0.1)
    assert all(torch.equal(new["undistilled_model"][k], v) for k, v in old["model"].items())
    assert not all(torch.equal(new["model"][k], v) for k, v in old["model"].items())
    assert new["iteration"] == old["iteration"] and new["optimizer"].keys() == old["optimizer"].keys()
    from trainer.ppo.export import export
    card = export(run, ["torchscript"], out=tmp_path / "export")
    assert card["checkpoint"]["distilled"] == new["distilled"]  # what is shipped says it was distilled
    train_main(["--resume", str(run), "--total-steps", "192"])  # as a user resumes it
    resumed = checkpoints.load(checkpoints.checkpoint_files(run)[0])
    assert resumed["env_steps"] == 192 and "distilled" not in resumed  # it trains on; the record stays where written


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
    assert distill_command.asks_for_distillation(vr_edge) == (64, 1)  # the defaults: make train
    assert distill_command.asks_for_distillation({**vr_edge, "distill_rounds": 2}) == (64, 2)
    assert distill_command.asks_for_distillation({**vr_edge, "total_steps": 999_999}) == no  # a short run
    assert distill_command.asks_for_distillation({**vr_edge, "distill_episodes": 0}) == no  # turned off
    assert distill_command.asks_for_distillation({k: v for k, v in vr_edge.items() if k != "distill_episodes"}) == no
    assert distill_command.asks_for_distillation({**vr_edge, "env": "CartPole-v1", "env_kwargs": ""}) == no
    assert distill_command.asks_for_distillation({**vr_edge, "env_kwargs": "capacity_trace=pensieve"}) == no
    apex = TrainConfig.from_dict({"algo": "apex", "total_steps": 3_000_000}).to_dict()
    assert distill_command.asks_for_distillation(apex) == no


@pytest.mark.slow  # trains, distils (twice), resumes
def test_a_finished_run_that_asks_is_distilled_and_says_so(tmp_path, capsys, monkeypatch):
    run, config = tmp_path / "run", tmp_path / "distil.toml"
    config.write_text("distill_episodes = 2\ndistill_rounds = 2\n")
    monkeypatch.setattr(distill_command, "DISTILL_AFTER_STEPS", 64)  # (a test run: as long as a real one)
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


def test_runs_that_cannot_be_distilled_are_one_line(tmp_path, capsys):
    cartpole = tmp_path / "cartpole"
    train(parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "16",
                      "--threads", "1", "--run-dir", str(cartpole)]).config, progress=False)
    with exits(2, "CartPole-v1", capsys=capsys):
        distill_command.main([str(cartpole)])
    with exits(2, "nowhere", capsys=capsys):
        distill_command.main([str(tmp_path / "nowhere")])
    with exits(2, "--epochs", capsys=capsys):
        distill_command.main([str(cartpole), "--epochs", "0"])
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
