"""Where one training iteration's time goes: collecting vs learning, with 1 and 2 learner threads.

    python -m benchmarks.iteration_breakdown                 # VR-edge defaults
    python -m benchmarks.iteration_breakdown --env CartPole-v1 --num-envs 8 --minibatch-size 256 \\
        --lr 2.5e-4 --gamma 0.99 --ent-coef 0.01 --config benchmarks/cleanrl_cartpole.toml

Runs the trainer's own ``collect()`` (sync backend) and ``PPO.learn`` (``trainer.ppo.algorithm``) alternately
and prints the median of each over the iterations after the first, per thread count. The
bound it implies for ``--overlap`` on two cores is ``min(collect + learn at 1 thread, at 2 threads) /
max(collect, learn at 1 thread)``: overlapped, each phase gets one core and an iteration takes the longer one.
"""

from __future__ import annotations

import statistics
import sys
import time

from trainer.config import named, setting_fields
from trainer.flags import build_parser, parse_args
from trainer.registry import reads

PROG = "python -m benchmarks.iteration_breakdown"
# trainer flags about the run, its processes and Ray: this benchmark times one process's collect() and learn()
# at 1 and 2 threads, and would silently ignore them
RUN_FLAGS = ("algo", "backend", "total_steps", "run_dir", "num_workers", "num_splits", "threads", "tensorboard",
             "ray_address", "envs_per_worker", "cpus_per_worker", "worker_timeout", "keep_collecting", "overlap",
             "overlap_targets", "max_lag", "rho_bar", "c_bar", "checkpoint_every", "eval_every", "eval_episodes",
             "keep_checkpoints")

# another algorithm's settings (it times PPO): refused by the trainer's parser as such, and left out of --help
OTHER_ALGORITHMS_FLAGS = sorted(f.name for _, f in setting_fields() if not reads("ppo", f.name))


def main(argv: list[str] | None = None, iterations: int = 6) -> dict[int, tuple[float, float]]:
    """Median (collect, learn) seconds per thread count; ``argv``: ``trainer.train`` flags."""
    cli = parse_args(argv if argv is not None else sys.argv[1:], prog=PROG,
                     description=__doc__.splitlines()[0] + " Takes trainer.train's flags for PPO and the env; "
                     "those about the run, its processes and Ray are refused.",
                     hidden=(*RUN_FLAGS, *OTHER_ALGORITHMS_FLAGS, "resume", "overwrite"))
    what_it_does = {("algo", "ppo"), ("backend", "sync")}  # these two may be said, if they say what it does
    refused = [named(key) for key in RUN_FLAGS
               if key in cli.given and (key, cli.given[key]) not in what_it_does]
    refused += [flag for flag, given in (("--resume", bool(cli.resume)), ("--overwrite", cli.overwrite)) if given]
    if refused:  # taken by the parser (they are trainer flags), not by this benchmark: refused, not ignored
        build_parser(PROG).error(f"{', '.join(refused)}: this benchmark times PPO's learn() next to the sync "
                                 f"backend's collect() in one process; drop {'it' if len(refused) == 1 else 'them'}")
    # imported once the command line is checked: --help and a mistake answer before torch loads
    import torch

    from benchmarks.machine import print_machine
    from collectors import make_collector
    from envs.settings import ConfigError
    from trainer.ppo.algorithm import PPO
    from trainer.run_layout import Machine, run_layout

    cfg = cli.config
    try:
        layout = run_layout(cfg, Machine(cores=1))
        run = PPO.new(cfg, layout)  # (builds the first env)
    except ConfigError as e:  # what only the env can tell (an unknown id, arguments it does not take)
        build_parser(PROG).error(str(e))
    print_machine()
    out = {}
    with make_collector(layout.env_factories(), run.acting, backend="sync", num_steps=cfg.num_steps,
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
    print(f"best possible --overlap gain on 2 cores: {overlap_bound(out):.2f}x")
    return out


def overlap_bound(phases: dict[int, tuple[float, float]]) -> float:
    """The most ``--overlap`` can gain on two cores, from (collect, learn) seconds at 1 and 2 threads: the
    faster one-after-the-other iteration over the overlapped one, where each phase has one core and an
    iteration takes the longer (at most 2x; a busy machine can make 2 threads slower than 1).

    >>> overlap_bound({1: (1.0, 1.0), 2: (0.6, 0.6)}), overlap_bound({1: (1.0, 3.0), 2: (2.0, 4.0)})
    (1.2, 1.3333333333333333)
    """
    return min(sum(phases[1]), sum(phases[2])) / max(phases[1])


if __name__ == "__main__":
    main()
