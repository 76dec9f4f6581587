"""Evaluate a trained policy against the heuristic baselines on held-out seeds.

    python -m trainer.evaluate --checkpoint RUN_DIR_OR_FILE [--episodes 50] [--seed S]
                               [--deterministic | --stochastic] [--baselines all] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import checkpoints
import envs
from trainer.config import TrainConfig
from trainer.evaluation import paired_difference, run_episodes, summarize
from trainer.model import ActorCritic
from trainer.run import make_model

COLUMNS = (("mean_return", "return"), ("reward_per_step", "reward/step"), ("quality", "quality"),
           ("stall_s", "stall s/step"), ("switches", "switches/step"))


def load_policy(path: str | Path) -> tuple[ActorCritic, TrainConfig, Path]:
    """The policy of a checkpoint (or of a run directory's newest loadable checkpoint), on the CPU, frozen."""
    source, state, problems = checkpoints.latest_loadable(path)
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    model, cfg = policy_from_state(state, source)
    return model, cfg, source


def policy_from_state(state: dict[str, Any], source: Path) -> tuple[ActorCritic, TrainConfig]:
    """The frozen CPU policy and training config of a loaded checkpoint ``state`` (read from ``source``)."""
    cfg = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.__dataclass_fields__})
    try:
        gym.spec(cfg.env)
    except gym.error.Error:
        raise ValueError(f"{source} was trained on {cfg.env}, which is not registered in this process; register it "
                         "(gym.register) in the process that loads the policy") from None
    model = make_model(cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise ValueError(f"{source}: its network does not fit {cfg.env} as this process builds it (different "
                         "spaces or env parameters?): " + str(e).strip().splitlines()[-1].strip()) from None
    return model.eval(), cfg


def policy_actions(model: ActorCritic, deterministic: bool):
    def act(obs: np.ndarray) -> np.ndarray:
        obs_t = torch.from_numpy(obs)
        return (model.act_deterministic(obs_t) if deterministic else model.act(obs_t)["action"]).numpy()
    return act


def baseline_names(spec: str, env_id: str) -> list[str]:
    if spec in ("", "none"):
        return []
    names = list(envs.BASELINES) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in envs.BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; expected 'all', 'none' or names from "
                         f"{', '.join(envs.BASELINES)}")
    return names if env_id == "VREdge-v0" else []


def format_table(results: dict[str, dict[str, Any]]) -> str:
    present = [(k, title) for k, title in COLUMNS if any(k in r for r in results.values())]
    head = f"{'policy':<22}" + "".join(f"{title:>22}" for _, title in present)
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        cells = "".join(f"{r[k]:>12.3f} ± {r[k + '_ci95']:<7.3f}" if k in r else f"{'-':>22}" for k, _ in present)
        lines.append(f"{name:<22}{cells}")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], run_dir: Path, out: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    names = list(results)
    ax1.bar(names, [results[n]["reward_per_step"] for n in names],
            yerr=[results[n]["reward_per_step_ci95"] for n in names], capsize=4)
    ax1.set_ylabel("mean reward per step (95% CI)")
    ax1.tick_params(axis="x", rotation=30)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        ax2.plot([r["env_steps"] for r in rows], [r["reward_per_step"] for r in rows])
        ax2.set_xlabel("env steps")
        ax2.set_ylabel("training reward per step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def check_writable(directory: Path, what: str = "the evaluation outputs") -> None:
    """Raise ``ValueError`` naming ``directory`` when files cannot be created in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".check-", suffix=".tmp"):
            pass
    except OSError as e:
        raise ValueError(f"cannot write {what} to {directory}: {e.strerror or e}; pass --out DIR") from None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint file, or run directory (its newest checkpoint)")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (a seed branch that training never uses)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--deterministic", dest="deterministic", action="store_true", default=True,
                      help="greedy actions (default)")
    mode.add_argument("--stochastic", dest="deterministic", action="store_false", help="sample actions")
    p.add_argument("--baselines", default="all", help="'all', 'none' or comma-separated names (VR-edge only)")
    p.add_argument("--env", default="", help="fail unless the checkpoint was trained on this env id")
    p.add_argument("--json", action="store_true", help="also print the results as JSON to stdout")
    p.add_argument("--out", default="", help="where evaluation.json/.png go (default: the run directory)")
    args = p.parse_args(argv)
    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes={args.episodes} is invalid: must be >= 1")
        model, cfg, source = load_policy(args.checkpoint)
        if args.env and args.env != cfg.env:
            raise ValueError(f"{source} was trained on {cfg.env}, not {args.env}")
        names = baseline_names(args.baselines, cfg.env)
        run_dir = checkpoints.run_dir_of(source)
        out_dir = Path(args.out) if args.out else run_dir
        check_writable(out_dir)  # before minutes of episodes, not after
    except (ValueError, checkpoints.CheckpointError) as e:
        raise SystemExit(f"error: {e}") from None
    env_fn = functools.partial(gym.make, cfg.env)
    label = f"policy ({'greedy' if args.deterministic else 'stochastic'})"
    played = {label: run_episodes(policy_actions(model, args.deterministic), env_fn, args.episodes, args.seed)}
    vr_config = envs.VREdgeConfig()
    for name in names:
        played[name] = run_episodes(envs.make_baseline(name, vr_config), env_fn, args.episodes, args.seed)
    results = {name: summarize(records) for name, records in played.items()}
    paired = {name: paired_difference(played[label], played[name]) for name in names}
    payload = {"checkpoint": str(source.resolve()), "env": cfg.env, "episodes": args.episodes, "seed": args.seed,
               "policy": results[label], "baselines": {n: results[n] for n in names},
               "paired_reward_per_step": paired}
    print(f"{cfg.env}: {args.episodes} episodes on held-out seeds (seed {args.seed}), checkpoint {source}")
    print(format_table(results))
    if paired:
        print("\npolicy minus baseline, reward/step, paired over the same episodes (mean ± 95% CI, policy better in):")
        for name, d in paired.items():
            print(f"  vs {name:<14}{d['mean']:+.3f} ± {d['ci95']:.3f}   {d['wins']}/{d['episodes']} episodes")
    (out_dir / "evaluation.json").write_text(json.dumps(payload, indent=2))
    png = plot(results, run_dir, out_dir / "evaluation.png")
    print(f"\nwrote {out_dir / 'evaluation.json'}" + (f" and {png}" if png else " (pip install matplotlib for a plot)"))
    if args.json:
        print(json.dumps(payload))


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
