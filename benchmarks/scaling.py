"""How ``async`` collection scales with worker processes, up to this machine's cores.

    python -m benchmarks.scaling                 # 1, 2, 4, ... workers up to the usable cores
    python -m benchmarks.scaling --quick         # tiny sizes: checks that it runs (CI)

Weak scaling: every worker process steps the same share (one ``VREdgeVectorEnv`` of
``--envs-per-worker`` envs for VR-edge; that many single envs with ``--step-cost-us`` of
extra work per step for the heavy env), the collecting process only runs the policy. The
one-process rate is the ``sync`` backend stepping one share; parallel efficiency is
``transitions/s / (workers x one-process rate)`` (1.0 = perfect scaling).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.machine import print_machine
from benchmarks.run_rollout_benchmark import collector_contender, make_env, make_vector, measure
from collectors.resources import usable_cores
from trainer.ppo.model import ActorCritic


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return sorted(set(counts + [cores]))


def workloads(envs_per_worker: int, step_cost_us: float) -> dict[str, tuple[Callable[[], Any], int]]:
    """Name -> (factory of one worker's share, factories per worker)."""
    return {
        f"VR-edge, VREdgeVectorEnv({envs_per_worker}) per worker":
            (functools.partial(make_vector, envs_per_worker, 0.0), 1),
        f"heavy env, {envs_per_worker} x VR-edge +{step_cost_us:g} us/step per worker":
            (functools.partial(make_env, "VREdge-v0", step_cost_us), envs_per_worker),
    }


def scale(factory: Callable[[], Any], per_worker: int, counts: list[int], num_steps: int,
          repeats: int) -> dict[int, float]:
    """Median transitions/s of ``sync`` on one share (key 0) and of ``async`` with each worker count."""
    probe = make_env("VREdge-v0", 0.0)
    policy = ActorCritic(probe.observation_space, probe.action_space)
    contenders = {0: collector_contender([factory] * per_worker, policy, "sync", num_steps)}
    for w in counts:
        contenders[w] = collector_contender([factory] * (per_worker * w), policy, "async", num_steps, num_workers=w,
                                            main_share=False)
    return {w: statistics.median(r) for w, r in measure(contenders, repeats).items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-workers", type=int, default=0, help="largest worker count (0: the usable cores)")
    p.add_argument("--envs-per-worker", type=int, default=16)
    p.add_argument("--step-cost-us", type=float, default=200.0, help="heavy env: extra CPU work per step")
    p.add_argument("--num-steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 and 2 workers, tiny sizes (checks that it runs)")
    args = p.parse_args(argv)
    if args.quick:
        args.max_workers, args.envs_per_worker, args.num_steps, args.repeats = 2, 2, 8, 1
    torch.set_num_threads(1)  # the collecting process runs a small policy; workers use one thread each
    print_machine()
    cores = usable_cores()
    counts = worker_counts(args.max_workers or cores)
    print(f"usable cores: {cores}; workers: {counts}; num_steps {args.num_steps}; {args.repeats} repeats (interleaved)")
    for name, (factory, per_worker) in workloads(args.envs_per_worker, args.step_cost_us).items():
        rates = scale(factory, per_worker, counts, args.num_steps, args.repeats)
        one = rates.pop(0)
        print(f"\n{name}: one process (sync) {one:,.0f} transitions/s")
        print(f"{'workers':>8} {'transitions/s':>14} {'speed-up':>9} {'efficiency':>11}")
        for w, r in rates.items():
            print(f"{w:>8} {r:>14,.0f} {r / one:>8.2f}x {r / (w * one):>11.2f}")


if __name__ == "__main__":
    main()
