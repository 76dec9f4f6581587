"""Starting and closing ``async`` workers: forked from a forkserver (the default) against spawned.

    python -m benchmarks.worker_start                    # 1, 2 and 4 workers, 5 rounds
    python -m benchmarks.worker_start --quick            # 1 worker, 1 round: checks that it runs (CI)

Each round runs every start method in a fresh process (the order alternates between rounds), as a program
does: it imports the collectors, then starts and closes ``--collectors`` collectors' workers one after the
other (VR-edge envs, two per process). The first collector of a forkserver program also starts the
forkserver, which imports torch; later ones only fork. Reported per method and worker count: the median
seconds to start the first and the later collectors' workers and to close them, with the spread, and the
memory the workers and their forkserver hold (USS: pages no other process shares; PSS: shared pages divided
among their sharers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.machine import print_machine

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("forkserver", "spawn")

_PROGRAM = textwrap.dedent("""
    import json, sys, time
    import psutil
    from collectors.backends.async_ import AsyncStepper
    from envs import SyntheticVREdgeEnv
    if __name__ == "__main__":
        method, workers, collectors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        starts, closes, memory = [], [], None
        for _ in range(collectors):
            began = time.perf_counter()
            stepper = AsyncStepper([SyntheticVREdgeEnv] * (2 * (workers + 1)), num_workers=workers, start_method=method)
            starts.append(time.perf_counter() - began)
            if memory is None:  # the workers, and the forkserver they were forked from
                procs = [psutil.Process(p.pid) for p in stepper.procs]
                procs += [psutil.Process(pid) for pid in {p.ppid() for p in procs} - {psutil.Process().pid}]
                info = [p.memory_full_info() for p in procs]
                memory = {"uss": sum(i.uss for i in info), "pss": sum(i.pss for i in info)}
            began = time.perf_counter()
            stepper.close()
            closes.append(time.perf_counter() - began)
        print(json.dumps({"starts": starts, "closes": closes, **memory}))
""")


def one_program(method: str, workers: int, collectors: int) -> dict:
    """Start and close ``collectors`` collectors' ``workers`` workers in a fresh process; its timings."""
    out = subprocess.run([sys.executable, "-c", _PROGRAM, method, str(workers), str(collectors)], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{method} with {workers} workers failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(values: list[float]) -> str:
    if not values:  # one collector per program: no later starts
        return "     -"
    return f"{statistics.median(values):6.2f} [{min(values):.2f} - {max(values):.2f}]"


def report(results: dict[tuple[str, int], list[dict]]) -> None:
    print(f"\n{'method':<12}{'workers':>8}   {'first start s':<22}{'later start s':<22}{'close s':<22}"
          f"{'USS MiB':>8}{'PSS MiB':>9}")
    for (method, workers), runs in results.items():
        first = [r["starts"][0] for r in runs]
        later = [s for r in runs for s in r["starts"][1:]]
        closes = [c for r in runs for c in r["closes"]]
        uss = statistics.median(r["uss"] for r in runs) / 2**20
        pss = statistics.median(r["pss"] for r in runs) / 2**20
        print(f"{method:<12}{workers:>8}   {_spread(first):<22}{_spread(later):<22}{_spread(closes):<22}"
              f"{uss:8.0f}{pss:9.0f}")
    for workers in sorted({w for _, w in results}):
        fork, spawn = results[("forkserver", workers)], results[("spawn", workers)]
        ratio = [s["starts"][0] / f["starts"][0] for f, s in zip(fork, spawn)]
        later = [statistics.median(s["starts"][1:]) / statistics.median(f["starts"][1:])
                 for f, s in zip(fork, spawn) if len(f["starts"]) > 1]
        line = f"{workers} workers: spawn / forkserver, first start {_spread(ratio)}x"
        print(line + (f", later starts {_spread(later)}x" if later else ""))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="worker counts (default: 1 2 4)")
    p.add_argument("--rounds", type=int, default=5, help="fresh programs per method and count (default: 5)")
    p.add_argument("--collectors", type=int, default=3, help="collectors started one after the other in each "
                                                             "program (default: 3)")
    p.add_argument("--quick", action="store_true", help="1 worker, 1 round, 2 collectors (overrides the three above)")
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.rounds, args.collectors = [1], 1, 2
    if min(args.workers) < 1 or args.rounds < 1 or args.collectors < 1:
        p.error("--workers, --rounds and --collectors must be at least 1")
    print_machine()
    print(f"{args.rounds} rounds x {args.collectors} collectors; VR-edge envs, two per process")
    results: dict[tuple[str, int], list[dict]] = {(m, w): [] for w in args.workers for m in METHODS}
    for r in range(args.rounds):
        for w in args.workers:
            for method in (METHODS if r % 2 == 0 else METHODS[::-1]):
                results[(method, w)].append(one_program(method, w, args.collectors))
    report(results)


if __name__ == "__main__":
    main()
