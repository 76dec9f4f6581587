"""How close to optimal is the clairvoyant reference? Its score against lookahead and search width.

    python -m benchmarks.clairvoyant [--episodes 16] [--lookahead 1 3 5 8] [--sweeps 1 2 4]

Plays ``envs.planner.ClairvoyantPlanner`` with every (lookahead, sweeps) pair on the same
held-out episodes as ``trainer.evaluate`` and prints mean reward per step, each paired
against the default planner (lookahead 5, 2 sweeps), and the seconds it took. Where more
lookahead and more sweeps stop paying, the search is close to what this planner family can
reach.
"""

from __future__ import annotations

import argparse
import functools
import time

import gymnasium as gym

import envs
from envs.planner import ClairvoyantPlanner
from trainer.evaluation import paired_difference, reference_episodes, summarize


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.clairvoyant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (as trainer.evaluate)")
    p.add_argument("--lookahead", type=int, nargs="+", default=[1, 3, 5, 8])
    p.add_argument("--sweeps", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args(argv)
    config, env_fn = envs.VREdgeConfig(), functools.partial(gym.make, "VREdge-v0")

    def play(lookahead: int, sweeps: int) -> tuple[list[dict[str, float]], float]:
        start = time.perf_counter()
        records = reference_episodes(ClairvoyantPlanner(config, lookahead, sweeps), env_fn, args.episodes, args.seed,
                                     num_envs=64)
        return records, time.perf_counter() - start

    default, _ = play(5, 2)
    print(f"{'lookahead':>9} {'sweeps':>6} {'reward/step':>12} {'vs (5, 2), paired':>20} {'seconds':>8}")
    for lookahead in args.lookahead:
        for sweeps in args.sweeps:
            records, seconds = play(lookahead, sweeps)
            d = paired_difference(records, default)
            print(f"{lookahead:>9} {sweeps:>6} {summarize(records)['reward_per_step']:>12.4f} "
                  f"{d['mean']:>+12.4f} ± {d['ci95']:.4f} {seconds:>8.1f}")


if __name__ == "__main__":
    main()
