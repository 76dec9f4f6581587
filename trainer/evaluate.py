"""Evaluate a trained policy against the heuristic baselines on held-out seeds.

    python -m trainer.evaluate --checkpoint RUN_DIR_OR_FILE [--episodes 50] [--seed S] [--pick best|latest]
                               [--deterministic | --stochastic] [--baselines all] [--reference clairvoyant,belief,bound]
                               [--capacity-trace PATH] [--env-kwargs K=V,...] [--users 2,4,8,12,16 --churn 0,0.05]
                               [--json]

A run directory's checkpoint is its ``best`` (highest validation return, from --eval-every)
when it has one, else its newest loadable one; the command says which it loaded. A run trained on traces plays
their held-out test split; --env-kwargs plays any run on other env arguments (e.g. a recorded trace set) that keep
its observation and action shapes. With --users and --churn
the policy, the baselines and the reference are played for each (users, churn) pair on the same held-out
episodes (evaluation_cells.json and .png).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from collectors.stop_signals import exiting_at_once_on_stop_signals
from envs.settings import ConfigError, did_you_mean
from trainer.arguments import (
    OneLineParser,
    churn_levels,
    counted,
    ending_quietly_when_stdout_closes,
    most_users,
    not_a_directory,
    user_counts,
)
from trainer.interrupts import StopSignals, ignore_late_signals

if TYPE_CHECKING:  # (torch loads once the command line is checked)
    import gymnasium as gym
    from torch import nn

    from envs import VREdgeConfig
    from envs.profiles import EnvProfile
    from trainer.config import TrainConfig
    from trainer.evaluation.cells import Cell
    from trainer.evaluation.contenders import Comparison

CELLS_FILES = ("evaluation_cells.json", "evaluation_cells.png")  # what --users/--churn write


@ending_quietly_when_stdout_closes()
def main(argv: list[str] | None = None) -> None:
    """``python -m trainer.evaluate``; Ctrl-C or SIGTERM at any moment is one line and exit status 128 + the
    signal; a reader of its standard output that has gone (``| head -1``) ends it quietly, exit status 141, its
    files written together or not at all."""
    with StopSignals() as signals:
        try:
            _evaluate(argv, signals)
            ignore_late_signals()  # the results are written: `evaluate && export` goes on whatever arrives now
        except KeyboardInterrupt as e:
            print(f"\n{str(e) or 'interrupted'}: the evaluation did not finish (its results are written once every "
                  "episode is played)", file=sys.stderr)
            raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None


def _evaluate(argv: list[str] | None, signals: StopSignals) -> None:
    """Evaluate as ``argv`` asks: the checkpoint's policy and the baselines over the same held-out episodes, the
    table on stdout (stderr with ``--json``), ``evaluation.json`` and its plot written whole."""
    parser = _parser()
    args = parser.parse_args(argv)
    asked_baselines = _checked_before_torch(parser, args)
    _import_the_evaluation()
    import checkpoints
    from trainer.evaluation.episodes import episodes_shown
    from trainer.evaluation.report import plot

    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the JSON alone
    try:
        setup = _setup(parser, args, asked_baselines)
    except (ValueError, checkpoints.CheckpointError) as e:
        raise SystemExit(f"error: {e}") from None
    guard = f", {args.guard} guard" if args.guard else ""  # (the table's row and the plot's bar say it too)
    label = f"policy ({'greedy' if args.deterministic else 'stochastic'}{guard})"
    print(f"loaded {setup.which}: {setup.source}", file=sys.stderr)
    if setup.cells:
        _evaluate_cells(args, setup, label, signals, out)
        return
    with episodes_shown(_episodes_per_cell(args, setup)):
        played, guard = _played(args, setup, label)
        comparison = _compared(played, label, setup)
    payload = {**_payload(args, setup, label, comparison), **({"guard": guard} if guard else {})}
    _print_results(args, setup, comparison, out, guard)
    _write_results(args, setup, payload, lambda png: plot(comparison.results, setup.run_dir, png), signals, out)


def _evaluate_cells(args: argparse.Namespace, setup: _Setup, label: str, signals: StopSignals, out: TextIO) -> None:
    """``--users``/``--churn``: every player on the same held-out episodes for each (users, churn) pair, a line of
    each table per pair (what each scored, then the summary: the policy minus each), ``evaluation_cells.json``
    (``cells``: one entry per pair, every statistic) and its plot."""
    from trainer.evaluation.cells import cell_entry, leads_table, play_cells, plot_cells, scores_table
    from trainer.evaluation.episodes import episodes_shown

    with episodes_shown(len(setup.cells) * _episodes_per_cell(args, setup)):
        results = play_cells(setup.model, setup.cfg, setup.cells, setup.env_kwargs, label, setup.names,
                             args.episodes, args.seed, _with_reference(args, setup), args.deterministic,
                             args.belief_base)
    entries = [cell_entry(r, label, setup.names) for r in results]
    _print_header(args, setup, out)
    print(f"in cells of {results[0].env_kwargs['num_users']} user slots, each line's users and churn in place of "
          "the run's", file=out)
    print(f"\n{scores_table(entries)}", file=out)
    if summary := leads_table(entries):  # (none where the policy played alone)
        print(f"\n{summary}", file=out)
    payload = {**_payload_head(args, setup), "slots": results[0].env_kwargs["num_users"], "cells": entries}
    _write_results(args, setup, payload, lambda png: plot_cells(payload["cells"], png), signals, out, CELLS_FILES)


def _parser() -> OneLineParser:
    """The command line's flags."""
    p = OneLineParser(prog="python -m trainer.evaluate", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint file, or run directory: its best checkpoint when training had --eval-every "
                        "(see --pick), else its newest loadable one")
    p.add_argument("--episodes", type=int, default=50,
                   help="episodes per policy, the same seeds for each (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="evaluation seed (a seed branch that training never uses; default: %(default)s)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--deterministic", dest="deterministic", action="store_true", default=True,
                      help="greedy actions (default)")
    mode.add_argument("--stochastic", dest="deterministic", action="store_false", help="sample actions")
    p.add_argument("--baselines", default="all",
                   help="'all', 'none' or comma-separated names (VR-edge only; default: %(default)s)")
    _add_contender_flags(p)
    _add_env_flags(p)
    p.add_argument("--users", default=None, metavar="LIST",
                   help="VR-edge: evaluate in cells of these active users, comma-separated numbers or ranges "
                        "LOW-HIGH drawn per episode (e.g. 2,4,8,12,16), each with each --churn, all in cells of as "
                        "many slots as the most users (a flat or per-head policy: its own slot count); writes "
                        "evaluation_cells.json/.png (default: the run's own users where only --churn is given)")
    p.add_argument("--churn", default=None, metavar="LIST",
                   help="VR-edge: with --users, the churn levels, comma-separated probabilities within 0..1 (e.g. "
                        "0,0.05; default: the run's own churn)")
    p.add_argument("--pick", choices=("best", "latest"), default="best",
                   help="from a run directory: its best checkpoint (validation, --eval-every) when it has one, "
                        "or the newest (default: %(default)s)")
    p.add_argument("--env", default="", help="fail unless the checkpoint was trained on this env id")
    p.add_argument("--json", action="store_true",
                   help="print the results as JSON to stdout, and nothing else (the table goes to stderr), so "
                        "that `--json > f` and `--json | jq` work")
    p.add_argument("--out", default="", help="where evaluation.json/.png go (with --users or --churn: "
                                             "evaluation_cells.json/.png; default: the run directory)")
    return p


