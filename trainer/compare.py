"""Compare groups of training runs (seeds of one setup against seeds of another) on the same held-out episodes.

    python -m trainer.compare GROUP_A GROUP_B [...] [--labels A,B] [--pick best|latest] [--episodes 50] [--seed S]
                              [--curve reward_per_step|episode_return|val_return] [--out DIR] [--json]

A GROUP is a folder of run directories (e.g. runs/default holding s1/ s2/ ...), a quoted glob of them
('runs/flat-s*'), or one run directory. Every run's policy (its best checkpoint, from --eval-every, else its
newest) plays greedily on the same held-out episodes, those trainer.evaluate plays. Per group: the mean and the
interquartile mean (IQM) of its runs' scores, each with a stratified bootstrap 95% CI; per pair of groups: the
probability that a run of one scores above a run of the other, and their difference per episode. Written to
--out: compare.json, curves.png/.svg (the learning curves from metrics.jsonl, with 95% bands over runs) and
scores.png/.svg (each run's score, each group's IQM).
The manual: docs/experiments.md#compare-groups-of-runs-trainercompare
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import multiprocessing
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from collectors.stop_signals import exiting_at_once_on_stop_signals
from trainer.arguments import OneLineParser, counted, not_a_directory
from trainer.interrupts import StopSignals, ignore_late_signals

if TYPE_CHECKING:  # (torch loads once the command line is checked)
    from trainer.evaluation.comparison import LoadedRun, Records

CURVES = {"reward_per_step": "training reward per step", "episode_return": "training episode return",
          "val_return": "validation return"}  # what --curve can draw (metrics.jsonl columns), in words
NEEDS_MATPLOTLIB = "trainer.compare draws its plots with matplotlib: pip install -e '.[experiments]'"


def main(argv: list[str] | None = None) -> None:
    """``python -m trainer.compare``; Ctrl-C or SIGTERM at any moment is one line and exit status 128 + the signal,
    and nothing is written."""
    with StopSignals() as signals:
        try:
            _compare(argv, signals)
            ignore_late_signals()  # the results are written: whatever arrives now has nothing to stop
        except KeyboardInterrupt as e:
            print(f"\n{str(e) or 'interrupted'}: the comparison did not finish, nothing was written (its results are "
                  "written once every run is evaluated)", file=sys.stderr)
            raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None


class _Group(NamedTuple):
    """A group of runs, as the command line names it (a folder, a glob or a run directory, with its label)."""

    label: str  # its name in the table, the plots and the JSON
    path: str  # as given: a folder, a glob or a run directory
    runs: list[Path]  # its run directories


def _compare(argv: list[str] | None, signals: StopSignals) -> None:
    """Compare as ``argv`` asks: the table on stdout (stderr with ``--json``), the JSON and the plots written whole
    once every run is evaluated."""
    parser = _parser()
    args = parser.parse_args(argv)
    groups = _checked_before_torch(parser, args)
    out_dir = Path(args.out) if args.out else _beside(args.groups[0]) / f"compare-{'-vs-'.join(map(_folder, groups))}"
    if run := _run_around(out_dir):
        where = "is the run directory" if run == out_dir.resolve() else f"lies inside the run directory {run}"
        parser.error(f"{'--out ' if args.out else 'the output folder '}{out_dir} {where}: the comparison's files "
                     "would mix with that run's; pass --out DIR, a folder outside every run")
    _import_the_comparison()
    import checkpoints
    from trainer.evaluation.comparison import load_run
    from trainer.evaluation.report import check_writable

    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the JSON alone
    runs: dict[Path, Path] = {}  # a run in two groups is loaded and played once
    for run in (run for g in groups for run in g.runs):
        runs.setdefault(run.resolve(), run)
    try:
        loaded = {resolved: load_run(run, args.pick) for resolved, run in runs.items()}
        first = _check_one_env(parser, loaded)
        metric = args.curve or _default_curve(first.cfg.env)
        curves = _curves(groups, metric)
        check_writable(out_dir, "the comparison", make=False)  # before minutes of episodes
    except (ValueError, checkpoints.CheckpointError) as e:
        raise SystemExit(f"error: {e}") from None
    played = _played(args, loaded)
    payload = _payload(args, groups, loaded, played, metric, curves)
    _print_results(args, payload, out)
    _write_results(args, payload, out_dir, signals, out)


def _parser() -> OneLineParser:
    """The command line's arguments."""
    p = OneLineParser(prog="python -m trainer.compare", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("groups", nargs="+", metavar="GROUP",
                   help="a folder of run directories, a quoted glob of them ('runs/flat-s*'), or a run directory")
    p.add_argument("--labels", default="",
                   help="the groups' names, comma-separated, one per GROUP (default: each folder's or glob's name)")
    p.add_argument("--pick", choices=("best", "latest"), default="best",
                   help="each run's best checkpoint (validation, --eval-every) where it has one, else its newest; "
                        "or its newest (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50,
                   help="held-out episodes each run plays, the same for every run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="evaluation seed: the held-out episodes trainer.evaluate --seed plays (default: %(default)s)")
    p.add_argument("--curve", choices=list(CURVES), default=None,
                   help="the metrics.jsonl column the learning curves show against env steps (default: "
                        "reward_per_step on VREdge-v0, episode_return on other envs; val_return needs --eval-every)")
    p.add_argument("--out", default="",
                   help="where compare.json and the plots go (default: compare-A-vs-B next to the first GROUP)")
    p.add_argument("--json", action="store_true",
                   help="print the results as JSON to stdout, and nothing else (the table goes to stderr); "
                        "compare.json is written either way")
    return p


def _checked_before_torch(parser: OneLineParser, args: argparse.Namespace) -> list[_Group]:
    """The groups, once what needs no checkpoint is checked: a mistake is a usage error, answered at once, before
    torch loads."""
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} is invalid: must be >= 1")
    if args.seed < 0:
        parser.error(f"--seed={args.seed} is invalid: must be >= 0")
    if args.out and (problem := not_a_directory("--out", args.out)):
        parser.error(problem)
    labels = [label.strip() for label in args.labels.split(",")] if args.labels else [
        _default_label(spec) for spec in args.groups]
    if len(labels) != len(args.groups):
        parser.error(f"--labels={args.labels!r} names {counted(len(labels), 'group')} for "
                     f"{counted(len(args.groups), 'GROUP')}: give one label per GROUP")
    if any(not label for label in labels) or len(set(labels)) < len(labels):
        twice = next((label for label in labels if labels.count(label) > 1), "")
        given = f"--labels={args.labels!r}" if args.labels else f"the groups {' and '.join(args.groups)}"
        fix = ("quote each glob ('runs/flat/s*') so that its runs make one GROUP" if len(args.groups) > 2 and
               not args.labels else "pass --labels with a distinct name for each GROUP")  # (the shell expanded one)
        parser.error(f"{given}: {'two groups are named ' + repr(twice) if twice else 'an empty label'}; {fix}")
    groups = [_Group(label, spec, _runs_of(parser, spec)) for label, spec in zip(labels, args.groups)]
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit(f"error: {NEEDS_MATPLOTLIB}")
    if len(groups) > 2 and all(len(g.runs) == 1 for g in groups):  # the shell expanded an unquoted glob
        print(f"note: {len(groups)} groups of one run each; quote a glob ('runs/flat-s*') to make its runs one "
              "group", file=sys.stderr)
    return groups


def _runs_of(parser: OneLineParser, spec: str) -> list[Path]:
    """The run directories a GROUP names: itself, the run directories in it, or a glob's (each match a run
    directory or a folder of them), in natural order (s2 before s10); a usage error where there are none."""
    if glob.has_magic(spec):
        matches = [Path(m) for m in sorted(glob.glob(spec))]
        if not matches:
            parser.error(f"GROUP {spec!r}: the glob matches nothing")
    elif not Path(spec).exists():
        parser.error(f"GROUP {spec}: no such directory")
    else:
        matches = [Path(spec)]
    runs = [m for m in matches if _is_run(m)]
    runs += [d for m in matches if m.is_dir() and not _is_run(m) for d in m.iterdir() if _is_run(d)]
    if not runs:
        parser.error(f"GROUP {spec}: no run directories there (a run directory holds config.json or checkpoints/); "
                     "pass a folder of runs, a quoted glob of them, or a run directory")
    return sorted(dict.fromkeys(runs), key=_natural)


def _is_run(path: Path) -> bool:
    """Whether ``path`` is a run directory: what trainer.train writes first (config.json) or checkpoints are there."""
    return path.is_dir() and ((path / "config.json").is_file() or (path / "checkpoints").is_dir())


def _run_around(path: Path) -> Path | None:
    """The run directory that ``path`` is or lies inside (links resolved), or ``None``."""
    resolved = path.resolve()
    return next((p for p in (resolved, *resolved.parents) if _is_run(p)), None)


def _natural(path: Path) -> list[Any]:
    """Sort key of ``path`` with its numbers as numbers: ``s2`` before ``s10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _default_label(spec: str) -> str:
    """A GROUP's name where --labels gives none: its folder's name, or its glob's last part (``flat-s*``)."""
    return Path(spec).name if glob.has_magic(spec) else Path(spec).resolve().name


def _beside(spec: str) -> Path:
    """The folder a GROUP is in: its folder's parent, or for a glob the folder its matches are in."""
    parts = Path(spec).parts
    magic = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
    return Path(*parts[:magic]) if magic is not None else Path(spec).resolve().parent


def _folder(group: _Group) -> str:
    """A group's label as part of a folder's name: ``flat-s*`` as ``flat-s``."""
    return re.sub(r"[^\w.+=-]+", "_", group.label).strip("_.") or "group"


def _import_the_comparison() -> None:
    """Load torch and what the comparison runs on (seconds), once the command line is checked (``--help`` and a
    typo answer before it); a stop signal meanwhile is one line and an exit, not an import traceback."""
    with exiting_at_once_on_stop_signals("nothing was compared, nothing was written; run the same command again"):
        # (the functions above import what they use again: from memory, once it is loaded here)
        import checkpoints  # noqa: F401
        import trainer.evaluation.comparison  # noqa: F401
        import trainer.evaluation.curves  # noqa: F401


def _check_one_env(parser: OneLineParser, loaded: dict[Path, LoadedRun]) -> LoadedRun:
    """The first run, once every run is checked to play the same env with the same env arguments (the same
    episodes); a usage error naming two runs that do not."""
    from trainer.config import format_env_kwargs

    def played_on(run: LoadedRun) -> str:
        return f"{run.cfg.env}" + (f" ({format_env_kwargs(run.env_kwargs)})" if run.env_kwargs else "")

    first, *others = loaded.values()
    for run in others:
        if (run.cfg.env, run.env_kwargs) != (first.cfg.env, first.env_kwargs):
            parser.error(f"{first.run} plays {played_on(first)} but {run.run} plays {played_on(run)}: the runs "
                         "compared must play the same episodes; compare runs of one env with the same --env-kwargs")
    return first


def _default_curve(env: str) -> str:
    """What the learning curves show where --curve says nothing: the column the env's profile names (VR-edge: its
    score, the reward per step); elsewhere the episode return (CartPole's reward is 1 at every step: its return is
    what learning changes)."""
    from envs.profiles import profile_of
    return profile_of(env).curve


def _curves(groups: list[_Group], metric: str) -> dict[str, dict[str, Any]]:
    """Each group's learning curve of ``metric`` (:func:`trainer.evaluation.curves.group_curve`), by label; a
    ``ValueError`` naming the group, and what to do, where a run has none."""
    from trainer.evaluation.curves import group_curve, learning_curve

    curves = {}
    for g in groups:
        try:
            curves[g.label] = group_curve([learning_curve(run, metric) for run in g.runs])
        except ValueError as e:
            others = ", ".join(c for c in CURVES if c != metric)
            hint = " (validations: train with --eval-every K)" if metric == "val_return" else ""
            raise ValueError(f"group {g.label}: {e}; pass --curve with another of {others}{hint}") from None
    return curves


def _played(args: argparse.Namespace, loaded: dict[Path, LoadedRun]) -> dict[Path, Records]:
    """Each run's records over the held-out episodes, by run directory, said run by run on stderr."""
    from tqdm import tqdm

    from trainer.evaluation.comparison import SCORES, play, score_keys
    from trainer.evaluation.episodes import episodes_shown

    keys = score_keys(next(iter(loaded.values())).cfg.env)
    print(f"playing {counted(len(loaded), 'run')} greedily on the same {counted(args.episodes, 'held-out episode')} "
          f"(seed {args.seed}), --pick {args.pick}:", file=sys.stderr)
    played = {}
    with episodes_shown(len(loaded) * args.episodes):
        for run_dir, run in loaded.items():
            played[run_dir] = records = play(run, args.episodes, args.seed)
            scores = ", ".join(f"{SCORES[k]} {sum(e[k] for e in records) / len(records):.3f}" for k in keys)
            tqdm.write(f"  {run.run}: {run.which}, {run.env_steps:,} env steps: {scores}", file=sys.stderr)
    return played


def _payload(args: argparse.Namespace, groups: list[_Group], loaded: dict[Path, LoadedRun],
             played: dict[Path, Records], metric: str, curves: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What ``compare.json`` holds (and ``--json`` prints)."""
    from trainer.evaluation import aggregate
    from trainer.evaluation.comparison import compared, score_keys

    first = next(iter(loaded.values()))
    keys = score_keys(first.cfg.env)
    comparison = compared({g.label: [played[r.resolve()] for r in g.runs] for g in groups}, keys)

    def run_entry(run: LoadedRun) -> dict[str, Any]:
        return {"run": str(run.run.resolve()), "checkpoint": str(run.source.resolve()),
                "checkpoint_sha256": run.sha256, "checkpoint_kind": run.which, "env_steps": run.env_steps}

    return {"env": first.cfg.env, "env_kwargs": first.env_kwargs, "episodes": args.episodes, "seed": args.seed,
            "actions": "greedy", "pick": args.pick, "scored_by": list(keys),
            "bootstrap": {"method": "stratified bootstrap over runs, percentile interval", "reps": aggregate.REPS,
                          "seed": aggregate.SEED, "confidence": aggregate.CONFIDENCE},
            "groups": {g.label: {"path": g.path, "runs": [run_entry(loaded[r.resolve()]) for r in g.runs],
                                 **comparison["groups"][g.label]} for g in groups},
            "pairs": comparison["pairs"],
            "curves": {"metric": metric, "groups": curves}}


def _print_results(args: argparse.Namespace, payload: dict[str, Any], out: TextIO) -> None:
    """The table on ``out``: what was played, then each score's statistics per group and per pair."""
    from trainer.config import format_env_kwargs
    from trainer.evaluation.comparison import format_comparison

    env_kwargs = payload["env_kwargs"]
    arguments = f" ({format_env_kwargs(env_kwargs)})" if env_kwargs else ""
    runs = sum(len(g["runs"]) for g in payload["groups"].values())
    print(f"\n{payload['env']}{arguments}: {counted(len(payload['groups']), 'group')}, {counted(runs, 'run')}, each "
          f"played greedily on the same {counted(args.episodes, 'held-out episode')} (seed {args.seed})\n", file=out)
    print(format_comparison(payload, tuple(payload["scored_by"])), file=out)


def _write_results(args: argparse.Namespace, payload: dict[str, Any], out_dir: Path, signals: StopSignals,
                   out: TextIO) -> None:
    """Write ``compare.json`` and the plots, each replaced whole, under ``signals``: a stop signal waits for them,
    then has nothing left to stop."""
    from trainer.evaluation.comparison import plot_scores
    from trainer.evaluation.curves import plot_curves
    from trainer.evaluation.report import json_ready, write_replacing

    payload = json_ready(payload)
    with signals.critical():
        out_dir.mkdir(parents=True, exist_ok=True)
        metric = payload["curves"]["metric"]
        plots = plot_curves(payload["curves"]["groups"], f"{CURVES[metric]} ({metric})", out_dir / "curves")
        plots += plot_scores(payload, tuple(payload["scored_by"]), out_dir / "scores")
        write_replacing(out_dir / "compare.json", json.dumps(payload, indent=2, allow_nan=False))
        print(f"\nwrote {out_dir / 'compare.json'} and {', '.join(p.name for p in plots)}", file=out)
        if args.json:
            print(json.dumps(payload, allow_nan=False))
        signals.finish()


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
