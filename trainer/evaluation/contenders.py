"""A policy against its contenders on the same held-out episodes: the baselines and the references played beside it
(:func:`play_contenders`), the statistics of each and the policy's paired leads (:func:`compare_contenders`), in
words (:func:`comparison_text`) and as JSON (:func:`comparison_payload`); what ``trainer.evaluate`` shows for one
cell, and for each of ``--users``' cells (:mod:`trainer.evaluation.cells`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym

import envs
from envs.belief_mpc import ON_CRITIC, BeliefMPC, TerminalValue
from envs.planner import ClairvoyantPlanner
from envs.profiles import profile_of
from trainer.evaluation.baselines import best_baseline
from trainer.evaluation.bracket import BOUND, bound_records, bracket_figures, bracket_text
from trainer.evaluation.episodes import (
    EPISODE_BATCH,
    Act,
    Player,
    Records,
    batched_reference_episodes,
    evaluation_seeds,
    filter_episodes,
    made_env,
    play_together,
    validation_seeds,
)
from trainer.evaluation.report import format_capture, format_table, plus_minus
from trainer.evaluation.servable import unservable, unservable_text
from trainer.evaluation.statistics import gap_closed, paired_difference, summarize

REFERENCE = "clairvoyant"  # the reference's name in the results (trainer.evaluate --reference)
BELIEF = "belief"  # the causal reference's (envs.belief_mpc.BeliefMPC on fair_share or the policy): --reference belief
REFERENCES = (REFERENCE, BELIEF, BOUND)  # (the bound: trainer.evaluation.bracket)
BELIEF_BASE = "fair_share"  # the base the causal reference improves on, and the lower end of its figures
WITH_CRITIC = "policy_critic"  # the reference on the policy, its rollout ending on the run's critic (--belief-base)
SELECTION_EPISODES = 16  # validation episodes on which the best baseline (the gap's lower end) is picked


class Comparison(NamedTuple):
    """The players' results on one cell and how the policy compares (:func:`compare_contenders`)."""

    results: dict[str, dict[str, Any]]  # each player's summary, by name
    paired: dict[str, dict[str, Any]]  # policy minus each baseline (and the reference), paired over episodes
    best: str | None  # the best baseline, picked on validation episodes
    gap: dict[str, Any] | None  # the fraction of the gap from it to the reference that the policy closes
    paired_qoe_lin: dict[str, dict[str, Any]] = {}  # as ``paired``, of QoE_lin per user (an env whose info has it)
    capture: dict[str, Any] | None = None  # the policy's share of the causal reference's lead over fair_share
    causal_share: dict[str, Any] | None = None  # the causal reference's share of the clairvoyant's lead over it
    unservable: bool | None = None  # nobody serves the cell (trainer.evaluation.servable); None: not said
    unservable_line: str = ""  # where it is: the line that says so (trainer.evaluation.servable.unservable_text)
    bracket: dict[str, Any] | None = None  # where the bound was played (trainer.evaluation.bracket.bracket_figures)


def play_contenders(act: Act, label: str, names: Sequence[str], vr_config: envs.VREdgeConfig | None,
                    env_fn: Callable[[], gym.Env], episodes: int, seed: int, reference: bool | Sequence[str],
                    belief_base: str = BELIEF_BASE, critic: TerminalValue | None = None,
                    policy_records: Records | None = None) -> dict[str, Records]:
    """The records of the episodes each player played, by name: the policy ``act`` (as ``label``), the baselines
    ``names``, the references ``reference`` names (VR-edge: ``vr_config``; ``True``: the clairvoyant, ``False``:
    none): the clairvoyant planner, and the causal reference :class:`envs.belief_mpc.BeliefMPC` on ``belief_base``
    (:data:`BELIEF_BASE`; ``"policy"``: ``act``; :data:`WITH_CRITIC`: ``act``, the rollout ending on ``critic``, the
    policy's critic: the reference at its strongest), with :data:`BELIEF_BASE` played too where ``names`` lacks it;
    the same held-out seeds for each. The policy and the baselines play together, in one batched env
    (:func:`trainer.evaluation.episodes.play_together`), each reference in one of its own. ``policy_records``: the
    policy's records where it has played already (through a guard: :mod:`trainer.evaluation.guards`)."""
    references = references_of(reference) if vr_config is not None else ()
    baselines = list(names) + ([BELIEF_BASE] if BELIEF in references and BELIEF_BASE not in names else [])
    seeds = evaluation_seeds(seed, episodes)
    env, kwargs = made_env(env_fn)
    made = profile_of(env).baselines
    players = {n: Player(made[n](kwargs), seeds) for n in baselines}
    if policy_records is None:
        players = {label: Player(act, seeds, EPISODE_BATCH), **players}
    played = dict(zip(players, play_together(list(players.values()), env_fn))) if players else {}
    played.update({label: policy_records} if policy_records is not None else {})
    if REFERENCE in references:
        played[REFERENCE] = clairvoyant_records(vr_config, env_fn, episodes, seed)
    if BELIEF in references:
        if belief_base == WITH_CRITIC and critic is None:
            raise ValueError(f"belief_base={WITH_CRITIC!r} needs the policy's critic (critic=...)")
        on_policy = belief_base in ("policy", WITH_CRITIC)
        played[BELIEF] = belief_records(vr_config, env_fn, episodes, seed, act if on_policy else belief_base,
                                         critic if belief_base == WITH_CRITIC else None)
    if BOUND in references:
        played[BOUND] = bound_records(vr_config, episodes, seed)
    return {name: played[name] for name in [label, *names, *REFERENCES, BELIEF_BASE] if name in played}


