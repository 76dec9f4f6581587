"""The results table of a cell recipe (issue 49): trained runs of ``docs/cells.toml`` against baselines in cells of
2 to 16 users, with and without churn, each paired with every baseline over the same held-out episodes.

    python -m benchmarks.cells_table runs/cells/s1 runs/cells/s2 runs/cells/s3 --users 2,4,8,12,16 \\
        --churn 0,0.05 --episodes 50 --out runs/cells/table

What ``trainer.evaluate --users --churn`` plays, for several runs at once: every player of a cell (each run's
greedy policy, each baseline) plays the same held-out episodes (evaluation seed ``--seed``, the runs' held-out env
arguments, in the slots trainer.evaluate plays them in), and the baselines are played once for all the runs, not
once per run. Each player's episode records go to ``OUT/<cell>/<player>.json`` as soon as they are played, so a
stopped table goes on where it stopped, and ``--runs-later`` plays the baselines before the runs have finished
training. A run's records name its checkpoint by content hash: a run whose checkpoint holds other weights now (a new
best, a file rewritten) is played again. ``--jobs`` players at a time, one thread each. Prints a Markdown table (a
row per cell: each baseline's reward per step, then per run the policy minus each baseline, paired, mean ± 95%
interval) and writes it to ``OUT/table.md``, with every number in ``OUT/table.json`` (the policy's own reward per
step and the episodes it won too, and each run's checkpoint: ``checkpoint``, ``checkpoint_sha256``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import checkpoints
import envs
from benchmarks.machine import print_machine
from collectors.stop_signals import handled_stop_signals, leave_ctrl_c_to_the_parent, restore_handlers
from envs.profiles import profile_of
from envs.settings import ConfigError
from envs.traces import TRACE_ARGUMENTS, TraceError
from trainer.arguments import OneLineParser, churn_levels, most_users, user_counts
from trainer.config import TrainConfig
from trainer.evaluation.cells import Cell, cell_env_kwargs, cell_slots, cells_of, check_vr_edge
from trainer.evaluation.episodes import EPISODE_BATCH, held_out_env_kwargs, run_episodes
from trainer.evaluation.servable import LOST_IN_MOST_EPISODES, UNSERVABLE, unservable
from trainer.evaluation.statistics import paired_difference, summarize

if TYPE_CHECKING:
    from torch import nn

DEFAULT_BASELINES = ("fair_share", "robust_mpc")


class CheckpointChangedError(ValueError):
    """A run's checkpoint that holds other weights than when the table began (its content hash is another)."""


def _cell_name(cell: Cell) -> str:
    return f"users-{cell.users}_churn-{cell.churn:g}"


def _play(task: tuple[str, str | None, dict[str, Any], str]) -> str:
    """Play one player (a baseline by name, or a run's policy) on one cell's episodes; write its records."""
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    player, run, played_with, out = task
    kwargs = played_with["env_kwargs"]
    if run is None:
        act = envs.make_baseline(player, envs.VREdgeConfig(**kwargs))
    else:
        from trainer.evaluation.episodes import policy_actions

        act = policy_actions(_checked_model(played_with), deterministic=True)
    records = run_episodes(act, functools.partial(gym.make, "VREdge-v0", **kwargs), played_with["episodes"],
                           played_with["seed"])
    return _written(out, played_with, records)


def _written(out: str, played_with: dict[str, Any], records: list[dict[str, float]], **more: Any) -> str:
    """A player's record file ``out`` written (what it was played with, its records and ``more``); its path."""
    checkpoints.files.write_whole(Path(out), json.dumps({"played_with": played_with, "records": records, **more}))
    return out  # whole or absent: a stopped table plays it again


def _checked_model(played_with: dict[str, Any]) -> nn.Module:
    """The policy of the checkpoint file ``played_with`` names, once its content is the one named: the records say
    which weights they are of (the run's best may have moved, or its file been rewritten, since the table began)."""
    from trainer.evaluation.policies import policy_from_state

    path = Path(played_with["checkpoint"])
    state = checkpoints.load(path)
    if checkpoints.content_hash(path) != played_with["checkpoint_sha256"]:  # (after the load: of what it loaded)
        raise CheckpointChangedError(f"{path} holds other weights than when the table began; the same command "
                                     "plays the run again")
    return policy_from_state(state, path)[0]


def _checkpoint_named(source: Path) -> dict[str, str]:
    """A run's checkpoint file as its records name it: its path, and its content hash, which says whether records
    are of it."""
    return {"checkpoint": str(source), "checkpoint_sha256": checkpoints.content_hash(source)}