def _add_contender_flags(p: OneLineParser) -> None:
    """The flags of what plays beside the policy (the references) and of how the policy plays (a guard)."""
    p.add_argument("--reference", default=None, metavar="NAMES",
                   help="VR-edge: the references played beside the policy, comma-separated, or none: clairvoyant "
                        "(envs.planner; sees the true future: the fraction of the gap from the best baseline that "
                        "the policy closes), belief (envs.belief_mpc: the causal reference, from observations only: "
                        "the policy's capture of its lead over fair_share and, with clairvoyant, its causal share "
                        "of the clairvoyant's; synthetic cells only), bound (envs.hindsight: a certified upper bound "
                        "on any policy's score per episode, the bracket and the policy's optimality gap; users that "
                        "do not vary; about 14 s an episode on the default cell) (default: clairvoyant; with --users "
                        "or --churn none, as the references cost most of a cell evaluation's time)")
    p.add_argument("--belief-base", choices=("fair_share", "policy", "policy_critic"), default="fair_share",
                   help="with --reference belief: what the causal reference improves by rollout: fair_share, the "
                        "policy evaluated (its forward passes in every rollout), or policy_critic: the policy, each "
                        "rollout 4 rounds ending on the run's critic (the discounted return at the run's --gamma; a "
                        "PPO run), a level kept unless another's lead is one standard error clear: the strongest "
                        "causal player measured (default: %(default)s)")
    p.add_argument("--guard", default="", metavar="NAME",
                   help="play the policy through a guard its env declares, its threshold the highest its statistic "
                        "took on the first 50 validation episodes of the run's own training network (VR-edge: "
                        "volatility: lowest where the cell's capacity jumps more often than there, for networks "
                        "the run never saw; docs/traces.md) (default: none)")


