"""Print PPO's minibatch plan for a rollout size.

    python -m trainer.batching --n-envs 64 --n-steps 2048 --batch-size 4096
"""

from __future__ import annotations

import argparse

from trainer.ppo.batching import plan_minibatches


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print the PPO minibatch plan for a rollout size.")
    p.add_argument("--n-envs", type=int, required=True)
    p.add_argument("--n-steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=None, help="minibatch size (default: planner's choice)")
    args = p.parse_args(argv)
    try:
        print(plan_minibatches(args.n_envs, args.n_steps, args.batch_size).describe())
    except ValueError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