def _same_play(kept: dict[str, Any] | None, asked: dict[str, Any]) -> bool:
    """Whether records played with ``kept`` are what ``asked`` asks for: the same cell, episodes and seed and, for a
    run, a checkpoint of the same content hash, wherever it lies (records without one, of an older version: not)."""
    def content(played_with: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in played_with.items() if k != "checkpoint"}  # (the path: where, not what)
    return kept is not None and content(kept) == content(json.loads(json.dumps(asked)))  # (as JSON reads it back)


def _played_with(path: Path) -> dict[str, Any] | None:
    """What a record file was played with (its cell's env arguments, episodes, seed, a run's checkpoint); ``None``
    where there is no whole one."""
    try:
        return json.loads(path.read_text())["played_with"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tasks(args: argparse.Namespace, cells: list[Cell], runs: _Runs) -> list[tuple]:
    """Every (player, cell) not played as asked now: the baselines, then the runs whose training has finished. A
    record played otherwise (other episodes, seed or slots; a run's checkpoint of other content) is played again."""
    tasks = []
    masked = envs.VREdgeConfig(**runs.env_kwargs).masked
    for cell in cells:
        played_with = {"env_kwargs": cell_env_kwargs(runs.env_kwargs, runs.slots, cell, masked),
                       "episodes": args.episodes, "seed": args.seed}
        players = [(name, None, played_with) for name in args.baselines]
        players += [(run.name, str(run), {**played_with, **runs.checkpoints[run]})
                    for run in args.runs if not args.runs_later]
        tasks += _unplayed(args.out / _cell_name(cell), players)
    return _slowest_first(tasks)


def _unplayed(folder: Path, players: list[tuple[str, str | None, dict[str, Any]]]) -> list[tuple]:
    """The tasks of ``players`` (name, run or ``None`` for a baseline, what to play) whose records in ``folder`` (made
    if missing) are not of what they ask now."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = []
    for player, run, asked in players:
        out = folder / f"{player}.json"
        if not _same_play(_played_with(out), asked):
            tasks.append((player, run, asked, str(out)))
    return tasks


def _slowest_first(tasks: list[tuple]) -> list[tuple]:
    # the robust MPC plans every step: first, so that the last ones to finish are short
    return sorted(tasks, key=lambda t: t[0] != "robust_mpc")


def _records(args: argparse.Namespace, cell: Cell, player: str) -> list[dict[str, float]]:
    return json.loads((args.out / _cell_name(cell) / f"{player}.json").read_text())["records"]


def _reward_per_step(records: list[dict[str, float]]) -> dict[str, float]:
    summary = summarize(records)
    return {"mean": summary["reward_per_step"], "ci95": summary["reward_per_step_ci95"]}


def table(args: argparse.Namespace, cells: list[Cell], runs: _Runs) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and its numbers: a row per cell (each baseline's reward per step), a column per run (its
    policy's reward per step minus each baseline's, paired: mean ± 95% interval, in the order of the baselines,
    marked UNSERVABLE where the policy and the cell's best baseline, by reward per step on these episodes, both lose
    their users in most episodes: :mod:`trainer.evaluation.servable`); each run's checkpoint named by its content
    hash, in both."""
    abandonment = profile_of("VREdge-v0").abandonment
    head = ["users", "churn", *args.baselines, *(f"{run.name}: policy minus each" for run in args.runs)]
    played = ", ".join(f"{run.name} {Path(runs.checkpoints[run]['checkpoint']).name} (sha256 "
                       f"{runs.checkpoints[run]['checkpoint_sha256'][:12]})" for run in args.runs)
    lines = [f"{args.episodes} held-out episodes per cell (seed {args.seed}) in cells of {runs.slots} user slots; "
             f"checkpoints: {played}\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for cell in cells:
        baselines = {b: _records(args, cell, b) for b in args.baselines}
        summaries = {b: summarize(r) for b, r in baselines.items()}
        best = max(summaries, key=lambda b: summaries[b]["reward_per_step"]) if summaries else None
        cols = [str(cell.users), f"{cell.churn:g}", *(f"{_reward_per_step(r)['mean']:.3f}" for r in baselines.values())]
        for run in args.runs:
            policy = _records(args, cell, run.name)
            paired = {b: paired_difference(policy, records) for b, records in baselines.items()}
            cannot = unservable(summarize(policy), summaries.get(best), abandonment)
            rows.append({"users": cell.users, "churn": cell.churn, "run": str(run), **runs.checkpoints[run],
                         "policy": _reward_per_step(policy),
                         "baselines": {b: _reward_per_step(r) for b, r in baselines.items()}, "paired": paired,
                         "unservable": cannot})
            cols.append(" / ".join(f"{p['mean']:+.3f} ± {p['ci95']:.3f}" for p in paired.values())
                        + (f" {UNSERVABLE}" if cannot else ""))
        lines.append("| " + " | ".join(cols) + " |")
    if any(row["unservable"] for row in rows):
        lines.append(f"\n{UNSERVABLE}: the policy and the cell's best baseline lose their users (a user abandons) in "
                     f"more than {LOST_IN_MOST_EPISODES:g} of their episodes there: nobody serves that cell, so that "
                     "comparison is no result (docs/traces.md: how a trace set's scale sets the cell's difficulty)")
    return "\n".join(lines), rows


def _check_cells_fit(args: argparse.Namespace, cfg: TrainConfig, cells: list[Cell], kwargs: dict[str, Any]) -> None:
    """A :class:`ConfigError` where ``--jobs`` players at once, each playing its episodes as ``trainer.evaluate``
    does, in cells of env arguments ``kwargs`` (those of the most users) would not fit this machine's memory: said
    before anything is played, not as each player's allocation error."""
    from trainer.memory import check_cells_fit
    from trainer.run_layout import memory_available

    asked = ",".join(dict.fromkeys(str(c.users) for c in cells))
    check_cells_fit(cfg.env, asked, kwargs, args.jobs * min(args.episodes, EPISODE_BATCH), memory_available(),
                    widest_layer=max(cfg.hidden_sizes), fewer_with="--jobs or --episodes")


def _stored_config(p: OneLineParser, run: Path) -> TrainConfig:
    """The training config that ``run``'s ``config.json`` holds (as trainer.train wrote it; an older version's names
    read as today's); a usage error naming the file and what is wrong with it where it is missing, unreadable, not
    JSON, not a run's config, or a config no run could have had (a file damaged or edited by hand)."""
    from trainer.config import format_env_kwargs, with_current_names

    path = run / "config.json"
    if not path.is_file():
        p.error(f"{run}: not a run directory (no config.json); pass the folders trainer.train wrote")
    try:
        held = json.loads(checkpoints.read_small_file(path))
    except OSError as e:  # a FIFO or an oversized file planted there, no permission
        why = f"cannot be read ({e.strerror or e})"
    except ValueError:  # not UTF-8, not JSON
        why = "is not JSON"
    else:
        why = "" if isinstance(held, dict) and isinstance(held.get("config"), dict) else 'holds no "config" object'
    if not why:
        try:  # its settings' types and limits too: a damaged value is said here, not as a traceback further on
            cfg = TrainConfig.from_dict(with_current_names(held["config"]), stored=True)
            untraced = {k: v for k, v in cfg.env_options.items() if k not in TRACE_ARGUMENTS}
            # (without its traces: a trace folder that moved is said where the cells are built, as what it is)
            dataclasses.replace(cfg, env_kwargs=format_env_kwargs(untraced)).validate()
            return cfg
        except (ValueError, TypeError) as e:  # (ConfigError is a ValueError)
            why = f"holds a config no run can have ({e})"
    p.error(f"{path} {why}: it is not the file trainer.train wrote; put the run's own config.json back (from a copy "
            "of the run), or pass another run directory")


class _Runs(NamedTuple):
    """What the runs of one recipe share, as :func:`_check_runs` found it."""

    slots: int  # the slots every cell is played in (trainer.evaluate's: cell_slots)
    env_kwargs: dict[str, Any]  # the recipe's held-out env arguments
    checkpoints: dict[Path, dict[str, str]]  # the checkpoint each run plays, named (none with --runs-later)


def _check_runs(p: OneLineParser, args: argparse.Namespace, cells: list[Cell]) -> _Runs:
    """Every run a VR-edge run whose policy can act on ``cells``, named apart from the others and the baselines, and
    all of one recipe played in as many slots: a usage error otherwise, before anything is played."""
    from checkpoints import CheckpointError
    from trainer.evaluation.policies import make_model, picked_checkpoint

    names = [run.name for run in args.runs]
    if clash := sorted({n for n in names if names.count(n) > 1 or n in args.baselines}):
        p.error(f"{', '.join(clash)}: two runs, or a run and a baseline, of one name (a player's records are named "
                "by it); pass runs whose folders are named apart")
    recipes: dict[Path, dict[str, Any]] = {}
    slots: dict[Path, int] = {}
    played: dict[Path, dict[str, str]] = {}
    biggest = max(cells, key=lambda c: most_users(c.users))
    for run in args.runs:
        cfg = _stored_config(p, run)
        if cfg.env != "VREdge-v0":
            p.error(f"{run}: trained on {cfg.env}; cells_table plays runs of a VR-edge cell recipe (VREdge-v0)")
        recipes[run] = held_out_env_kwargs(cfg.env, cfg.env_options)
        try:
            check_vr_edge(cfg, cells)  # the model's shape, not its weights, says which slots it acts on
            trained = envs.VREdgeConfig(**recipes[run])
            slots[run] = cell_slots(make_model(cfg), cfg, trained, cells)
            _check_cells_fit(args, cfg, cells, cell_env_kwargs(recipes[run], slots[run], biggest, trained.masked))
            if not args.runs_later:
                played[run] = _checkpoint_named(picked_checkpoint(run, "best").source)
        except (ConfigError, TraceError) as e:  # (a trace folder that moved since the run was trained, say)
            p.error(f"{run}: {e}")
        except CheckpointError as e:
            p.error(f"{run}: {e}; while its training goes on, --runs-later plays the baselines")
    first = args.runs[0]
    for run, recipe in recipes.items():
        if differ := sorted(k for k in set(recipe) | set(recipes[first]) if recipe.get(k) != recipes[first].get(k)):
            p.error(f"{first} and {run} were trained on different env arguments ({', '.join(differ)}); pass the "
                    "runs of one recipe")
        if slots[run] != slots[first]:
            p.error(f"{first} plays in {slots[first]} user slots and {run} in {slots[run]} (a policy whose "
                    "parameters fix its slots plays in its own); pass runs of one policy_arch")
    return _Runs(slots[first], recipes[first], played)


def _play_all(args: argparse.Namespace, tasks: list[tuple], play: Callable[[tuple], str] = _play) -> None:
    """Play ``tasks`` (with ``play``), ``--jobs`` at a time, each said as it is done; a stop signal, or a run's
    checkpoint that holds other weights than when the table began, ends the command, every record played kept."""
    print(f"{len(tasks)} records to play (a player in a cell each), {args.jobs} at a time", flush=True)
    played, stopped_by = 0, [signal.SIGINT]

    def stop(signum: int, frame: Any) -> None:  # any stop signal as Ctrl-C: the pool's exit ends its players
        stopped_by[0] = signum
        raise KeyboardInterrupt
    previous = {s: signal.signal(s, stop) for s in handled_stop_signals() if s != signal.SIGINT}
    try:
        with multiprocessing.get_context("spawn").Pool(args.jobs, initializer=leave_ctrl_c_to_the_parent) as pool:
            try:
                for done in pool.imap_unordered(play, tasks):
                    played += 1
                    print(f"played {done}", flush=True)
            except CheckpointChangedError as e:  # the records kept name the weights they are of: none is mistaken
                sys.exit(f"error: {e}")
            except KeyboardInterrupt:  # the pool's exit terminates the players; what they finished is kept
                print(f"stopped: every player that finished is kept in {args.out} (of {len(tasks)}: {played} "
                      "reported); the same command goes on", file=sys.stderr)
                sys.exit(128 + stopped_by[0])
    finally:
        restore_handlers(previous)


def main(argv: list[str] | None = None) -> None:
    stopped_before_playing(_main, argv)


def stopped_before_playing(command: Callable[[list[str] | None], None], argv: list[str] | None) -> None:
    """Run a table's ``command``; a Ctrl-C before its players start (checking the runs, loading their models,
    writing traces: nothing played) is one line and exit 130 (once they play, :func:`_play_all` says what is kept)."""
    try:
        command(argv)
    except KeyboardInterrupt:
        print("stopped before anything was played; the same command starts again", file=sys.stderr)
        sys.exit(130)


def _main(argv: list[str] | None) -> None:
    p = OneLineParser(prog="python -m benchmarks.cells_table", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories trained on one cell recipe")
    p.add_argument("--users", default="2,4,8,12,16", help="comma-separated user counts (default: %(default)s)")
    p.add_argument("--churn", default="0,0.05", help="comma-separated churn levels (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes per cell (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed, as trainer.evaluate's (default: 0)")
    p.add_argument("--baselines", default=",".join(DEFAULT_BASELINES), help="default: %(default)s")
    p.add_argument("--jobs", type=int, default=2, help="players at a time (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True,
                   help="folder for the episode records and the table (table.md, table.json)")
    p.add_argument("--runs-later", action="store_true", help="play the baselines only (the runs still train)")
    args = p.parse_args(argv)
    args.baselines = [b for b in args.baselines.split(",") if b]
    unknown = [b for b in args.baselines if b not in envs.BASELINES]
    if unknown:
        p.error(f"--baselines: {', '.join(unknown)} unknown; pick from {', '.join(envs.BASELINES)}")
    for flag, value in (("--episodes", args.episodes), ("--jobs", args.jobs)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:
        users, churns = user_counts(args.users), churn_levels(args.churn)
    except ConfigError as e:
        p.error(str(e))
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out}: a file is there; name a folder (made if missing)")
    cells = cells_of(users, churns)
    runs = _check_runs(p, args, cells)
    print_machine()
    tasks = _tasks(args, cells, runs)
    _play_all(args, tasks)
    if args.runs_later:
        print(f"the baselines are played; once the runs have finished, the same command without --runs-later plays "
              f"them and writes {args.out / 'table.md'}")
        return
    text, rows = table(args, cells, runs)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))
    print(text)
    print(f"wrote {args.out / 'table.md'} and table.json")


if __name__ == "__main__":
    main()
