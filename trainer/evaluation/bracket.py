"""How far from optimal, certified: the bound above every policy (``trainer.evaluate --reference bound``) and the
bracket it makes with the best causal player below it.

The upper bound of an episode is :func:`envs.hindsight.lagrangian_bound` on the episode's own future
(:func:`envs.hindsight.episode_future` of its seed): no policy, causal or not, scores more on that episode (the
argument: ``docs/ceiling.md``, "How far from optimal"). The best any causal policy could do lies between the best
causal player played (the policy, the best baseline, the causal reference BeliefMPC) and that bound; the bracket's
width is how much is left, for any causal method.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Sequence
from typing import Any

import numpy as np

import envs
from collectors.stop_signals import leave_ctrl_c_to_the_parent
from envs.hindsight import episode_bound
from trainer.evaluation.episodes import Records, evaluation_seeds, say_played
from trainer.evaluation.report import plus_minus
from trainer.evaluation.statistics import paired_difference, summarize

BOUND = "bound"  # the bound's name in the results (trainer.evaluate --reference bound)
# Why lagrangian_bound at 20 iterations: on two held-out default-cell episodes (evaluation_seeds(0, 2)) its value per
# round after 20 subgradient steps was within 0.004 and 0.002 of its value after 40, at half the cost (16 s an
# episode against 33 s, 2-core AMD EPYC under load); sharing_bound is about 0.05 tighter there but about 5 times
# slower than 40 steps (147 s an episode): 50 episodes would take two hours (docs/ceiling.md).
BOUND_ITERATIONS = 20
BOUND_SOLVER = f"envs.hindsight.lagrangian_bound (any schedule, {BOUND_ITERATIONS} iterations)"
# a cell of fewer user-rounds per episode than this is bounded in the evaluation's own process: its episodes take
# well under a second each, less than starting a process (about 0.5 s); the default cell's (8 users, 300 rounds)
# take 6-9 s each on a 2-core AMD EPYC, and one process per core halves the bound's wall time there
PARALLEL_USER_ROUNDS = 1000
# how long an episode's bound may take in a worker before the evaluation says it will not come (a worker that dies
# loses its task and the pool waits for ever): the default cell's take 3-15 s on a 2-core AMD EPYC, under load too
EPISODE_DEADLINE_S = 600
RETURN_TOLERANCE = 1e-9  # a player's return above the bound's by more than this is a violation (float sums)


def bound_records(vr_config: envs.VREdgeConfig, episodes: int, seed: int) -> Records:
    """The upper bound's records on the held-out episodes ``seed`` gives (:func:`evaluation_seeds`: those every
    other player plays), one per episode: ``return`` (the bound on any player's return), ``length`` (the episode's
    rounds) and ``reward_per_step`` (the bound over those rounds); each episode moves the evaluation's bar. Where
    the cell is large enough to pay for it, the episodes are bounded in one process per usable core (the same
    numbers: each episode's bound is its own)."""
    from collectors.resources import usable_cores

    seeds = evaluation_seeds(seed, episodes)
    bounded = functools.partial(episode_bound, vr_config, iterations=BOUND_ITERATIONS)  # (a worker loads no torch)
    workers = min(usable_cores(), len(seeds))
    values = []
    if workers < 2 or vr_config.num_users * vr_config.max_steps < PARALLEL_USER_ROUNDS or \
            multiprocessing.current_process().daemon:  # (a pool's worker may start no process of its own)
        for episode_seed in seeds:
            values.append(bounded(episode_seed))
            say_played()
    else:
        with multiprocessing.get_context("spawn").Pool(workers, initializer=leave_ctrl_c_to_the_parent) as pool:
            coming = pool.imap(bounded, seeds)  # (in the seeds' order)
            for _ in seeds:
                try:
                    values.append(coming.next(timeout=EPISODE_DEADLINE_S))
                except multiprocessing.TimeoutError:  # a worker killed (out of memory?) loses its episode for good
                    raise TimeoutError(f"the bound of a held-out episode did not come back in {EPISODE_DEADLINE_S} s "
                                       "(a worker killed?); run the evaluation again, or without bound") from None
                say_played()
    return [{"return": value, "length": rounds, "reward_per_step": value / rounds} for value, rounds in values]


def bracket_figures(played: dict[str, Records], label: str, causal: Sequence[str]) -> dict[str, Any]:
    """The bracket, paired over the same episodes (reward per step, mean ± 95% interval): ``policy`` (its name),
    ``bound`` (its solver,
    mean, interval and each episode's figure), ``best_causal`` (the highest mean among ``causal``, the causal
    players played: the policy ``label``, the best baseline, the causal reference), ``width`` (bound minus best
    causal), ``optimality_gap`` (bound minus the policy), ``policy_below_best_causal`` and ``bound_holds``: the
    episodes where the bound's return is at least every player's (every record in ``played``; a violation is a bug
    of the bound, listed by episode and player)."""
    bound = played[BOUND]
    means = {name: float(np.mean([r["reward_per_step"] for r in played[name]])) for name in causal}
    best = max(causal, key=lambda name: means[name])  # (a tie: the first, the policy)
    below = [{"episode": i, "player": name} for name in played if name != BOUND
             for i, (b, r) in enumerate(zip(bound, played[name])) if r["return"] > b["return"] + RETURN_TOLERANCE]
    summary = summarize(bound)
    return {"policy": label,
            "bound": {"solver": BOUND_SOLVER, "reward_per_step": summary["reward_per_step"],
                      "ci95": summary["reward_per_step_ci95"],
                      "per_episode": [r["reward_per_step"] for r in bound]},
            "best_causal": {"name": best, "reward_per_step": means[best],
                            "ci95": summarize(played[best])["reward_per_step_ci95"]},
            "width": paired_difference(bound, played[best]),
            "optimality_gap": paired_difference(bound, played[label]),
            "policy_below_best_causal": paired_difference(played[best], played[label]),
            "bound_holds": {"episodes": len(bound), "held": len(bound) - len({v["episode"] for v in below}),
                            "below": below}}


def bracket_text(bracket: dict[str, Any]) -> str:
    """The bracket in words (:func:`bracket_figures`): the bound, the best causal player, the width, the policy's
    place, and whether the bound held on every episode (a loud line where it did not).

    >>> figure = {"mean": 0.1, "ci95": 0.01, "wins": 3, "episodes": 3}
    >>> print(bracket_text({"policy": "p", "bound": {"solver": "s", "reward_per_step": 0.9, "ci95": 0.02},
    ...     "best_causal": {"name": "p", "reward_per_step": 0.8, "ci95": 0.03}, "width": figure,
    ...     "optimality_gap": figure, "policy_below_best_causal": {**figure, "mean": 0.0},
    ...     "bound_holds": {"episodes": 3, "held": 3, "below": []}}))  # doctest: +NORMALIZE_WHITESPACE
    bracket: the best any causal policy could score lies between the best causal player and the certified upper
    bound (reward/step, the same 3 episodes, mean ± 95% CI)
      upper bound                 0.900 ± 0.020  s: no policy, causal or not, scores more on an episode
      best causal player          0.800 ± 0.030  p
      width (bound minus best)   +0.100 ± 0.010  paired
      the policy is the best causal player: its optimality gap (bound minus policy) is the width
      the bound is at least every player's return in 3/3 episodes
    """
    bound, best, width, gap = (bracket[k] for k in ("bound", "best_causal", "width", "optimality_gap"))
    holds = bracket["bound_holds"]
    lines = [f"bracket: the best any causal policy could score lies between the best causal player and the certified "
             f"upper bound (reward/step, the same {holds['episodes']} episodes, mean ± 95% CI)",
             f"  {'upper bound':<26}{bound['reward_per_step']:>7.3f} {plus_minus(bound['ci95']):<8} "
             f"{bound['solver']}: no policy, causal or not, scores more on an episode",
             f"  {'best causal player':<26}{best['reward_per_step']:>7.3f} {plus_minus(best['ci95']):<8} "
             f"{best['name']}",
             f"  {'width (bound minus best)':<26}{width['mean']:>+7.3f} {plus_minus(width['ci95']):<8} paired"]
    if best["name"] == bracket["policy"]:
        lines.append("  the policy is the best causal player: its optimality gap (bound minus policy) is the width")
    else:
        under = bracket["policy_below_best_causal"]
        lines.append(f"  the policy: optimality gap (bound minus policy) {gap['mean']:+.3f} {plus_minus(gap['ci95'])}, "
                     f"of which {under['mean']:+.3f} {plus_minus(under['ci95'])} below {best['name']}")
    if holds["held"] == holds["episodes"]:
        lines.append(f"  the bound is at least every player's return in {holds['held']}/{holds['episodes']} episodes")
    else:
        first = holds["below"][0]
        lines.append(f"  THE BOUND FAILED: a player's return is above it in {holds['episodes'] - holds['held']}/"
                     f"{holds['episodes']} episodes (first: episode {first['episode']}, {first['player']}), so it "
                     "bounds nothing there and the gaps above are not certified: a bug of envs/hindsight.py, please "
                     "report it with this command")
    return "\n".join(lines)
