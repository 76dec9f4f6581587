"""Training speed of two git revisions, side by side in one run: is a change measurably slower?

    python -m benchmarks.revisions --base eae2906 --rounds 3 -- --env VREdge-v0 --total-steps 163840

Checks ``--base`` out into a temporary worktree and runs ``python -m trainer.train`` with the
same flags alternately from the base and from this checkout (base, head, base, head, ...), each
in a fresh interpreter with this interpreter's packages. The rate of a run is its env steps per
second over the iterations after the first (warm-up and start-up left out), read from its
``metrics.jsonl``. Prints each side's median and spread and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.machine import print_machine, side_by_side

ROOT = Path(__file__).resolve().parent.parent


def steady_rate(metrics: Path) -> float:
    """Env steps/s after the first iteration (rows carry steps/s since the start of the run)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    first, last = rows[0], rows[-1]
    elapsed = last["env_steps"] / last["sps"] - first["env_steps"] / first["sps"]
    return (last["env_steps"] - first["env_steps"]) / elapsed


def train_rate(source: Path, flags: list[str], run_dir: Path) -> float:
    subprocess.run([sys.executable, "-m", "trainer.train", *flags, "--run-dir", str(run_dir)], cwd=source,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(source)})  # its own packages before the installed ones
    return steady_rate(run_dir / "metrics.jsonl")


@contextlib.contextmanager
def worktree(revision: str, where: Path) -> Iterator[Path]:
    """``revision`` checked out at ``where`` (a detached git worktree, removed afterwards)."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), revision], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.revisions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare against")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="trainer flags, after --")
    args = p.parse_args(argv)
    flags = [f for f in args.flags if f != "--"]
    print_machine()
    print(f"flags: {' '.join(flags)}")
    rates: dict[str, list[float]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        with worktree(args.base, Path(tmp) / "base") as base:
            for r in range(args.rounds):
                for side, source in (("base", base), ("head", ROOT)):
                    rates[side].append(train_rate(source, flags, Path(tmp) / f"{side}{r}"))
                    print(f"round {r + 1} {side}: {rates[side][-1]:,.0f} env steps/s", flush=True)
    labels = {"base": f"base ({args.base})", "head": "head (this checkout)"}
    print("\n".join(side_by_side(rates, labels, ("head", "base"))))


if __name__ == "__main__":
    main()
