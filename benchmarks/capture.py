"""The policy's capture of the causal reference, checkpoint by checkpoint: how much of what is reachable from
observations a run has learnt, against the env steps it trained for (issue 51).

    python -m benchmarks.capture RUN [RUN ...] --out DIR [--checkpoints 4] [--episodes 50] [--seed 0]

Plays ``fair_share`` and the causal reference (``envs.belief_mpc.BeliefMPC`` on ``fair_share``, its defaults) once
on the held-out episodes ``trainer.evaluate`` plays, then the greedy policy of ``--checkpoints`` checkpoints of
each run spread over the ones it kept (its newest always; ``--keep-checkpoints`` and ``--checkpoint-every`` at
training decide which exist), each on the same episodes. For each it reports the **capture** ``(policy -
fair_share) / (belief - fair_share)`` with its 95% interval (delta method over episodes, as ``trainer.evaluate``),
in ``DIR/table.md``, ``DIR/table.json`` and ``DIR/capture.png`` (capture against env steps, one line per run).
The references' records are kept in ``DIR/references.json`` and reused by a later call on the same episodes and
env (the reference's 50 episodes take minutes; a checkpoint's, seconds). The runs must share one synthetic VR-edge
cell (the filter has no model of a trace).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

import checkpoints
import envs
from benchmarks.machine import print_machine
from envs.belief import filter_refusal
from envs.settings import ConfigError
from trainer.arguments import OneLineParser
from trainer.evaluation.comparison import load_run, play
from trainer.evaluation.contenders import belief_records
from trainer.evaluation.episodes import run_episodes
from trainer.evaluation.report import check_writable, plus_minus, pyplot, write_figure
from trainer.evaluation.statistics import gap_closed, paired_difference

Records = list[dict[str, float]]
BASE, REFERENCE = "fair_share", "belief"


def spread(files: list[Path], n: int) -> list[Path]:
    """``n`` of a run's checkpoint ``files`` (oldest first), evenly spread, the newest always among them.

    >>> spread([Path(f"c{i}") for i in range(10)], 4)
    [PosixPath('c0'), PosixPath('c3'), PosixPath('c6'), PosixPath('c9')]
    >>> spread([Path("c0"), Path("c1")], 5)
    [PosixPath('c0'), PosixPath('c1')]
    """
    if n >= len(files):
        return list(files)
    last = len(files) - 1
    return [files[round(i * last / (n - 1))] for i in range(n)] if n > 1 else [files[-1]]


def checkpoints_of(run: Path, n: int) -> list[Path]:
    """The checkpoints to score of ``run``: ``n`` of a run directory's, :func:`spread`; a checkpoint file itself."""
    return [run] if run.is_file() else spread(sorted(checkpoints.checkpoint_files(run)), n)


def run_cell(run: Path) -> dict[str, Any]:
    """The env arguments a run's policy is played with (its cell, held out), from its newest checkpoint."""
    loaded = load_run(run, "latest")
    if loaded.cfg.env != "VREdge-v0":
        raise ConfigError("runs", str(run), message=f"{run}: trained on {loaded.cfg.env}; the reference is VR-edge's")
    if why := filter_refusal(envs.VREdgeConfig(**loaded.env_kwargs)):
        raise ConfigError("runs", str(run), message=f"{run}: {why}")
    return loaded.env_kwargs


def references(env_kwargs: dict[str, Any], episodes: int, seed: int, out: Path) -> dict[str, Records]:
    """``fair_share``'s and the reference's records on the held-out episodes: those kept in ``out`` where they were
    played on the same episodes and env, else played now (and kept)."""
    path, key = out / "references.json", {"env_kwargs": env_kwargs, "episodes": episodes, "seed": seed}
    if path.is_file() and (kept := json.loads(path.read_text())).get("key") == json.loads(json.dumps(key)):
        return kept["records"]
    cfg, env_fn = envs.VREdgeConfig(**env_kwargs), functools.partial(gym.make, "VREdge-v0", **env_kwargs)
    played = {BASE: run_episodes(envs.make_baseline(BASE, cfg), env_fn, episodes, seed),
              REFERENCE: belief_records(cfg, env_fn, episodes, seed, BASE)}
    path.write_text(json.dumps({"key": key, "records": played}))
    return played