def clairvoyant_records(vr_config: envs.VREdgeConfig, env_fn: Callable[[], gym.Env], episodes: int, seed: int
                        ) -> Records:
    """The clairvoyant reference's records (:class:`envs.planner.ClairvoyantPlanner`) on the held-out episodes
    ``seed`` gives: one batched env, a row per episode, planned from its state at every step (a row whose episode
    ended too: its plan is moot). Its plans are each row's own, so they are those of single envs, at a batched
    env's cost."""
    return batched_reference_episodes(ClairvoyantPlanner(vr_config), env_fn, episodes, seed, num_envs=episodes)


def belief_records(vr_config: envs.VREdgeConfig, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                    base: str | Act = BELIEF_BASE, terminal_value: TerminalValue | None = None) -> Records:
    """The causal reference's records (:class:`envs.belief_mpc.BeliefMPC` on ``base``, its defaults; with a
    ``terminal_value``, its rollout ending on it with :data:`envs.belief_mpc.ON_CRITIC`'s settings) on the held-out
    episodes ``seed`` gives, every env's observation at every step in one batched env (its filter keeps a row each)."""
    settings = ON_CRITIC if terminal_value is not None else {}
    return filter_episodes(BeliefMPC(vr_config, base=base, terminal_value=terminal_value, **settings), env_fn,
                           episodes, seed, num_envs=64)


def rows_at_once(episodes: int, names: Sequence[str], reference: bool | Sequence[str]) -> int:
    """The most env rows one pair's players hold at once (:func:`play_contenders`, then :func:`compare_contenders`'
    validation episodes): the policy's and the baselines' ``episodes`` each (:data:`BELIEF_BASE`'s too where the
    causal reference needs it) in one batched env, or the baselines' :data:`SELECTION_EPISODES` each in one; each
    reference plays fewer rows, in one of its own. What a memory check counts (``trainer.evaluate --users``).

    >>> rows_at_once(50, ["fair_share", "buffer"], False), rows_at_once(2, ["fair_share", "buffer"], ["belief"])
    (150, 32)
    """
    references = references_of(reference)
    players = 1 + len(names) + (BELIEF in references and BELIEF_BASE not in names)
    return max(episodes * players, SELECTION_EPISODES * len(names))


def references_of(reference: bool | Sequence[str]) -> tuple[str, ...]:
    """The references to play, by name (:data:`REFERENCES`): ``True`` is the clairvoyant alone, ``False`` none."""
    if isinstance(reference, bool):
        return (REFERENCE,) if reference else ()
    return tuple(reference)


def compare_contenders(played: dict[str, Records], label: str, names: Sequence[str],
                       vr_config: envs.VREdgeConfig | None, env_fn: Callable[[], gym.Env], run_seed: int
                       ) -> Comparison:
    """The statistics of what each player scored, and the policy (``label``) against the others; the best baseline
    is picked on :data:`SELECTION_EPISODES` validation episodes of the run's seed ``run_seed``."""
    results = {name: summarize(records) for name, records in played.items()}
    # the bound is no player: it is paired in the bracket (bound minus the policy), not here
    compared = list(names) + [r for r in REFERENCES if r in played and r != BOUND]
    paired = {name: paired_difference(played[label], played[name]) for name in compared}
    with_qoe = all("qoe_lin" in r for name, records in played.items() if name != BOUND for r in records)
    paired_qoe = {name: paired_difference(played[label], played[name], "qoe_lin") for name in compared} \
        if with_qoe else {}
    env, kwargs = made_env(env_fn)
    best, _ = best_baseline(env, list(names), kwargs, env_fn, validation_seeds(run_seed, SELECTION_EPISODES))
    gap = gap_closed(played[label], played[best], played[REFERENCE]) if REFERENCE in played and best else None
    lost = profile_of(env).abandonment
    cannot = unservable(results[label], results[best] if best else None, lost)
    line = unservable_text(results[label], best, results[best], lost) if cannot else ""
    causal = [name for name in (label, best, BELIEF) if name and name in played]
    bracket = bracket_figures(played, label, causal) if BOUND in played else None
    return Comparison(results, paired, best, gap, paired_qoe, *capture_figures(played, label), cannot, line, bracket)


