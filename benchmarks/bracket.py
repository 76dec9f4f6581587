"""The bracket of several trained runs on the same held-out episodes (issue 65): how far each run's policy is from
the best any causal scheduler could do, certified.

    python -m benchmarks.bracket runs/s1 runs/s2 runs/s3 --episodes 50 --out runs/bracket

What ``trainer.evaluate --checkpoint RUN --reference belief,bound`` reports for one run (its bracket: the certified
upper bound, the best causal player, the width, the policy's optimality gap), for several runs at once: the players
that do not depend on the run (every baseline, the causal reference ``BeliefMPC`` on ``fair_share``, the upper bound,
each a function of the episodes alone) are played once for all the runs, not once per run, which saves most of the
time (the bound and BeliefMPC are minutes each on the default cell; a policy's 50 episodes, seconds). The runs must
share their env arguments (the same held-out episodes). Each player's records go to ``OUT/<player>.json`` as soon as
they are played, so a stopped bracket goes on where it stopped; a run's records name its checkpoint by content hash
(a checkpoint that holds other weights now is played again). Prints a Markdown table, a row per run, and writes it
to ``OUT/bracket.md`` with every figure in ``OUT/bracket.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import checkpoints
import envs
from benchmarks.machine import print_machine
from envs.profiles import profile_of
from trainer.arguments import OneLineParser
from trainer.evaluation.bracket import BOUND, bound_records
from trainer.evaluation.contenders import BELIEF, BELIEF_BASE, belief_records, compare_contenders
from trainer.evaluation.episodes import Records, episodes_shown, held_out_env_kwargs, policy_actions, run_episodes
from trainer.evaluation.report import plus_minus, write_replacing


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m benchmarks.bracket", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (their best checkpoint, as trainer.evaluate)")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes per player (default 50)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed, as trainer.evaluate --seed (default 0)")
    p.add_argument("--out", type=Path, required=True, help="folder for the records and the table")
    return p


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.episodes < 2:
        parser.error(f"--episodes {args.episodes}: a paired interval needs at least 2; give 2 or more")
    from trainer.evaluation.policies import load_policy

    runs = {}
    for run in args.runs:
        try:
            runs[run] = load_policy(run, pick="best")
        except (OSError, ValueError) as e:
            parser.error(f"{run}: {e}")
    kwargs = {run: held_out_env_kwargs(p.config.env, p.config.env_options, {}) for run, p in runs.items()}
    first = args.runs[0]
    if other := [str(run) for run in args.runs if kwargs[run] != kwargs[first] or runs[run].config.env != "VREdge-v0"]:
        parser.error(f"{', '.join(other)}: not VR-edge with {first}'s env arguments; give runs of one VR-edge setup")
    config = envs.VREdgeConfig(**kwargs[first])
    if refused := profile_of("VREdge-v0").references[BOUND](kwargs[first]):
        parser.error(f"{first}: {refused}")
    args.out.mkdir(parents=True, exist_ok=True)
    print_machine()
    rows = bracket_rows(args, runs, config, kwargs[first])
    table = bracket_table(rows, args.episodes)
    print(table)
    write_replacing(args.out / "bracket.md", table + "\n")
    write_replacing(args.out / "bracket.json", json.dumps(rows, indent=1) + "\n")


def bracket_rows(args: argparse.Namespace, runs: dict[Path, Any], config: envs.VREdgeConfig,
                 env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each run's bracket (:func:`trainer.evaluation.bracket.bracket_figures` through ``compare_contenders``, as
    ``trainer.evaluate`` computes it), the run-free players played once and kept in ``args.out``."""
    import gymnasium as gym

    env_fn = functools.partial(gym.make, "VREdge-v0", **env_kwargs)
    names = list(profile_of("VREdge-v0").baselines)
    played_with = {"env_kwargs": env_kwargs, "episodes": args.episodes, "seed": args.seed}
    make = profile_of("VREdge-v0").baselines
    free = {name: functools.partial(run_episodes, make[name](env_kwargs), env_fn, args.episodes, args.seed)
            for name in names}
    free[BELIEF] = functools.partial(belief_records, config, env_fn, args.episodes, args.seed, BELIEF_BASE)
    free[BOUND] = functools.partial(bound_records, config, args.episodes, args.seed)
    played = {name: _kept(args.out / f"{name}.json", played_with, play, name) for name, play in free.items()}
    rows = []
    for run, policy in runs.items():
        label = f"policy ({run.name})"
        named = {**played_with, "checkpoint_sha256": checkpoints.content_hash(policy.source)}
        act = policy_actions(policy.model, deterministic=True)
        played[label] = _kept(args.out / f"run-{run.name}.json", named,
                              functools.partial(run_episodes, act, env_fn, args.episodes, args.seed), label)
        comparison = compare_contenders(played, label, names, config, env_fn, policy.config.seed)
        rows.append({"run": str(run), "checkpoint": str(policy.source), **comparison.bracket})
        del played[label]
    return rows


def _kept(path: Path, played_with: dict[str, Any], play: Any, name: str) -> Records:
    """The records in ``path`` where they were played as ``played_with`` asks, else ``play()``'s, written there
    whole (a stopped bracket plays them again) with a bar of the episodes."""
    try:
        kept = json.loads(path.read_text())
        if kept["played_with"] == json.loads(json.dumps(played_with)):
            return kept["records"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print(f"bracket: playing {name} on {played_with['episodes']} held-out episodes", file=sys.stderr, flush=True)
    with episodes_shown(played_with["episodes"], name):
        records = play()
    write_replacing(path, json.dumps({"played_with": played_with, "records": records}))  # whole or absent
    return records


def bracket_table(rows: list[dict[str, Any]], episodes: int) -> str:
    """The rows as a Markdown table: per run, the policy, the best causal player, the bound, the width and the
    optimality gap (reward per step, mean ± 95% interval, paired over the same ``episodes``)."""
    lines = [f"reward per step on the same {episodes} held-out episodes, mean ± 95% interval (differences paired); "
             f"bound: {rows[0]['bound']['solver'] if rows else ''}", "",
             "| run | policy | best causal player | upper bound | width (bound − best) | optimality gap "
             "(bound − policy) | bound held |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        best, bound, holds = row["best_causal"], row["bound"], row["bound_holds"]
        below = row["policy_below_best_causal"]
        policy = best["reward_per_step"] - below["mean"]
        lines.append(f"| {Path(row['run']).name} | {policy:.4f} | {best['name'].split(' ')[0]} "
                     f"{best['reward_per_step']:.4f} ± {best['ci95']:.4f} | {bound['reward_per_step']:.4f} "
                     f"{plus_minus(bound['ci95'])} | {row['width']['mean']:+.4f} {plus_minus(row['width']['ci95'])} | "
                     f"{row['optimality_gap']['mean']:+.4f} {plus_minus(row['optimality_gap']['ci95'])} | "
                     f"{holds['held']}/{holds['episodes']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
