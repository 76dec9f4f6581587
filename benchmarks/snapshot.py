"""Host work per iteration that could grow with the envs: the snapshot for exact resume, and GAE's loop over time.

    python -m benchmarks.snapshot                                  # VR-edge, device backend, CPU: 4,096 and 65,536 envs
    python -m benchmarks.snapshot --device cuda --num-envs 4096 65536
    python -m benchmarks.snapshot --quick                          # tiny sizes: what the tests run

Per number of envs, one ``--backend device`` PPO run as the trainer builds it: the median of a whole iteration
(``PPO.iterate``: rollout and update) next to the snapshot the loop takes after each (``PPO.snapshot``) and to the
envs' states alone, the way the device backend kept them before issue 63 (one dict per env, copied) and now (a few
``[N, ...]`` arrays), all in one run. Then GAE over the run's ``[T, N]`` shape on ``--device``: the loop over time
(what the CPU runs) next to the scan (what a CUDA learner runs). On the CPU the scan does more work than the
loop (``T log T`` against ``T``) and is slower; what it saves is the loop's kernel launches on a GPU.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.machine import print_machine

SIZES = (4096, 65536)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn`` takes, its device work finished."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def snapshot_share(num_envs: int, num_steps: int = 128, device: str = "cpu", iterations: int = 3,
                   compile: str = "off") -> dict[str, float]:
    """Median seconds of a device-backend VR-edge iteration (``"iteration"``), of the snapshot after it
    (``"snapshot"``), and of its envs' states copied as before issue 63 (``"states_before"``: one dict per env,
    :func:`collectors.env_group.env_states`) and now (``"states_now"``: batched), over ``iterations`` iterations
    after a first one (which compiles and warms up)."""
    from collectors import make_collector
    from collectors.env_group import env_states
    from trainer.common.state import cpu_copy
    from trainer.config import TrainConfig
    from trainer.ppo.algorithm import PPO
    from trainer.run_layout import Machine, run_layout

    cfg = TrainConfig(env="VREdge-v0", backend="device", num_envs=num_envs, num_steps=num_steps, device=device,
                      compile=compile, total_steps=num_envs * num_steps * (iterations + 1))
    layout = run_layout(cfg, Machine(cores=1))
    run = PPO.new(cfg, layout)
    times: dict[str, list[float]] = {"iteration": [], "snapshot": [], "states_before": [], "states_now": []}
    with make_collector(layout.env_factories(), run.acting, backend="device", num_steps=num_steps, seed=cfg.seed,
                        **layout.collector_kwargs(), **run.collector_options()) as collector:
        run.attach(collector)
        start = (0, time.perf_counter())
        run.iterate(start)
        for _ in range(iterations):
            times["iteration"].append(_seconds(lambda: run.iterate(start), run.device))
            times["snapshot"].append(_seconds(run.snapshot, run.device))
            times["states_before"].append(_seconds(lambda: cpu_copy(env_states([collector.env])), run.device))
            times["states_now"].append(_seconds(lambda: cpu_copy(collector.get_state()["env_states"]), run.device))
    return {k: statistics.median(v) for k, v in times.items()}


def gae_times(num_steps: int, num_envs: int, device: str = "cpu", repeats: int = 7) -> dict[str, float]:
    """Median seconds of GAE's backward recursion over ``[num_steps, num_envs]`` float32 on ``device``: the loop
    over time (``"loop"``) and the scan (``"scan"``), alternating, after one warm-up call of each."""
    from trainer.ppo.targets import discounted_sums_by_loop, discounted_sums_by_scan

    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(num_steps, num_envs, generator=g).to(dev)
    carry = (0.99 * 0.95 * (torch.rand(num_steps, num_envs, generator=g) > 0.01).float()).to(dev)
    ways = {"loop": discounted_sums_by_loop, "scan": discounted_sums_by_scan}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(repeats + 1):
        for name, way in ways.items():
            took = _seconds(functools.partial(way, deltas, carry), dev)
            if round_:
                times[name].append(took)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.snapshot", description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=list(SIZES), help="numbers of envs (default: "
                        "%(default)s)")
    parser.add_argument("--num-steps", type=int, default=128, help="steps per rollout, T (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="where the env, the learner and GAE run (default: cpu)")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per size (default: %(default)s)")
    parser.add_argument("--compile", default="off", help="trainer --compile (default: off)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, "
                        f"{torch.get_num_threads()} here)")
    parser.add_argument("--quick", action="store_true", help="8 and 32 envs, 8 steps, 1 iteration")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_envs, args.num_steps, args.iterations = [8, 32], 8, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print_machine()
    print(f"{'threads':>10}: {torch.get_num_threads()}")
    out = {}
    for n in args.num_envs:
        share = snapshot_share(n, args.num_steps, args.device, args.iterations, args.compile)
        gae = gae_times(args.num_steps, n, args.device)
        out[n] = {**share, **{f"gae_{k}": v for k, v in gae.items()}}
        it = share["iteration"]
        print(f"{n:,} envs x {args.num_steps} steps on {args.device}: iteration {it:.3f} s; snapshot "
              f"{share['snapshot'] * 1e3:.1f} ms ({share['snapshot'] / it:.2%} of it); its envs' states "
              f"{share['states_now'] * 1e3:.1f} ms now (batched, {share['states_now'] / it:.2%}) vs "
              f"{share['states_before'] * 1e3:.1f} ms one dict per env as before ({share['states_before'] / it:.2%}, "
              f"{share['states_before'] / share['states_now']:.0f}x)")
        print(f"{n:,} envs x {args.num_steps} steps on {args.device}: GAE loop {gae['loop'] * 1e3:.2f} ms, scan "
              f"{gae['scan'] * 1e3:.2f} ms (the scan takes {gae['scan'] / gae['loop']:.2f}x the loop's time)")
    return out


if __name__ == "__main__":
    main()
