"""Print PPO's minibatch plan for a rollout size.

    python -m trainer.batching --num-envs 64 --num-steps 2048 --batch-size 4096

The flags are ``trainer.train``'s (``--n-envs`` and ``--n-steps`` are accepted too).
"""

from __future__ import annotations

from trainer.arguments import OneLineParser
from trainer.ppo.batching import plan_minibatches  # no torch: --help answers at once


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m trainer.batching", description="Print the PPO minibatch plan for a rollout "
                      "size (the flags are trainer.train's).")
    p.add_argument("--num-envs", "--n-envs", dest="num_envs", type=int, required=True, help="parallel envs")
    p.add_argument("--num-steps", "--n-steps", dest="num_steps", type=int, required=True,
                   help="steps per env per rollout")
    p.add_argument("--batch-size", type=int, default=0, help="minibatch size (default 0: the planner picks, as "
                   "for trainer.train)")
    args = p.parse_args(argv)
    for flag, value, least in (("--num-envs", args.num_envs, 1), ("--num-steps", args.num_steps, 1),
                               ("--batch-size", args.batch_size, 0)):
        if value < least:
            p.error(f"{flag}={value} is invalid: must be >= {least}")
    try:
        print(plan_minibatches(args.num_envs, args.num_steps, args.batch_size or None).describe())
    except ValueError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
