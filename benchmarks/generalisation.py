"""The generalisation table (issue 64): runs trained on one set of networks, played on others they never saw, each
paired with ``fair_share`` and ``robust_mpc`` on the same held-out episodes.

    python -m benchmarks.generalisation --recipe synthetic=runs/default/s1,runs/default/s2,runs/default/s3 \\
        --recipe pensieve=runs/pensieve/s1,runs/pensieve/s2,runs/pensieve/s3 \\
        --recipe robust=runs/robust/s1,runs/robust/s2,runs/robust/s3 --episodes 50 --out runs/generalisation

Every player (each run's greedy policy at the checkpoint ``trainer.evaluate`` picks, each baseline) plays the same
``--episodes`` episodes (evaluation seed ``--seed``) of each network (:func:`networks`): the synthetic default cell,
it with outages, Pensieve's test traces, and a heavy-tailed, outage-heavy set this command generates
(``envs.make_traces --kind heavy``, 40 files of 320 s, seed 64) as the cell's capacity, scaled by its mean and by
its median. A network is
the whole of the network's arguments over the runs' cell (their other arguments: users, episode length): a run
trained with randomised conditions plays each network as it is, not with its training ranges over it. Records are
kept per network and player (``OUT/<network>/<player>.json``, named by the checkpoint's content hash), so a stopped
table goes on where it stopped.

Prints a Markdown table, a line per network and recipe: its seeds' mean policy minus ``fair_share``, ``robust_mpc``
and the best of every rule-based baseline on that network, paired per episode (the seeds' rewards averaged), mean ±
95% interval over the episodes; how many seeds are above the best by their own intervals; the episode length of the
policy and of the best baseline. ``OUT/table.md`` holds it, ``OUT/table.json`` every number. A network where the
policy and the best baseline both lose their users in most episodes is marked UNSERVABLE
(:mod:`trainer.evaluation.servable`). ``--guard Z`` plays each run a second time with a guard (:func:`guarded`),
``--volatility-guard`` with :class:`envs.guard.VolatilityGuard`, its threshold calibrated on the run's own training
network (:mod:`trainer.evaluation.guards`); ``--volatility-guard 8,32`` once per hedge (the rounds each episode
starts with at the lowest level), a recipe's row named for its hedge where it is not the default 8
(``synthetic+volatility32``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import envs
from benchmarks.cells_table import (
    _checked_model,
    _checkpoint_named,
    _play,
    _play_all,
    _slowest_first,
    _stored_config,
    _unplayed,
    _written,
    stopped_before_playing,
)
from benchmarks.machine import print_machine
from envs.guard import HEDGE_ROUNDS, VolatilityGuard
from envs.make_traces import write_traces
from envs.profiles import profile_of
from envs.traces import TRACE_ARGUMENTS
from trainer.arguments import OneLineParser
from trainer.evaluation.servable import LOST_IN_MOST_EPISODES, UNSERVABLE, unservable
from trainer.evaluation.statistics import paired_difference, summarize

PAIRED = ("fair_share", "robust_mpc")  # the baselines each recipe is paired with in the table's columns
# every baseline that acts by rule (not `random`): the best of them on a network is the one a policy must match
BASELINES = ("lowest", "throughput", "buffer", "fair_share", "robust_mpc", "bola")
GUARD = "+guard"  # a run's player with the guard: its name's suffix
VOLATILITY = "+volatility"  # a run's player with the volatility guard (envs.guard): its name's suffix
HEAVY = {"files": 40, "seconds": 320, "seed": 64, "kind": "heavy"}  # the generated set (write_traces' arguments)
# The arguments that say a network's conditions; a run trained with others (users, rewards) plays another cell.
NETWORK_ARGUMENTS = TRACE_ARGUMENTS | {"outage_prob", "outage_end_prob", "outage_depth", "capacity_scale",
                                       "condition_grid"}


def networks(heavy: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Name -> (what it is, its env arguments over the runs' cell), with the generated set at ``heavy``. The
    generated set sets the cell's capacity only: as every user's link too, each user's outages stall that user
    alone and every player, ``lowest`` included, lost every user within 40 steps (16 episodes, 2026-12-06), a
    network that tells no scheduler from another."""
    heavy_cell = {"capacity_trace": str(heavy), "trace_split": "all"}
    return {
        "synthetic": ("the synthetic default cell", {}),
        "synthetic-outages": ("it with Gilbert-Elliott outages (outage_prob 0.05: 14% of the steps at 5%)",
                              {"outage_prob": 0.05}),
        "pensieve-test": ("Pensieve's test traces (cell and links), scaled by their mean",
                          {"capacity_trace": "pensieve", "user_traces": "pensieve", "trace_split": "test"}),
        "heavy": ("the generated heavy-tailed set as the cell's capacity, scaled by its mean", heavy_cell),
        "heavy-median": ("the generated heavy-tailed set as the cell's capacity, scaled by its median",
                         {**heavy_cell, "trace_quantile": 0.5}),
    }


