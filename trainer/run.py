"""A training run's state: how it is built from a config, what a checkpoint of it holds, where it lives."""

from __future__ import annotations

import random
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import checkpoints
import envs  # noqa: F401 - registers VREdge-v0
from trainer import __version__
from trainer.config import TrainConfig, resumed_config
from trainer.dqn import QNetwork
from trainer.flat_params import flat_parameters
from trainer.layout import learner_device
from trainer.model import ActorCritic
from trainer.pipeline import Pipeline
from trainer.reward_scaling import ReturnScaler


def make_model(cfg: TrainConfig) -> ActorCritic | QNetwork:
    """The actor-critic for ``cfg.env`` (per-head actor where the env declares a layout and ``--policy-arch``
    allows), or for ``--algo apex`` the Q-network (``trainer.apex.make_q_network``)."""
    if cfg.algo == "apex":
        from trainer.apex import make_q_network  # the Ape-X tier imports this module
        return make_q_network(cfg)
    obs_space, act_space, per_head = model_spaces(cfg)
    return ActorCritic(obs_space, act_space, cfg.hidden_sizes, cfg.shared_trunk, cfg.normalize_obs, seed=cfg.seed,
                       per_head=per_head)


def model_spaces(cfg: TrainConfig) -> tuple[gym.Space, gym.Space, tuple[int, int] | None]:
    """``(observation space, action space, per-head layout or None)`` of ``cfg.env`` as ``--policy-arch`` asks:
    the per-head layout where the env declares one (``auto``, ``per_head``), none for ``flat``."""
    env = gym.make(cfg.env, **cfg.env_options)
    try:
        layout = getattr(env.unwrapped, "head_observation_layout", None)
        if cfg.policy_arch == "per_head" and layout is None:
            raise ValueError(f"--policy-arch per_head: {cfg.env} declares no head_observation_layout; use flat")
        per_head = layout if cfg.policy_arch in ("auto", "per_head") else None
        return env.observation_space, env.action_space, per_head
    finally:
        env.close()


def resolve_device(name: str) -> torch.device:
    """The learner's device for ``--device`` (``auto``: CUDA where there is one)."""
    return torch.device(learner_device(name, torch.cuda.device_count()))


@dataclass
class Run:
    """Everything a training run carries from one iteration to the next (and into a checkpoint).

    ``model`` learns on ``device``; ``acting`` is the CPU copy the collector acts with (its
    weights arrive through ``collector.update_policy``; its sampling generator is run state).
    """

    cfg: TrainConfig
    device: torch.device
    model: ActorCritic
    acting: ActorCritic
    optimizer: torch.optim.Optimizer
    scaler: ReturnScaler | None
    iteration: int = 0
    env_steps: int = 0
    dropped: int = 0
    lags: dict = field(default_factory=dict)  # policy lag -> number of rollouts
    recent: deque = field(default_factory=lambda: deque(maxlen=100))

    @classmethod
    def new(cls, cfg: TrainConfig) -> Run:
        """A fresh run: model and its acting copy from ``cfg.seed``, fused Adam over one flat parameter."""
        device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        model = make_model(cfg).to(device)
        acting = make_model(cfg)
        acting.load_state_dict(model.state_dict())
        # one flat tensor and a fused kernel: Adam is a single op per minibatch, not ~10 per parameter
        optimizer = torch.optim.Adam([flat_parameters(model)], lr=cfg.lr, eps=1e-5, fused=True)
        return cls(cfg, device, model, acting, optimizer,
                   ReturnScaler(cfg.num_envs, cfg.gamma, device) if cfg.scale_rewards else None)

    def snapshot(self, pipeline: Pipeline) -> dict[str, Any]:
        """A copy of the whole state, on the CPU, with nothing tied to a device: what a checkpoint holds."""
        return copied({
            "version": __version__,
            "config": self.cfg.to_dict(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reward_scaler": self.scaler.state_dict() if self.scaler else None,
            "recent_returns": list(self.recent),
            "rng": {
                "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "acting": self.acting.generator.get_state(),
            },
            **pipeline.state(),  # "collector" (and, with --overlap, "acting_model")
        })

    def restore(self, state: dict[str, Any], pipeline: Pipeline) -> bool:
        """Load a checkpoint's state; returns whether the envs were restored exactly."""
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["reward_scaler"] is not None:
            self.scaler.load_state_dict(state["reward_scaler"])
        self.recent.extend(state["recent_returns"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():  # else: another machine
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.acting.generator.set_state(rng["acting"])
        return pipeline.restore(state, self.model.state_dict(), reseed=self.iteration)


def copied(x: Any) -> Any:
    """Deep copy of a state: tensors to fresh CPU tensors, arrays copied, containers rebuilt."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: copied(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(copied(v) for v in x)
    return x


RUN_FILES = ("checkpoints", "metrics.jsonl", "config.json", "evaluation.json", "evaluation.png", "tb")


def claim_new_run_dir(run_dir: Path, overwrite: bool) -> list[str]:
    """Refuse a directory that holds another run's checkpoints unless ``overwrite``; clear that run's files.

    A directory without checkpoints holds nothing to resume (a run stopped before its first
    save): it is free, and what that run left is cleared so that it does not mix with this one.
    Returns notes for the user.
    """
    if checkpoints.checkpoint_files(run_dir) and not overwrite:
        raise ValueError(f"run directory {run_dir} already holds a run (checkpoints); resume it with --resume "
                         f"{run_dir}, choose another --run-dir, or pass --overwrite to delete that run")
    left = [name for name in RUN_FILES if (run_dir / name).exists()]
    for name in left:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    if not left:
        return []
    return [f"--overwrite: deleted the previous run's files in {run_dir}" if overwrite else
            f"{run_dir}: cleared {', '.join(left)} of an earlier run that wrote no checkpoint"]


def resume_state(resume: str, given: dict[str, Any]) -> tuple[TrainConfig, Path, dict[str, Any], list[str]]:
    """Load the checkpoint to resume from; returns the resumed config, its file, state and notes."""
    source, saved, problems = checkpoints.latest_loadable(resume)
    notes = [f"skipped {p}" for p in problems]
    if saved.get("version") != __version__:
        notes.append(f"{source} was written by parallel-rollouts {saved.get('version')}; this is {__version__}")
    run_dir = checkpoints.run_dir_of(resume)
    if "run_dir" in given and Path(given["run_dir"]).resolve() != run_dir.resolve():
        raise ValueError(f"--resume writes into the run directory it resumes ({run_dir}); to continue a copy, "
                         f"copy the directory and resume the copy (drop --run-dir)")
    cfg = resumed_config({**saved["config"], "run_dir": str(run_dir)}, {**given, "run_dir": str(run_dir)},
                         str(source))
    return cfg, source, saved, notes
