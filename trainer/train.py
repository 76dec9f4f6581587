"""Train a PPO policy: ``python -m trainer.train`` (VR-edge with defaults; ``--help`` for every flag)."""

from __future__ import annotations

import json
import multiprocessing
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import checkpoints
import envs  # noqa: F401 - registers VREdge-v0
from collectors import RolloutCollector
from collectors.resources import torch_threads
from trainer import __version__
from trainer.batching import plan_minibatches
from trainer.config import TrainConfig, parse_args, resumed_config
from trainer.flat_params import flat_parameters
from trainer.layout import Machine, learner_device, run_layout
from trainer.model import ActorCritic
from trainer.ppo import NonFiniteLossError, advantages_and_returns, ppo_update, vtrace_targets

QOE_KEYS = ("quality", "stall_s", "switches")


def make_model(cfg: TrainConfig) -> ActorCritic:
    """The actor-critic for ``cfg.env``: per-head actor where the env declares a layout and ``--policy-arch`` allows."""
    env = gym.make(cfg.env)
    try:
        layout = getattr(env.unwrapped, "head_observation_layout", None)
        if cfg.policy_arch == "per_head" and layout is None:
            raise ValueError(f"--policy-arch per_head: {cfg.env} declares no head_observation_layout; use flat")
        per_head = layout if cfg.policy_arch in ("auto", "per_head") else None
        return ActorCritic(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.shared_trunk,
                           cfg.normalize_obs, seed=cfg.seed, per_head=per_head)
    finally:
        env.close()


def resolve_device(name: str) -> torch.device:
    return torch.device(learner_device(name, torch.cuda.device_count()))


