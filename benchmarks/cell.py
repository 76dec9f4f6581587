"""What a cell of varying users costs per env step: the fixed cell against users drawn per episode with churn, and
padded to more slots, side by side in one run (NumPy env and torch env).

    python -m benchmarks.cell                 # 256 envs, 5 alternating rounds
    python -m benchmarks.cell --quick         # tiny sizes: what CI runs
    python -m benchmarks.cell --train         # whole trainings: the recipe against today's defaults

Contenders (VREdge-v0 keyword arguments): today's default (8 of 8 slots), the fixed cell at 12 and 16 slots, and
the recipe's cell (``users="2-12"``, ``churn="0-0.05"``: drawn per episode) in 12 and in 16 slots. Each is
reported as env steps/s (the median of the rounds) and as the time per step against the fixed cell of as many
slots and against the default.
No policy: the env alone, with random actions and autoreset.

``--train``: ``python -m trainer.train`` as a user runs it (VR-edge's defaults, ``--compile off``, a fresh
interpreter each, the contenders alternating within each round): today's defaults (8 slots), today's defaults at
12 slots (a ``per_head`` policy), the cell recipe (``docs/cells.toml``: 12 slots, 2-12 users, churn, a ``set``
policy with one encoder for its actor and critic) and the recipe with an encoder of its own for each
(``shared_trunk = false``: the recipe before 2026-12-06, and what older set runs rebuild with); the steady
env steps/s of each (after the first iteration) and the time per env step against the 12-slot defaults. With
``--base REV``, the 12-slot defaults and the recipe of the revision ``REV`` train in the same rounds (each against
its own 12-slot defaults): what a change did, measured side by side.

    python -m benchmarks.cell --train --base main      # the recipe's cost per env step, before and after
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import envs
from benchmarks.machine import print_machine, timed
from benchmarks.revisions import ROOT, train_rate, worktree

RECIPE = {"users": "2-12", "churn": "0-0.05"}
CELLS = {  # name -> (slots, the other keyword arguments)
    "fixed 8 (default)": (8, {}),
    "fixed 12": (12, {}),
    "fixed 16": (16, {}),
    "2-12, churn 0-0.05, 12 slots": (12, RECIPE),
    "2-12, churn 0-0.05, 16 slots": (16, RECIPE),
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


TRAININGS = {  # name -> trainer flags; {recipe}: the checkout's docs/cells.toml, {separate}: it with two encoders
    "defaults, 8 slots": [],
    "defaults, 12 slots": ["--env-kwargs", "num_users=12"],
    "the cell recipe, 12 slots": ["--config", "{recipe}"],
    "the recipe, two encoders": ["--config", "{separate}"],
}
BASE = ("defaults, 12 slots", "the cell recipe, 12 slots")  # what --base also trains, from that revision
BASE_SUFFIX = " (base)"


def recipe_files(source: Path, folder: Path) -> dict[str, str]:
    """``{recipe}`` and ``{separate}`` of :data:`TRAININGS` for the checkout at ``source``: its recipe, and a copy of
    it in ``folder`` whose set policy has an encoder for the actor and one for the critic (``shared_trunk = false``;
    a revision whose recipe does not name it has them already)."""
    recipe = source / "docs" / "cells.toml"
    separate = folder / f"{source.name}-cells-separate.toml"
    kept = [line for line in recipe.read_text().splitlines() if not line.replace(" ", "").startswith("shared_trunk=")]
    separate.write_text("shared_trunk = false\n" + "\n".join(kept) + "\n")  # (a top-level key: before any table)
    return {"recipe": str(recipe), "separate": str(separate)}


def train_rates(iterations: int, rounds: int, num_envs: int, num_steps: int,
                base: str | None = None) -> dict[str, list[float]]:
    """Steady env steps/s of each training in :data:`TRAININGS`, one per round, alternating within each round;
    with ``base`` (a git revision), the trainings of :data:`BASE` from that revision too."""
    shared = ["--compile", "off", "--num-envs", str(num_envs), "--num-steps", str(num_steps),
              "--total-steps", str(iterations * num_envs * num_steps)]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sources = {name: ROOT for name in TRAININGS}
        if base is not None:
            base_root = stack.enter_context(worktree(base, Path(tmp) / "base"))
            sources |= {name + BASE_SUFFIX: base_root for name in BASE}
        files = {root: recipe_files(root, Path(tmp)) for root in set(sources.values())}
        measured: dict[str, list[float]] = {name: [] for name in sources}
        for r in range(rounds):
            for i, (name, root) in enumerate(sources.items()):
                flags = [f.format(**files[root]) for f in TRAININGS[name.removesuffix(BASE_SUFFIX)]]
                measured[name].append(train_rate(root, [*flags, *shared], Path(tmp) / f"{i}-{r}"))
                print(f"round {r + 1} {name}: {measured[name][-1]:,.0f} env steps/s", flush=True)
    return measured


def report_training(measured: dict[str, list[float]]) -> None:
    """The table: median steady env steps/s [min - max], and the time per env step against the 12-slot defaults of
    the same code (a base revision's against its own)."""
    print(f"\n{'training':<37} {'env steps/s, median [min - max]':>34} {'x defaults, 12 slots':>21}")
    for name, values in measured.items():
        suffix = BASE_SUFFIX if name.endswith(BASE_SUFFIX) else ""
        rate, base = statistics.median(values), statistics.median(measured["defaults, 12 slots" + suffix])
        spread = f"{rate:,.0f} [{min(values):,.0f} - {max(values):,.0f}]"
        print(f"{name:<37} {spread:>34} {base / rate:>20.2f}x")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cell", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="steps per round")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="16 envs, 5 steps, 1 round (a smoke run); with --train: "
                   "8 envs x 16 steps, 3 iterations, 1 round")
    p.add_argument("--train", action="store_true", help="whole trainings instead of the env alone")
    p.add_argument("--iterations", type=int, default=12, help="with --train: iterations per training")
    p.add_argument("--base", help="with --train: a git revision whose 12-slot defaults and recipe train too, side by "
                   "side (checked out in a temporary worktree), e.g. --base main")
    args = p.parse_args(argv)
    if args.train:
        print_machine()
        rounds, iterations, envs_steps = (1, 3, (8, 16)) if args.quick else (args.repeats, args.iterations, (64, 128))
        print(f"training: {envs_steps[0]} envs x {envs_steps[1]} steps, {iterations} iterations, {rounds} rounds, "
              "--compile off; time per env step as a multiple (1.50x: 50% slower)")
        report_training(train_rates(iterations, rounds, *envs_steps, base=args.base))
        return
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