def guarded(act: Callable[[np.ndarray], np.ndarray], fallback: Callable[[np.ndarray], np.ndarray], mean: np.ndarray,
            std: np.ndarray, z: float, counts: list[int]) -> Callable[[np.ndarray], np.ndarray]:
    """``act`` with a guard: where a row's observation has a feature more than ``z`` standard deviations from what
    the policy saw in training (its observation normaliser's ``mean`` and ``std``), that row's actions are
    ``fallback``'s. ``counts`` gains the rows guarded and the rows played, call by call.

    >>> counts = [0, 0]
    >>> act = guarded(lambda o: np.zeros((len(o), 1)), lambda o: np.ones((len(o), 1)), np.zeros(2), np.ones(2), 6.0,
    ...               counts)
    >>> act(np.array([[0.5, -2.0], [7.0, 0.0]])).ravel().tolist(), counts
    ([0.0, 1.0], [1, 2])
    """
    def act_guarded(obs: np.ndarray) -> np.ndarray:
        actions = np.array(act(obs), copy=True)
        outside = (np.abs((np.asarray(obs, dtype=np.float64) - mean) / std) > z).any(axis=1)
        if outside.any():
            actions[outside] = np.asarray(fallback(obs))[outside]
        counts[0] += int(outside.sum())
        counts[1] += len(outside)
        return actions
    return act_guarded


def _play_volatility_guarded(task: tuple[str, str | None, dict[str, Any], str]) -> str:
    """Play a run through the volatility guard (:class:`envs.guard.VolatilityGuard`), its threshold calibrated on
    the run's own training network (:mod:`trainer.evaluation.guards`, as ``trainer.evaluate --guard volatility``);
    its records with the threshold and the share of its steps the guard played (the hedge's included)."""
    import torch

    from trainer.evaluation.episodes import policy_actions
    from trainer.evaluation.guards import calibrated_threshold, guarded_records

    torch.set_num_threads(1)
    player, run, played_with, out = task
    hedge = played_with.get("hedge_rounds", HEDGE_ROUNDS)

    def make(act: Callable[[np.ndarray], np.ndarray], kwargs: dict[str, Any], threshold: float) -> VolatilityGuard:
        return VolatilityGuard(act, envs.VREdgeConfig(**kwargs), threshold, hedge_rounds=hedge)
    act = policy_actions(_checked_model(played_with), deterministic=True)
    threshold = calibrated_threshold(make, act, "VREdge-v0", played_with["trained_on"])
    records, share = guarded_records(make, act, threshold, "VREdge-v0", played_with["env_kwargs"],
                                     played_with["episodes"], played_with["seed"])
    return _written(out, played_with, records, guarded_share=share, threshold=threshold)


def _play_task(task: tuple[str, str | None, dict[str, Any], str]) -> str:
    """Play one task: a guarded run's (:func:`guarded`, its records with the share of its steps guarded; or the
    volatility guard's), else as cells_table plays a player."""
    player, run, played_with, out = task
    if VOLATILITY in player:
        return _play_volatility_guarded(task)
    if GUARD not in player:
        return _play(task)
    import functools

    import gymnasium as gym
    import torch

    from trainer.evaluation.episodes import policy_actions, run_episodes

    torch.set_num_threads(1)
    kwargs = played_with["env_kwargs"]
    model = _checked_model(played_with)
    norm, counts = model.norm, [0, 0]
    act = guarded(policy_actions(model, deterministic=True),
                  envs.make_baseline(played_with["guard_fallback"], envs.VREdgeConfig(**kwargs)),
                  norm.mean.numpy(), np.sqrt(norm.var.numpy() + 1e-8), played_with["guard_z"], counts)
    records = run_episodes(act, functools.partial(gym.make, "VREdge-v0", **kwargs), played_with["episodes"],
                           played_with["seed"])
    return _written(out, played_with, records, guarded_share=counts[0] / max(counts[1], 1))