def _add_env_flags(p: OneLineParser) -> None:
    """The flags that replace the run's own env arguments: its traces (``--capacity-trace``, ``--trace-split``) or
    any (``--env-kwargs``)."""
    p.add_argument("--capacity-trace", default="", metavar="PATH",
                   help="VR-edge: replay recorded bandwidth traces as the cell's capacity: a shipped set's name "
                        "(pensieve: its test folder), a set with train/ and test/ folders (its test folder), a "
                        "folder (all its files) or a file; replaces the run's own traces (e.g. a trace directory "
                        "that moved)")
    p.add_argument("--trace-split", default="", choices=("all", "train", "test"),
                   help="VR-edge: play these files of the traces (a set's own train/ or test/ folder, a flat "
                        "folder's hash split; default: as --capacity-trace says)")
    p.add_argument("--env-kwargs", default="", metavar="K=V,...",
                   help="env arguments to play with in place of the run's own, key by key (its others hold), as "
                        "trainer.train takes them, e.g. capacity_trace=pensieve,user_traces=pensieve to play any "
                        "run on recorded networks (a set that comes split: its test folder; capacity_trace= "
                        "drops the run's); only arguments that keep the observation and action shapes")


def _checked_before_torch(parser: OneLineParser, args: argparse.Namespace) -> list[str] | None:
    """The baselines asked for, once what needs no checkpoint is checked: a mistake is a usage error, answered at
    once, before torch loads."""
    _check_numbers(parser, args)
    args.given = _given_env_kwargs(parser, args)
    asked_baselines = _asked_baselines(parser, args.baselines)
    args.reference = _asked_references(parser, args.reference) if args.reference is not None else None
    try:
        args.users = user_counts(args.users) if args.users is not None else None
        args.churn = churn_levels(args.churn) if args.churn is not None else None
    except ConfigError as e:
        parser.error(str(e))
    if "bound" in (args.reference or ()) and (args.users is not None or args.churn is not None):
        parser.error("--reference bound brackets the run's own cell, not the cells of --users/--churn: drop bound, or "
                     "drop --users and --churn")
    args.guard = "" if args.guard == "none" else args.guard
    if args.guard and (args.users is not None or args.churn is not None):
        parser.error("--guard plays one cell (the run's, or --env-kwargs' network over it), not the cells of "
                     "--users/--churn: drop --guard, or drop --users and --churn")
    if not Path(args.checkpoint).exists():  # a typo is answered at once, as a usage error
        parser.error(f"--checkpoint {args.checkpoint}: no such checkpoint file or run directory")
    if args.out and (problem := not_a_directory("--out", args.out)):
        parser.error(problem)
    return asked_baselines


