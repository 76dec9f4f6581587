"""GPU check: host-to-device copies per ``collect()`` (must be 1) and rollout throughput on CUDA.

    python -m benchmarks.gpu_check

Exits 0 with a message where CUDA is not available.
"""

from __future__ import annotations

import functools
import time

import torch
from torch.profiler import ProfilerActivity, profile

import envs
from benchmarks.machine import print_machine
from collectors import RolloutCollector
from trainer.model import ActorCritic


def _collector(num_envs: int, horizon: int) -> RolloutCollector:
    fn = functools.partial(envs.VREdgeVectorEnv, num_envs)
    probe = envs.SyntheticVREdgeEnv()
    policy = ActorCritic(probe.observation_space, probe.action_space)
    return RolloutCollector([fn], policy, backend="sync", horizon=horizon, seed=0, device="cuda")


def count_h2d_copies(num_envs: int = 64, horizon: int = 128) -> int:
    """Number of host-to-device memcpy kernels during one ``collect()``."""
    with _collector(num_envs, horizon) as c:
        c.collect()  # warm-up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            c.collect()
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "HtoD" in e.name or "Memcpy HtoD" in e.name)


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here; nothing to check.")
        return
    print_machine()
    copies = count_h2d_copies()
    print(f"host-to-device copies per collect(): {copies} ({'OK' if copies == 1 else 'EXPECTED 1'})")
    for n in (64, 1024):
        with _collector(n, 128) as c:
            c.collect()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(5):
                batch = c.collect()
            torch.cuda.synchronize()
            rate = 5 * 128 * n / (time.perf_counter() - start)
        print(f"VREdgeVectorEnv({n}) -> cuda: {rate:,.0f} transitions/s; batch on {batch.device}")
    if copies != 1:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
