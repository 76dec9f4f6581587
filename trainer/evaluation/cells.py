"""Evaluation across cells: a policy, the baselines and the clairvoyant reference played on the same held-out
episodes for each (users, churn) pair (``python -m trainer.evaluate --users 2,4,8,12,16 --churn 0,0.05``), each
cell as ``trainer.evaluate`` plays one without ``--users`` (:mod:`trainer.evaluation.contenders`).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
from torch import nn

import envs
from envs.profiles import profile_of, profiled_envs
from envs.settings import ConfigError
from trainer.arguments import most_users
from trainer.config import TrainConfig
from trainer.evaluation.contenders import (
    BELIEF_BASE,
    REFERENCES,
    WITH_CRITIC,
    Comparison,
    compare_contenders,
    comparison_payload,
    play_contenders,
)
from trainer.evaluation.episodes import (
    held_out_env_kwargs,
    policy_actions,
)
from trainer.evaluation.policies import critic_value
from trainer.evaluation.report import pyplot, write_figure
from trainer.evaluation.servable import LOST_IN_MOST_EPISODES, UNSERVABLE


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
    """A :class:`envs.settings.ConfigError` unless ``cfg``'s env has cells of users (its profile says)."""
    if not profile_of(cfg.env).cells:
        raise ConfigError("users", ",".join(str(c.users) for c in cells),
                          message=f"--users and --churn apply to {', '.join(profiled_envs('cells'))}, not {cfg.env}; "
                                  "drop them")


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
               label: str, names: Sequence[str], episodes: int, seed: int, reference: bool | Sequence[str] = False,
               deterministic: bool = True, belief_base: str = BELIEF_BASE) -> list[CellResult]:
    """Each cell's players (:func:`play_contenders`: the policy ``model`` as ``label``, the baselines ``names``, the
    reference) on the same held-out episodes of ``seed``, in cells of :func:`cell_slots` slots on ``env_kwargs``
    (the run's, held out), and how the policy compares (:func:`compare_contenders`)."""
    check_vr_edge(cfg, cells)
    trained = envs.VREdgeConfig(**env_kwargs)
    slots = cell_slots(model, cfg, trained, cells)
    act = policy_actions(model, deterministic)
    critic = critic_value(model, cfg) if belief_base == WITH_CRITIC else None
    out = []
    for cell in cells:
        kwargs = cell_env_kwargs(env_kwargs, slots, cell, trained.masked)
        vr_config, env_fn = envs.VREdgeConfig(**kwargs), functools.partial(gym.make, cfg.env, **kwargs)
        played = play_contenders(act, label, names, vr_config, env_fn, episodes, seed, reference, belief_base,
                                 critic)
        out.append(CellResult(cell, kwargs, compare_contenders(played, label, names, vr_config, env_fn, cfg.seed)))
    return out


def cell_entry(result: CellResult, label: str, names: Sequence[str]) -> dict[str, Any]:
    """One cell as the ``cells`` list of ``evaluation_cells.json`` holds it: ``users``, ``churn``, the keys of
    :func:`comparison_payload`, and the ``env_kwargs`` it was played with."""
    return {"users": result.cell.users, "churn": result.cell.churn,
            **comparison_payload(result.comparison, label, names), "env_kwargs": result.env_kwargs}


