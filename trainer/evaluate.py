"""Evaluate a trained policy against the heuristic baselines on held-out seeds.

    python -m trainer.evaluate --checkpoint RUN_DIR_OR_FILE [--episodes 50] [--seed S] [--pick best|latest]
                               [--deterministic | --stochastic] [--baselines all] [--reference clairvoyant]
                               [--capacity-trace PATH] [--json]

A run directory's checkpoint is its ``best`` (highest validation return, from --eval-every)
when it has one, else its newest loadable one; the command says which it loaded.
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

import checkpoints
import envs
from envs.planner import ClairvoyantPlanner
from trainer.config import TrainConfig
from trainer.evaluation import gap_closed, paired_difference, policy_actions, run_episodes, summarize, validation_seeds
from trainer.model import ActorCritic
from trainer.run import make_model

COLUMNS = (("mean_return", "return"), ("reward_per_step", "reward/step"), ("quality", "quality"),
           ("stall_s", "stall s/step"), ("switches", "switches/step"), ("qoe_lin", "QoE_lin/user"),
           ("fairness", "Jain fairness"))
REFERENCE = "clairvoyant"
SELECTION_EPISODES = 16  # validation episodes on which the best baseline (the gap's lower end) is picked


def load_policy(path: str | Path, pick: str = "latest") -> tuple[ActorCritic, TrainConfig, Path]:
    """The policy of a checkpoint file, or of a run directory's ``pick`` (``best``: the ``best`` pointer
    when there is one, else the newest loadable checkpoint; ``latest``: the newest loadable), on the CPU, frozen."""
    best = checkpoints.best_checkpoint(path) if pick == "best" and Path(path).is_dir() else None
    if best is not None:
        path = best
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


def baseline_names(spec: str, env_id: str) -> list[str]:
    if spec in ("", "none"):
        return []
    names = list(envs.BASELINES) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in envs.BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; expected 'all', 'none' or names from "
                         f"{', '.join(envs.BASELINES)}")
    return names if env_id == "VREdge-v0" else []


def best_baseline(names: list[str], config: envs.VREdgeConfig, env_fn, seeds: list[int]
                  ) -> tuple[str | None, dict[str, list[dict[str, float]]]]:
    """The baseline with the highest reward per step on the episodes of ``seeds``, and every baseline's records.

    Pick it on other episodes than those it is then compared on: the best of several baselines
    on the test episodes is, by selection, lucky on them, which would shrink the policy's lead.
    """
    played = {name: run_episodes(envs.make_baseline(name, config), env_fn, len(seeds), 0, seeds=seeds)
              for name in names}
    best = max(names, key=lambda n: summarize(played[n])["reward_per_step"]) if names else None
    return best, played


def checkpoint_label(given: str | Path, source: Path, pick: str) -> str:
    """Which checkpoint ``source`` is for the path the user gave: the run's best or latest, or that file."""
    if Path(given).is_file():
        return "the checkpoint file"
    best = checkpoints.best_checkpoint(given)
    if pick == "best" and best is not None and best.resolve() == source.resolve():
        return "the best checkpoint (validation)"
    return "the latest checkpoint" + (" (the run has no best checkpoint)" if pick == "best" else "")


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


