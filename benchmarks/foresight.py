"""The foresight curve: the causal reference told the true next k rounds, against k.

    python -m benchmarks.foresight [--k 0 1 2 4 8] [--episodes 16] [--seed 0] [--checkpoint RUN_DIR]
                                   [--env-kwargs K=V,...] [--horizon 12] [--scenarios 16] [--sweeps 1] [--out DIR]

Plays ``envs.foresight.ForesightMPC`` for each ``k`` (the true capacity and users' channels of the next k rounds,
the rest of its horizon drawn from the filter given them; ``k = 0`` is ``envs.belief_mpc.BeliefMPC``, the same
numbers), ``fair_share``, the clairvoyant reference (``envs.planner.ClairvoyantPlanner``, its defaults) and, with
``--checkpoint``, a trained policy (greedy, loaded as ``trainer.evaluate`` loads it, on the run's env arguments)
on the same held-out episodes as ``trainer.evaluate``. Each is paired with BeliefMPC (k = 0), mean ± 95% interval,
and given its share of the clairvoyant's lead over BeliefMPC (delta method): the curve splits that lead into what
knowing the next rounds is worth and what the clairvoyant's search over them adds. Prints a Markdown table and
writes it to ``OUT/foresight.md``, every number to ``OUT/foresight.csv``, and ``OUT/foresight.png``: reward per step
against k (95% intervals), the other players as horizontal lines.
"""

from __future__ import annotations

import csv
import functools
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym

import envs
from benchmarks.machine import print_machine
from envs.belief import filter_refusal
from envs.belief_mpc import BeliefMPCSettings
from envs.settings import ConfigError
from trainer.arguments import OneLineParser

Records = list[dict[str, float]]
CLAIRVOYANT = "clairvoyant"
FILES = ("foresight.md", "foresight.csv", "foresight.png")
COLUMNS = ("player", "k", "episodes", "reward_per_step", "reward_per_step_ci95", "vs_k0", "vs_k0_ci95", "wins",
           "share_of_clairvoyant_lead", "share_ci95", "seconds")


class Played(NamedTuple):
    """One player's episodes: its name, ``k`` (a ForesightMPC's; ``None`` for the others), records and seconds."""

    name: str
    k: int | None
    records: Records
    seconds: float


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.foresight``."""
    parser = _parser()
    args = parser.parse_args(argv)
    settings = _checked(parser, args)
    try:
        policy, env_kwargs = _policy(parser, args)
    except ValueError as e:  # (a checkpoint that does not load: CheckpointError is one)
        parser.error(str(e))
    config = _config(parser, env_kwargs)
    print_machine()
    print(f"{args.episodes} held-out episodes (seed {args.seed}), env {env_kwargs or 'defaults'}, BeliefMPC "
          f"horizon {settings.horizon}, {settings.scenarios} scenarios, {settings.sweeps} sweep(s)", flush=True)
    played = _play_all(args, config, env_kwargs, settings, policy)
    rows = table_rows(played)
    text = markdown(rows)
    print(text)
    _write(args.out, text, rows, played)
    print(f"wrote {', '.join(str(args.out / f) for f in FILES)}")


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m benchmarks.foresight", description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, nargs="+", default=[0, 1, 2, 4, 8],
                   help="rounds of the true future known, each a player (k >= --horizon: all the horizon's; 0, "
                        "BeliefMPC, is always played; default: %(default)s)")
    p.add_argument("--episodes", type=int, default=16, help="held-out episodes per player (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed, as trainer.evaluate's (default: 0)")
    p.add_argument("--checkpoint", default="", metavar="RUN_DIR",
                   help="a run directory or checkpoint file whose greedy policy is played too (default: none)")
    p.add_argument("--pick", choices=("best", "latest"), default="best", help="as trainer.evaluate's")
    p.add_argument("--env-kwargs", default="", metavar="K=V,...",
                   help="VR-edge's arguments (over the run's own with --checkpoint), e.g. num_users=4,max_steps=100")
    defaults = BeliefMPCSettings()
    for name in ("horizon", "scenarios", "sweeps"):
        p.add_argument(f"--{name}", type=int, default=getattr(defaults, name),
                       help=f"BeliefMPC's {name} (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/foresight"),
                   help=f"folder for {', '.join(FILES)} (made if missing; default: %(default)s)")
    return p


def _checked(parser: OneLineParser, args: Any) -> BeliefMPCSettings:
    """BeliefMPC's settings, once every number given is checked: a mistake is one line and exit status 2."""
    if bad := [k for k in args.k if k < 0]:
        parser.error(f"--k must be integers >= 0 (rounds of the true future known), got {bad[0]}")
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: a file is there; name a folder (made if missing)")
    args.k = sorted(set(args.k) | {0})  # k = 0 (BeliefMPC) is what the others are paired with
    try:
        return BeliefMPCSettings(horizon=args.horizon, scenarios=args.scenarios, sweeps=args.sweeps)
    except ConfigError as e:
        parser.error(str(ConfigError(e.key, e.value, e.rule)))  # (named by its flag)