def evaluate_cells(model: nn.Module, cfg: TrainConfig, users: Sequence[int | str], churns: Sequence[float], *,
                   episodes: int = 50, seed: int = 0, baselines: Sequence[str] = tuple(envs.BASELINES),
                   reference: bool | Sequence[str] = False, deterministic: bool = True,
                   env_kwargs: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """The policy ``model`` (trained as ``cfg`` says), the ``baselines`` and the reference on the same held-out
    episodes for each (users, churn) pair (:func:`play_cells`), one :func:`cell_entry` per pair, users first;
    ``env_kwargs`` in place of the run's own held-out ones. What ``trainer.evaluate --users --churn --json`` lists
    as ``cells``; a :class:`envs.settings.ConfigError` where the policy cannot act on the cells."""
    kwargs = held_out_env_kwargs(cfg.env, cfg.env_options) if env_kwargs is None else env_kwargs
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


def _players(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A cell entry's (:func:`cell_entry`'s) players' results, by name: the policy, the baselines, the references."""
    return {"policy": entry["policy"], **entry["baselines"], **entry["reference"]}


def _cell_name(entry: dict[str, Any]) -> str:
    """A cell's users and churn, as the tables' first two columns."""
    return f"{str(entry['users']):>5} {entry['churn']:>6g}"


def _unservable_mark(entry: dict[str, Any]) -> str:
    """``  UNSERVABLE`` after a table's line of a cell nobody serves (:mod:`trainer.evaluation.servable`)."""
    return f"  {UNSERVABLE}" if entry.get("unservable") else ""


def unservable_note(entries: list[dict[str, Any]]) -> str:
    """The line under a cell table that says what its :data:`UNSERVABLE` marks mean; ``""`` where none is."""
    marked = [e for e in entries if e.get("unservable")]
    if not marked:
        return ""
    return (f"{UNSERVABLE} ({len(marked)} of {len(entries)} cells): the policy and the best baseline lose their users "
            f"(a user abandons) in more than {LOST_IN_MOST_EPISODES:g} of their episodes there: nobody serves "
            "those cells, so their comparisons are no result (docs/traces.md: how a trace set's scale sets the "
            "cell's difficulty)")


def scores_table(entries: list[dict[str, Any]]) -> str:
    """Each player's mean reward per step in each cell (:func:`cell_entry`'s), a line per cell: the short form of
    what each scored (each mean's interval, and every other statistic, in ``evaluation_cells.json``)."""
    names = list(_players(entries[0]))
    width = max([8, *(len(n) + 1 for n in names)])
    lines = ["reward per step, mean over the held-out episodes:",
             f"{'users':>5} {'churn':>6}" + "".join(f"{n:>{width}}" for n in names)]
    lines += [_cell_name(e) + "".join(f"{_players(e)[n]['reward_per_step']:>{width}.3f}" for n in names)
              + _unservable_mark(e) for e in entries]
    return "\n".join(lines + ([note] if (note := unservable_note(entries)) else []))


_FIGURES = {"gap closed": "gap_closed", "capture": "capture"}  # a cell's ratios where references were played


class Lead(NamedTuple):
    """The policy minus one other player in one cell, paired over the same episodes (:func:`leads`)."""

    users: int | str
    churn: float
    other: str
    mean: float
    ci95: float | None  # None: one episode, no interval


def leads(entries: list[dict[str, Any]]) -> list[Lead]:
    """The policy's paired lead in reward per step over each baseline (and reference) in each cell, in the order of
    the cells, then of the players."""
    return [Lead(e["users"], e["churn"], name, d["mean"], d["ci95"])
            for e in entries for name, d in e["paired_reward_per_step"].items()]


def leads_table(entries: list[dict[str, Any]], most_named: int = 6) -> str:
    """The summary of a cell evaluation: the policy minus each baseline (and reference) per cell, paired over the
    same episodes (mean ± 95% interval), a line per cell (users x churn), with the gap closed and the capture where
    the references were played; then how many of the leads over a baseline are above 0 with 95% confidence, how
    many below, and (up to ``most_named``) which are below; ``""`` where the policy played alone."""
    found = leads(entries)
    if not found:
        return ""
    others = list(dict.fromkeys(lead.other for lead in found))
    figures = [title for title, key in _FIGURES.items() if any(e.get(key) for e in entries)]
    width = max([15, *(len(n) + 2 for n in others + figures)])
    by_cell = {(lead.users, lead.churn, lead.other): lead for lead in found}
    lines = ["policy minus each, reward per step paired over the same episodes (mean ± 95% CI), per cell"
             + (f"; then {', '.join(figures)} (fractions, 95% CI)" if figures else "") + ":",
             f"{'users':>5} {'churn':>6}" + "".join(f"{n:>{width}}" for n in others + figures)]
    for e in entries:
        cells = [by_cell.get((e["users"], e["churn"], n)) for n in others]
        ratios = [e.get(_FIGURES[f]) for f in figures]
        lines.append(_cell_name(e) + "".join(f"{_lead_text(c) if c else '-':>{width}}" for c in cells)
                     + "".join(f"{_ratio_text(r):>{width}}" for r in ratios) + _unservable_mark(e))
    unserved = {(e["users"], e["churn"]) for e in entries if e.get("unservable")}
    # a reference is a bound, not a rival; a cell nobody serves holds no result to count
    against = [lead for lead in found if lead.other not in REFERENCES and (lead.users, lead.churn) not in unserved]
    if not against:
        return "\n".join(lines)
    ahead = sum(_above_zero(lead) for lead in against)
    behind = [lead for lead in against if _above_zero(lead._replace(mean=-lead.mean))]
    spanning = len(against) - ahead - len(behind)
    left_out = f" (the {UNSERVABLE} cells left out)" if unserved else ""
    lines.append(f"\nthe policy leads (95% interval above 0) in {ahead} of {len(against)} (cell, baseline) pairs"
                 f"{left_out}, trails (below 0) in {len(behind)}"
                 + (f", the interval spans 0 in {spanning}" if spanning else ""))
    if behind:
        lines.append("trails: " + ", ".join(f"{b.other} at {b.users} users, churn {b.churn:g} ({_lead_text(b)})"
                                            for b in behind[:most_named])
                     + (f" and {len(behind) - most_named} more" if len(behind) > most_named else ""))
    return "\n".join(lines)


def _ratio_text(figure: dict[str, Any] | None) -> str:
    """``0.250±0.120`` of a cell's gap closed or capture; ``-`` where there is none (undefined: NaN)."""
    if not figure or not math.isfinite(figure["fraction"]):
        return "-"
    ci = figure.get("ci95")
    return f"{figure['fraction']:.3f}" + (f"±{ci:.3f}" if ci is not None and math.isfinite(ci) else "")


def _above_zero(lead: Lead) -> bool:
    """Whether the policy's lead is above 0 with 95% confidence (one episode has no interval: not)."""
    return lead.ci95 is not None and math.isfinite(lead.ci95) and lead.mean - lead.ci95 > 0


def _lead_text(lead: Lead) -> str:
    """``+0.022±0.009`` (no interval for one episode)."""
    return f"{lead.mean:+.3f}" + (f"±{lead.ci95:.3f}" if lead.ci95 is not None and math.isfinite(lead.ci95) else "")


class Band(NamedTuple):
    """Where the players of a cell evaluation's plot go (:func:`plot_band`)."""

    low: float  # the main axis' range of reward per step
    high: float
    far_below: tuple[str, ...]  # the players drawn in a panel of their own, under it


def plot_band(entries: list[dict[str, Any]]) -> Band:
    """The main axis' range and the players off it: a player whose mean falls below those of the policy, the best
    baseline of each cell and the references by more than their spread, in some cell (``random``, ``lowest``), is
    far below, drawn in a panel of its own; the main axis spans every other player's intervals.

    Why: ``random`` (down to -0.75) and ``lowest`` stretched one axis over the band where the policy and six
    baselines lie (0.6-0.75), and the policy could not be told from ``fair_share``.
    """
    core = []  # the policy, each cell's best baseline, the references: what the axis must tell apart
    for e in entries:
        core += [e["policy"]["reward_per_step"], *(r["reward_per_step"] for r in e["reference"].values())]
        core += [max(r["reward_per_step"] for r in e["baselines"].values())] if e["baselines"] else []
    low, high = min(core), max(core)
    far = tuple(n for n in _players(entries[0]) if n != "policy" and any(
        _players(e)[n]["reward_per_step"] < low - max(high - low, 1e-3) for e in entries))
    shown = [(r["reward_per_step"], _finite(r["reward_per_step_ci95"]))
             for e in entries for n, r in _players(e).items() if n not in far]
    low, high = min(m - ci for m, ci in shown), max(m + ci for m, ci in shown)
    margin = 0.06 * max(high - low, 1e-3)
    return Band(low - margin, high + margin, far)


def cells_figure(entries: list[dict[str, Any]]) -> Any:
    """The matplotlib figure of :func:`plot_cells`: reward per step against the users, one line per player with its
    95% intervals, one column of panels per churn; the competitive players on the main row, on :func:`plot_band`'s
    range, the players far below it on a row of their own; the legend right of the panels, clear of every line."""
    plt = pyplot()
    churns = list(dict.fromkeys(e["churn"] for e in entries))
    band = plot_band(entries)
    rows = 2 if band.far_below else 1
    fig, axes = plt.subplots(rows, len(churns), figsize=(5.5 * len(churns) + 2.2, 4.2 + 2.2 * (rows - 1)),
                             squeeze=False, sharex="col", sharey="row", layout="constrained",
                             gridspec_kw={"height_ratios": [2.2, 1][:rows]})
    names = list(_players(entries[0]))
    for column, churn in enumerate(churns):
        cells = [e for e in entries if e["churn"] == churn]
        xs = [_user_axis(e["users"]) for e in cells]
        dodge = 0.05 * min([b - a for a, b in zip(sorted(xs), sorted(xs)[1:]) if b > a] or [1.0])
        for i, name in enumerate(names):  # (each player a little aside: the intervals overlap less)
            ax = axes[1 if name in band.far_below else 0][column]
            scores = [_players(e)[name] for e in cells]
            ax.errorbar([x + (i - (len(names) - 1) / 2) * dodge for x in xs], [r["reward_per_step"] for r in scores],
                        yerr=[_finite(r["reward_per_step_ci95"]) for r in scores], color=f"C{i}", marker="o",
                        capsize=3, label=name)
        axes[0][column].set(title=f"churn {churn:g}", ylim=(band.low, band.high))
        axes[-1][column].set(xlabel="active users")
        axes[-1][column].set_xticks(xs, [str(e["users"]) for e in cells])
        for ax in axes[:, column]:
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean reward per step (95% CI)")
    if band.far_below:
        axes[1][0].set_ylabel("far below (own scale)")
    shown = {}  # each player's line once, in the players' order
    for ax in axes[:, 0]:
        shown.update({label: handle for handle, label in zip(*ax.get_legend_handles_labels())})
    fig.legend([shown[n] for n in names], names, loc="outside right upper", fontsize="small")
    return fig


def plot_cells(entries: list[dict[str, Any]], out: Path) -> Path | None:
    """:func:`cells_figure`, written as ``out``; ``None`` without matplotlib."""
    try:
        plt = pyplot()
    except ImportError:
        return None
    fig = cells_figure(entries)
    write_figure(fig, out)
    plt.close(fig)
    return out
