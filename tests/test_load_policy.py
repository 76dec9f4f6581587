"""trainer.load_policy: a trained policy in three lines, acting as trainer.evaluate plays it."""

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

import checkpoints
import trainer
from trainer.evaluation import policy_actions
from trainer.evaluation.policies import picked_checkpoint, policy_from_state
from trainer.flags import parse_args
from trainer.train import train

REPO = Path(__file__).resolve().parents[1]
TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "32", "--threads", "1",
        "--device", "cpu", "--backend", "sync", "--checkpoint-every", "1"]
APEX = ["--algo", "apex", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "64",
        "--learning-starts", "16", "--threads", "1", "--device", "cpu", "--backend", "sync"]


def trained(run_dir: Path, flags: list[str]) -> Path:
    train(parse_args([*flags, "--run-dir", str(run_dir)]).config, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return trained(tmp_path_factory.mktemp("cartpole") / "run", TINY)


def played_observations(count: int = 64) -> np.ndarray:
    """Observations ``[count, 4]`` that CartPole gives, from random play on a few seeds."""
    env, seen = gym.make("CartPole-v1"), []
    env.action_space.seed(0)
    observation, _ = env.reset(seed=0)
    while len(seen) < count:
        seen.append(observation)
        observation, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            observation, _ = env.reset(seed=len(seen))
    return np.stack(seen)


def evaluated_actions(path: Path, observations: np.ndarray, pick: str = "best") -> np.ndarray:
    """The greedy actions ``python -m trainer.evaluate --checkpoint path`` plays on ``observations``."""
    source, state, _ = picked_checkpoint(path, pick)
    model, _ = policy_from_state(state, source)
    return policy_actions(model, deterministic=True)(observations)


def test_a_run_directory_acts_as_trainer_evaluate_plays_it_one_observation_or_a_batch(run):
    policy = trainer.load_policy(run)
    observations = played_observations()
    expected = evaluated_actions(run, observations)
    batch = policy(observations)
    assert batch.shape == (len(observations),) and np.array_equal(batch, expected)
    one_by_one = [policy(o) for o in observations]
    assert all(np.shape(a) == () for a in one_by_one)  # one observation, one action: as env.step takes it
    assert np.array_equal(np.array(one_by_one), expected)
    assert np.array_equal(policy(observations.astype(np.float64)), expected)  # cast as the env's dtype
    assert policy.source == checkpoints.checkpoint_files(run)[0]  # no best pointer: the newest loadable
    assert policy.config.env == "CartPole-v1" and policy.config.total_steps == 32
    assert policy.observation_space == gym.make("CartPole-v1").observation_space
    assert policy.action_space == gym.spaces.Discrete(2)


def test_a_checkpoint_file_is_that_checkpoint(run):
    oldest = checkpoints.checkpoint_files(run)[-1]
    assert oldest != checkpoints.checkpoint_files(run)[0]  # a run of two checkpoints: the file is not the newest
    policy = trainer.load_policy(oldest)
    observations = played_observations()
    assert policy.source == oldest
    assert np.array_equal(policy(observations), evaluated_actions(oldest, observations))


def test_pick_best_takes_the_best_pointer_and_latest_the_newest(run, tmp_path):
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    newest, oldest = checkpoints.checkpoint_files(copy)
    checkpoints.set_best(copy, oldest, {"val_return": 1.0}, keep=2)
    assert trainer.load_policy(copy).source == oldest
    assert trainer.load_policy(copy, pick="latest").source == newest


def test_a_pick_with_nothing_skipped_says_nothing(run, tmp_path, capsys):
    """Issue 61: ``pick="latest"`` said a blank ``skipped`` line (no problem to name) on stderr."""
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    capsys.readouterr()
    trainer.load_policy(run, pick="latest")  # a run without a best pointer
    trainer.load_policy(run)
    checkpoints.set_best(copy, checkpoints.checkpoint_files(copy)[-1], {"val_return": 1.0}, keep=2)
    trainer.load_policy(copy, pick="latest")  # a best pointer there, not asked for
    said = capsys.readouterr()
    assert said.err == "" and said.out == "", said


def test_stochastic_samples_where_greedy_does_not(run):
    observations = np.repeat(played_observations(1), 256, axis=0)
    assert len(set(trainer.load_policy(run)(observations).tolist())) == 1
    sampled = trainer.load_policy(run, stochastic=True)(observations)  # a policy 32 steps old: about 50/50
    assert set(sampled.tolist()) == {0, 1}


def test_an_ape_x_policy_acts_greedily_and_says_it_cannot_sample(tmp_path):
    run_dir = trained(tmp_path / "apex", APEX)
    with pytest.raises(ValueError, match="stochastic=True: .*Ape-X Q-network, whose policy is greedy.*pass "
                                         "stochastic=False"):
        trainer.load_policy(run_dir, stochastic=True)
    observations = played_observations()
    assert np.array_equal(trainer.load_policy(run_dir)(observations), evaluated_actions(run_dir, observations))


def test_a_missing_path_is_one_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-run"
    with pytest.raises(checkpoints.CheckpointError, match=re.escape(f"{missing}: no such checkpoint file or run "
                                                                    "directory")):
        trainer.load_policy(missing)


def test_an_observation_of_another_shape_is_refused_naming_both(run):
    with pytest.raises(ValueError, match=re.escape("an observation of shape [5]: CartPole-v1's are [4], one, or "
                                                   "[n, 4] for a batch")):
        trainer.load_policy(run)(np.zeros(5))


def test_the_package_loads_torch_only_when_load_policy_is_used():
    code = ("import sys, trainer\n"
            "assert 'torch' not in sys.modules and 'load_policy' in trainer.__all__\n"
            "trainer.load_policy\n"
            "assert 'torch' in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_readmes_lines_act_on_the_newest_run_in_a_fresh_interpreter_as_written(tmp_path, monkeypatch):
    """As a user pastes them into a new Python in the checkout after ``make train``, unchanged: nothing imported
    before (VREdge-v0 must be registered by what the lines import), the newest run under ``runs/`` is the one they
    load (an older run beside it is not), and the action is the one trainer.evaluate plays on that observation."""
    code = re.search(r"<!-- docs-test: run by tests/test_load_policy.py -->\n```python\n(.*?)```",
                     (REPO / "README.md").read_text(), re.S).group(1)
    older = tmp_path / "runs" / "VREdge-v0-s1-20000101-000000"  # not a run at all: loading it would fail
    older.mkdir(parents=True)
    os.utime(older, (0, 0))
    monkeypatch.chdir(tmp_path)  # a new run's default directory is runs/<env>-s<seed>-<time>, as make train's
    train(parse_args(["--env", "VREdge-v0", "--num-envs", "2", "--num-steps", "8", "--total-steps", "16",
                      "--threads", "1", "--device", "cpu", "--eval-episodes", "0"]).config, progress=False)
    (run_dir,) = set((tmp_path / "runs").iterdir()) - {older}
    shown = "import json; print(json.dumps([str(run), observation.tolist(), action.tolist()]))\n"
    done = subprocess.run([sys.executable, "-c", code + shown], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, observation, action = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(loaded) == Path("runs") / run_dir.name
    observation = np.asarray(observation, dtype=np.float32)
    assert np.array_equal(action, evaluated_actions(run_dir, observation[None])[0])


def test_a_pick_that_is_not_one_is_refused(run):
    with pytest.raises(ValueError) as e:
        trainer.load_policy(run, pick="newest")
    assert "newest" in str(e.value) and "latest" in str(e.value)


def test_a_set_policy_acts_on_observations_of_any_slot_count(tmp_path):
    run_dir = trained(tmp_path / "set", ["--env", "VREdge-v0", "--num-envs", "2", "--num-steps", "8",
                                         "--total-steps", "16", "--threads", "1", "--device", "cpu",
                                         "--config", str(REPO / "tests" / "settings" / "policy_arch_set.toml")])
    policy = trainer.load_policy(run_dir)
    env = gym.make("VREdge-v0")
    observation, _ = env.reset(seed=0)
    observations = [observation]
    for _ in range(15):
        observations.append(env.step(env.action_space.sample())[0])
    observations = np.stack(observations)
    assert np.array_equal(policy(observations), evaluated_actions(run_dir, observations))  # at its 8 slots
    users, cell = observations[:, :-5].reshape(16, 8, 7), observations[:, -5:]
    for slots in ([3], [0, 1], list(range(8)) * 2):  # 1, 2 and 16 slots
        wider = np.concatenate([users[:, slots].reshape(16, -1), cell], axis=1)
        assert policy(wider).shape == (16, len(slots)) and policy(wider[0]).shape == (len(slots),)
        assert np.array_equal(policy(wider), policy.model.act_deterministic(torch.from_numpy(wider)).numpy())
    with pytest.raises(ValueError, match=r"7 \* users \+ 5"):
        policy(observations[:, :-1])