def _given_env_kwargs(parser: OneLineParser, args: argparse.Namespace) -> dict[str, Any]:
    """The env arguments given in place of the run's own: ``--env-kwargs``, with ``--capacity-trace`` and
    ``--trace-split`` in, the trace sets' paths absolute; a mistake in them is a usage error."""
    from envs.traces import TRACE_SETS, absolute_trace_path, trace_root
    from trainer.config import PATH_ENV_KWARGS, parse_env_kwargs

    try:
        given = parse_env_kwargs(args.env_kwargs)
    except ValueError as e:
        parser.error(f"--env-kwargs={args.env_kwargs!r} is invalid: {e}")
    for flag, key in (("--capacity-trace", "capacity_trace"), ("--trace-split", "trace_split")):
        if getattr(args, key) and key in given:
            parser.error(f"{flag} and --env-kwargs {key}=... are the same argument: give one of them")
        if getattr(args, key):
            given[key] = getattr(args, key)
    for key in sorted(PATH_ENV_KWARGS & given.keys()):
        if not isinstance(given[key], str) or not given[key]:
            continue  # (empty: the run's traces dropped; not text: said when the env is built)
        flag = "--capacity-trace" if args.capacity_trace and key == "capacity_trace" else f"--env-kwargs {key}"
        if not trace_root(given[key]).exists():
            parser.error(f"{flag}={given[key]}: no such file or directory (a shipped set is named "
                         f"{' or '.join(TRACE_SETS)})")
        given[key] = absolute_trace_path(given[key])
    return given


def _import_the_evaluation() -> None:
    """Load torch and what the evaluation runs on (seconds), once the command line is checked (``--help`` and a
    typo answer before it); a stop signal meanwhile is one line and an exit, not an import traceback."""
    with exiting_at_once_on_stop_signals("nothing was evaluated; run the same command again"):
        # (the functions below import what they use again: from memory, once it is loaded here)
        import checkpoints  # noqa: F401
        import envs.belief_mpc  # noqa: F401
        import envs.planner  # noqa: F401
        import trainer.evaluation.baselines  # noqa: F401
        import trainer.evaluation.cells  # noqa: F401
        import trainer.evaluation.contenders  # noqa: F401
        import trainer.evaluation.policies  # noqa: F401
        import trainer.evaluation.report  # noqa: F401


class _Setup(NamedTuple):
    """What is evaluated, and where the results go (:func:`_setup`)."""

    source: Path  # the checkpoint file
    sha256: str  # its content hash (checkpoints.content_hash): what the results name it by, with its path
    which: str  # which checkpoint it is, in words
    model: nn.Module  # its policy
    cfg: TrainConfig  # its run's
    names: list[str]  # the baselines played
    env_kwargs: dict[str, Any]  # the env arguments every policy is played with
    env_fn: Callable[[], gym.Env]  # the env they are played in
    vr_config: VREdgeConfig | None  # VR-edge's config (None: another env)
    run_dir: Path  # the run given
    out_dir: Path  # where evaluation.json/.png go
    cells: list[Cell]  # the (users, churn) pairs asked for (--users, --churn); none: the run's own cell
    own_env_kwargs: dict[str, Any]  # the run's own env arguments, as it trained (a guard is calibrated on them)


