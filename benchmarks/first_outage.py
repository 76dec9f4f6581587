"""How episodes end on an outage-heavy network (issue 64, docs/traces.md "How long to hedge"): for each player,
how many of its episodes end in the very round of the first outage it meets, and when that first outage comes.

    python -m benchmarks.first_outage runs/default/s1 runs/default/s2 runs/default/s3 --out runs/first_outage

Every player (each run's greedy policy, and ``lowest``) plays the same ``--episodes`` episodes (evaluation seed
``--seed``) of a network of :func:`benchmarks.generalisation.networks` (``heavy`` by default: the generated
heavy-tailed set, the same bytes as the generalisation table's) over each run's cell, in one batched env of a row
per episode. A round is an outage where the cell's capacity in it is below a tenth of the nominal (the observation's
capacity, which is over the nominal: on a set scaled by its mean, a tenth of the mean, issue 64's measure of a heavy
tail). The capacity does not depend on the player: an episode's first outage comes in the same round for every
player still playing it. Prints a Markdown table: the mean episode length, the episodes that met an outage, those
that ended in the round of their first (and within two rounds of it), and the quartiles of the first outage's
round over the episodes that met one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.generalisation import HEAVY, Played, Recipe, _checked_runs, networks
from benchmarks.machine import print_machine
from collectors.stop_signals import exiting_at_once_on_stop_signals
from envs.make_traces import write_traces
from trainer.arguments import OneLineParser

OUTAGE = 0.1  # a round whose capacity is below this share of the nominal is an outage


def outage_episodes(act: Any, env_kwargs: dict[str, Any], episodes: int, seed: int) -> list[dict[str, int]]:
    """Per episode (evaluation seeds of ``seed``), its ``length``, whether a user's leaving ended it
    (``terminated``: 1, not the episode's last round) and the round of the first outage its player met
    (``first_outage``, 1-based; 0 where none): ``act(obs [n, obs_dim]) -> levels [n, users]`` plays every row."""
    from envs.vector import VREdgeVectorEnv
    from trainer.evaluation.episodes import evaluation_seeds

    env = VREdgeVectorEnv(num_envs=episodes, **env_kwargs)
    cfg = env.config
    capacity = cfg.num_user_features * cfg.num_users + cfg.history - 1  # the last round's, in the history
    obs, _ = env.reset(seed=evaluation_seeds(seed, episodes))
    length, first, left = np.zeros(episodes, dtype=int), np.zeros(episodes, dtype=int), np.zeros(episodes, dtype=int)
    playing = np.ones(episodes, dtype=bool)
    for t in range(1, cfg.max_steps + 1):
        obs, _, terminated, truncated, info = env.step(np.asarray(act(obs)))
        ended = terminated | truncated
        seen = np.where(ended[:, None], info["final_obs"], obs) if ended.any() else obs  # the round's own capacity
        met = playing & (first == 0) & (seen[:, capacity] < OUTAGE)
        first[met] = t
        length[playing & ended] = t
        left[playing & terminated] = 1
        playing &= ~ended
        if not playing.any():
            break
    env.close()
    return [{"length": int(n), "terminated": int(e), "first_outage": int(f)} for n, e, f in zip(length, left, first)]


def summary(episodes: list[dict[str, int]]) -> dict[str, Any]:
    """A player's row: mean length, episodes meeting an outage, ended by a user leaving in its round (and within
    two rounds after), and the quartiles of the first outage's round over the episodes meeting one."""
    met = [e for e in episodes if e["first_outage"]]
    after = [e["length"] - e["first_outage"] for e in met if e["terminated"]]
    return {"episodes": len(episodes), "mean_length": float(np.mean([e["length"] for e in episodes])),
            "met_an_outage": len(met), "ended_in_its_round": sum(a == 0 for a in after),
            "ended_within_2": sum(0 <= a <= 2 for a in after),
            "first_outage_quartiles": np.quantile([e["first_outage"] for e in met], [0.25, 0.5, 0.75]).tolist()
            if met else []}


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.first_outage", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (VR-edge, one cell)")
    p.add_argument("--network", default="heavy", help="a network of the generalisation table: "
                   f"{', '.join(networks(Path('.')))} (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True,
                   help="folder for the generated traces and the table (first_outage_NETWORK.md and .json)")
    args = p.parse_args(argv)
    known = networks(args.out / "heavy-traces")
    if args.network not in known:
        p.error(f"--network {args.network} unknown; pick from {', '.join(known)}")
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out}: a file is there; name a folder (made if missing)")
    runs = list(dict.fromkeys(args.runs))  # (a run named twice is one player)
    # each run its own recipe: checked as the generalisation table checks them (VR-edge, one cell, a checkpoint)
    played = _checked_runs(p, [Recipe(f"run{i}", [run]) for i, run in enumerate(runs)], guard=False)
    with exiting_at_once_on_stop_signals("nothing was written; run the same command again"):
        rows = _played(args, runs, played, {**played.cell, **known[args.network][1]})
    text = _table(args, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"first_outage_{args.network}.md").write_text(text + "\n")
    (args.out / f"first_outage_{args.network}.json").write_text(json.dumps(rows, indent=1))
    print(text)
    print(f"wrote {args.out / f'first_outage_{args.network}.md'} and .json")


def _played(args: argparse.Namespace, runs: list[Path], played: Played, env_kwargs: dict[str, Any]
            ) -> dict[str, dict[str, Any]]:
    """Each player's row (:func:`summary`): ``lowest`` and each run's greedy policy."""
    import torch

    import envs
    from benchmarks.cells_table import _checked_model
    from trainer.evaluation.episodes import policy_actions

    print_machine()
    write_traces(args.out / "heavy-traces", **HEAVY)  # the same bytes every time
    torch.set_num_threads(1)
    users = envs.VREdgeConfig(**env_kwargs).num_users
    players = {"lowest": lambda obs: np.zeros((len(obs), users), dtype=np.int64)}
    players |= {str(run): policy_actions(_checked_model(named), deterministic=True)
                for run, named in zip(runs, played.checkpoints.values())}
    print(f"{len(players)} players, {args.episodes} episodes each (a few seconds a player on the default cell)",
          flush=True)
    rows = {}
    for name, act in players.items():
        rows[name] = summary(outage_episodes(act, env_kwargs, args.episodes, args.seed))
        print(f"played {name}", flush=True)
    return rows


def _table(args: argparse.Namespace, rows: dict[str, dict[str, Any]]) -> str:
    head = ["player", "episode length", "met an outage", "ended in its round", "within 2 rounds",
            "first outage: round (quartiles)"]
    lines = [f"{args.network}: {args.episodes} held-out episodes (seed {args.seed}); an outage: a round whose "
             f"capacity is below {OUTAGE:g} of the nominal; ended: by a user leaving\n", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([name, f"{r['mean_length']:.1f}", str(r["met_an_outage"]), str(r["ended_in_its_round"]),
                                 str(r["ended_within_2"]),
                                 ", ".join(f"{q:g}" for q in r["first_outage_quartiles"]) or "none"]) + " |"
              for name, r in rows.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
