"""Training speed on a busy machine: how much slower a run gets while other processes hold the cores.

    python -m benchmarks.busy_machine --busy 2 --rounds 3 --seconds 60 -- --env VREdge-v0
    python -m benchmarks.busy_machine --busy 2 --rounds 3 --seconds 60 -- --algo apex --env CartPole-v1 --num-envs 8 \
        --num-steps 16 --gamma 0.99 --lr 1e-3 --n-step 5 --max-grad-norm 10 --learning-starts 1000

Runs ``python -m trainer.train`` with the given flags on a quiet machine and with ``--busy`` busy-loop
processes (one pure-Python spin each, like another user's job), under each OpenMP wait policy: ``active``
(idle OpenMP threads spin; GNU OpenMP's default spins 300,000 times before it sleeps, which is the same for
the short waits between a small network's ops), ``passive`` (they sleep at once) and ``spin:N`` (they spin
N times, then sleep: the trainer sets ``GOMP_SPINCOUNT=1000`` unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
is given, so ``spin:1000`` is what it runs). Rounds interleave every combination. Each run is stopped with SIGTERM
after ``--seconds`` (a slowdown of 100x must not take hours to measure); its rate is its env steps per second
after the first iteration (``benchmarks.revisions.steady_rate``). Prints each combination's
median and spread and the slowdown under load; fair share is ``(busy + threads) / cores``.
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
from benchmarks.revisions import steady_rate

POLICIES = ("active", "passive")


def policy_env(policy: str) -> dict[str, str]:
    """The OpenMP environment of ``policy``: ``active``, ``passive``, or ``spin:N`` (GNU OpenMP spins N times
    before it sleeps)."""
    if policy.startswith("spin:"):
        return {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": policy[5:]}  # the count overrides ACTIVE's
    return {"OMP_WAIT_POLICY": policy.upper()}


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def train_rate(flags: list[str], run_dir: Path, policy: str, seconds: float) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *flags, "--total-steps", str(10**9),
                             "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **policy_env(policy)})
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.busy_machine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=2, help="busy-loop processes while the loaded runs train")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=60, help="wall clock of each run")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), help="active, passive or spin:N")
    p.add_argument("flags", nargs="*", help="trainer.train flags (after --)")
    args = p.parse_args(argv)
    flags = args.flags or ["--env", "VREdge-v0"]
    print_machine()
    print(f"trainer.train {' '.join(flags)}; {args.busy} busy loops on {os.cpu_count()} cores when loaded")
    rates: dict[tuple[str, int], list[float]] = {(p_, b): [] for p_ in args.policies for b in (0, args.busy)}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for (policy, busy), out in rates.items():
                loops = busy_loops(busy)
                try:
                    out.append(train_rate(flags, Path(tmp) / f"{policy}-{busy}-{r}", policy, args.seconds))
                finally:
                    for proc in loops:
                        proc.kill()
                        proc.wait()
                print(f"round {r + 1}: {policy:<8} busy {busy}: {out[-1]:,.0f} steps/s", flush=True)
    print(f"\n{'policy':<9}{'quiet steps/s':>28}{'loaded steps/s':>28}{'slowdown':>10}")
    for policy in args.policies:
        quiet, loaded = rates[(policy, 0)], rates[(policy, args.busy)]
        spread = [f"{statistics.median(v):,.0f} [{min(v):,.0f}-{max(v):,.0f}]" for v in (quiet, loaded)]
        print(f"{policy:<9}{spread[0]:>28}{spread[1]:>28}{statistics.median(quiet) / statistics.median(loaded):>9.1f}x")
    if set(POLICIES) <= set(args.policies):
        active, passive = (statistics.median(rates[(p_, 0)]) for p_ in POLICIES)
        print(f"\nquiet machine, passive / active: {passive / active:.2f}x")


if __name__ == "__main__":
    main()