class Recipe(NamedTuple):
    name: str
    runs: list[Path]


def _recipe(text: str) -> Recipe:
    name, _, runs = text.partition("=")
    if not name or not runs:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=RUN[,RUN...], e.g. robust=runs/robust/s1")
    if "+" in name:  # (a guarded player's names end in +guard or +volatility)
        raise argparse.ArgumentTypeError(f"{text!r}: a recipe's NAME has no '+' ({GUARD} and {VOLATILITY} mark "
                                         "guarded runs)")
    return Recipe(name, [Path(r) for r in runs.split(",") if r])


def _player(recipe: Recipe, run: Path) -> str:
    return f"{recipe.name}-{run.name}"


class Played(NamedTuple):
    """What the runs share, as :func:`_checked_runs` found it."""

    cell: dict[str, Any]  # the runs' env arguments but their networks' (every network is played over them)
    checkpoints: dict[str, dict[str, str]]  # player -> its checkpoint's path and content hash
    trained_on: dict[str, dict[str, Any]]  # player -> its run's env arguments (its training network's included)


def _checked_runs(p: OneLineParser, recipes: list[Recipe], guard: bool) -> Played:
    """Each run's checkpoint named, and the cell all runs were trained in: a usage error, before anything is
    played, where a run is not a VR-edge run, two were trained in different cells (other than by their networks:
    users, rewards, episode length), or two players share a name."""
    from checkpoints import CheckpointError
    from trainer.evaluation.policies import picked_checkpoint

    cells: dict[Path, dict[str, Any]] = {}
    for run in (run for recipe in recipes for run in recipe.runs):
        cfg = _stored_config(p, run)
        if cfg.env != "VREdge-v0":
            p.error(f"{run}: trained on {cfg.env}; the table plays VR-edge runs (VREdge-v0)")
        if guard and not (cfg.algo == "ppo" and cfg.algo_settings.normalize_obs):
            p.error(f"{run}: --guard reads a PPO run's observation normaliser, and this run has none")
        cells[run] = {k: v for k, v in cfg.env_options.items() if k not in NETWORK_ARGUMENTS}
        first, cell = next(iter(cells.items()))
        if cells[run] != cell:
            differ = sorted(k for k in set(cell) | set(cells[run]) if cell.get(k) != cells[run].get(k))
            p.error(f"{first} and {run} were trained in different cells ({', '.join(differ)}); pass runs that "
                    "differ only in their networks")
    named: dict[str, dict[str, str]] = {}
    trained_on: dict[str, dict[str, Any]] = {}
    for recipe in recipes:
        for run in recipe.runs:
            player = _player(recipe, run)
            if player in named or player in BASELINES:
                p.error(f"{player}: two players of one name; name the recipes apart")
            try:
                named[player] = _checkpoint_named(picked_checkpoint(run, "best").source)
            except CheckpointError as e:
                p.error(str(e))
            trained_on[player] = dict(_stored_config(p, run).env_options)
    return Played(next(iter(cells.values())), named, trained_on)


def _tasks(args: argparse.Namespace, played: Played) -> list[tuple]:
    """Every (player, network) not played as asked now, the robust MPC first (it plans every step)."""
    tasks = []
    guard = {"guard_z": args.guard, "guard_fallback": args.guard_fallback}
    for name, (_, network) in args.networks.items():
        asked = {"env_kwargs": {**played.cell, **network}, "episodes": args.episodes, "seed": args.seed}
        players = [(b, None, asked) for b in BASELINES]
        players += [(player, str(Path(named["checkpoint"]).parent), {**asked, **named, **_guarded_with(
                    player, guard, played.trained_on[player])}) for player, named in played.checkpoints.items()]
        tasks += _unplayed(args.out / name, players)
    return _slowest_first(tasks)


def _guarded_with(player: str, guard: dict[str, Any], trained_on: dict[str, Any]) -> dict[str, Any]:
    """What a guarded player plays with beyond an unguarded one's: the z-guard's settings, or the volatility
    guard's training network (its threshold is calibrated there) and its hedge where not the default."""
    if GUARD in player:
        return guard
    if VOLATILITY not in player:
        return {}
    hedge = re.match(r"\d*", player.partition(VOLATILITY)[2]).group()  # "synthetic+volatility32-s1": 32
    return {"trained_on": trained_on, **({"hedge_rounds": int(hedge)} if hedge else {})}


