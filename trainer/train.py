"""Train a PPO policy: ``python -m trainer.train`` (VR-edge with defaults; ``--help`` for every flag)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import sys
import time
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import envs  # noqa: F401 - registers VREdge-v0
from collectors import RolloutCollector
from trainer.batching import plan_minibatches
from trainer.config import TrainConfig, parse_config
from trainer.model import ActorCritic
from trainer.ppo import NonFiniteLossError, advantages_and_returns, ppo_update

QOE_KEYS = ("quality", "stall_s", "switches")


def env_factories(cfg: TrainConfig) -> list:
    """VR-edge runs as natively batched envs (one per process for async); other ids via gymnasium.make."""
    if cfg.env not in gym.registry:
        raise ValueError(f"unknown env id {cfg.env!r}: register it with gymnasium first (e.g. CartPole-v1, "
                         "VREdge-v0)")
    if cfg.env == "VREdge-v0" and cfg.backend != "serial":
        parts = 1 if cfg.backend == "sync" else max(2, cfg.num_workers + 1)
        sizes = [len(a) for a in np.array_split(np.arange(cfg.num_envs), min(parts, cfg.num_envs))]
        return [functools.partial(envs.VREdgeVectorEnv, n) for n in sizes]
    return [functools.partial(gym.make, cfg.env)] * cfg.num_envs


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available; use --device cpu or auto")
    return torch.device(name)


class ReturnScaler:
    """Divides rewards by the running std of the discounted return (per env), as in many PPO codes."""

    def __init__(self, num_envs: int, gamma: float, device: torch.device) -> None:
        self.gamma = gamma
        self.ret = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)
        self.count = 1e-4

    def scale(self, rewards: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        rets = torch.empty_like(rewards, dtype=torch.float64)
        for t in range(rewards.shape[0]):
            self.ret = self.ret * self.gamma + rewards[t]
            rets[t] = self.ret
            self.ret = torch.where(done[t], torch.zeros_like(self.ret), self.ret)
        n = rets.numel()
        delta, total = rets.mean() - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + rets.var(unbiased=False) * n + delta**2 * self.count * n / total) / total
        self.count = total
        return (1.0 / torch.sqrt(self.var + 1e-8)).float()


def train(cfg: TrainConfig, progress: bool = True) -> dict:
    """Run PPO as configured; returns a summary (run dir, final metrics)."""
    factories = env_factories(cfg)  # checks the env id before anything is created
    device = resolve_device(cfg.device)
    plan = plan_minibatches(cfg.num_envs, cfg.num_steps, cfg.batch_size or None)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    run_dir = Path(cfg.run_dir or f"runs/{cfg.env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    torch.manual_seed(cfg.seed)

    probe = gym.make(cfg.env) if cfg.env != "VREdge-v0" else envs.SyntheticVREdgeEnv()
    model = ActorCritic(probe.observation_space, probe.action_space, cfg.hidden_sizes, cfg.shared_trunk,
                        cfg.normalize_obs, seed=cfg.seed).to(device)
    probe.close()
    acting = ActorCritic(probe.observation_space, probe.action_space, cfg.hidden_sizes, cfg.shared_trunk,
                         cfg.normalize_obs, seed=cfg.seed)
    acting.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5)
    perm_gen = torch.Generator(device=device).manual_seed(cfg.seed + 2)
    scaler = ReturnScaler(cfg.num_envs, cfg.gamma, device) if cfg.scale_rewards else None
    writer = _tensorboard(run_dir) if cfg.tensorboard else None

    per_rollout = cfg.num_envs * cfg.num_steps
    iterations = max(1, cfg.total_steps // per_rollout)
    recent = deque(maxlen=100)
    metrics_path = run_dir / "metrics.jsonl"
    summary: dict = {"run_dir": str(run_dir), "iterations": 0}
    collector = RolloutCollector(factories, acting, backend=cfg.backend, horizon=cfg.num_steps,
                                 seed=cfg.seed, device=device, num_workers=cfg.num_workers or None)
    bar = tqdm(range(1, iterations + 1), disable=not progress, unit="it", dynamic_ncols=True)
    start = time.perf_counter()
    try:
        with collector, metrics_path.open("a") as log:
            for it in bar:
                if cfg.anneal_lr:
                    optimizer.param_groups[0]["lr"] = cfg.lr * (1 - (it - 1) / iterations)
                batch = collector.collect()
                episodes = collector.episodes
                recent.extend(e["return"] for e in episodes)
                if cfg.normalize_obs:
                    model.norm.update(batch["observations"])
                scale = scaler.scale(batch["rewards"], batch["final_observation_mask"]) if scaler else 1.0
                adv, ret = advantages_and_returns(model, batch, collector.last_observations, cfg.gamma,
                                                  cfg.gae_lambda, scale)
                good = {k: v.clone() for k, v in model.state_dict().items()}
                try:
                    stats = ppo_update(model, optimizer, batch, adv, ret, epochs=cfg.epochs,
                                       minibatch_size=plan.minibatch_size, clip_coef=cfg.clip_coef,
                                       clip_value=cfg.clip_value, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
                                       max_grad_norm=cfg.max_grad_norm, norm_adv=cfg.norm_adv,
                                       target_kl=cfg.target_kl or None, generator=perm_gen)
                except NonFiniteLossError as e:
                    model.load_state_dict(good)
                    raise NonFiniteLossError(f"iteration {it}: {e}; training stopped, the model keeps the "
                                             "weights of the previous iteration (try a lower --lr)") from None
                acting.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})  # once per rollout
                steps = it * per_rollout
                row = {"iteration": it, "env_steps": steps, "sps": steps / (time.perf_counter() - start),
                       "lr": optimizer.param_groups[0]["lr"], **stats, "episodes": len(episodes),
                       "episode_return": float(np.mean([e["return"] for e in episodes])) if episodes else None,
                       "episode_length": float(np.mean([e["length"] for e in episodes])) if episodes else None,
                       "reward_per_step": float(batch["rewards"].mean())}
                for k in QOE_KEYS:
                    vals = [e[k] for e in episodes if k in e]
                    if vals:
                        row[k] = float(np.mean(vals))
                log.write(json.dumps(row) + "\n")
                log.flush()
                if writer:
                    for k, v in row.items():
                        if isinstance(v, (int, float)):
                            writer.add_scalar(k, v, steps)
                bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{np.mean(recent):.2f}" if recent else "-")
                summary.update(iterations=it, env_steps=steps, last=row,
                               recent_return=float(np.mean(recent)) if recent else None)
    except KeyboardInterrupt:
        print(f"\ninterrupted after {summary['iterations']} iterations; workers closed", file=sys.stderr)
    finally:
        bar.close()
        if writer:
            writer.close()
    torch.save({"model": model.state_dict(), "config": cfg.to_dict()}, run_dir / "model.pt")
    summary["model"] = str(run_dir / "model.pt")
    return summary


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ValueError("--tensorboard needs the tensorboard extra: pip install -e '.[tensorboard]'") from e
    return SummaryWriter(str(run_dir / "tb"))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    try:
        summary = train(cfg)
    except (ValueError, TypeError, NonFiniteLossError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"run directory: {summary['run_dir']} ({summary['iterations']} iterations, "
          f"{summary.get('env_steps', 0):,} env steps)")
    print(f"metrics:       {summary['run_dir']}/metrics.jsonl")
    print(f"final model:   {summary['model']}")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
