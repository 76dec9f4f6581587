"""Evaluation across cells: a policy, the baselines and the clairvoyant reference played on the same held-out
episodes for each (users, churn) pair (``python -m trainer.evaluate --users 2,4,8,12,16 --churn 0,0.05``), and what
playing them on one cell shares with ``trainer.evaluate`` without ``--users``: :func:`play_contenders`,
:func:`compare_contenders`, :func:`comparison_payload`.

A cell is ``num_users`` slots with ``users`` active (a number, or a range drawn per episode) and ``churn``; every
pair is played in cells with the same slot count, the most users asked for, on the run's own env arguments
otherwise, with the active mask in the observation wherever the run was trained with it. A policy whose parameters
fix its slot count (``model.layout``'s kind ``flat``, ``per_head``) plays in cells of its own slot count, and no
more users than that; one that acts on any slot count (kind ``set``) plays in cells of the most users.

Example: a fair-share "policy" and the robust MPC at 2 and 3 of 3 slots, without and with churn::

    >>> import torch
    >>> from trainer.common.policy_layout import FLAT
    >>> from trainer.config import TrainConfig
    >>> cfg = TrainConfig.from_dict({"env": "VREdge-v0", "env_kwargs": "num_users=3,users=2-3,max_steps=20"})
    >>> class FairShare(torch.nn.Module):  # a model that plays the fair-share baseline
    ...     layout = FLAT
    ...     def act_deterministic(self, obs):
    ...         return torch.from_numpy(envs.make_baseline("fair_share", envs.VREdgeConfig(**cfg.env_options))(
    ...             obs.numpy()))
    >>> entries = evaluate_cells(FairShare(), cfg, (2, 3), (0.0, 0.05), episodes=2, baselines=("buffer",),
    ...                          reference=False)
    >>> [(e["users"], e["churn"]) for e in entries], sorted(entries[0]["baselines"])
    ([(2, 0.0), (2, 0.05), (3, 0.0), (3, 0.05)], ['buffer'])
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
from torch import nn

import envs
from envs.belief_mpc import BeliefMPC
from envs.planner import ClairvoyantPlanner
from envs.settings import ConfigError
from trainer.arguments import most_users
from trainer.config import TrainConfig
from trainer.evaluation.baselines import best_baseline
from trainer.evaluation.episodes import Act, held_out_env_kwargs, policy_actions, run_episodes, validation_seeds
from trainer.evaluation.report import pyplot, write_figure
from trainer.evaluation.statistics import gap_closed, paired_difference, summarize

REFERENCE = "clairvoyant"  # the reference's name in the results (trainer.evaluate --reference)
BELIEF = "belief"  # the causal ceiling's (envs.belief_mpc.BeliefMPC on fair_share or the policy): --reference belief
REFERENCES = (REFERENCE, BELIEF)
CEILING_BASE = "fair_share"  # the base the causal ceiling improves on, and the lower end of its figures
SELECTION_EPISODES = 16  # validation episodes on which the best baseline (the gap's lower end) is picked
Records = list[dict[str, float]]  # one per episode (run_episodes)


class Comparison(NamedTuple):
    """The players' results on one cell and how the policy compares (:func:`compare_contenders`)."""

    results: dict[str, dict[str, Any]]  # each player's summary, by name
    paired: dict[str, dict[str, Any]]  # policy minus each baseline (and the reference), paired over episodes
    best: str | None  # the best baseline, picked on validation episodes
    gap: dict[str, Any] | None  # the fraction of the gap from it to the reference that the policy closes
    paired_qoe_lin: dict[str, dict[str, Any]] = {}  # as ``paired``, of QoE_lin per user (an env whose info has it)
    capture: dict[str, Any] | None = None  # the policy's share of the causal ceiling's lead over fair_share
    causal_share: dict[str, Any] | None = None  # the causal ceiling's share of the clairvoyant's lead over it


