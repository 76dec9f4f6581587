"""Raw VR-edge env steps/s: the NumPy env vs the torch env (eager, and compiled with ``--compile``), side by side.

    python -m benchmarks.env_steps                          # CPU, N = 64 ... 65,536
    python -m benchmarks.env_steps --device cuda --compile  # on a GPU (NumPy stays on the CPU); + CUDA graphs
    python -m benchmarks.env_steps --quick                  # tiny sizes: what CI runs

Both envs take the same random actions and autoreset as they go; rounds alternate so that
machine noise hits every contender. No policy: this is the env alone.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import torch

import envs
from benchmarks.machine import print_machine, summary, timed

SIZES = (64, 256, 1024, 4096, 16384, 65536)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def contenders(num_envs: int, steps: int, device: str, compile: bool, num_users: int = 8
               ) -> dict[str, Callable[[], int]]:
    """Name -> a function that runs ``steps`` steps of ``num_envs`` envs and returns the transitions taken."""
    g = np.random.default_rng(0)
    actions = g.integers(0, 6, size=(steps, num_envs, num_users))
    numpy_env = envs.VREdgeVectorEnv(num_envs, num_users=num_users)
    numpy_env.reset(seed=0)

    def run_numpy() -> int:
        for a in actions:
            numpy_env.step(a)
        return steps * num_envs

    out = {"numpy": run_numpy}
    dev = torch.device(device)
    torch_actions = torch.from_numpy(actions).to(dev)
    variants = [("torch eager", False)]
    if compile:  # on CUDA also captured as CUDA graphs (inductor's "reduce-overhead"): measured, not assumed
        variants += [("torch compiled", True), *((("torch graphed", "reduce-overhead"),) if dev.type == "cuda" else ())]
    for name, compiled in variants:
        env = envs.VREdgeTorchEnv(num_envs, num_users=num_users, device=dev, compile=compiled)
        env.reset(seed=0)

        def run_torch(env=env) -> int:
            for a in torch_actions:
                env.step(a)
            _sync(dev)
            return steps * num_envs

        run_torch()  # warm-up: compilation, kernels, the allocator
        out[name] = run_torch
    return out


def rates(num_envs: int, steps: int, device: str, compile: bool, repeats: int) -> dict[str, list[float]]:
    """Steps/s of every contender over ``repeats`` alternating rounds."""
    runs = contenders(num_envs, steps, device, compile)
    measured: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            measured[name].append(timed(fn))
    return measured


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.env_steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated numbers of envs")
    p.add_argument("--steps", type=int, default=20, help="steps per round")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="where the torch env steps (cpu or cuda)")
    p.add_argument("--compile", action="store_true", help="also time the torch env under torch.compile")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI): checks that every part runs")
    args = p.parse_args(argv)
    sizes = (8, 64) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    steps, repeats = (3, 1) if args.quick else (args.steps, args.repeats)
    print_machine()
    print(f"\nraw VR-edge steps/s, 8 users, {steps} steps x {repeats} rounds (median [min - max]); torch on "
          f"{args.device}")
    for n in sizes:
        measured = rates(n, steps, args.device, args.compile, repeats)
        base = statistics.median(measured["numpy"])
        for name, r in measured.items():
            print(f"{n:>7}  {name:<16}{summary(r)}  {statistics.median(r) / base:6.2f}x numpy")


if __name__ == "__main__":
    main()