def held_out_env_kwargs(trained: dict[str, Any], capacity_trace: str) -> dict[str, Any]:
    """The env arguments to evaluate with: the run's own (``--env-kwargs``), with ``--capacity-trace``
    replacing its traces; a directory of traces is evaluated on its held-out (``test``) files.

    >>> held_out_env_kwargs({"num_users": 6, "capacity_trace": "t/", "trace_split": "train"}, "")
    {'num_users': 6, 'capacity_trace': 't/', 'trace_split': 'test'}
    """
    kwargs = dict(trained)
    if capacity_trace:
        kwargs["capacity_trace"] = capacity_trace
    if "capacity_trace" in kwargs:
        kwargs["trace_split"] = "test" if Path(kwargs["capacity_trace"]).is_dir() else "all"
    return kwargs


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
    p.add_argument("--reference", choices=(REFERENCE, "none"), default=REFERENCE,
                   help="VR-edge: also play the clairvoyant planner (envs.planner; sees the true future) as the "
                        "ceiling, and report the fraction of the gap from the best baseline that the policy closes")
    p.add_argument("--capacity-trace", default="", metavar="PATH",
                   help="VR-edge: replay recorded bandwidth traces (a file or directory, Pensieve or Mahimahi "
                        "format) as the cell's capacity; a directory's held-out test files are used")
    p.add_argument("--pick", choices=("best", "latest"), default="best",
                   help="from a run directory: its best checkpoint (validation, --eval-every) when it has one, "
                        "or the newest")
    p.add_argument("--env", default="", help="fail unless the checkpoint was trained on this env id")
    p.add_argument("--json", action="store_true", help="also print the results as JSON to stdout")
    p.add_argument("--out", default="", help="where evaluation.json/.png go (default: the run directory)")
    args = p.parse_args(argv)
    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes={args.episodes} is invalid: must be >= 1")
        model, cfg, source = load_policy(args.checkpoint, args.pick)
        if not args.deterministic and cfg.algo == "apex":
            raise ValueError(f"--stochastic: {source} holds an Ape-X Q-network, whose policy is greedy (its "
                             "exploration was the actors' epsilon); drop --stochastic")
        if args.env and args.env != cfg.env:
            raise ValueError(f"{source} was trained on {cfg.env}, not {args.env}")
        names = baseline_names(args.baselines, cfg.env)
        vr_edge = cfg.env == "VREdge-v0"
        if args.capacity_trace and not vr_edge:
            raise ValueError(f"--capacity-trace applies to VREdge-v0, not {cfg.env}")
        env_kwargs = held_out_env_kwargs(cfg.env_options, args.capacity_trace)
        vr_config = envs.VREdgeConfig(**env_kwargs) if vr_edge else None  # a bad trace fails here, at once
        run_dir = checkpoints.run_dir_of(source)
        out_dir = Path(args.out) if args.out else run_dir
        check_writable(out_dir)  # before minutes of episodes, not after
    except (ValueError, checkpoints.CheckpointError) as e:
        raise SystemExit(f"error: {e}") from None
    env_fn = functools.partial(gym.make, cfg.env, **env_kwargs)
    label = f"policy ({'greedy' if args.deterministic else 'stochastic'})"
    which = checkpoint_label(args.checkpoint, source, args.pick)
    print(f"loaded {which}: {source}", file=sys.stderr)
    played = {label: run_episodes(policy_actions(model, args.deterministic), env_fn, args.episodes, args.seed)}
    for name in names:
        played[name] = run_episodes(envs.make_baseline(name, vr_config), env_fn, args.episodes, args.seed)
    reference = vr_edge and args.reference == REFERENCE
    if reference:
        played[REFERENCE] = run_episodes(ClairvoyantPlanner(vr_config), env_fn, args.episodes, args.seed,
                                         num_envs=64, with_envs=True)
    results = {name: summarize(records) for name, records in played.items()}
    compared = names + ([REFERENCE] if reference else [])
    paired = {name: paired_difference(played[label], played[name]) for name in compared}
    best, _ = best_baseline(names, vr_config, env_fn, validation_seeds(cfg.seed, SELECTION_EPISODES))
    gap = gap_closed(played[label], played[best], played[REFERENCE]) if reference and best else None
    payload = {"checkpoint": str(source.resolve()), "checkpoint_kind": which, "env": cfg.env,
               "env_kwargs": env_kwargs, "episodes": args.episodes, "seed": args.seed,
               "policy": results[label], "baselines": {n: results[n] for n in names},
               "reference": {REFERENCE: results[REFERENCE]} if reference else {},
               "paired_reward_per_step": paired, "best_baseline": best,
               "best_baseline_picked_on": f"{SELECTION_EPISODES} validation episodes" if best else None,
               "gap_closed": gap}
    trace = f", capacity traces {args.capacity_trace}" if args.capacity_trace else ""
    print(f"{cfg.env}: {args.episodes} episodes on held-out seeds (seed {args.seed}{trace}), {which} {source}")
    print(format_table(results))
    if paired:
        print("\npolicy minus baseline, reward/step, paired over the same episodes (mean ± 95% CI, policy better in):")
        for name, d in paired.items():
            print(f"  vs {name:<14}{d['mean']:+.3f} ± {d['ci95']:.3f}   {d['wins']}/{d['episodes']} episodes")
    if gap:
        print(f"\ngap closed: the policy closes {gap['fraction']:.2f} ± {gap['ci95']:.2f} (95% CI) of the gap between "
              f"the best baseline ({best}, picked on {SELECTION_EPISODES} validation episodes) and the clairvoyant "
              f"reference ({gap['gap']:+.3f} reward/step)")
    (out_dir / "evaluation.json").write_text(json.dumps(payload, indent=2))
    png = plot(results, run_dir, out_dir / "evaluation.png")
    print(f"\nwrote {out_dir / 'evaluation.json'}" + (f" and {png}" if png else " (pip install matplotlib for a plot)"))
    if args.json:
        print(json.dumps(payload))


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
