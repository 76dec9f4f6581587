"""One policy layout (trainer.common.policy_layout): every model the algorithms build carries a PolicyLayout of the
right kind, and export, evaluation and cells decide from it, never from the model's class or the config."""

import ast
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import tests.factories  # noqa: F401  (registers MaskedCell-v0)
from envs.settings import ConfigError
from tests.messages import raises
from trainer.common.policy_layout import FLAT, PolicyLayout
from trainer.config import TrainConfig
from trainer.evaluation.policies import TrainedPolicy, make_model
from trainer.ppo import export
from trainer.ppo.set_model import SetActorCritic

REPO = Path(__file__).resolve().parents[1]
MASKED = "tests.factories:MaskedCell-v0"  # 5 slots of 4 features (the flag at 3), then 2 shared


@pytest.mark.parametrize("env, env_kwargs, arch, algo, layout", [
    ("CartPole-v1", "", "auto", "ppo", FLAT),
    ("CartPole-v1", "", "auto", "apex", FLAT),
    ("VREdge-v0", "", "flat", "ppo", FLAT),
    ("VREdge-v0", "", "auto", "ppo", PolicyLayout("per_head", 7, 5)),
    ("VREdge-v0", "", "per_head", "apex", PolicyLayout("per_head", 7, 5)),
    ("VREdge-v0", "", "set", "ppo", PolicyLayout("set", 7, 5)),
    (MASKED, "", "auto", "ppo", PolicyLayout("set", 4, 2, 3)),
    (MASKED, "masked=false", "auto", "ppo", PolicyLayout("per_head", 4, 2)),
    (MASKED, "", "auto", "apex", PolicyLayout("per_head", 4, 2)),  # Ape-X branches per head at the env's slots
    (MASKED, "", "per_head", "ppo", PolicyLayout("per_head", 4, 2)),  # the flag is a feature like any other
])
def test_every_model_the_algorithms_build_carries_its_layout(env, env_kwargs, arch, algo, layout):
    cfg = TrainConfig.from_dict({"env": env, "env_kwargs": env_kwargs, "policy_arch": arch, "algo": algo})
    assert make_model(cfg).layout == layout


def test_a_layout_says_its_kind_and_slot_facts_and_refuses_what_does_not_hold():
    layout = PolicyLayout("set", features=4, shared=2, active=3)
    assert layout.fits(5 * 4 + 2) and layout.fits(4 + 2) and not layout.fits(2) and not layout.fits(5 * 4 + 3)
    assert layout.slots(5 * 4 + 2) == 5 and PolicyLayout("per_head", 4, 2).slots(3 * 4 + 2) == 3
    assert not FLAT.fits(22)
    with raises(ValueError, "12 wide"):
        FLAT.slots(12)
    for bad in (dict(kind="tree"), dict(kind="flat", features=3), dict(kind="per_head"),
                dict(kind="per_head", features=4, shared=2, active=3), dict(kind="set", features=4, active=4)):
        with pytest.raises(ValueError):
            PolicyLayout(**bad)
    with pytest.raises(AttributeError):  # frozen: built once, never changed
        layout.kind = "flat"


def test_the_models_refuse_a_layout_of_another_kind():
    from trainer.apex.q_network import QNetwork
    from trainer.ppo.model import ActorCritic

    obs, act = gym.spaces.Box(0, 1, (3 * 4 + 2,)), gym.spaces.MultiDiscrete([3] * 3)
    with raises(ValueError, "SetActorCritic"):
        ActorCritic(obs, act, layout=PolicyLayout("set", 4, 2))
    with raises(ValueError, "set layout"):
        QNetwork(obs, act, layout=PolicyLayout("set", 4, 2))
    with raises(ValueError, "SetActorCritic reads a set layout"):
        SetActorCritic(obs, act, PolicyLayout("per_head", 4, 2))


