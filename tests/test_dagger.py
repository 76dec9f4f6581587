"""DAgger inside the loop (trainer/ppo/dagger.py, ``dagger_labels``): the expert sees every step of the envs it
labels and labels what a standalone expert following them would; one imitation step moves the actor toward its
levels; a run that labels resumes bit for bit (the expert's state is in the checkpoint); settings it cannot run with
are refused in one line."""

from pathlib import Path

import numpy as np
import pytest
import torch

import checkpoints
import envs
from envs.belief_mpc_torch import TorchBeliefMPC
from envs.settings import ConfigError
from tests.factories import settings_file
from tests.messages import raises
from trainer import train as train_module
from trainer.common.world import ALONE
from trainer.config import TrainConfig
from trainer.flags import parse_args
from trainer.ppo.dagger import InLoopLabels, LabelPlan, imitation_step, label_plan
from trainer.ppo.model import ActorCritic

SMALL = {"num_users": 3, "max_steps": 12}


def _rollouts(steps: int, num_envs: int = 4, seed: int = 0) -> list[np.ndarray]:
    """Observations of ``num_envs`` envs of :data:`SMALL` playing random levels for ``steps`` steps (autoresets
    included: 12-step episodes)."""
    venv = envs.VREdgeVectorEnv(num_envs, seed=seed, **SMALL)
    obs, _ = venv.reset()
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(steps):
        seen.append(obs)
        obs, *_ = venv.step(rng.integers(0, venv.config.num_levels, size=(num_envs, venv.config.num_users)))
    return seen


def test_the_labels_are_a_standalone_experts_on_the_planned_steps():
    seen = _rollouts(30)  # two rollouts of 15 steps, every 3rd step of the first 2 envs labelled
    labeller = InLoopLabels("VREdge-v0", SMALL, LabelPlan(2, 3), seed=7, device="cpu")
    got = [labeller.labelled(torch.as_tensor(np.stack(seen[i:i + 15]))) for i in (0, 15)]
    standalone = TorchBeliefMPC(envs.VREdgeConfig(**SMALL), seed=7)
    want_obs, want_levels = [], []
    for t, obs in enumerate(seen):
        if t % 3 == 0:
            want_obs.append(obs[:2])
            want_levels.append(standalone(obs[:2]))
        else:
            standalone.observe(obs[:2])
    assert torch.equal(torch.cat([g.observations for g in got]), torch.as_tensor(np.concatenate(want_obs)))
    assert torch.equal(torch.cat([g.levels for g in got]), torch.as_tensor(np.concatenate(want_levels)))


def test_a_labeller_restored_from_its_state_labels_what_the_first_would():
    seen = [torch.as_tensor(np.stack(_rollouts(24)[i:i + 8])) for i in (0, 8, 16)]
    first = InLoopLabels("VREdge-v0", SMALL, LabelPlan(2, 2), seed=3, device="cpu")
    first.labelled(seen[0])
    second = InLoopLabels("VREdge-v0", SMALL, LabelPlan(2, 2), seed=3, device="cpu")
    second.load_state(first.state())
    for rollout in seen[1:]:
        assert torch.equal(first.labelled(rollout).levels, second.labelled(rollout).levels)


def test_imitation_steps_move_the_actor_toward_the_experts_levels():
    venv = envs.VREdgeVectorEnv(4, seed=0, **SMALL)
    labeller = InLoopLabels("VREdge-v0", SMALL, LabelPlan(4, 1), seed=0, device="cpu")
    labels = labeller.labelled(torch.as_tensor(np.stack(_rollouts(12))))
    model = ActorCritic(venv.single_observation_space, venv.single_action_space, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = [imitation_step(model, optimizer, labels, 0.5, ALONE) for _ in range(60)]
    assert first[-1]["imitation_loss"] < 0.7 * first[0]["imitation_loss"]
    assert first[-1]["imitation_agreement"] > first[0]["imitation_agreement"] + 0.2


@pytest.mark.parametrize("labels, want", [(128, LabelPlan(8, 8)), (1, LabelPlan(8, 1024)), (4096, LabelPlan(8, 1))])
def test_the_plan_spreads_the_labels_over_8_envs(labels, want):
    assert label_plan(labels, 64, 128) == want


def _run(argv, **kw):
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given,
                              overwrite=cli.overwrite, **kw)


def test_a_run_that_labels_resumes_bit_for_bit(tmp_path, capsys):
    argv = ["--env", "VREdge-v0", "--env-kwargs", "num_users=3,max_steps=12", "--num-envs", "4", "--num-steps", "16",
            "--total-steps", str(4 * 16 * 4), "--checkpoint-every", "1", "--seed", "5",
            "--config", settings_file("dagger")]
    straight = _run(argv + ["--run-dir", str(tmp_path / "straight")])
    assert "dagger_labels" in capsys.readouterr().err  # (the start says it labels)
    _run(argv + ["--run-dir", str(tmp_path / "split")], max_iterations=2)
    _run(["--resume", str(tmp_path / "split")])
    a, b = (checkpoints.latest_loadable(tmp_path / d)[1] for d in ("straight", "split"))
    assert straight["iterations"] == 4
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["labeller"]["step"] == b["labeller"]["step"] == 4 * 16
    # and the labels mattered: the same run without them ends elsewhere
    _run([x for x in argv if x not in ("--config", settings_file("dagger"))] + ["--run-dir", str(tmp_path / "plain")])
    plain = checkpoints.latest_loadable(tmp_path / "plain")[1]["model"]
    assert any(not torch.equal(plain[k], a["model"][k]) for k in plain)


@pytest.mark.parametrize("config, named", [
    ({"env": "CartPole-v1"}, "CartPole-v1"),
    ({"env": "VREdge-v0", "env_kwargs": "capacity_trace=pensieve"}, "capacity_trace"),
])
def test_what_it_cannot_label_is_refused_in_one_line(config, named):
    with raises(ConfigError, "dagger_labels", named):
        TrainConfig.from_dict({**config, "dagger_labels": 16}).validate()


def test_the_recipe_asks_for_labels_during_half_the_default_steps():
    cfg = parse_args(["--config", str(Path(__file__).parents[1] / "docs" / "dagger.toml")]).config
    cfg.validate()
    default = parse_args(["--env", "VREdge-v0"]).config
    assert cfg.algo_settings.dagger_labels > 0 and default.algo_settings.dagger_labels == 0
    assert cfg.total_steps * 2 == default.total_steps
    assert cfg.algo_settings.distill_episodes == default.algo_settings.distill_episodes > 0  # the round after it
