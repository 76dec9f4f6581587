"""Print PPO's minibatch plan for a rollout size.

    python -m trainer.batching --num-envs 64 --num-steps 2048 --minibatch-size 4096

The flags are ``trainer.train``'s, with their limits.
"""

from __future__ import annotations

from envs.settings import ConfigError, check_limits
from trainer.arguments import OneLineParser
from trainer.config import TrainConfig
from trainer.ppo.minibatches import plan_minibatches  # no torch: --help answers at once


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m trainer.batching", description="Print the PPO minibatch plan for a rollout "
                      "size (the flags are trainer.train's).")
    p.add_argument("--num-envs", type=int, required=True, help="parallel envs")
    p.add_argument("--num-steps", type=int, required=True, help="steps per env per rollout")
    p.add_argument("--minibatch-size", type=int, default=0,
                   help="minibatch size (default 0: the planner picks, as for trainer.train)")
    args = p.parse_args(argv)
    try:
        cfg = TrainConfig.from_dict(vars(args))
        check_limits(cfg)
        check_limits(cfg.algo_settings)
        print(plan_minibatches(args.num_envs, args.num_steps, args.minibatch_size or None).describe())
    except ConfigError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