def _setup(parser: OneLineParser, args: argparse.Namespace, asked_baselines: list[str] | None) -> _Setup:
    """The checkpoint's policy and what it is played against; what the checkpoint cannot do with these flags is a
    usage error, a checkpoint or config that does not load a ``ValueError`` (``CheckpointError``)."""
    import functools

    import gymnasium as gym

    import checkpoints
    import envs
    from envs.profiles import profile_of
    from trainer.evaluation import held_out_env_kwargs, policies
    from trainer.evaluation.policies import critic_refusal, picked_checkpoint, policy_from_state, sampling_refused
    from trainer.evaluation.report import check_writable

    source, state, which = picked_checkpoint(args.checkpoint, args.pick)
    sha256 = checkpoints.content_hash(source)  # right after the load: the weights evaluated (the path may change)
    trained_on = state.get("config", {}).get("env")
    _check_traced(parser, args, trained_on, source)  # before building the env with traces it cannot take
    # the given arguments, traces with the split they are played with (a file: all of it), not the run's own split
    model, cfg = policy_from_state(state, source, held_out_env_kwargs(trained_on, {}, args.given))  # (traces gone?)
    if not args.deterministic and (refused := sampling_refused(cfg, source)):
        parser.error(f"--stochastic: {refused}; drop --stochastic")
    if args.env and args.env != cfg.env:
        parser.error(f"--env {args.env}: {source} was trained on {cfg.env}")
    profile = profile_of(cfg.env)
    names = list(profile.baselines) if asked_baselines is None else asked_baselines
    if other := [n for n in names if n not in profile.baselines]:  # another env's: say why they are not played
        print(f"note: --baselines {', '.join(other)}: {cfg.env} has no such baseline"
              + (f" (its baselines: {', '.join(profile.baselines)})" if profile.baselines else "")
              + ", so it is not played", file=sys.stderr)
        names = [n for n in names if n in profile.baselines]
    env_kwargs = held_out_env_kwargs(cfg.env, cfg.env_options, args.given)
    vr_config = envs.VREdgeConfig(**env_kwargs).read_traces() if profile.cells else None  # a bad trace: at once
    _check_references(parser, args, profile, env_kwargs)
    _check_guard(parser, args, profile, cfg.env)
    if args.belief_base == "policy_critic" and "belief" in (args.reference or ()) and \
            (refused := critic_refusal(model, cfg, source)):
        parser.error(f"--belief-base policy_critic: {refused}; use --belief-base policy")
    run_dir = checkpoints.run_dir_of(args.checkpoint)  # the run given: never one a pointer would lead to
    out_dir = Path(args.out) if args.out else run_dir
    # before minutes of episodes, not after; a folder --out names is made only when the results are written
    check_writable(out_dir, run_dir=None if args.out else run_dir, make=False)
    env_fn = functools.partial(gym.make, cfg.env, **env_kwargs)
    cells = _asked_cells(parser, args, model, cfg, vr_config, names)
    return _Setup(source, sha256, which, model, cfg, names, env_kwargs, env_fn, vr_config, run_dir, out_dir, cells,
                  policies.stored_config(state).env_options)


def _check_traced(parser: OneLineParser, args: argparse.Namespace, env: str | None, source: Path) -> None:
    """A usage error, in one line, where trace arguments are given for an env (``env``, the checkpoint's) that
    takes none."""
    from envs.profiles import profile_of, profiled_envs
    from envs.traces import TRACE_ARGUMENTS

    if traced := sorted((TRACE_ARGUMENTS - profile_of(env).trace_arguments) & args.given.keys()):
        flags = {"--capacity-trace": args.capacity_trace, "--trace-split": args.trace_split}
        flag = next((f for f, given in flags.items() if given), f"--env-kwargs {traced[0]}")
        parser.error(f"{flag} applies to {', '.join(profiled_envs('trace_arguments'))}, not {env} ({source}); "
                     "drop it")


def _check_references(parser: OneLineParser, args: argparse.Namespace, profile: EnvProfile,
                      env_kwargs: dict[str, Any]) -> None:
    """A usage error, in one line, where a reference asked for cannot play the env's cells (its profile says why:
    VR-edge's causal reference filters no traced cell, its bound takes no cell whose users vary)."""
    for name in args.reference or ():
        if name in profile.references and (refused := profile.references[name](env_kwargs)):
            parser.error(f"--reference {name}: {refused}; drop {name}")


def _check_guard(parser: OneLineParser, args: argparse.Namespace, profile: EnvProfile, env: str) -> None:
    """A usage error, in one line, where ``--guard`` names a guard the env's profile does not declare."""
    if args.guard and args.guard not in profile.guards:
        if profile.guards:
            parser.error(f"--guard {args.guard}: {env} declares the guards {', '.join(profile.guards)}; name one")
        parser.error(f"--guard {args.guard}: {env} declares no guard; drop --guard")


