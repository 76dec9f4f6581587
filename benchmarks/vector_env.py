"""Natively batched VR-edge env vs the same envs stepped one by one.

    python -m benchmarks.vector_env --num-envs 1024 --steps 50 --repeats 5

Both sides take the same actions; rounds alternate so that machine noise hits both.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import envs
from benchmarks.machine import print_machine, summary, timed


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vector_env", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--num-users", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    n, steps = args.num_envs, args.steps
    actions = np.random.default_rng(0).integers(0, 6, size=(steps, n, args.num_users))

    venv = envs.VREdgeVectorEnv(n, num_users=args.num_users)
    venv.reset(seed=list(range(n)))
    singles = [envs.SyntheticVREdgeEnv(num_users=args.num_users) for _ in range(n)]
    for i, e in enumerate(singles):
        e.reset(seed=i)

    def run_vector() -> int:
        for t in range(steps):
            venv.step(actions[t])
        return steps * n

    def run_singles() -> int:
        for t in range(steps):
            for i, e in enumerate(singles):
                _, _, term, trunc, _ = e.step(actions[t, i])
                if term or trunc:
                    e.reset()
        return steps * n

    vec, single = [], []
    for _ in range(args.repeats):
        vec.append(timed(run_vector))
        single.append(timed(run_singles))
    ratios = [v / s for v, s in zip(vec, single)]
    print_machine()
    print(f"\n{n} envs x {args.num_users} users, {steps} steps, {args.repeats} repeats (median [min - max])")
    print(f"{'single envs, one by one':<28}{summary(single)} transitions/s")
    print(f"{'VREdgeVectorEnv':<28}{summary(vec)} transitions/s")
    print(f"{'ratio':<28}{statistics.median(ratios):>12.1f}x [{min(ratios):.1f} - {max(ratios):.1f}]")


if __name__ == "__main__":
    main()
