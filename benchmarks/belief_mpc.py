"""Distillation's labels per second: the NumPy BeliefMPC against the torch one (on tensors, and fused on a CPU),
side by side in one run.

    python -m benchmarks.belief_mpc [--cells default,cells] [--batch 64] [--steps 4] [--repeats 3] [--device cpu]
                                    [--threads N]

Each round plays the same ``--steps`` steps of ``--batch`` envs (fair_share's levels, from reset: the filter sees each
episode from its first step) and times each expert labelling every state, NumPy's
(:class:`envs.belief_mpc.BeliefMPC`), then torch's (:class:`envs.belief_mpc_torch.TorchBeliefMPC` on ``--device``)
with its rollout on tensors (what a GPU runs) and, on a CPU, fused (:mod:`envs.belief_mpc_kernel`: what a CPU
runs), their defaults (the expert distillation declares), filter and futures included; rounds alternate so that a
machine's load hits all alike. Prints the machine, each cell's labels per second (median [min - max] of ``--repeats``
rounds), the ratio of the medians, and whether both chose the same levels. Cells: ``default`` (VR-edge's defaults)
and ``cells`` (``docs/cells.toml``: 12 slots, 2-12 users, churn 0-0.05). ``--batch 64``: the episodes distillation
labels side by side. ``--threads``: torch's intra-op threads (default: torch's own; on a 2-core machine shared with
other work, 1 avoids threads that wait on each other).

A device check times one device with :func:`labels_per_second`.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

import envs
from benchmarks.machine import print_machine
from envs.belief_mpc import BeliefMPC
from envs.belief_mpc_torch import TorchBeliefMPC
from trainer.arguments import OneLineParser

CELLS: dict[str, dict[str, Any]] = {"default": {},
                                    "cells": {"num_users": 12, "users": "2-12", "churn": "0-0.05"}}


def observations(env_kwargs: dict[str, Any], batch: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """``steps`` observations ``[batch, obs_dim]`` of envs of ``env_kwargs`` playing fair_share from reset."""
    venv = envs.VREdgeVectorEnv(batch, seed=seed, **env_kwargs)
    obs, _ = venv.reset()
    base = envs.make_baseline("fair_share", venv.config)
    seen = []
    for _ in range(steps):
        seen.append(obs)
        obs, *_ = venv.step(base(obs))
    return seen


def labelled(expert: Any, seen: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """``(labels per second, the levels)`` of ``expert`` labelling every state of ``seen``, in order."""
    start = time.perf_counter()
    levels = [expert(obs) for obs in seen]
    if isinstance(expert, TorchBeliefMPC) and expert.device.type == "cuda":
        torch.cuda.synchronize(expert.device)
    return sum(len(obs) for obs in seen) / (time.perf_counter() - start), np.stack(levels)


def labels_per_second(device: str | torch.device = "cpu", env_kwargs: dict[str, Any] | None = None, batch: int = 64,
                      steps: int = 4, repeats: int = 3) -> float:
    """The median labels per second of distillation's expert (the torch BeliefMPC, its defaults) on ``device``, on
    ``steps`` steps of ``batch`` envs of ``env_kwargs`` (VR-edge's defaults) from reset, ``repeats`` times (a first,
    untimed, warms the device up).

    >>> labels_per_second("cpu", {"num_users": 2, "max_steps": 10}, batch=2, steps=2, repeats=1) > 0
    True
    """
    cfg = envs.VREdgeConfig(**(env_kwargs or {}))
    seen = observations(env_kwargs or {}, batch, steps)
    labelled(TorchBeliefMPC(cfg, device=device), seen[:1])
    return statistics.median(labelled(TorchBeliefMPC(cfg, device=device), seen)[0] for _ in range(repeats))


def side_by_side(env_kwargs: dict[str, Any], batch: int, steps: int, repeats: int, device: str) -> list[str]:
    """Lines: the labels per second of NumPy's expert, of torch's on tensors and (on a CPU) fused, on one cell, their
    ratios to NumPy's, and whether their levels agree."""
    cfg = envs.VREdgeConfig(**env_kwargs)
    seen = observations(env_kwargs, batch, steps)
    experts = {"numpy": lambda: BeliefMPC(cfg), "tensors": lambda: TorchBeliefMPC(cfg, device=device, fused=False)}
    if torch.device(device).type == "cpu":
        experts["fused"] = lambda: TorchBeliefMPC(cfg, device=device, fused=True)
    for name in list(experts)[1:]:
        labelled(experts[name](), seen[:1])  # (a device's first call starts it up; the kernel's compiles it)
    rates: dict[str, list[float]] = {name: [] for name in experts}
    same = True
    for _ in range(repeats):
        levels = {}
        for name, expert in experts.items():
            rate, levels[name] = labelled(expert(), seen)
            rates[name].append(rate)
        same = same and all(np.array_equal(v, levels["numpy"]) for v in levels.values())
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = "; ".join(f"{k} / numpy {med[k] / med['numpy']:.1f}x" for k in list(experts)[1:])
    return [*(f"  {k:<7} labels/s: median {med[k]:,.0f} [{min(v):,.0f} - {max(v):,.0f}]" for k, v in rates.items()),
            f"  {ratios}; the same levels: {'yes' if same else 'NO'}"]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m benchmarks.belief_mpc", description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="default,cells", help=f"cells to time, of {', '.join(CELLS)}")
    p.add_argument("--batch", type=int, default=64, help="envs labelled side by side (distillation's: 64)")
    p.add_argument("--steps", type=int, default=4, help="steps of those envs each round labels")
    p.add_argument("--repeats", type=int, default=3, help="rounds, each timing both experts")
    p.add_argument("--device", default="cpu", help="the torch expert's device")
    p.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: torch's own)")
    args = p.parse_args(argv)
    cells = args.cells.split(",")
    if unknown := [c for c in cells if c not in CELLS]:
        p.error(f"--cells {','.join(unknown)}: not a cell here; choose from {', '.join(CELLS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print_machine()
    print(f"torch threads: {torch.get_num_threads()}; device {args.device}; {args.batch} envs x {args.steps} steps, "
          f"{args.repeats} rounds")
    for cell in cells:
        print(f"{cell} ({CELLS[cell] or 'VR-edge defaults'}):")
        for line in side_by_side(CELLS[cell], args.batch, args.steps, args.repeats, args.device):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