def checkpoint_row(source: Path, refs: dict[str, Records], episodes: int, seed: int) -> dict[str, Any]:
    """One checkpoint's policy on the held-out episodes: its env steps, reward per step and capture."""
    loaded = load_run(source, "latest")
    played = play(loaded, episodes, seed)
    capture = gap_closed(played, refs[BASE], refs[REFERENCE])
    lead = paired_difference(played, refs[BASE])
    return {"checkpoint": str(source), "checkpoint_sha256": loaded.sha256, "env_steps": loaded.env_steps,
            "reward_per_step": sum(r["reward_per_step"] for r in played) / len(played),
            "vs_fair_share": lead["mean"], "vs_fair_share_ci95": lead["ci95"],
            "capture": capture["fraction"], "capture_ci95": capture["ci95"]}


def table(rows: list[dict[str, Any]], refs: dict[str, Records]) -> str:
    """The rows as a markdown table, under the reference's lead over ``fair_share``."""
    lead = paired_difference(refs[REFERENCE], refs[BASE])
    lines = [f"causal reference (BeliefMPC on fair_share) minus fair_share: {lead['mean']:+.4f} "
             f"{plus_minus(lead['ci95'])} over {lead['episodes']} episodes", "",
             "| run | env steps | reward/step | policy - fair_share | capture |", "|---|---|---|---|---|"]
    lines += [f"| {Path(r['checkpoint']).parent.parent.name} | {r['env_steps']:,} | {r['reward_per_step']:.4f} | "
              f"{r['vs_fair_share']:+.4f} {plus_minus(r['vs_fair_share_ci95'])} | "
              f"{r['capture']:.2f} {plus_minus(r['capture_ci95'])} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out: Path) -> Path:
    """Capture against env steps with 95% intervals, one line per run, and the reference at 1."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in dict.fromkeys(Path(r["checkpoint"]).parent.parent for r in rows):
        mine = [r for r in rows if Path(r["checkpoint"]).parent.parent == run]
        ax.errorbar([r["env_steps"] for r in mine], [r["capture"] for r in mine],
                    yerr=[r["capture_ci95"] for r in mine], marker="o", capsize=3, label=run.name)
    ax.axhline(1.0, color="k", linestyle="--", label="the causal reference")
    ax.axhline(0.0, color="grey", linestyle=":", label="fair_share")
    ax.set(xlabel="env steps trained", ylabel="capture of the reference's lead over fair_share")
    ax.legend()
    return write_figure(fig, out / "capture.png")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.capture", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="VR-edge run directories (or checkpoint files) trained on one "
                   "synthetic cell")
    p.add_argument("--out", type=Path, required=True, help="folder for the records, the table and the plot")
    p.add_argument("--checkpoints", type=int, default=4, help="checkpoints per run, spread (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50, help="held-out episodes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed, as trainer.evaluate's (default: 0)")
    args = p.parse_args(argv)
    if args.checkpoints < 1 or args.episodes < 2:
        p.error(f"--checkpoints must be >= 1 and --episodes >= 2, got {args.checkpoints} and {args.episodes}")
    try:
        cells = [run_cell(run) for run in args.runs]
    except (ConfigError, checkpoints.CheckpointError) as e:
        p.error(str(e))
    if any(cell != cells[0] for cell in cells):
        p.error("the runs were trained on different cells: capture one cell's runs at a time")
    try:
        check_writable(args.out, "the records, the table and the plot")
    except ValueError as e:
        p.error(str(e))
    print_machine()
    refs = references(cells[0], args.episodes, args.seed, args.out)
    rows = [checkpoint_row(f, refs, args.episodes, args.seed) for run in args.runs
            for f in checkpoints_of(run, args.checkpoints)]
    text = table(rows, refs)
    (args.out / "table.md").write_text(text)
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))
    print(text + f"plot: {plot(rows, args.out)}")


if __name__ == "__main__":
    sys.exit(main())
