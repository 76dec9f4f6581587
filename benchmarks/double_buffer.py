"""Double-buffered ``async`` against lockstep ``async``, ``sync`` and Gymnasium's ``AsyncVectorEnv``.

    python -m benchmarks.double_buffer                      # heavy env: VR-edge + 200 us/step, 8 envs x 64 steps
    python -m benchmarks.double_buffer --quick              # tiny sizes: checks that it runs (CI)

All contenders run side by side in one process, rounds interleaved, the same acting policy
(the trainer's ``ActorCritic``; the collector calls it with keyed noise, Gymnasium's vector
env without). Reports the median transitions/s with the spread, per-round ratios, and the
parallel efficiency ``rate / (cores x sync rate)``: 1.0 means the ``cores`` busy processes
together are as fast as ``cores`` copies of the one-process ``sync`` collector.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch

from benchmarks.machine import print_machine, summary
from benchmarks.run_rollout_benchmark import collector_contender, gymnasium_contender, make_env, measure
from collectors.resources import async_workers, usable_cores
from trainer.ppo.model import ActorCritic


def contenders(num_envs: int, num_steps: int, step_cost_us: float, cores: int) -> dict:
    """Name -> (run, close) of every contender; ``sync`` first (the efficiency's reference)."""
    env_fn = functools.partial(make_env, "VREdge-v0", step_cost_us)
    probe = env_fn()
    policy = ActorCritic(probe.observation_space, probe.action_space)
    fns = [env_fn] * num_envs
    workers, main_share = async_workers(cores, num_envs)
    # double-buffered needs a factory per process and group: at most num_envs // 2 processes
    processes = max(1, min(cores, num_envs // 2))
    out = {
        "sync": collector_contender(fns, policy, "sync", num_steps),
        "async, lockstep (default)": collector_contender(fns, policy, "async", num_steps, num_splits=1,
                                                         num_workers=workers, main_share=main_share),
        # the trainer's --num-splits 2 layout: a worker per core, the collecting process only runs the policy
        "async, double-buffered": collector_contender(fns, policy, "async", num_steps, num_splits=2,
                                                      num_workers=processes, main_share=False),
    }
    if processes > 1:  # the lockstep layout, double-buffered: this process steps a share too
        out["async, double-buffered, main share"] = collector_contender(fns, policy, "async", num_steps, num_splits=2,
                                                                        num_workers=processes - 1, main_share=True)
    out["gymnasium AsyncVectorEnv(shm)"] = gymnasium_contender(fns, policy, num_steps, "AsyncVectorEnv")
    return out


def report(rates: dict[str, list[float]], cores: int) -> None:
    sync = rates["sync"]
    gym_async = rates["gymnasium AsyncVectorEnv(shm)"]
    print(f"\n{'contender':<40}{'median transitions/s':>20} [min - max]   efficiency [min - max]   "
          f"/ AsyncVectorEnv [min - max]")
    for name, r in rates.items():
        eff = [x / (cores * s) for x, s in zip(r, sync)]
        vs = [x / g for x, g in zip(r, gym_async)]
        print(f"{name:<40}{summary(r)}   {statistics.median(eff):5.2f} [{min(eff):.2f} - {max(eff):.2f}]"
              f"         {statistics.median(vs):5.2f}x [{min(vs):.2f} - {max(vs):.2f}]")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.double_buffer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=64)
    p.add_argument("--step-cost-us", type=float, default=200.0, help="extra CPU work per VR-edge step")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="4 envs, --num-steps 8, 1 repeat (checks that it runs)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_envs, args.num_steps, args.repeats = 4, 8, 1
    torch.set_num_threads(1)
    print_machine()
    cores = usable_cores()
    print(f"VR-edge +{args.step_cost_us:g} us/step, {args.num_envs} envs x {args.num_steps} steps, {cores} usable "
          f"cores, {args.repeats} repeats (rounds interleaved); efficiency = rate / ({cores} x sync rate)")
    report(measure(contenders(args.num_envs, args.num_steps, args.step_cost_us, cores), args.repeats), cores)


if __name__ == "__main__":
    main()