def play_contenders(act: Act, label: str, names: Sequence[str], vr_config: envs.VREdgeConfig | None,
                    env_fn: Callable[[], gym.Env], episodes: int, seed: int, reference: bool | Sequence[str],
                    ceiling_base: str = CEILING_BASE) -> dict[str, Records]:
    """The records of the episodes each player played, by name: the policy ``act`` (as ``label``), the baselines
    ``names``, the references ``reference`` names (VR-edge: ``vr_config``; ``True``: the clairvoyant, ``False``:
    none): the clairvoyant planner, and the causal ceiling :class:`envs.belief_mpc.BeliefMPC` on ``ceiling_base``
    (:data:`CEILING_BASE`, or ``"policy"``: ``act``, the ceiling at its strongest), with :data:`CEILING_BASE` played
    too where ``names`` lacks it; the same held-out seeds for each."""
    played = {label: run_episodes(act, env_fn, episodes, seed)}
    for name in names:
        played[name] = run_episodes(envs.make_baseline(name, vr_config), env_fn, episodes, seed)
    references = references_of(reference) if vr_config is not None else ()
    if REFERENCE in references:
        played[REFERENCE] = run_episodes(ClairvoyantPlanner(vr_config), env_fn, episodes, seed, num_envs=64,
                                         with_envs=True)
    if BELIEF in references:
        played[BELIEF] = ceiling_records(vr_config, env_fn, episodes, seed, act if ceiling_base == "policy"
                                         else ceiling_base)
        if CEILING_BASE not in played:
            played[CEILING_BASE] = run_episodes(envs.make_baseline(CEILING_BASE, vr_config), env_fn, episodes, seed)
    return played


def ceiling_records(vr_config: envs.VREdgeConfig, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                    base: str | Act = CEILING_BASE) -> Records:
    """The causal ceiling's records (:class:`envs.belief_mpc.BeliefMPC` on ``base``, its defaults) on the held-out
    episodes ``seed`` gives, every env's observation at every step in one batched env (its filter keeps a row each)."""
    return run_episodes(BeliefMPC(vr_config, base=base), env_fn, episodes, seed, num_envs=64, whole_batch=True)


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
    compared = list(names) + [r for r in REFERENCES if r in played]
    paired = {name: paired_difference(played[label], played[name]) for name in compared}
    with_qoe = all("qoe_lin" in r for records in played.values() for r in records)
    paired_qoe = {name: paired_difference(played[label], played[name], "qoe_lin") for name in compared} \
        if with_qoe else {}
    best, _ = best_baseline(list(names), vr_config, env_fn, validation_seeds(run_seed, SELECTION_EPISODES))
    gap = gap_closed(played[label], played[best], played[REFERENCE]) if REFERENCE in played and best else None
    return Comparison(results, paired, best, gap, paired_qoe, *ceiling_figures(played, label))


