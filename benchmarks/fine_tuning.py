"""Distillation's fine-tuning on one torch thread and on two, quiet and beside busy processes, side by side in one run.

    python -m benchmarks.fine_tuning RUN [--episodes 64] [--epochs 10] [--repeats 3] [--busy 0,1]

The newest checkpoint of the run ``RUN`` plays ``--episodes`` episodes of its cell, labelled once by the env's
expert (:func:`trainer.ppo.distillation.expert_labels`); then for each count in ``--busy`` of pure-Python busy loops
running meanwhile (another user's job), :func:`trainer.ppo.distillation.fine_tuned` takes ``--epochs`` epochs on a
fresh copy of the policy with 1 and with 2 torch threads, alternating, ``--repeats`` times. Prints the machine, each
setting's median [min - max] seconds and the ratio of the medians (two threads over one). What it decided:
``fine_tuned`` runs on one thread (docs/benchmarks.md, "Distillation's fine-tuning: one thread").
"""

from __future__ import annotations

import copy
import statistics
import subprocess
import sys
import time

from benchmarks.machine import print_machine
from trainer.arguments import OneLineParser


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.fine_tuning", description=__doc__)
    p.add_argument("run", help="a trained VR-edge run directory (its newest checkpoint)")
    p.add_argument("--episodes", type=int, default=64, help="episodes labelled (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=10, help="epochs of each timed fine-tuning (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timings of each setting (default: %(default)s)")
    p.add_argument("--busy", default="0,1", help="busy loops beside it, a list (default: %(default)s)")
    args = p.parse_args(argv)
    import checkpoints
    from trainer.evaluation.policies import policy_from_state
    from trainer.ppo.distillation import DistillSettings, expert_labels, fine_tuned

    source, state, _ = checkpoints.latest_loadable(args.run)
    model, cfg = policy_from_state(state, source)
    labels = expert_labels(model, cfg.env, cfg.env_options, args.episodes, seed=0)
    settings = DistillSettings(epochs=args.epochs)
    print_machine()
    print(f"{len(labels.observations):,} states, {args.epochs} epochs, minibatches of {settings.minibatch_size}")
    for busy in (int(b) for b in args.busy.split(",")):
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        seconds: dict[int, list[float]] = {1: [], 2: []}
        try:
            for _ in range(args.repeats):
                for threads in seconds:
                    copied, start = copy.deepcopy(model), time.perf_counter()
                    fine_tuned(copied, labels, settings, cfg.max_grad_norm, threads=threads)
                    seconds[threads].append(time.perf_counter() - start)
        finally:
            for loop in loops:
                loop.kill()
        medians = {n: statistics.median(s) for n, s in seconds.items()}
        cells = ", ".join(f"{n} thread{'s' * (n > 1)} {medians[n]:.2f} s [{min(s):.2f} - {max(s):.2f}]"
                          for n, s in seconds.items())
        print(f"{busy} busy loop{'s' * (busy != 1)}: {cells}; two / one {medians[2] / medians[1]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