def _policy(parser: OneLineParser, args: Any) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's greedy policy (``None`` without ``--checkpoint``) and the env arguments every player plays
    with: ``--env-kwargs`` over the run's own, as ``trainer.evaluate`` has them."""
    from trainer.config import parse_env_kwargs
    from trainer.evaluation import held_out_env_kwargs, policy_actions

    try:
        given = parse_env_kwargs(args.env_kwargs)
    except ValueError as e:
        parser.error(f"--env-kwargs={args.env_kwargs!r} is invalid: {e}")
    if not args.checkpoint:
        return None, given
    if not Path(args.checkpoint).exists():
        parser.error(f"--checkpoint {args.checkpoint}: no such checkpoint file or run directory")
    from trainer.evaluation.policies import trained_model

    model, cfg, source = trained_model(args.checkpoint, args.pick, held_out_env_kwargs("VREdge-v0", {}, given))
    if cfg.env != "VREdge-v0":
        parser.error(f"--checkpoint {args.checkpoint}: trained on {cfg.env}; the foresight curve is VREdge-v0's")
    print(f"loaded {source}", file=sys.stderr)
    return policy_actions(model, deterministic=True), held_out_env_kwargs(cfg.env, cfg.env_options, given)


def _config(parser: OneLineParser, env_kwargs: dict[str, Any]) -> envs.VREdgeConfig:
    """VR-edge's config of ``env_kwargs``; a usage error where it is invalid or has no hidden state to filter."""
    try:
        config = envs.VREdgeConfig(**env_kwargs)
    except (ConfigError, TypeError, ValueError) as e:
        parser.error(f"--env-kwargs: {e}")
    if refused := filter_refusal(config):
        parser.error(f"--env-kwargs: {refused}")
    return config


def _play_all(args: Any, config: envs.VREdgeConfig, env_kwargs: dict[str, Any], settings: BeliefMPCSettings,
              policy: Any) -> list[Played]:
    """Every player's records on the same held-out episodes, each said as it is played."""
    from envs.foresight import ForesightMPC
    from envs.planner import ClairvoyantPlanner
    from trainer.evaluation import batched_reference_episodes, reference_episodes, run_episodes, summarize

    env_fn = functools.partial(gym.make, "VREdge-v0", **env_kwargs)
    mpc = {"horizon": settings.horizon, "scenarios": settings.scenarios, "sweeps": settings.sweeps}
    players: list[tuple[str, int | None, Any]] = [
        ("fair_share", None, lambda: run_episodes(envs.make_baseline("fair_share", config), env_fn, args.episodes,
                                                  args.seed)),
        *[(_name(k), k, functools.partial(batched_reference_episodes, ForesightMPC(config, k, **mpc), env_fn,
                                          args.episodes, args.seed, num_envs=64))
          for k in args.k],
        (CLAIRVOYANT, None, lambda: reference_episodes(ClairvoyantPlanner(config), env_fn, args.episodes, args.seed,
                                                       num_envs=64))]
    if policy is not None:
        players.insert(1, ("policy", None, lambda: run_episodes(policy, env_fn, args.episodes, args.seed)))
    played = []
    for name, k, play in players:
        start = time.perf_counter()
        records = play()
        played.append(Played(name, k, records, time.perf_counter() - start))
        print(f"played {name}: {summarize(records)['reward_per_step']:.4f} per step, {played[-1].seconds:.1f} s",
              flush=True)
    return played