class _Wrapped(nn.Module):
    """A set policy behind a class the trainer does not know: only its layout says it is one."""

    def __init__(self, inner: SetActorCritic) -> None:
        super().__init__()
        self.inner, self.layout, self.kind = inner, inner.layout, inner.kind

    def exported(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.inner.exported(obs)

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner.act_deterministic(obs)

    def action_probs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner.action_probs(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner.value(obs)


def test_a_model_whose_layout_says_set_is_exported_as_a_set_policy_whatever_its_class(tmp_path):
    layout = PolicyLayout("set", 4, 2, 3)
    inner = SetActorCritic(gym.spaces.Box(0, 1, (3 * 4 + 2,)), gym.spaces.MultiDiscrete([3] * 3), layout, seed=0)
    model = _Wrapped(inner).eval()
    signature = export._signature(model, 3 * 4 + 2)
    assert "4 * users + 2" in signature["inputs"]["obs"] and "(3 in training)" in signature["inputs"]["obs"]
    cases = export.slot_cases(model, np.zeros((2, 14), np.float32), seed=0)
    assert sorted(cases) == ["1 of 3 slots", "2 of 3 slots", "3 of 3 slots", "3 slots permuted"]
    path = tmp_path / export.FILES["torchscript"]
    export.export_file(export.ExportedPolicy(model), "torchscript", path, 3 * 4 + 2)
    obs = np.random.default_rng(0).random((5, 6 * 4 + 2)).astype(np.float32)  # 6 slots: trained on 3
    assert export.verify(model, path, obs)["actions_identical"] == 5


def test_a_per_head_model_is_exported_as_one_of_fixed_width():
    model = make_model(TrainConfig.from_dict({"env": MASKED, "env_kwargs": "masked=false"}))
    assert "[batch, 22]" in export._signature(model, 22)["inputs"]["obs"]
    assert list(export.slot_cases(model, np.zeros((2, 22), np.float32), seed=0)) == [""]


def test_a_loaded_policy_takes_other_slot_counts_only_where_its_models_layout_is_set():
    """Ape-X on ``auto`` over a cell whose users vary branches per head (the env would have PPO's set policy):
    the model's layout, not the env's, says which observations it takes."""
    cfg = TrainConfig.from_dict({"env": MASKED, "algo": "apex"})
    policy = TrainedPolicy(make_model(cfg), cfg, Path("apex.pt"))
    observation = np.zeros(5 * 4 + 2, np.float32)
    assert policy(observation).shape == (5,)
    with raises(ValueError, "[14]", "[22]"):
        policy(observation[:3 * 4 + 2])  # 3 slots: its branches are 5
    ppo = TrainConfig.from_dict({"env": MASKED})
    assert TrainedPolicy(make_model(ppo), ppo, Path("ppo.pt"))(observation[:3 * 4 + 2]).shape == (3,)


def test_apex_refuses_a_set_policy_in_one_line():
    with raises(ConfigError, "policy_arch", "PPO", key="policy_arch"):
        make_model(TrainConfig.from_dict({"env": MASKED, "algo": "apex", "policy_arch": "set"}))


MODEL_CLASSES = {"ActorCritic", "SetActorCritic", "QNetwork"}  # and any class named *Layout: a kind is a field
DUCK_TYPED = {"layout", "per_head", "any_slot_count"}


def _decisions_elsewhere(path: Path) -> list[str]:
    """Where ``path`` decides what kind of policy a model is other than by reading ``model.layout``: an
    ``isinstance`` against a model class (or the layout's), a ``getattr``/``hasattr`` on a layout-like name."""
    found, where = [], path.relative_to(REPO) if path.is_relative_to(REPO) else path
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        second = node.args[1]
        if node.func.id == "isinstance":
            names = {n.id for n in ast.walk(second) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(second) if isinstance(n, ast.Attribute)}
            if names & MODEL_CLASSES or any(n.endswith("Layout") for n in names):
                found.append(f"{where}:{node.lineno}: isinstance(..., {ast.unparse(second)})")
        elif node.func.id in ("getattr", "hasattr") and isinstance(second, ast.Constant) and second.value in DUCK_TYPED:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_layout_says_what_kind_of_policy_a_model_is():
    found = [d for package in ("envs", "collectors", "trainer", "checkpoints", "benchmarks")
             for path in sorted((REPO / package).rglob("*.py")) for d in _decisions_elsewhere(path)]
    assert not found, "decide from model.layout (trainer.common.policy_layout):\n" + "\n".join(found)


def test_a_decision_elsewhere_would_be_found(tmp_path):
    (tmp_path / "m.py").write_text("def f(model, layout):\n"
                                   "    if isinstance(model, SetActorCritic):\n        return 1\n"
                                   "    if isinstance(layout, SetLayout):\n        return 2\n"
                                   "    return getattr(model, 'per_head', None)\n")
    assert len(_decisions_elsewhere(tmp_path / "m.py")) == 3
