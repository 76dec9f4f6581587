"""Train a PPO policy: ``python -m trainer.train`` (VR-edge with defaults; ``--help`` for every flag)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import shlex
import shutil
import signal
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
from trainer.interrupts import STOP_SIGNALS, Interrupted, StopSignals
from trainer.layout import Machine, learner_device, run_layout
from trainer.model import ActorCritic
from trainer.ppo import NonFiniteLossError, advantages_and_returns, ppo_update, vtrace_targets
from trainer.validation import Validator

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

    def scale(self, rewards: torch.Tensor, done: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """The factor for a ``[T, n]`` batch of the envs ``rows`` (default: all; IMPALA batches hold one slice)."""
        rows = rows if rows is not None else slice(None)
        ret = self.ret[rows]
        rets = torch.empty_like(rewards, dtype=torch.float64)
        for t in range(rewards.shape[0]):
            ret = ret * self.gamma + rewards[t]
            rets[t] = ret
            ret = torch.where(done[t], torch.zeros_like(ret), ret)
        self.ret[rows] = ret
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
    scaler: ReturnScaler | None
    iteration: int = 0
    env_steps: int = 0
    dropped: int = 0
    lags: dict = field(default_factory=dict)  # policy lag -> number of batches (0 when collection is synchronous)
    recent: deque = field(default_factory=lambda: deque(maxlen=100))

    def snapshot(self, collector: RolloutCollector) -> dict[str, Any]:
        """A copy of the whole state, on the CPU, with nothing tied to a device: what a checkpoint holds."""
        return _copied({
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
            "collector": collector.get_state(),
        })

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
        if torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():  # else: another machine
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.acting.generator.set_state(rng["acting"])
        return collector.set_state(state["collector"], reseed=self.iteration)


def _copied(x: Any) -> Any:
    """Deep copy of a state: tensors to fresh CPU tensors, arrays copied, containers rebuilt."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copied(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_copied(v) for v in x)
    return x


def minibatch_generator(seed: int, iteration: int, device: torch.device) -> torch.Generator:
    """The minibatch shuffles of one iteration: derived from (seed, iteration), so no device-specific
    generator state needs to be stored, and a run resumes on another device."""
    return torch.Generator(device=device).manual_seed(int(np.random.SeedSequence([seed, 2, iteration])
                                                          .generate_state(1)[0]))


def _new_run(cfg: TrainConfig) -> Run:
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = make_model(cfg).to(device)
    acting = make_model(cfg)  # the collector's CPU copy, synced once per rollout
    acting.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    # one flat tensor and a fused kernel: Adam is a single op per minibatch, not ~10 per parameter
    optimizer = torch.optim.Adam([flat_parameters(model)], lr=cfg.lr, eps=1e-5, fused=True)
    return Run(cfg, device, model, acting, optimizer,
               ReturnScaler(cfg.num_envs, cfg.gamma, device) if cfg.scale_rewards else None)


def _iteration(run: Run, collector: RolloutCollector, plan, iterations: int, start: tuple[int, float]) -> dict | None:
    """Collect one rollout and update PPO on it; returns the metrics row (``None`` for a dropped batch).

    Only ``run`` and the collector change; whatever interrupts this leaves the previous
    iteration's snapshot as the state to save.
    """
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
    scale = (run.scaler.scale(batch["rewards"], batch["final_observation_mask"], collector.batch_envs)
             if run.scaler else 1.0)
    if cfg.ray_async:
        adv, ret = vtrace_targets(model, batch, collector.last_observations, cfg.gamma, cfg.rho_bar, cfg.c_bar, scale)
    else:
        adv, ret = advantages_and_returns(model, batch, collector.last_observations, cfg.gamma, cfg.gae_lambda,
                                          scale)
    try:
        stats = ppo_update(model, run.optimizer, batch, adv, ret, epochs=cfg.epochs,
                           minibatch_size=plan.minibatch_size, clip_coef=cfg.clip_coef, clip_value=cfg.clip_value,
                           ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm,
                           norm_adv=cfg.norm_adv, target_kl=cfg.target_kl or None,
                           generator=minibatch_generator(cfg.seed, it, run.device))
    except NonFiniteLossError as e:
        raise NonFiniteLossError(f"iteration {it}: {e}; training stopped (try a lower --lr)") from None
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
    return row


