"""Where one training iteration's time goes: collecting vs learning, with 1 and 2 learner threads.

    python -m benchmarks.iteration_breakdown                 # VR-edge defaults
    python -m benchmarks.iteration_breakdown --env CartPole-v1 --num-envs 8 --batch-size 256 \\
        --lr 2.5e-4 --gamma 0.99 --ent-coef 0.01 --normalize-obs false

Runs the trainer's own ``collect()`` (sync backend) and ``PPO.learn`` (``trainer.ppo.algorithm``) alternately
and prints the median of each over the iterations after the first, per thread count. The
bound it implies for ``--overlap`` on two cores is ``(collect + learn at 2 threads) / max(collect,
learn at 1 thread)``: overlapped, each phase gets one core and an iteration takes the longer one.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks.machine import print_machine
from collectors import make_collector
from trainer.flags import parse_args
from trainer.ppo.algorithm import PPO
from trainer.run_layout import Machine, run_layout


def main(argv: list[str] | None = None, iterations: int = 6) -> dict[int, tuple[float, float]]:
    """Median (collect, learn) seconds per thread count; ``argv``: ``trainer.train`` flags."""
    cfg = parse_args(argv if argv is not None else sys.argv[1:], prog="python -m benchmarks.iteration_breakdown",
                     description=__doc__.splitlines()[0] + " Takes trainer.train's flags.").config
    print_machine()
    layout = run_layout(cfg, Machine(cores=1))
    run = PPO.new(cfg, layout)
    out = {}
    with make_collector(layout.env_factories(), run.acting, backend="sync", horizon=cfg.num_steps,
                        seed=cfg.seed) as collector:
        it = 0
        for threads in (1, 2):
            torch.set_num_threads(threads)
            collecting, learning = [], []
            for _ in range(iterations):
                it += 1
                start = time.perf_counter()
                rollout = collector.collect()
                collecting.append(time.perf_counter() - start)
                start = time.perf_counter()
                run.learn(rollout, it, cfg.lr)
                learning.append(time.perf_counter() - start)
                collector.update_policy(run.model.state_dict())
            out[threads] = (statistics.median(collecting[1:]), statistics.median(learning[1:]))
            print(f"{cfg.env}, {cfg.num_envs} envs x {cfg.num_steps} steps, minibatch {run.settings.minibatch_size}, "
                  f"{threads} thread(s): collect {out[threads][0] * 1e3:.0f} ms, learn {out[threads][1] * 1e3:.0f} ms")
    bound = (out[2][0] + out[2][1]) / max(out[1])
    print(f"best possible --overlap gain on 2 cores: {bound:.2f}x")
    return out


if __name__ == "__main__":
    main()