def _records(args: argparse.Namespace, network: str, player: str) -> list[dict[str, float]]:
    return _played(args, network, player)["records"]


def _played(args: argparse.Namespace, network: str, player: str) -> dict[str, Any]:
    return json.loads((args.out / network / f"{player}.json").read_text())


def _seed_mean(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Episode by episode, the runs' records averaged (the same episodes, in the same order, for every run)."""
    return [{k: sum(r[i][k] for r in runs) / len(runs) for k in runs[0][i]} for i in range(len(runs[0]))]


def recipe_row(args: argparse.Namespace, network: str, recipe: Recipe) -> dict[str, Any]:
    """One recipe on one network: its seeds' mean policy minus each paired baseline and the best of every baseline
    (paired per episode), the seeds above the best, the episode lengths, and whether nobody serves the network."""
    baselines = {b: _records(args, network, b) for b in BASELINES}
    summaries = {b: summarize(r) for b, r in baselines.items()}
    best = max(summaries, key=lambda b: summaries[b]["reward_per_step"])
    played = [_played(args, network, _player(recipe, run)) for run in recipe.runs]
    seeds = [p["records"] for p in played]
    mean = _seed_mean(seeds)
    per_seed = [paired_difference(s, baselines[best]) for s in seeds]
    pooled = summarize([r for s in seeds for r in s])
    return {"network": network, "recipe": recipe.name, "runs": [str(r) for r in recipe.runs], "best": best,
            "baselines": {b: summaries[b]["reward_per_step"] for b in BASELINES},
            "paired": {b: paired_difference(mean, baselines[b]) for b in PAIRED},
            "paired_best": paired_difference(mean, baselines[best]),
            "paired_best_per_seed": per_seed, "seeds_above_best": sum(d["mean"] - d["ci95"] > 0 for d in per_seed),
            "length": {"policy": pooled["mean_length"], "best": summaries[best]["mean_length"]},
            "length_paired": paired_difference(mean, baselines[best], key="length"),
            "unservable": unservable(pooled, summaries[best], profile_of("VREdge-v0").abandonment),
            **({"guarded_share": float(np.mean([p["guarded_share"] for p in played]))}
               if GUARD in recipe.name or VOLATILITY in recipe.name else {}),
            **({"thresholds": [p["threshold"] for p in played]} if VOLATILITY in recipe.name else {})}


def table(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and its rows (:func:`recipe_row` for every network and recipe): a line per network and
    recipe, the network's baselines on its first."""
    rows = [recipe_row(args, network, recipe) for network in args.networks for recipe in args.recipes]
    head = ["network (best baseline: reward/step)", "recipe", *(f"minus {b}" for b in PAIRED), "minus the best",
            "seeds above it", "episode length: policy (best)"]
    lines = [f"{args.episodes} held-out episodes per network (seed {args.seed}); each recipe's seeds averaged per "
             "episode, then paired with each baseline: reward per step, mean ± 95% interval over the episodes; the "
             f"best: the best of {', '.join(BASELINES)} on that network; seeds above it: those whose own paired "
             "interval against it is above zero\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        first = row is next(r for r in rows if r["network"] == row["network"])
        network = f"{row['network']} ({row['best']}: {row['baselines'][row['best']]:.3f})" if first else ""
        cannot = f" {UNSERVABLE}" if row["unservable"] else ""
        guarded = f" (guarded {row['guarded_share']:.0%})" if "guarded_share" in row else ""
        lines.append("| " + " | ".join([
            network, row["recipe"] + guarded,
            *(f"{d['mean']:+.3f} ± {d['ci95']:.3f}" for d in (*row["paired"].values(), row["paired_best"])),
            f"{row['seeds_above_best']}/{len(row['runs'])}{cannot}",
            f"{row['length']['policy']:.0f} ({row['length']['best']:.0f})"]) + " |")
    lines.append("\nNetworks: " + "; ".join(f"`{n}`: {what}" for n, (what, _) in args.networks.items()) + ".")
    if any(row["unservable"] for row in rows):
        lines.append(f"{UNSERVABLE}: the policy (its seeds pooled) and the best baseline lose their users in more "
                     f"than {LOST_IN_MOST_EPISODES:g} of their episodes: nobody serves that network, so its "
                     "comparison is no result.")
    return "\n".join(lines), rows


def _hedges(p: OneLineParser, text: str | None) -> list[int]:
    """``--volatility-guard``'s hedges (none where it was not given); a usage error where one is not a whole
    number >= 0 (an empty one included) or one is given twice."""
    if text is None:
        return []
    hedges = [h.strip() for h in text.split(",")]
    if bad := [h for h in hedges if not (h.isascii() and h.isdigit())]:
        p.error(f"--volatility-guard {text}: {', '.join(repr(h) for h in bad)} is not a whole number >= 0 of rounds; "
                "give comma-separated hedges, e.g. 8,32")
    if len(set(map(int, hedges))) < len(hedges):
        p.error(f"--volatility-guard {text}: a hedge given twice; give each once")
    return [int(h) for h in hedges]


def main(argv: list[str] | None = None) -> None:
    stopped_before_playing(_main, argv)


def _main(argv: list[str] | None) -> None:
    p = OneLineParser(prog="python -m benchmarks.generalisation", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", type=_recipe, action="append", required=True, dest="recipes",
                   help="NAME=RUN[,RUN...]: a recipe's runs (one per training seed); repeat for each recipe")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes per network (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed, as trainer.evaluate's (default: 0)")
    p.add_argument("--networks", default="", help="comma-separated names of the networks to play (default: all of "
                                                   f"{', '.join(networks(Path('.')))})")
    p.add_argument("--guard", type=float, default=0.0,
                   help="also play each run with a guard: where an observation's feature is more than this many "
                        "standard deviations from the run's training observations, --guard-fallback acts (0: off)")
    p.add_argument("--guard-fallback", default="robust_mpc", choices=PAIRED, help="default: %(default)s")
    p.add_argument("--volatility-guard", nargs="?", const=str(HEDGE_ROUNDS), default=None, metavar="HEDGES",
                   help="also play each run with envs.guard.VolatilityGuard (lowest where the cell's capacity jumps "
                        "more often than on any validation episode of the run's training network), once per "
                        "comma-separated hedge: the rounds each episode starts with at the lowest level (default: "
                        f"{HEDGE_ROUNDS}); a recipe's rows are NAME+volatility (hedge {HEDGE_ROUNDS}) and "
                        "NAME+volatilityN (hedge N)")
    p.add_argument("--jobs", type=int, default=2, help="players at a time (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="folder for the records, the generated traces, the table")
    args = p.parse_args(argv)
    for flag, value in (("--episodes", args.episodes), ("--jobs", args.jobs)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.guard < 0:
        p.error(f"--guard must be >= 0 (0: off), got {args.guard:g}")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out}: a file is there; name a folder (made if missing)")
    known = networks(args.out / "heavy-traces")
    asked = [n for n in args.networks.split(",") if n] or list(known)
    if unknown := [n for n in asked if n not in known]:
        p.error(f"--networks: {', '.join(unknown)} unknown; pick from {', '.join(known)}")
    args.networks = {n: known[n] for n in asked}
    unguarded = list(args.recipes)
    if args.guard:  # each recipe again, guarded
        args.recipes += [Recipe(r.name + GUARD, r.runs) for r in unguarded]
    hedges = _hedges(p, args.volatility_guard)
    args.recipes += [Recipe(r.name + VOLATILITY + ("" if h == HEDGE_ROUNDS else str(h)), r.runs)
                     for h in hedges for r in unguarded]
    if hedges and (first := next((run for r in unguarded for run in r.runs), None)):  # (one cell: checked below)
        options = _stored_config(p, first).env_options
        steps = envs.VREdgeConfig(**{k: v for k, v in options.items() if k not in NETWORK_ARGUMENTS}).max_steps
        if whole := [h for h in hedges if h >= steps]:
            p.error(f"--volatility-guard: a hedge of {whole[0]} rounds covers the runs' whole episode (max_steps "
                    f"{steps}): the policy would never play; give fewer rounds")
    played = _checked_runs(p, args.recipes, bool(args.guard))
    print_machine()
    write_traces(args.out / "heavy-traces", **HEAVY)  # the same bytes every time
    _play_all(args, _tasks(args, played), _play_task)
    text, rows = table(args)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))
    print(text)
    print(f"wrote {args.out / 'table.md'} and table.json")


if __name__ == "__main__":
    main()