def _asked_cells(parser: OneLineParser, args: argparse.Namespace, model: nn.Module, cfg: TrainConfig,
                 vr_config: VREdgeConfig | None, names: list[str]) -> list[Cell]:
    """The (users, churn) pairs ``--users`` and ``--churn`` ask for (the one not given: the run's own), none where
    neither is given; a usage error where the policy cannot act on them (another env than VR-edge, more users
    than a fixed-slot policy has slots, users that vary for a policy trained without the active mask)."""
    from trainer.evaluation.cells import cell_slots, cells_of, check_vr_edge

    if args.users is None and args.churn is None:
        return []
    try:
        if vr_config is None:
            check_vr_edge(cfg, cells_of(args.users or (), args.churn or ()))
        users = args.users if args.users is not None else user_counts(str(vr_config.users or vr_config.num_users))
        churns = args.churn if args.churn is not None else tuple(dict.fromkeys(vr_config.churn_range))  # its ends
        cells = cells_of(users, churns)
        _check_cells_fit(args, cfg, cells, cell_slots(model, cfg, vr_config, cells), vr_config, names)
    except ConfigError as e:
        parser.error(str(e))
    return cells


def _check_cells_fit(args: argparse.Namespace, cfg: TrainConfig, cells: list[Cell], slots: int,
                     vr_config: VREdgeConfig, names: list[str]) -> None:
    """A :class:`ConfigError` where cells of ``slots`` user slots, played as the episodes are (every player of a
    pair in one batched env, a row per episode: :func:`trainer.evaluation.contenders.rows_at_once`; the policy acting
    on up to ``EPISODE_BATCH`` rows at once), would not fit this machine's memory: said before any env is built,
    not as an allocation error once one is (``--users 100000000``)."""
    from trainer.evaluation.cells import cell_env_kwargs
    from trainer.evaluation.contenders import rows_at_once
    from trainer.evaluation.episodes import EPISODE_BATCH
    from trainer.memory import check_cells_fit
    from trainer.run_layout import memory_available

    biggest = max(cells, key=lambda c: most_users(c.users))
    asked = ",".join(dict.fromkeys(str(c.users) for c in cells))
    check_cells_fit(cfg.env, asked, cell_env_kwargs(vr_config.to_dict(), slots, biggest, vr_config.masked),
                    rows_at_once(args.episodes, names, args.reference or ()), memory_available(),
                    widest_layer=max(cfg.hidden_sizes), policy_rows=min(args.episodes, EPISODE_BATCH))


def _played(args: argparse.Namespace, setup: _Setup, label: str
            ) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any] | None]:
    """The records of the episodes each player played, by name: the policy (``label``; through ``--guard``'s guard
    where asked), the baselines, the references asked for; the same held-out seeds for each. With them, the guard's
    name, threshold and share of the policy's steps it played (``None``: no guard)."""
    from trainer.evaluation import policy_actions
    from trainer.evaluation.contenders import WITH_CRITIC, play_contenders
    from trainer.evaluation.policies import critic_value

    critic = critic_value(setup.model, setup.cfg) if args.belief_base == WITH_CRITIC else None
    act = policy_actions(setup.model, args.deterministic)
    guarded, guard = _guarded(args, setup, act) if args.guard else (None, None)
    return play_contenders(act, label, setup.names, setup.vr_config, setup.env_fn, args.episodes, args.seed,
                           _with_reference(args, setup), args.belief_base, critic, policy_records=guarded), guard


def _guarded(args: argparse.Namespace, setup: _Setup, act: Any) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """The policy's records through ``--guard``'s guard, its threshold calibrated on the run's own training
    network (:mod:`trainer.evaluation.guards`), and what the results say of it."""
    from envs.profiles import profile_of
    from trainer.evaluation.guards import CALIBRATION_EPISODES, calibrated_threshold, guarded_records

    guard = profile_of(setup.cfg.env).guards[args.guard]
    threshold = calibrated_threshold(guard.make, act, setup.cfg.env, setup.own_env_kwargs)
    records, share = guarded_records(guard.make, act, threshold, setup.cfg.env, setup.env_kwargs, args.episodes,
                                     args.seed)
    return records, {"name": args.guard, "threshold": threshold, "calibration_episodes": CALIBRATION_EPISODES,
                     "guarded_share": share}