def capture_figures(played: dict[str, Records], label: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(capture, causal_share)`` where the causal reference (:data:`BELIEF`) was played, paired over the same
    episodes, each a ratio of mean leads over :data:`BELIEF_BASE` with its 95% interval (delta method,
    :func:`trainer.evaluation.statistics.gap_closed`): the **capture** ``(policy - fair_share) / (belief -
    fair_share)``, with ``ceiling_tight`` (false where the policy scores above the reference: it then bounds nothing,
    and a capture above 1 no success); the **causal share** ``(belief - fair_share) / (clairvoyant - fair_share)``
    where the clairvoyant was played too."""
    if BELIEF not in played:
        return None, None
    base, reference = played[BELIEF_BASE], played[BELIEF]
    capture = gap_closed(played[label], base, reference)
    capture["ceiling_tight"] = paired_difference(reference, played[label])["mean"] >= 0
    causal = gap_closed(reference, base, played[REFERENCE]) if REFERENCE in played else None
    return capture, causal


def comparison_payload(comparison: Comparison, label: str, names: Sequence[str]) -> dict[str, Any]:
    """A comparison as ``evaluation.json`` holds it: ``policy``, ``baselines``, ``reference`` (by name),
    ``paired_reward_per_step``, ``paired_qoe_lin`` (VR-edge), ``best_baseline``, ``best_baseline_picked_on``,
    ``gap_closed``, ``capture`` and ``causal_share`` (:func:`capture_figures`; ``None`` where not played),
    ``unservable`` (:func:`trainer.evaluation.servable.unservable`: true where the policy and the best baseline both
    lose their users in most episodes; ``None`` where it cannot be said) and, only where the bound was played,
    ``optimality_gap`` (bound minus policy, paired) and ``bracket`` (:func:`trainer.evaluation.bracket.bracket_figures`,
    less the optimality gap)."""
    results, best = comparison.results, comparison.best
    bracket = comparison.bracket
    return {"policy": results[label], "baselines": {n: results[n] for n in names},
            "reference": {r: results[r] for r in REFERENCES if r in results},
            "paired_reward_per_step": comparison.paired,
            **({"paired_qoe_lin": comparison.paired_qoe_lin} if comparison.paired_qoe_lin else {}),
            "best_baseline": best,
            "best_baseline_picked_on": f"{SELECTION_EPISODES} validation episodes" if best else None,
            "gap_closed": comparison.gap, "capture": comparison.capture, "causal_share": comparison.causal_share,
            "unservable": comparison.unservable,
            **({"optimality_gap": bracket["optimality_gap"],
                "bracket": {k: v for k, v in bracket.items() if k != "optimality_gap"}} if bracket else {})}


def comparison_text(comparison: Comparison, belief_base: str = BELIEF_BASE) -> str:
    """One comparison in words: each player's statistics, the paired differences, the gap closed and, where the
    causal reference (BeliefMPC on ``belief_base``) was played, its causal share and the policy's capture, and where
    the bound was, the bracket (:func:`trainer.evaluation.bracket.bracket_text`); first, where nobody serves the
    cell, the line that says so (:func:`trainer.evaluation.servable.unservable_text`)."""
    lines = [format_table(comparison.results)]
    if comparison.unservable_line:
        lines.insert(0, comparison.unservable_line + "\n")
    if comparison.paired:
        qoe = comparison.paired_qoe_lin
        lines.append("\npolicy minus baseline, paired over the same episodes (mean ± 95% CI, policy better in): "
                     "reward/step" + (" | QoE_lin/user" if qoe else ""))
        for name, d in comparison.paired.items():
            q = qoe.get(name)
            also = f" | {q['mean']:+.3f} {plus_minus(q['ci95']):<9}{q['wins']}/{q['episodes']}" if q else ""
            lines.append(f"  vs {name:<14}{d['mean']:+.3f} {plus_minus(d['ci95']):<9}{d['wins']}/{d['episodes']} "
                         f"episodes{also}")
    gap = comparison.gap
    if gap:
        interval = f" {plus_minus(gap['ci95'])} (95% CI)" if plus_minus(gap["ci95"]) else ""
        lines.append(f"\ngap closed: the policy closes {gap['fraction']:.3f}{interval} of the gap between the best "
                     f"baseline ({comparison.best}, picked on {SELECTION_EPISODES} validation episodes) and the "
                     f"clairvoyant reference ({gap['gap']:+.3f} reward/step)")
    if comparison.capture is not None:
        lines.append("\n" + format_capture(comparison.capture, comparison.causal_share, belief_base))
    if comparison.bracket is not None:
        lines.append("\n" + bracket_text(comparison.bracket))
    return "\n".join(lines)
