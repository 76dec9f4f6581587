"""Rollout throughput of the collector backends, side by side with Gymnasium's vector envs.

    python -m benchmarks.run_rollout_benchmark --env CartPole-v1 --num-envs 8 --compare
    python -m benchmarks.run_rollout_benchmark --env VREdge-v0 --num-envs 8 --step-cost-us 200 --compare
    python -m benchmarks.run_rollout_benchmark --native-batch 1024

Every contender runs the same policy for ``--num-steps`` steps into the same kind of
preallocated storage; rounds interleave the contenders so machine noise hits all
of them alike. Reports the median transitions/s, the spread, and ratios to the first.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import gymnasium as gym
import numpy as np
import torch

import envs
from benchmarks.machine import print_machine, summary, timed
from collectors import RolloutCollector
from trainer.ppo.model import ActorCritic


def make_env(env_id: str, step_cost_us: float) -> gym.Env:
    if env_id == "VREdge-v0":
        return envs.SyntheticVREdgeEnv(step_cost_us=step_cost_us)
    return gym.make(env_id)


def make_vector(num_envs: int, step_cost_us: float) -> gym.vector.VectorEnv:
    return envs.VREdgeVectorEnv(num_envs, step_cost_us=step_cost_us)


def collector_contender(env_fns, policy, backend: str, num_steps: int, **kw):
    collector = RolloutCollector(env_fns, policy, backend=backend, num_steps=num_steps, seed=0, **kw)
    collector.collect()  # warm-up: allocation, first resets

    def run() -> int:
        collector.collect()
        return num_steps * collector.num_envs
    return run, collector.close


def gymnasium_contender(env_fns, policy, num_steps: int, kind: str):
    """Gymnasium's vector env driving the same policy into preallocated storage."""
    same_step = gym.vector.AutoresetMode.SAME_STEP
    if kind == "SyncVectorEnv":
        venv = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=same_step)
    else:
        venv = gym.vector.AsyncVectorEnv(env_fns, shared_memory=True, autoreset_mode=same_step)
    obs, _ = venv.reset(seed=0)
    n = venv.num_envs
    store_obs = np.zeros((num_steps + 1, *obs.shape), dtype=obs.dtype)
    store_rew = np.zeros((num_steps, n), dtype=np.float32)
    store_done = np.zeros((num_steps, 2, n), dtype=bool)

    def run() -> int:
        nonlocal obs
        store_obs[0] = obs
        for t in range(num_steps):
            action = policy(torch.from_numpy(store_obs[t]))["action"].numpy()
            obs, rew, term, trunc, _ = venv.step(action)
            store_obs[t + 1], store_rew[t], store_done[t, 0], store_done[t, 1] = obs, rew, term, trunc
        return num_steps * n
    run()
    return run, venv.close


def measure(contenders: dict, repeats: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, (run, _) in contenders.items():
            rates[name].append(timed(run))
    for _, close in contenders.values():
        close()
    return rates


def report(rates: dict[str, list[float]], title: str) -> None:
    base_name = next(iter(rates))
    print(f"\n{title}")
    print(f"{'contender':<34}{'median transitions/s':>14}  [min - max]      ratio to {base_name} [min - max]")
    for name, r in rates.items():
        print(f"{name:<34}{summary(r)}   {_ratio(r, rates[base_name])}")
    pairs = [(a, b) for a, b in (("sync", "gymnasium SyncVectorEnv"), ("async", "sync"),
                                 ("async", "gymnasium AsyncVectorEnv(shm)")) if a in rates and b in rates]
    for a, b in pairs:  # the targets, each as the median of per-round ratios
        print(f"{a} / {b}: {_ratio(rates[a], rates[b])}")


def _ratio(a: list[float], b: list[float]) -> str:
    """Median and range of the per-round ratios ``a / b`` (rounds interleave, so noise hits both alike)."""
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):6.2f}x [{min(r):.2f} - {max(r):.2f}]"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_rollout_benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", nargs="+", default=["serial", "sync", "async"], choices=["serial", "sync", "async"])
    p.add_argument("--env", default="CartPole-v1", help="CartPole-v1, VREdge-v0 or any registered env id")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--step-cost-us", type=float, default=0.0, help="extra CPU work per VR-edge step")
    p.add_argument("--num-workers", type=int, default=None, help="async workers (default: backend's choice)")
    p.add_argument("--no-main-share", action="store_true", help="async: the collecting process steps no envs")
    p.add_argument("--compare", action="store_true", help="also run gymnasium Sync/AsyncVectorEnv")
    p.add_argument("--native-batch", type=int, default=0, metavar="N",
                   help="compare N VR-edge envs as one VREdgeVectorEnv vs N single envs, both under sync")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    print_machine()

    if args.native_batch:
        n = args.native_batch
        single = functools.partial(make_env, "VREdge-v0", args.step_cost_us)
        probe = single()
        policy = ActorCritic(probe.observation_space, probe.action_space)
        contenders = {
            f"sync, {n} single envs": collector_contender([single] * n, policy, "sync", args.num_steps),
            f"sync, one VREdgeVectorEnv({n})": collector_contender(
                [functools.partial(make_vector, n, args.step_cost_us)], policy, "sync", args.num_steps),
        }
        report(measure(contenders, args.repeats), f"VR-edge, {n} envs, num_steps {args.num_steps}")
        return

    env_fn = functools.partial(make_env, args.env, args.step_cost_us)
    probe = env_fn()
    policy = ActorCritic(probe.observation_space, probe.action_space)
    fns = [env_fn] * args.num_envs
    contenders = {}
    if args.compare:
        contenders["gymnasium SyncVectorEnv"] = gymnasium_contender(fns, policy, args.num_steps, "SyncVectorEnv")
    for backend in args.backend:
        kw = dict(num_workers=args.num_workers, main_share=not args.no_main_share) if backend == "async" else {}
        contenders[backend] = collector_contender(fns, policy, backend, args.num_steps, **kw)
    if args.compare:
        contenders["gymnasium AsyncVectorEnv(shm)"] = gymnasium_contender(fns, policy, args.num_steps,
                                                                         "AsyncVectorEnv")
    title = (f"{args.env}, {args.num_envs} envs, num_steps {args.num_steps}, step_cost_us={args.step_cost_us}, "
             f"{args.repeats} repeats (rounds interleaved)")
    report(measure(contenders, args.repeats), title)


if __name__ == "__main__":
    main()
