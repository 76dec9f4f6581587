"""Data-parallel PPO on the CPU: 2 ranks x 1 thread (torchrun, gloo) against 1 process x 2 threads, side by side.

    python -m benchmarks.data_parallel --rounds 3 -- --total-steps 163840

(1) End to end: ``python -m trainer.train`` with the VR-edge defaults and the flags after ``--``, alternately in
one process with ``--threads 2`` and under ``torchrun --standalone --nproc-per-node 2`` with ``--threads 1``
(one process, 2 ranks, one process, ...); a run's rate is its env steps/s after the first iteration.

(2) The update's minibatch step on the defaults' shapes (64 envs x 128 steps; each rank 32 envs), timed in 2
spawned gloo ranks of one thread each: alone (no all-reduce: what the step costs without one), with the
trainer's one all-reduce of the flat gradient, and as ``DistributedDataParallel`` would run it (the model's own
parameters, DDP's bucketed all-reduce during backward, a foreach Adam). The all-reduce's share of an update is
``1 - alone / flat``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import print_machine, side_by_side
from benchmarks.revisions import ROOT, steady_rate

STEPS = 200  # minibatch steps per timing


def end_to_end(flags: list[str], run_dir: Path, ranks: int) -> float:
    """Env steps/s of one training run, in one process (``ranks`` 1, 2 threads) or under torchrun."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    threads = "1" if ranks > 1 else "2"
    subprocess.run([sys.executable, *launcher, "-m", "trainer.train", *flags, "--threads", threads,
                    "--run-dir", str(run_dir)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads})
    return steady_rate(run_dir / "metrics.jsonl")


def _step_times(rank: int, port: int, results) -> None:
    """A spawned rank: the minibatch step's median time alone, with the flat all-reduce, and under DDP."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from trainer.common.world import World
    from trainer.config import TrainConfig
    from trainer.ppo.algorithm import PPO
    from trainer.ppo.update import LearnerSamples, MinibatchStep, ppo_loss
    from trainer.run_layout import Machine, run_layout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    world = World(size=2, rank=rank, local_size=2)
    cfg = TrainConfig.from_dict({"env": "VREdge-v0", "device": "cpu", "compile": "off"})
    layout = run_layout(cfg, Machine(cores=2), world)
    ppo = PPO.new(cfg, layout)
    share = ppo.step.settings.minibatch_size
    obs = torch.randn(share, *ppo.model.norm.mean.shape)
    with torch.no_grad():
        acted = ppo.model.act(obs)
    mb = LearnerSamples(obs, acted["action"], acted["log_prob"], acted["value"], torch.randn(share),
                        torch.randn(share))

    class Loss(nn.Module):  # what DDP wraps: a forward that is the loss
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, samples):
            return ppo_loss(self.model, samples, ppo.step.settings).loss

    ddp_model = PPO.make_model(cfg)
    ddp_model.load_state_dict(ppo.model.state_dict())
    ddp = nn.parallel.DistributedDataParallel(Loss(ddp_model))
    ddp_adam = torch.optim.Adam(ddp.parameters(), lr=cfg.lr, foreach=True)

    def ddp_step(samples):
        ddp_adam.zero_grad(set_to_none=False)
        ddp(samples).backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5, foreach=True)
        ddp_adam.step()

    alone = MinibatchStep(ppo.model, ppo.optimizer, ppo.step.settings)
    steps = {"alone": alone, "flat": ppo.step, "ddp": ddp_step}
    times = {}
    for name, step in steps.items():
        for _ in range(10):  # warm-up
            step(mb)
        dist.barrier()
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(STEPS):
                step(mb)
            runs.append((time.perf_counter() - start) / STEPS)
            dist.barrier()
        times[name] = statistics.median(runs)
    results.put((rank, times, share))
    dist.destroy_process_group()


def step_times() -> tuple[dict[str, float], int]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = context.Queue()
    procs = [context.Process(target=_step_times, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((rank, (times, share)) for rank, times, share in (results.get(timeout=600) for _ in procs))
    for p in procs:
        p.join()
    return got[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_parallel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="trainer flags, after --")
    args = p.parse_args(argv)
    flags = ["--env", "VREdge-v0", "--device", "cpu", *[f for f in args.flags if f != "--"]]
    print_machine()
    print(f"(1) end to end, flags: {' '.join(flags)}")
    rates: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for ranks in (1, 2):
                rates[ranks].append(end_to_end(flags, Path(tmp) / f"{ranks}-{r}", ranks))
                print(f"round {r + 1}, {'2 ranks x 1 thread' if ranks == 2 else '1 process x 2 threads'}: "
                      f"{rates[ranks][-1]:,.0f} env steps/s", flush=True)
    labels = {"1 process": "1 process x 2 threads", "2 ranks": "2 ranks x 1 thread"}
    print("\n".join(side_by_side({"1 process": rates[1], "2 ranks": rates[2]}, labels, ("2 ranks", "1 process"))))
    times, share = step_times()
    print(f"(2) one minibatch step, {share} samples per rank (median of 5 x {STEPS} steps, rank 0):")
    for name, label in (("alone", "no all-reduce"), ("flat", "one all-reduce of the flat gradient (the trainer)"),
                        ("ddp", "DistributedDataParallel")):
        print(f"    {label:<52} {times[name] * 1e3:7.3f} ms")
    print(f"    the all-reduce's share of the trainer's step: {1 - times['alone'] / times['flat']:.1%}")


if __name__ == "__main__":
    main()