def _name(k: int) -> str:
    return "BeliefMPC (k=0)" if k == 0 else f"ForesightMPC k={k}"


def table_rows(played: list[Played]) -> list[dict[str, Any]]:
    """One row per player (:data:`COLUMNS`): its reward per step, paired with BeliefMPC (k = 0), and its share of
    the clairvoyant's lead over BeliefMPC (NaN where that lead is not above 0)."""
    from trainer.evaluation import gap_closed, paired_difference, summarize

    belief = next(p.records for p in played if p.k == 0)
    clairvoyant = next(p.records for p in played if p.name == CLAIRVOYANT)
    rows = []
    for p in played:
        s, d, share = summarize(p.records), paired_difference(p.records, belief), gap_closed(p.records, belief,
                                                                                              clairvoyant)
        rows.append(dict(zip(COLUMNS, (p.name, "" if p.k is None else p.k, len(p.records), s["reward_per_step"],
                                       s["reward_per_step_ci95"], d["mean"], d["ci95"], d["wins"],
                                       share["fraction"], share["ci95"], round(p.seconds, 1)))))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| player | k | reward/step (± 95% CI) | vs BeliefMPC (k=0), paired | wins | share of the clairvoyant's "
             "lead over BeliefMPC | s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['player']} | {r['k']} | {r['reward_per_step']:.4f} ± {r['reward_per_step_ci95']:.4f} | "
                     f"{r['vs_k0']:+.4f} ± {r['vs_k0_ci95']:.4f} | {r['wins']}/{r['episodes']} | "
                     f"{r['share_of_clairvoyant_lead']:.3f} ± {r['share_ci95']:.3f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def _write(out: Path, text: str, rows: list[dict[str, Any]], played: list[Played]) -> None:
    """``foresight.md``, ``foresight.csv`` and ``foresight.png`` in ``out`` (made if missing), each written whole."""
    import io

    from trainer.evaluation.report import write_replacing

    out.mkdir(parents=True, exist_ok=True)
    write_replacing(out / FILES[0], text + "\n")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_replacing(out / FILES[1], buffer.getvalue())
    plot(rows, out / FILES[2])


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    """Reward per step against k with 95% intervals (left) and paired with BeliefMPC (right); the other players as
    horizontal lines (their intervals in the legend)."""
    from trainer.evaluation.report import pyplot, write_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    curve, lines = [r for r in rows if r["k"] != ""], [r for r in rows if r["k"] == ""]
    for ax, (key, what) in zip(axes, (("reward_per_step", "mean reward per step"),
                                      ("vs_k0", "reward per step minus BeliefMPC's, paired"))):
        ax.errorbar([r["k"] for r in curve], [r[key] for r in curve], yerr=[r[key + "_ci95"] for r in curve],
                    marker="o", capsize=4, color="C0", label="ForesightMPC (k = 0: BeliefMPC)")
        for i, r in enumerate(lines):
            ax.axhline(r[key], color=f"C{i + 1}", linestyle="--",
                       label=f"{r['player']} ({r[key]:{'+' if key == 'vs_k0' else ''}.3f} ± {r[key + '_ci95']:.3f})")
        ax.set_xticks([r["k"] for r in curve])
        ax.set_xlabel("k: rounds of the true future known")
        ax.set_ylabel(f"{what} (95% CI)")
        ax.legend(fontsize="small")
    fig.suptitle(f"the foresight curve ({curve[0]['episodes']} held-out episodes)")
    fig.tight_layout()
    write_figure(fig, png)
    plt.close(fig)


if __name__ == "__main__":
    main()