def _episodes_per_cell(args: argparse.Namespace, setup: _Setup) -> int:
    """The episodes an evaluation plays per cell: each player's held-out ones, then each baseline's validation
    episodes (where the best baseline is picked)."""
    from trainer.evaluation.contenders import SELECTION_EPISODES
    from trainer.evaluation.guards import CALIBRATION_EPISODES

    references = _with_reference(args, setup)
    belief_base = "belief" in references and "fair_share" not in setup.names  # (played for the capture)
    players = 1 + len(setup.names) + len(references) + belief_base
    calibration = CALIBRATION_EPISODES if args.guard else 0  # (a guard's threshold: its own episodes)
    return args.episodes * players + SELECTION_EPISODES * len(setup.names) + calibration


def _with_reference(args: argparse.Namespace, setup: _Setup) -> tuple[str, ...]:
    """The references played: those asked for that the env's profile declares; by default its first (VR-edge's
    clairvoyant), and none across cells (``--users``/``--churn``), where it would cost several times what every
    other player costs."""
    from envs.profiles import profile_of

    declared = profile_of(setup.cfg.env).references
    if args.reference is None:
        return () if setup.cells else tuple(declared)[:1]
    return tuple(r for r in args.reference if r in declared)


def _compared(played: dict[str, list[dict[str, float]]], label: str, setup: _Setup) -> Comparison:
    """The statistics of what each player scored, and the policy (``label``) against the others."""
    from trainer.evaluation.contenders import compare_contenders

    return compare_contenders(played, label, setup.names, setup.vr_config, setup.env_fn, setup.cfg.seed)


def _payload(args: argparse.Namespace, setup: _Setup, label: str, comparison: Comparison) -> dict[str, Any]:
    """What ``evaluation.json`` holds (and ``--json`` prints)."""
    from trainer.evaluation.contenders import comparison_payload

    return {**_payload_head(args, setup), **comparison_payload(comparison, label, setup.names)}


def _payload_head(args: argparse.Namespace, setup: _Setup) -> dict[str, Any]:
    """What every evaluation's JSON starts with: what was evaluated, and on which episodes."""
    from envs.belief_mpc import ON_CRITIC
    from trainer.evaluation.contenders import WITH_CRITIC

    belief = "belief" in _with_reference(args, setup)
    return {"checkpoint": str(setup.source.resolve()), "checkpoint_sha256": setup.sha256,
            "checkpoint_kind": setup.which, "env": setup.cfg.env,
            "env_kwargs": setup.env_kwargs, "episodes": args.episodes, "seed": args.seed,
            "actions": "greedy" if args.deterministic else "sampled",
            **({"belief_base": args.belief_base} if belief else {}),
            **({"belief_settings": ON_CRITIC} if belief and args.belief_base == WITH_CRITIC else {})}


def _print_results(args: argparse.Namespace, setup: _Setup, comparison: Comparison, out: TextIO,
                   guard: dict[str, Any] | None = None) -> None:
    """The results as a table on ``out``: what was played (and the guard the policy played through), each player's
    statistics, the paired differences and the gap closed."""
    from envs.profiles import profile_of
    from trainer.evaluation.contenders import comparison_text

    _print_header(args, setup, out)
    if guard:
        words = profile_of(setup.cfg.env).guards[guard["name"]]
        print(f"guard: {guard['name']} at {guard['threshold']:.3f} ({words.statistic}, the highest it was on the first "
              f"{counted(guard['calibration_episodes'], 'validation episode')} of the run's own training network); it "
              f"played {guard['guarded_share']:.0%} of the policy's steps ({words.hedge})", file=out)
    print(comparison_text(comparison, args.belief_base), file=out)


