"""Grid-search the parameters of the VR-edge baselines on training seeds (never the held-out ones).

    python -m benchmarks.tune_baselines [--episodes 16] [--seed 1] [--baselines robust_mpc,bola]

Episodes are reset with the seeds training's envs get (``collectors.seeding.env_seeds``), so
the held-out evaluation and validation episodes play no part in choosing the defaults.
Prints each grid point's mean reward per step, best first.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import gymnasium as gym

import envs
from collectors.seeding import env_seeds
from trainer.evaluation import run_episodes, summarize

GRIDS = {
    "robust_mpc": {"share": [0.7, 0.85, 1.0, 1.15, 1.3]},
    "bola": {"low_s": [0.5, 1.0, 1.5], "high_s": [2.5, 3.0, 3.5, 4.0]},
    "fair_share": {"safety": [1.0, 1.15, 1.3, 1.5], "low_buffer_s": [0.5, 1.0]},
}


def tune(name: str, episodes: int, seed: int) -> list[tuple[float, dict[str, float]]]:
    """``(reward per step, params)`` for every point of ``GRIDS[name]``, best first."""
    config = envs.VREdgeConfig()
    env_fn = functools.partial(gym.make, "VREdge-v0")
    seeds = env_seeds(seed, episodes)
    grid = GRIDS[name]
    scores = []
    for values in itertools.product(*grid.values()):
        params = dict(zip(grid, values))
        if name == "bola" and params["low_s"] >= params["high_s"]:
            continue
        records = run_episodes(envs.make_baseline(name, config, **params), env_fn, episodes, 0, seeds=seeds)
        scores.append((summarize(records)["reward_per_step"], params))
    return sorted(scores, key=lambda s: -s[0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune_baselines", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=1, help="training seed whose env seeds are played")
    p.add_argument("--baselines", default="robust_mpc,bola", help=f"comma-separated, from {', '.join(GRIDS)}")
    args = p.parse_args(argv)
    for name in args.baselines.split(","):
        if name not in GRIDS:
            raise SystemExit(f"error: no grid for {name!r}; choose from {', '.join(GRIDS)}")
        for score, params in tune(name, args.episodes, args.seed):
            print(f"{name:<12}{score:.4f}  {params}")


if __name__ == "__main__":
    main()