def ceiling_figures(played: dict[str, Records], label: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(capture, causal_share)`` where the causal ceiling (:data:`BELIEF`) was played, paired over the same
    episodes, each a ratio of mean leads over :data:`CEILING_BASE` with its 95% interval (delta method,
    :func:`trainer.evaluation.statistics.gap_closed`): the **capture** ``(policy - fair_share) / (belief -
    fair_share)``, with ``ceiling_tight`` (false where the policy scores above the ceiling: it is then no ceiling,
    and a capture above 1 no success); the **causal share** ``(belief - fair_share) / (clairvoyant - fair_share)``
    where the clairvoyant was played too."""
    if BELIEF not in played:
        return None, None
    base, ceiling = played[CEILING_BASE], played[BELIEF]
    capture = gap_closed(played[label], base, ceiling)
    capture["ceiling_tight"] = paired_difference(ceiling, played[label])["mean"] >= 0
    causal = gap_closed(ceiling, base, played[REFERENCE]) if REFERENCE in played else None
    return capture, causal


def comparison_payload(comparison: Comparison, label: str, names: Sequence[str]) -> dict[str, Any]:
    """A comparison as ``evaluation.json`` holds it: ``policy``, ``baselines``, ``reference`` (by name),
    ``paired_reward_per_step``, ``paired_qoe_lin`` (VR-edge), ``best_baseline``, ``best_baseline_picked_on``,
    ``gap_closed``, ``capture`` and ``causal_share`` (:func:`ceiling_figures`; ``None`` where not played)."""
    results, best = comparison.results, comparison.best
    return {"policy": results[label], "baselines": {n: results[n] for n in names},
            "reference": {r: results[r] for r in REFERENCES if r in results},
            "paired_reward_per_step": comparison.paired,
            **({"paired_qoe_lin": comparison.paired_qoe_lin} if comparison.paired_qoe_lin else {}),
            "best_baseline": best,
            "best_baseline_picked_on": f"{SELECTION_EPISODES} validation episodes" if best else None,
            "gap_closed": comparison.gap, "capture": comparison.capture, "causal_share": comparison.causal_share}


class Cell(NamedTuple):
    """One (users, churn) pair: ``users`` active (a number, or a range ``"LOW-HIGH"`` drawn per episode), each
    leaving with probability ``churn`` per step."""

    users: int | str
    churn: float


def cells_of(users: Sequence[int | str], churns: Sequence[float]) -> list[Cell]:
    """Every (users, churn) pair, users first: ``cells_of((2, 4), (0, 0.05))`` is 2 with 0, 2 with 0.05, 4 with 0,
    4 with 0.05."""
    return [Cell(u, float(c)) for u, c in itertools.product(users, churns)]


def cell_slots(model: nn.Module, cfg: TrainConfig, trained: envs.VREdgeConfig, cells: Sequence[Cell]) -> int:
    """The slot count every cell is played with: the most users asked for, or, for a policy whose parameters fix
    its slot count, its own (``trained.num_users``). A :class:`envs.settings.ConfigError` where the policy cannot
    act on the cells: more users than its slots, or users that vary for a policy trained without the mask."""
    asked = ",".join(dict.fromkeys(str(c.users) for c in cells))
    if model.layout.kind == "set":  # no parameter depends on the slot count
        slots = max(most_users(c.users) for c in cells)
    elif (slots := trained.num_users) < max(most_users(c.users) for c in cells):
        raise ConfigError("users", asked, message=(
            f"--users {asked}: the policy ({model.layout.kind.replace('_', '-')}, "
            f"policy_arch = {cfg.policy_arch!r}) acts on {slots} user slots, which its parameters fix; pass --users "
            f"up to {slots}, or train with policy_arch = \"set\" (a policy for any slot count)"))
    varying = [c for c in cells if envs.VREdgeConfig(num_users=slots, users=c.users, churn=c.churn).varies]
    if varying and not trained.masked:
        c = varying[0]
        raise ConfigError("users", asked, message=(
            f"--users {c.users} --churn {c.churn:g}: the policy was trained on {trained.num_users} users that never "
            "vary, without the active mask in its observation, so it cannot act where users vary; train with "
            f"--env-kwargs observe_active=true (or users=LOW-HIGH, churn), or pass --users {slots} --churn 0"))
    return slots


def check_vr_edge(cfg: TrainConfig, cells: Sequence[Cell]) -> None:
    """A :class:`envs.settings.ConfigError` unless ``cfg``'s env is VR-edge, the env whose cells have users."""
    if cfg.env != "VREdge-v0":
        raise ConfigError("users", ",".join(str(c.users) for c in cells),
                          message=f"--users and --churn apply to VREdge-v0, not {cfg.env}; drop them")


def cell_env_kwargs(env_kwargs: dict[str, Any], slots: int, cell: Cell, masked: bool) -> dict[str, Any]:
    """The env arguments ``cell`` is played with: the run's ``env_kwargs`` with ``slots`` slots, the cell's users
    and churn, and the active mask in the observation where the run was trained with it (``masked``).

    >>> cell_env_kwargs({"num_users": 6, "users": "2-6"}, 6, Cell(4, 0.0), masked=True)
    {'num_users': 6, 'users': 4, 'churn': 0.0, 'observe_active': True}
    """
    kwargs = {**env_kwargs, "num_users": slots, "users": cell.users, "churn": cell.churn}
    return {**kwargs, "observe_active": True} if masked else kwargs


class CellResult(NamedTuple):
    """What one cell's players scored (:func:`play_cells`)."""

    cell: Cell
    env_kwargs: dict[str, Any]  # the env arguments it was played with
    comparison: Comparison


def play_cells(model: nn.Module, cfg: TrainConfig, cells: Sequence[Cell], env_kwargs: dict[str, Any],
               label: str, names: Sequence[str], episodes: int, seed: int, reference: bool | Sequence[str] = True,
               deterministic: bool = True, ceiling_base: str = CEILING_BASE) -> list[CellResult]:
    """Each cell's players (:func:`play_contenders`: the policy ``model`` as ``label``, the baselines ``names``, the
    reference) on the same held-out episodes of ``seed``, in cells of :func:`cell_slots` slots on ``env_kwargs``
    (the run's, held out), and how the policy compares (:func:`compare_contenders`)."""
    check_vr_edge(cfg, cells)
    trained = envs.VREdgeConfig(**env_kwargs)
    slots = cell_slots(model, cfg, trained, cells)
    act = policy_actions(model, deterministic)
    out = []
    for cell in cells:
        kwargs = cell_env_kwargs(env_kwargs, slots, cell, trained.masked)
        vr_config, env_fn = envs.VREdgeConfig(**kwargs), functools.partial(gym.make, cfg.env, **kwargs)
        played = play_contenders(act, label, names, vr_config, env_fn, episodes, seed, reference, ceiling_base)
        out.append(CellResult(cell, kwargs, compare_contenders(played, label, names, vr_config, env_fn, cfg.seed)))
    return out


def cell_entry(result: CellResult, label: str, names: Sequence[str]) -> dict[str, Any]:
    """One cell as the ``cells`` list of ``evaluation_cells.json`` holds it: ``users``, ``churn``, the keys of
    :func:`comparison_payload`, and the ``env_kwargs`` it was played with."""
    return {"users": result.cell.users, "churn": result.cell.churn,
            **comparison_payload(result.comparison, label, names), "env_kwargs": result.env_kwargs}


def evaluate_cells(model: nn.Module, cfg: TrainConfig, users: Sequence[int | str], churns: Sequence[float], *,
                   episodes: int = 50, seed: int = 0, baselines: Sequence[str] = tuple(envs.BASELINES),
                   reference: bool | Sequence[str] = True, deterministic: bool = True,
                   env_kwargs: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """The policy ``model`` (trained as ``cfg`` says), the ``baselines`` and the reference on the same held-out
    episodes for each (users, churn) pair (:func:`play_cells`), one :func:`cell_entry` per pair, users first;
    ``env_kwargs`` in place of the run's own held-out ones. What ``trainer.evaluate --users --churn --json`` lists
    as ``cells``; a :class:`envs.settings.ConfigError` where the policy cannot act on the cells."""
    kwargs = held_out_env_kwargs(cfg.env_options, "") if env_kwargs is None else env_kwargs
    label = f"policy ({'greedy' if deterministic else 'stochastic'})"
    results = play_cells(model, cfg, cells_of(users, churns), kwargs, label, list(baselines), episodes, seed,
                         reference, deterministic)
    return [cell_entry(r, label, list(baselines)) for r in results]


def _user_axis(users: int | str) -> float:
    """Where a cell's users go on the plot's axis: the number, or a range's middle."""
    low, _, high = str(users).partition("-")
    return (int(low) + int(high or low)) / 2


def _finite(value: float | None) -> float:
    """``value``, or 0 where there is none (one episode has no interval; JSON keeps ``None`` for NaN)."""
    return value if value is not None and math.isfinite(value) else 0.0


def plot_cells(entries: list[dict[str, Any]], out: Path) -> Path | None:
    """Reward per step against the users of each cell (:func:`cell_entry`'s), one line per player with 95% intervals,
    one panel per churn; written as ``out``; ``None`` without matplotlib."""
    try:
        plt = pyplot()
    except ImportError:
        return None
    churns = list(dict.fromkeys(e["churn"] for e in entries))
    fig, axes = plt.subplots(1, len(churns), figsize=(5.5 * len(churns), 4.2), squeeze=False, sharey=True)
    players = [("policy", lambda e: e["policy"])]
    players += [(n, functools.partial(lambda e, n: e["baselines"][n], n=n)) for n in entries[0]["baselines"]]
    players += [(n, functools.partial(lambda e, n: e["reference"][n], n=n)) for n in entries[0]["reference"]]
    for ax, churn in zip(axes[0], churns):
        rows = [e for e in entries if e["churn"] == churn]
        xs = [_user_axis(e["users"]) for e in rows]
        dodge = 0.05 * min([b - a for a, b in zip(sorted(xs), sorted(xs)[1:]) if b > a] or [1.0])
        for i, (name, of) in enumerate(players):  # (each player a little aside: the intervals overlap less)
            ax.errorbar([x + (i - (len(players) - 1) / 2) * dodge for x in xs],
                        [of(e)["reward_per_step"] for e in rows], color=f"C{i}", marker="o", capsize=3,
                        yerr=[_finite(of(e)["reward_per_step_ci95"]) for e in rows], label=name)
        ax.set_xticks(xs, [str(e["users"]) for e in rows])
        ax.set(title=f"churn {churn:g}", xlabel="active users")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean reward per step (95% CI)")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    write_figure(fig, out)
    plt.close(fig)
    return out