def _print_header(args: argparse.Namespace, setup: _Setup, out: TextIO) -> None:
    """What was played, on ``out``: the env, its arguments and the files it replays (as its profile words them),
    the episodes, the checkpoint."""
    from envs.profiles import profile_of
    from trainer.config import format_env_kwargs

    others, files = profile_of(setup.cfg.env).played_on(setup.env_kwargs, args.given)
    print(f"{setup.cfg.env}{f' ({format_env_kwargs(others)})' if others else ''}: {counted(args.episodes, 'episode')}"
          f" on held-out seeds (seed {args.seed}{files}), {setup.which} {setup.source}", file=out)


def _write_results(args: argparse.Namespace, setup: _Setup, payload: dict[str, Any],
                   draw: Callable[[Path], Path | None], signals: StopSignals, out: TextIO,
                   files: tuple[str, str] = ("evaluation.json", "evaluation.png")) -> None:
    """Write ``files``: the JSON (replaced whole, said when it replaces one) and the plot ``draw`` makes (``None``
    without matplotlib: an earlier evaluation's plot is removed), under ``signals``: a stop signal waits for them,
    then has nothing left to stop. Both are written before a word is said: a reader of ``out`` that has gone
    (``| head -1``) stops the command with the two of one evaluation in place, never a new JSON beside an old plot."""
    from trainer.evaluation.report import json_ready, write_replacing

    payload = json_ready(payload)
    out_dir = setup.out_dir
    replaced = _described(out_dir / files[0])
    with signals.critical():
        out_dir.mkdir(parents=True, exist_ok=True)
        write_replacing(out_dir / files[0], json.dumps(payload, indent=2, allow_nan=False))
        png = draw(out_dir / files[1])
        if png is None:  # no plot of these results: none of earlier ones beside them
            (out_dir / files[1]).unlink(missing_ok=True)
        if replaced:  # a quick look must not pass unnoticed over a long evaluation (export's card reads this file)
            keep = "another --out DIR" if args.out else "--out DIR"
            print(f"replaced the previous {out_dir / files[0]} ({replaced}); {keep} keeps both", file=out)
        print(f"\nwrote {out_dir / files[0]}" +
              (f" and {png}" if png else " (pip install matplotlib for a plot)"), file=out)
        if args.json:
            print(json.dumps(payload, allow_nan=False))
        signals.finish()


def _described(path: Path) -> str:
    """What an earlier ``evaluation.json`` at ``path`` held, in a few words; ``""`` for none."""
    import checkpoints

    try:
        earlier = json.loads(checkpoints.read_small_file(path))
        return (f"{counted(earlier['episodes'], 'episode')}, {earlier.get('actions', 'greedy')} actions, of "
                f"{Path(earlier['checkpoint']).name}")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _check_numbers(parser: OneLineParser, args: argparse.Namespace) -> None:
    """``--episodes`` and ``--seed`` need no checkpoint: a mistake is a usage error, answered before torch loads."""
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} is invalid: must be >= 1")
    if args.seed < 0:
        parser.error(f"--seed={args.seed} is invalid: must be >= 0")


def _asked_references(parser: OneLineParser, spec: str) -> tuple[str, ...]:
    """The references ``--reference`` names (``none``, or names some env's profile declares, comma-separated); an
    unknown name is a usage error."""
    from envs.profiles import names_declared

    if spec.strip() in ("", "none"):
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    known = names_declared("references")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--reference={spec!r} is invalid: unknown {', '.join(unknown)}; use none or names from "
                     f"{', '.join(known)}{did_you_mean(unknown, known)}")
    return names


def _asked_baselines(parser: OneLineParser, spec: str) -> list[str] | None:
    """The baselines ``--baselines`` names (``none``, a comma-separated list; ``None`` for ``all``: every baseline
    of the env played, known once the checkpoint is); a name no env's profile declares is a usage error."""
    from envs.profiles import names_declared

    if spec in ("", "none"):
        return []
    if spec == "all":
        return None
    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = names_declared("baselines")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--baselines={spec!r} is invalid: unknown {', '.join(unknown)}; use all, none or names "
                     f"from {', '.join(known)}{did_you_mean(unknown, known)}")
    return names


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
