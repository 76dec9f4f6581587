"""BeliefMPC's rollout on a trained policy, with and without the run's critic as terminal value, against the policy
itself, paired on the held-out episodes ``trainer.evaluate`` plays (issue 65, item 3).

    python -m benchmarks.rollout_critic RUN --out DIR [--episodes 20] [--seed 0] [--pick best]
                                        [--players truncated:12,critic:12,critic:4]

Plays the run's greedy policy, then each of ``--players``: ``truncated:H`` is ``--belief-base policy`` (today's
rollout, ``H`` rounds, no terminal value; ``H = 12`` is its default), ``critic:H`` is ``--belief-base
policy_critic`` (the discounted rollout ending on the critic, ``envs.belief_mpc.TerminalValue``, ``H`` rounds), the
other settings BeliefMPC's defaults. Each player's records go to ``DIR/<player>.json`` as it finishes (a later call
with the same episodes reuses them), and the table (reward per step, each minus the policy paired over the
episodes with its 95% interval, the seconds each took) to ``DIR/table.md``; the CPU and its load are printed first.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import envs
from benchmarks.machine import print_machine
from trainer.arguments import OneLineParser
from trainer.evaluation.contenders import belief_records
from trainer.evaluation.episodes import held_out_env_kwargs, policy_actions, run_episodes
from trainer.evaluation.policies import critic_refusal, critic_value, trained_model
from trainer.evaluation.report import plus_minus
from trainer.evaluation.statistics import paired_difference, summarize

KINDS = ("truncated", "critic")


def parsed_players(text: str) -> list[tuple[str, int]]:
    """``--players``: ``kind:horizon`` pairs, comma-separated.

    >>> parsed_players("truncated:12,critic:4")
    [('truncated', 12), ('critic', 4)]
    """
    players = []
    for item in text.split(","):
        kind, _, horizon = item.partition(":")
        if kind not in KINDS or not horizon.isdigit() or not 1 <= int(horizon) <= 32:
            raise ValueError(f"--players {item!r}: use KIND:H, KIND one of {', '.join(KINDS)}, H in 1..32")
        players.append((kind, int(horizon)))
    return players


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.rollout_critic", description=__doc__)
    p.add_argument("run", help="run directory or checkpoint file (a PPO run on a synthetic VR-edge cell)")
    p.add_argument("--out", required=True, help="where the records and table.md go")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (default: %(default)s)")
    p.add_argument("--pick", choices=("best", "latest"), default="best")
    p.add_argument("--players", default="truncated:12,critic:12")
    args = p.parse_args(argv)
    try:
        players = parsed_players(args.players)
    except ValueError as e:
        p.error(str(e))
    model, cfg, source = trained_model(args.run, args.pick)
    if refused := critic_refusal(model, cfg, source):
        p.error(refused)
    kwargs = held_out_env_kwargs(cfg.env, cfg.env_options)
    vr_config, env_fn = envs.VREdgeConfig(**kwargs), functools.partial(gym.make, cfg.env, **kwargs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_machine()
    print(f"load average at the start: {os.getloadavg()}; checkpoint {source}; {args.episodes} episodes, seed "
          f"{args.seed}; gamma {cfg.gamma}", flush=True)
    act = policy_actions(model, True)
    played: dict[str, Any] = {"policy": _cached(out / "policy.json", args, lambda: run_episodes(
        act, env_fn, args.episodes, args.seed))}
    for kind, horizon in players:
        name = f"{kind}:{horizon}"
        tail = critic_value(model, cfg) if kind == "critic" else None
        played[name] = _cached(out / f"{kind}_{horizon}.json", args, functools.partial(
            _rollout, vr_config, env_fn, args, act, tail, horizon))
    table = _table(played)
    (out / "table.md").write_text(table + "\n")
    print(table)


def _rollout(vr_config: envs.VREdgeConfig, env_fn: Any, args: Any, act: Any, tail: Any, horizon: int
             ) -> list[dict[str, float]]:
    """One rollout player's records: BeliefMPC on the policy, ``horizon`` rounds, ending on ``tail`` (or none)."""
    from envs.belief_mpc import BeliefMPC
    from trainer.evaluation.episodes import filter_episodes

    if horizon == 12:  # (BeliefMPC's default: exactly what trainer.evaluate plays)
        return belief_records(vr_config, env_fn, args.episodes, args.seed, act, tail)
    return filter_episodes(BeliefMPC(vr_config, base=act, terminal_value=tail, horizon=horizon), env_fn,
                           args.episodes, args.seed, num_envs=64)


def _cached(path: Path, args: Any, play: Any) -> dict[str, Any]:
    """A player's records and seconds from ``path`` where it holds these episodes, else played and written."""
    if path.exists():
        held = json.loads(path.read_text())
        if held["episodes"] == args.episodes and held["seed"] == args.seed:
            return held
    start = time.perf_counter()
    records = play()
    held = {"episodes": args.episodes, "seed": args.seed, "seconds": time.perf_counter() - start,
            "load": os.getloadavg(), "records": records}
    path.write_text(json.dumps(held))
    print(f"{path.stem}: {summarize(records)['reward_per_step']:.4f} reward/step, {held['seconds']:.0f} s "
          f"(load {held['load'][0]:.1f})", flush=True)
    return held


def _table(played: dict[str, Any]) -> str:
    """Each player's reward per step and its lead over the policy, paired."""
    policy = played["policy"]["records"]
    lines = ["| player | reward/step (± 95% CI) | minus the policy, paired | wins | s |", "|---|---|---|---|---|"]
    for name, held in played.items():
        s = summarize(held["records"])
        d = paired_difference(held["records"], policy) if name != "policy" else None
        lead = f"{d['mean']:+.4f} {plus_minus(d['ci95'])}" if d else ""
        wins = f"{d['wins']}/{d['episodes']}" if d else ""
        lines.append(f"| {name} | {s['reward_per_step']:.4f} {plus_minus(s['reward_per_step_ci95'])} | {lead} | "
                     f"{wins} | {held['seconds']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
