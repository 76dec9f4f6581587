"""End-to-end PPO training speed per backend and ``--compile`` setting, side by side in one run.

    python -m benchmarks.backends                     # VR-edge defaults, 25 iterations, 3 rounds
    python -m benchmarks.backends --rounds 5 -- --num-envs 256
    python -m benchmarks.backends --device cuda --contenders sync device device+compile

Each contender is ``python -m trainer.train`` with its backend flags and the shared flags, in a
fresh interpreter; rounds alternate the contenders so that machine noise hits all of them. Two
numbers per run: the steady rate (env steps/s over the iterations after the first: collection
and learning, no start-up) and the wall time of the whole command (start-up, compilation and
all). Ratios are against the first contender.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import print_machine
from benchmarks.revisions import steady_rate

CONTENDERS = {
    "serial": ["--backend", "serial", "--compile", "off"],
    "sync": ["--backend", "sync", "--compile", "off"],
    "sync+compile": ["--backend", "sync", "--compile", "on"],
    "async": ["--backend", "async", "--compile", "off"],
    "device": ["--backend", "device", "--compile", "off"],
    "device+compile": ["--backend", "device", "--compile", "on"],
}


def run(flags: list[str], run_dir: Path) -> tuple[float, float]:
    """``(steady env steps/s, wall seconds of the whole command)`` of one training run."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer.train", *flags, "--run-dir", str(run_dir)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return steady_rate(run_dir / "metrics.jsonl"), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.backends", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=25, help="iterations per run (of --num-envs x --num-steps)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--contenders", nargs="+", default=["sync", "sync+compile", "async", "device", "device+compile"],
                   choices=list(CONTENDERS))
    p.add_argument("flags", nargs=argparse.REMAINDER, help="more trainer flags, after --")
    args = p.parse_args(argv)
    extra = [f for f in args.flags if f != "--"]
    envs, steps = 64, 128  # VR-edge's defaults, unless the extra flags say otherwise
    for name, value in zip(extra, extra[1:]):
        envs = int(value) if name == "--num-envs" else envs
        steps = int(value) if name == "--num-steps" else steps
    shared = ["--device", args.device, "--total-steps", str(args.iterations * envs * steps), *extra]
    print_machine()
    print(f"shared flags: {' '.join(shared)}")
    rates: dict[str, list[float]] = {c: [] for c in args.contenders}
    walls: dict[str, list[float]] = {c: [] for c in args.contenders}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for c in args.contenders:
                rate, wall = run([*CONTENDERS[c], *shared], Path(tmp) / f"{c}-{r}")
                rates[c].append(rate)
                walls[c].append(wall)
                print(f"round {r + 1} {c}: {rate:,.0f} env steps/s, {wall:.1f} s in all", flush=True)
    first = args.contenders[0]
    base = statistics.median(rates[first])
    print(f"\n| contender | env steps/s, median [min - max] | vs {first} | whole run, s (median) |")
    print("|---|---|---|---|")
    for c in args.contenders:
        med = statistics.median(rates[c])
        print(f"| {c} | {med:,.0f} [{min(rates[c]):,.0f} - {max(rates[c]):,.0f}] | {med / base:.3f}x | "
              f"{statistics.median(walls[c]):.1f} |")


if __name__ == "__main__":
    main()