class ReturnScaler:
    """Divides rewards by the running std of the discounted return (per env), as in many PPO codes."""

    def __init__(self, num_envs: int, gamma: float, device: torch.device) -> None:
        self.gamma = gamma
        self.ret = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.moments = torch.tensor([0.0, 1.0, 1e-4], dtype=torch.float64, device=device)  # mean, var, count

    def scale(self, rewards: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        rets = torch.empty_like(rewards, dtype=torch.float64)
        for t in range(rewards.shape[0]):
            self.ret = self.ret * self.gamma + rewards[t]
            rets[t] = self.ret
            self.ret = torch.where(done[t], torch.zeros_like(self.ret), self.ret)
        mean, var, count = self.moments
        n = rets.numel()
        delta, total = rets.mean() - mean, count + n
        var = (var * count + rets.var(unbiased=False) * n + delta**2 * count * n / total) / total
        self.moments = torch.stack([mean + delta * n / total, var, total])
        return (1.0 / torch.sqrt(var + 1e-8)).float()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"ret": self.ret.cpu(), "moments": self.moments.cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.ret = state["ret"].to(self.ret.device)
        self.moments = state["moments"].to(self.moments.device)


@dataclass
class Run:
    """Everything a training run carries from one iteration to the next (and into a checkpoint)."""

    cfg: TrainConfig
    device: torch.device
    model: ActorCritic
    acting: ActorCritic
    optimizer: torch.optim.Optimizer
    perm_gen: torch.Generator
    scaler: ReturnScaler | None
    iteration: int = 0
    env_steps: int = 0
    dropped: int = 0
    lags: dict = field(default_factory=dict)  # policy lag -> number of batches (0 when collection is synchronous)
    recent: deque = field(default_factory=lambda: deque(maxlen=100))

    def state(self, collector: RolloutCollector) -> dict[str, Any]:
        return {
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
                "acting": self.acting.generator.get_state(), "minibatch": self.perm_gen.get_state(),
            },
            "collector": collector.get_state(),
        }

    def restore(self, state: dict[str, Any], collector: RolloutCollector) -> bool:
        """Load a checkpoint's state; returns whether the envs were restored exactly."""
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.model.load_state_dict(state["model"])
        self.acting.load_state_dict({k: v.cpu() for k, v in self.model.state_dict().items()})
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["reward_scaler"] is not None:
            self.scaler.load_state_dict(state["reward_scaler"])
        self.recent.extend(state["recent_returns"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.acting.generator.set_state(rng["acting"])
        self.perm_gen.set_state(rng["minibatch"])
        return collector.set_state(state["collector"], reseed=self.iteration)


def _new_run(cfg: TrainConfig) -> Run:
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = make_model(cfg).to(device)
    acting = make_model(cfg)  # the collector's CPU copy, synced once per rollout
    acting.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    # one flat tensor and a fused kernel: Adam is a single op per minibatch, not ~10 per parameter
    optimizer = torch.optim.Adam([flat_parameters(model)], lr=cfg.lr, eps=1e-5, fused=True)
    return Run(cfg, device, model, acting, optimizer,
               torch.Generator(device=device).manual_seed(cfg.seed + 2),
               ReturnScaler(cfg.num_envs, cfg.gamma, device) if cfg.scale_rewards else None)


def _iteration(run: Run, collector: RolloutCollector, plan, iterations: int, start: tuple[int, float],
               log) -> dict | None:
    """Collect one rollout, update PPO on it, log; returns the logged row (``None`` for a dropped batch)."""
    cfg, model = run.cfg, run.model
    it = run.iteration + 1
    if cfg.anneal_lr:
        run.optimizer.param_groups[0]["lr"] = cfg.lr * (1 - (it - 1) / iterations)
    batch = collector.collect()
    lag = collector.policy_version - collector.batch_version
    run.lags[lag] = run.lags.get(lag, 0) + 1
    if cfg.ray_async and lag > cfg.max_lag:  # too stale to correct well: skip it, the next one is fresher
        run.dropped += 1
        return None
    episodes = collector.episodes
    run.recent.extend(e["return"] for e in episodes)
    if cfg.normalize_obs:
        model.norm.update(batch["observations"])
    scale = run.scaler.scale(batch["rewards"], batch["final_observation_mask"]) if run.scaler else 1.0
    if cfg.ray_async:
        adv, ret = vtrace_targets(model, batch, collector.last_observations, cfg.gamma, cfg.rho_bar, cfg.c_bar, scale)
    else:
        adv, ret = advantages_and_returns(model, batch, collector.last_observations, cfg.gamma, cfg.gae_lambda,
                                          scale)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        stats = ppo_update(model, run.optimizer, batch, adv, ret, epochs=cfg.epochs,
                           minibatch_size=plan.minibatch_size, clip_coef=cfg.clip_coef, clip_value=cfg.clip_value,
                           ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm,
                           norm_adv=cfg.norm_adv, target_kl=cfg.target_kl or None, generator=run.perm_gen)
    except NonFiniteLossError as e:
        model.load_state_dict(good)
        raise NonFiniteLossError(f"iteration {it}: {e}; training stopped, the model keeps the weights of the "
                                 "previous iteration (try a lower --lr)") from None
    run.acting.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    run.iteration = it
    run.env_steps += batch.numel()
    steps = run.env_steps
    row = {"iteration": it, "env_steps": steps, "sps": (steps - start[0]) / (time.perf_counter() - start[1]),
           "lr": run.optimizer.param_groups[0]["lr"], **stats,
           "episodes": len(episodes),
           "episode_return": float(np.mean([e["return"] for e in episodes])) if episodes else None,
           "episode_length": float(np.mean([e["length"] for e in episodes])) if episodes else None,
           "reward_per_step": float(batch["rewards"].mean()), "policy_lag": lag}
    for k in QOE_KEYS:
        vals = [e[k] for e in episodes if k in e]
        if vals:
            row[k] = float(np.mean(vals))
    log.write(json.dumps(row) + "\n")
    log.flush()
    return row


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, machine: Machine | None = None) -> dict:
    """Run PPO as configured (or continue the run at ``resume``); returns a summary.

    ``max_iterations`` stops early after that many iterations in total (the LR schedule
    still follows ``total_steps``), leaving a checkpoint to resume from. ``machine``
    replaces the detected one in the run layout (tests simulate machines with it).
    """
    saved, source, notes = None, None, []
    if resume:
        source, saved, problems = checkpoints.latest_loadable(resume)
        notes += [f"skipped {p}" for p in problems]
        cfg = resumed_config(saved["config"], given or {}, str(source))
        if not cfg.run_dir:
            cfg.run_dir = str(source.parent.parent if source.parent.name == "checkpoints" else source.parent)
    # --- run layout (issue 10): computed once here; nothing below recomputes it
    layout = run_layout(cfg, machine or Machine.detect(cfg.backend, cfg.ray_address))  # checks the env id first
    print(layout.describe(), *(f"warning: {w}" for w in layout.warnings), sep="\n", file=sys.stderr)
    factories, batch_envs = layout.env_factories(), layout.batch_envs  # ray_async: one actor's slice
    # --- end run layout
    plan = plan_minibatches(batch_envs, cfg.num_steps, cfg.batch_size or None)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    run_dir = Path(cfg.run_dir or f"runs/{cfg.env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": layout.to_dict()}, indent=2))
    run = _new_run(cfg)
    writer = _tensorboard(run_dir) if cfg.tensorboard else None
    iterations = max(1, cfg.total_steps // (batch_envs * cfg.num_steps))
    stop = min(iterations, max_iterations or iterations)
    collector = RolloutCollector(factories, run.acting, backend=cfg.backend, horizon=cfg.num_steps,
                                 seed=cfg.seed, device=run.device, **layout.collector_kwargs())
    summary: dict = {"run_dir": str(run_dir), "iterations": 0, "interrupted": False}
    last_saved = None
    with collector, torch_threads(layout.learn_threads):  # the collector switches to its own count while collecting
        if saved is not None:
            exact = run.restore(saved, collector)
            notes.append(f"resumed from {source} at iteration {run.iteration}")
            if not exact:
                notes.append("these envs offer no get_state(): their episodes restart from derived seeds, "
                             "so the resumed run is not identical to an uninterrupted one")
        for note in notes:
            print(note, file=sys.stderr)

        def save() -> Path:
            return checkpoints.save_in_run_dir(run_dir, run.state(collector), run.iteration, cfg.keep_checkpoints)

        bar = tqdm(total=stop, initial=run.iteration, disable=not progress, unit="it", dynamic_ncols=True)
        start = (run.env_steps, time.perf_counter())
        try:
            with (run_dir / "metrics.jsonl").open("a") as log:
                while run.iteration < stop:
                    row = _iteration(run, collector, plan, iterations, start, log)
                    if row is None:  # a batch too stale to learn from
                        continue
                    if writer:
                        for k, v in row.items():
                            if isinstance(v, (int, float)):
                                writer.add_scalar(k, v, row["env_steps"])
                    bar.update(1)
                    bar.set_postfix(sps=f"{row['sps']:,.0f}",
                                    ret=f"{np.mean(run.recent):.2f}" if run.recent else "-")
                    summary.update(last=row, env_steps=row["env_steps"])
                    if run.iteration % cfg.checkpoint_every == 0 or run.iteration == stop:
                        last_saved = save()
        except NonFiniteLossError as e:
            where = f"the newest checkpoint is {last_saved}" if last_saved else "no checkpoint was written yet"
            raise NonFiniteLossError(f"{e}; {where}") from None
        except KeyboardInterrupt:
            summary["interrupted"] = True
            print(f"\ninterrupted at iteration {run.iteration}; workers closed", file=sys.stderr)
            if run.iteration and (last_saved is None or run.iteration % cfg.checkpoint_every):
                last_saved = save()  # the last completed iteration is not lost
        finally:
            bar.close()
            if writer:
                writer.close()
    if cfg.ray_async:
        print(f"policy lag (versions behind: batches): {dict(sorted(run.lags.items()))}; dropped {run.dropped} "
              f"batches older than --max-lag {cfg.max_lag}", file=sys.stderr)
    summary.update(iterations=run.iteration, checkpoint=str(last_saved) if last_saved else None,
                   lags=dict(run.lags), dropped=run.dropped,
                   recent_return=float(np.mean(run.recent)) if run.recent else None,
                   finished=run.iteration >= iterations)
    return summary


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ValueError("--tensorboard needs the tensorboard extra: pip install -e '.[tensorboard]'") from e
    return SummaryWriter(str(run_dir / "tb"))


def main(argv: list[str] | None = None) -> None:
    cfg, given, resume = parse_args(argv)
    try:
        summary = train(cfg, resume=resume, given=given)
    except (ValueError, TypeError, NonFiniteLossError) as e:
        raise SystemExit(f"error: {e}") from None
    run_dir = summary["run_dir"]
    print(f"run directory: {run_dir} ({summary['iterations']} iterations, {summary.get('env_steps', 0):,} env steps)")
    print(f"metrics:       {run_dir}/metrics.jsonl")
    if summary["checkpoint"]:
        print(f"checkpoint:    {summary['checkpoint']}")
        print(f"evaluate:      python -m trainer.evaluate --checkpoint {run_dir}")
        if not summary["finished"]:
            print(f"resume:        python -m trainer.train --resume {run_dir}")
        else:
            print(f"train longer:  python -m trainer.train --resume {run_dir} --total-steps N")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
