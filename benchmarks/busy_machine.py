"""Training speed on a quiet and on a busy machine, side by side: the thread and OpenMP settings of the landed
revision against this checkout's default.

    python -m benchmarks.busy_machine --base 72521b6 --busy 2 --rounds 3 --seconds 20
    python -m benchmarks.busy_machine --base 72521b6 --workloads cartpole --variants landed new

Workloads: ``cartpole``, docs/training.md's PPO CartPole command (8 envs x 128 steps), and ``vr-edge``, the defaults on
VREdge-v0 (eagerly). Variants: ``landed`` (``--base`` as it runs: its thread counts and its OpenMP settings),
``active`` and ``passive`` (``--base`` with ``OMP_WAIT_POLICY=ACTIVE`` or ``PASSIVE``: idle OpenMP threads spin,
or sleep at once), ``threads-1`` (``--base --threads 1``), ``new`` (this checkout's default) and ``new-spin-1000``
(this checkout with ``GOMP_SPINCOUNT=1000``). Each run trains with ``--total-steps 10**9`` (so a long run's
settings apply: threads are planned) and is stopped with SIGTERM after ``--seconds``; its rate is its env steps
per second after the first iteration (``benchmarks.revisions.steady_rate``): start-up is left out, the planning
iterations are not. Busy means ``--busy`` pure-Python busy loops (another user's job) run meanwhile. Rounds
interleave every combination. Prints the CPU model, each combination's median and spread, and the slowdown under
load; fair share is ``(busy + threads) / cores``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import print_machine
from benchmarks.revisions import ROOT, steady_rate, worktree

WORKLOADS = {"cartpole": ["--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "128"],
             "vr-edge": ["--env", "VREdge-v0", "--compile", "off"]}
# variant -> (which source, OpenMP environment, extra flags)
VARIANTS = {"landed": ("base", {}, []),
            "active": ("base", {"OMP_WAIT_POLICY": "ACTIVE"}, []),
            "passive": ("base", {"OMP_WAIT_POLICY": "PASSIVE"}, []),
            "threads-1": ("base", {}, ["--threads", "1"]),
            "new": ("head", {}, []),
            "new-spin-1000": ("head", {"GOMP_SPINCOUNT": "1000"}, [])}


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def train_rate(source: Path, flags: list[str], run_dir: Path, omp: dict[str, str], seconds: float) -> float:
    """Env steps/s of ``trainer.train`` from ``source`` with ``flags``, stopped after ``seconds``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *flags, "--total-steps", str(10**9),
                             "--run-dir", str(run_dir)], cwd=source, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**env, **omp, "PYTHONPATH": str(source)})
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the trainer saves the last completed iteration and exits
        proc.wait()
    metrics = run_dir / "metrics.jsonl"
    rows = metrics.read_text().splitlines() if metrics.exists() else []
    if len(rows) < 2:  # too slow for a steady rate: the first iteration's, start-up included (0: none finished)
        return json.loads(rows[0])["sps"] if rows else 0.0
    return steady_rate(metrics)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.busy_machine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="the landed revision the base variants run (git revision)")
    p.add_argument("--busy", type=int, default=2, help="busy-loop processes while the loaded runs train")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20, help="wall clock of each run")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args(argv)
    print_machine()
    print(f"base: {args.base}; {args.busy} busy loops on {os.cpu_count()} cores when busy; {args.seconds:g} s a run")
    keys = [(w, v, b) for w in args.workloads for v in args.variants for b in sorted({0, args.busy})]
    rates: dict[tuple[str, str, int], list[float]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory() as tmp, worktree(args.base, Path(tmp) / "base") as base:
        for r in range(args.rounds):
            for workload, variant, busy in keys:
                source, omp, extra = VARIANTS[variant]
                loops = busy_loops(busy)
                try:
                    rate = train_rate(base if source == "base" else ROOT, WORKLOADS[workload] + extra,
                                      Path(tmp) / f"{workload}-{variant}-{busy}-{r}", omp, args.seconds)
                finally:
                    for proc in loops:
                        proc.kill()
                        proc.wait()
                rates[(workload, variant, busy)].append(rate)
                print(f"round {r + 1}: {workload:<9}{variant:<14}busy {busy}: {rate:,.0f} steps/s", flush=True)
    for workload in args.workloads:
        print(f"\n{workload}: {' '.join(WORKLOADS[workload])}")
        print(f"{'variant':<15}{'quiet steps/s':>26}{'busy steps/s':>26}{'slowdown':>10}")
        for variant in args.variants:
            quiet, loaded = rates[(workload, variant, 0)], rates[(workload, variant, args.busy)]
            slowdown = statistics.median(quiet) / max(statistics.median(loaded), 1e-9)
            print(f"{variant:<15}{spread(quiet):>26}{spread(loaded):>26}{slowdown:>9.1f}x")


if __name__ == "__main__":
    main()
