"""PPO's minibatch planner: the minibatch count follows from ``num_envs x num_steps`` (its command line is
``python -m trainer.batching``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from envs.settings import ConfigError
from trainer.arguments import counted

MIN_MINIBATCHES = 32  # target range of minibatches per epoch, where the rollout is large enough
MAX_MINIBATCHES = 256
MIN_MINIBATCH_SIZE = 64  # below this, per-minibatch advantage normalisation is mostly noise


@dataclass(frozen=True)
class MinibatchPlan:
    total: int
    minibatch_size: int
    num_minibatches: int
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"{self.total} transitions per rollout -> {counted(self.num_minibatches, 'minibatch', 'minibatches')} "
                 f"of {self.minibatch_size}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _recommended(total: int) -> int:
    """Largest minibatch count in [32, 256] that divides ``total`` with minibatches >= 64;
    for small rollouts, the count that keeps minibatches at least 64 transitions."""
    counts = [k for k in _divisors(total) if total // k >= MIN_MINIBATCH_SIZE]
    in_range = [k for k in counts if MIN_MINIBATCHES <= k <= MAX_MINIBATCHES]
    if in_range:
        return min(in_range)  # the coarsest in range: fewer, larger minibatches are cheaper on a GPU
    below = [k for k in counts if k < MIN_MINIBATCHES]
    return max(below) if below else 1


def plan_minibatches(num_envs: int, num_steps: int, minibatch_size: int | None = None) -> MinibatchPlan:
    """Plan minibatches for a rollout of ``num_envs * num_steps`` transitions.

    ``minibatch_size`` is optional; without it the planner picks one.
    Impossible values raise ``ValueError``; workable but poor ones produce warnings
    that name better values.
    """
    for name, v in (("num_envs", num_envs), ("num_steps", num_steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} is invalid: must be an integer >= 1")
    total = num_envs * num_steps
    best = _recommended(total)
    if minibatch_size is None:
        return MinibatchPlan(total, total // best, best)
    if isinstance(minibatch_size, bool) or not isinstance(minibatch_size, int) or minibatch_size < 1:
        raise ConfigError("minibatch_size", minibatch_size, "must be an integer >= 1")
    if minibatch_size > total:
        raise ConfigError("minibatch_size", minibatch_size, f"must be at most the rollout's {total} transitions "
                          f"({num_envs} envs x {num_steps} steps; the planner picks {total // best})")
    suggestion = f"use --minibatch-size {total // best} ({counted(best, 'minibatch', 'minibatches')})"
    warnings = []
    if total % minibatch_size:
        warnings.append(f"--minibatch-size {minibatch_size} does not divide {total}: the last "
                        f"{counted(total % minibatch_size, 'transition')} of each epoch "
                        f"{'is' if total % minibatch_size == 1 else 'are'} dropped; {suggestion}")
    count = total // minibatch_size
    if minibatch_size < MIN_MINIBATCH_SIZE:
        warnings.append(f"minibatches of {minibatch_size} are too small for advantage normalisation; {suggestion}")
    elif count > MAX_MINIBATCHES:
        warnings.append(f"{count} minibatches per epoch make the update too aggressive; {suggestion}")
    elif count < MIN_MINIBATCHES and best >= MIN_MINIBATCHES:
        warnings.append(f"{counted(count, 'minibatch', 'minibatches')} per epoch "
                        f"{'is' if count == 1 else 'are'} too coarse (target {MIN_MINIBATCHES}-"
                        f"{MAX_MINIBATCHES}); {suggestion}")
    return MinibatchPlan(total, minibatch_size, count, warnings)


def rank_minibatch_size(plan: MinibatchPlan, num_envs: int, num_steps: int, world_size: int) -> int:
    """Each rank's share of the plan's minibatch in a data-parallel run of ``world_size`` ranks (alone: the whole
    minibatch). A minibatch is then whole slots of the shuffle, ``minibatch / num_envs`` steps of every env
    (``trainer.ppo.update.epoch_order``), so that every rank holds an equal share of each: a minibatch size that
    is not a multiple of ``num_envs`` is refused, naming the sizes that are.

    >>> rank_minibatch_size(plan_minibatches(64, 128), 64, 128, world_size=2)
    128
    """
    if world_size == 1:
        return plan.minibatch_size
    if plan.minibatch_size % num_envs:
        whole = [num_envs * d for d in _divisors(num_steps)]
        near = sorted(whole, key=lambda m: abs(m - plan.minibatch_size))[:2]
        raise ConfigError("minibatch_size", plan.minibatch_size, f"must be a multiple of --num-envs {num_envs} under "
                          f"torchrun, so that each of the {world_size} ranks holds an equal share of every minibatch; "
                          f"use --minibatch-size {' or '.join(str(m) for m in sorted(near))}")
    return plan.minibatch_size // world_size