def keep_metrics_until(path: Path, iteration: int) -> int:
    """Drop rows of iterations after ``iteration`` (lost in a crash, to be run again); returns how many.

    Rewritten atomically, so a crash here leaves the old file.
    """
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if _row_iteration(line) <= iteration]
    if len(kept) < len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


def _row_iteration(line: str) -> float:
    try:
        return json.loads(line)["iteration"]
    except (ValueError, KeyError, TypeError):  # a line torn by a crash, or a blank one
        return float("inf")


RUN_FILES = ("checkpoints", "metrics.jsonl", "config.json", "evaluation.json", "evaluation.png", "tb")


def _claim_new_run_dir(run_dir: Path, overwrite: bool) -> list[str]:
    """Refuse a directory that holds another run's checkpoints unless ``overwrite``; clear that run's files.

    A directory without checkpoints holds nothing to resume (a run stopped before its first
    save): it is free, and what that run left is cleared so that it does not mix with this one.
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


def _resume_state(resume: str, given: dict[str, Any]) -> tuple[TrainConfig, Path, dict[str, Any], list[str]]:
    """Load the checkpoint to resume from; returns the resumed config, its file, state and notes."""
    source, saved, problems = checkpoints.latest_loadable(resume)
    notes = [f"skipped {p}" for p in problems]
    run_dir = checkpoints.run_dir_of(resume)
    if "run_dir" in given and Path(given["run_dir"]).resolve() != run_dir.resolve():
        raise ValueError(f"--resume writes into the run directory it resumes ({run_dir}); to continue a copy, "
                         f"copy the directory and resume the copy (drop --run-dir)")
    cfg = resumed_config({**saved["config"], "run_dir": str(run_dir)}, {**given, "run_dir": str(run_dir)},
                         str(source))
    return cfg, source, saved, notes


class TrainingStopped(Interrupted):
    """:class:`Interrupted` after the checkpoint was written: says where it is."""

    def __init__(self, signum: int, run_dir: Path, iteration: int, checkpoint: Path | None) -> None:
        super().__init__(signum)
        self.run_dir, self.iteration, self.checkpoint = run_dir, iteration, checkpoint


def train(cfg: TrainConfig, progress: bool = True, resume: str = "", given: dict | None = None,
          max_iterations: int | None = None, overwrite: bool = False, machine: Machine | None = None) -> dict:
    """Run PPO as configured (or continue the run at ``resume``); returns a summary.

    ``max_iterations`` stops early after that many iterations in total (the LR schedule
    still follows ``total_steps``), leaving a checkpoint to resume from. ``machine``
    replaces the detected one in the run layout (tests simulate machines with it).

    Durability: after every completed iteration the whole state is snapshotted (in memory,
    under a signal guard); whatever ends the run (SIGINT, SIGTERM, SIGUSR1, an error), that
    snapshot is the checkpoint written, never a half-done iteration. A signal raises
    :class:`TrainingStopped` (a ``KeyboardInterrupt``) once the checkpoint is on disk.
    """
    with contextlib.ExitStack() as stack:
        signals = stack.enter_context(StopSignals())
        saved, source, notes = None, None, []
        if resume:  # read before the lock is taken: files are replaced atomically, and a typo creates nothing
            cfg, source, saved, notes = _resume_state(resume, given or {})
        # the run layout: computed once here; nothing below recomputes it
        layout = run_layout(cfg, machine or Machine.detect(cfg.backend, cfg.ray_address))  # checks the env id
        print(layout.describe(), *(f"warning: {w}" for w in layout.warnings), sep="\n", file=sys.stderr)
        factories, batch_envs = layout.env_factories(), layout.batch_envs  # ray_async: one actor's slice
        plan = plan_minibatches(batch_envs, cfg.num_steps, cfg.batch_size or None)
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)
        run = _new_run(cfg)  # a model the env cannot have fails here, before anything is written
        run_dir = Path(cfg.run_dir or f"runs/{cfg.env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        lock = stack.enter_context(checkpoints.RunDirLock(run_dir))
        if resume:
            moved = checkpoints.set_aside_newer(run_dir, saved["iteration"])
            notes += [f"set aside {p.name}: newer than the checkpoint resumed from" for p in moved]
            dropped = keep_metrics_until(run_dir / "metrics.jsonl", saved["iteration"])
            if dropped:
                notes.append(f"metrics.jsonl: dropped {dropped} rows of iterations after {saved['iteration']} "
                             "(they are run again)")
        else:
            notes += _claim_new_run_dir(run_dir, overwrite)
        if lock.stale:
            notes.append(lock.stale)
        cfg.run_dir = str(run_dir)
        (run_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": layout.to_dict()},
                                                        indent=2))
        writer = _tensorboard(run_dir) if cfg.tensorboard else None
        if writer:
            stack.callback(writer.close)
        iterations = max(1, cfg.total_steps // (batch_envs * cfg.num_steps))
        stop = min(iterations, max_iterations or iterations)
        collector = stack.enter_context(RolloutCollector(factories, run.acting, backend=cfg.backend,
                                                         horizon=cfg.num_steps, seed=cfg.seed, device=run.device,
                                                         **layout.collector_kwargs()))
        stack.enter_context(torch_threads(layout.learn_threads))  # the collector uses its own count while collecting
        if saved is not None:
            exact = run.restore(saved, collector)
            notes.append(f"resumed from {source} at iteration {run.iteration}")
            if not exact:
                notes.append("these envs offer no get_state(): their episodes restart from derived seeds, "
                             "so the resumed run is not identical to an uninterrupted one")
        if run.iteration >= stop:
            notes.append(f"the run is already at iteration {run.iteration} of {iterations}: nothing to do "
                         "(pass a larger --total-steps to train longer)")
        for note in notes:
            print(note, file=sys.stderr)
        return _loop(run, collector, plan, iterations, stop, run_dir, signals, writer, progress, source)


def _loop(run: Run, collector: RolloutCollector, plan, iterations: int, stop: int, run_dir: Path,
          signals: StopSignals, writer, progress: bool, resumed_from: Path | None) -> dict:
    """Iterate until ``stop``; snapshot after each completed iteration; on any exit, save the newest one."""
    cfg = run.cfg
    with signals.critical():
        snapshot = run.snapshot(collector)
    saved_at = run.iteration if run.iteration else None  # resumed: that state is on disk already
    last_saved = resumed_from

    def save() -> Path:
        nonlocal saved_at, last_saved
        with signals.critical():
            last_saved = checkpoints.save_in_run_dir(run_dir, snapshot, snapshot["iteration"], cfg.keep_checkpoints)
            saved_at = snapshot["iteration"]
        return last_saved

    validator = Validator(cfg, run_dir, run.iteration)  # --eval-every: validation episodes, the best checkpoint
    bar = tqdm(total=stop, initial=run.iteration, disable=not progress, unit="it", dynamic_ncols=True)
    start = (run.env_steps, time.perf_counter())
    try:
        with (run_dir / "metrics.jsonl").open("a") as log:
            while run.iteration < stop:
                row = _iteration(run, collector, plan, iterations, start)
                if row is None:  # a batch too stale to learn from
                    continue
                row.update(validator.evaluate(run.iteration, run.acting))
                with signals.critical():  # the iteration is complete once its snapshot and its row exist
                    snapshot = run.snapshot(collector)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                if writer:
                    for k, v in row.items():
                        if isinstance(v, (int, float)):
                            writer.add_scalar(k, v, row["env_steps"])
                bar.update(1)
                bar.set_postfix(sps=f"{row['sps']:,.0f}", ret=f"{np.mean(run.recent):.2f}" if run.recent else "-")
                if run.iteration % cfg.checkpoint_every == 0 or run.iteration == stop or validator.improved:
                    validator.saved(save())
    except BaseException as e:
        signals.stop()  # a signal from here on waits: the snapshot is saved first
        bar.close()
        done = snapshot["iteration"]
        if done and saved_at != done and not isinstance(e, checkpoints.CheckpointError):  # (that save just failed)
            try:
                save()
            except checkpoints.CheckpointError as failed:
                print(f"could not save the last completed iteration: {failed}", file=sys.stderr)
        where = (f"the newest checkpoint {last_saved} holds iteration {saved_at}" if last_saved
                 else "no iteration was completed, nothing to save" if not done
                 else f"iteration {done} completed but no checkpoint could be written")
        if isinstance(e, KeyboardInterrupt):
            signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
            raise TrainingStopped(signum, run_dir, saved_at or 0, last_saved) from None
        if isinstance(e, NonFiniteLossError):
            raise NonFiniteLossError(f"{e}; {where}") from None
        print(f"training failed: {where}", file=sys.stderr)
        raise
    finally:
        bar.close()
    if cfg.ray_async:
        print(f"policy lag (versions behind: batches): {dict(sorted(run.lags.items()))}; dropped {run.dropped} "
              f"batches older than --max-lag {cfg.max_lag}", file=sys.stderr)
    return {"run_dir": str(run_dir), "iterations": run.iteration, "env_steps": run.env_steps,
            "checkpoint": str(last_saved) if last_saved else None, "lags": dict(run.lags), "dropped": run.dropped,
            "recent_return": float(np.mean(run.recent)) if run.recent else None,
            "finished": run.iteration >= iterations}


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ValueError("--tensorboard needs the tensorboard extra: pip install -e '.[tensorboard]'") from e
    return SummaryWriter(str(run_dir / "tb"))


def _command(*args: str) -> str:
    """A shell command with this interpreter and absolute paths, so that it runs as printed from any
    directory (the packages may live in a venv that is not on the PATH)."""
    return " ".join(shlex.quote(a) for a in (sys.executable, *args))


def _ignore_late_signals() -> None:
    """After the run finished, a stop signal (a scheduler's early warning) has nothing left to stop."""
    def note(signum, frame):
        print(f"{signal.Signals(signum).name} after the run finished: nothing to stop", file=sys.stderr)
    for signum in STOP_SIGNALS:
        signal.signal(signum, note)


def main(argv: list[str] | None = None) -> None:
    cli = parse_args(argv)
    try:
        summary = train(cli.config, resume=cli.resume, given=cli.given, overwrite=cli.overwrite)
        _ignore_late_signals()
    except TrainingStopped as e:
        print(f"\n{e} after iteration {e.iteration}" +
              (f"; checkpoint: {e.checkpoint}" if e.checkpoint else "; no checkpoint (no iteration completed)"),
              file=sys.stderr)
        run_dir = str(e.run_dir.resolve())
        if e.checkpoint:
            print(f"resume:        {_command('-m', 'trainer.train', '--resume', run_dir)}", file=sys.stderr)
        else:
            print("start again:   the same command (the run directory holds no checkpoint)", file=sys.stderr)
        raise SystemExit(e.exit_status) from None
    except KeyboardInterrupt as e:  # before the run started: nothing to save
        print(f"\n{e or 'interrupted'}", file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None
    except (ValueError, TypeError, NonFiniteLossError) as e:
        raise SystemExit(f"error: {e}") from None
    run_dir = str(Path(summary["run_dir"]).resolve())
    print(f"run directory: {run_dir} ({summary['iterations']} iterations, {summary['env_steps']:,} env steps)")
    print(f"metrics:       {run_dir}/metrics.jsonl")
    if summary["checkpoint"]:
        print(f"checkpoint:    {Path(summary['checkpoint']).resolve()}")
        print(f"evaluate:      {_command('-m', 'trainer.evaluate', '--checkpoint', run_dir)}")
        if not summary["finished"]:
            print(f"resume:        {_command('-m', 'trainer.train', '--resume', run_dir)}")
        else:
            print(f"train longer:  {_command('-m', 'trainer.train', '--resume', run_dir, '--total-steps', 'N')}")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
