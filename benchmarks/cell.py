"""What a cell of varying users costs per env step: the fixed cell against users drawn per episode with churn, and
padded to more slots, side by side in one run (NumPy env and torch env).

    python -m benchmarks.cell                 # 256 envs, 5 alternating rounds
    python -m benchmarks.cell --quick         # tiny sizes: what CI runs

Contenders (VREdge-v0 keyword arguments): today's default (8 of 8 slots), the fixed cell at 12 and 16 slots, and
the recipe's cell (``users="4-12"``, ``churn=0.05``) in 12 and in 16 slots. Each is reported as env steps/s (the
median of the rounds) and as the time per step against the fixed cell of as many slots and against the default.
No policy: the env alone, with random actions and autoreset.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import torch

import envs
from benchmarks.machine import print_machine, timed

RECIPE = {"users": "4-12", "churn": 0.05}
CELLS = {  # name -> (slots, the other keyword arguments)
    "fixed 8 (default)": (8, {}),
    "fixed 12": (12, {}),
    "fixed 16": (16, {}),
    "4-12, churn 0.05, 12 slots": (12, RECIPE),
    "4-12, churn 0.05, 16 slots": (16, RECIPE),
}


def contenders(num_envs: int, steps: int, engine: str) -> dict[str, Callable[[], int]]:
    """Cell name -> a function that steps ``num_envs`` envs of that cell ``steps`` times with the ``engine``
    (``numpy`` or ``torch``) and returns the env steps taken."""
    out = {}
    for name, (slots, kwargs) in CELLS.items():
        actions = np.random.default_rng(0).integers(0, 6, size=(steps, num_envs, slots))
        if engine == "numpy":
            env = envs.VREdgeVectorEnv(num_envs, num_users=slots, **kwargs)
        else:
            env, actions = envs.VREdgeTorchEnv(num_envs, num_users=slots, **kwargs), torch.from_numpy(actions)
        env.reset(seed=0)

        def run(env=env, actions=actions) -> int:
            for a in actions:
                env.step(a)
            return steps * num_envs

        run()  # warm-up
        out[name] = run
    return out


def rates(num_envs: int, steps: int, engine: str, repeats: int) -> dict[str, float]:
    """Median env steps/s of every cell over ``repeats`` rounds, the cells alternating within each round."""
    runs = contenders(num_envs, steps, engine)
    measured: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            measured[name].append(timed(fn))
    return {name: statistics.median(values) for name, values in measured.items()}


def report(engine: str, medians: dict[str, float]) -> None:
    """The table: steps/s, and time per step against the fixed cell of as many slots and against the default."""
    default = medians["fixed 8 (default)"]
    fixed = {slots: medians[name] for name, (slots, kwargs) in CELLS.items() if not kwargs}  # by slot count
    print(f"\n{engine}: {'cell':<28} {'env steps/s':>12} {'x fixed, same slots':>20} {'x default':>10}")
    for name, rate in medians.items():
        same_slots = fixed[CELLS[name][0]]
        print(f"{'':<{len(engine) + 2}}{name:<28} {rate:>12,.0f} {same_slots / rate:>19.2f}x {default / rate:>9.2f}x")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cell", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="steps per round")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="16 envs, 5 steps, 1 round (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_envs, args.steps, args.repeats = 16, 5, 1
    torch.set_num_threads(1)
    print_machine()
    print(f"{args.num_envs} envs, {args.steps} steps per round, median of {args.repeats} rounds; time per step "
          "as a multiple (1.50x: 50% slower)")
    for engine in ("numpy", "torch"):
        report(engine, rates(args.num_envs, args.steps, engine, args.repeats))


if __name__ == "__main__":
    main()
