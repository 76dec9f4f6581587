"""BeliefMPC's rollout on a trained policy, with and without the run's critic as terminal value, against the policy
itself, paired on the held-out episodes ``trainer.evaluate`` plays (issue 65, item 3).

    python -m benchmarks.rollout_critic RUN --out DIR [--episodes 20] [--seed 0] [--pick best]
                                        [--players truncated:12,critic:12,critic:4,critic:4:1]

Plays the run's greedy policy, then each of ``--players``: ``truncated:H`` is BeliefMPC's rollout on the policy,
``H`` rounds, no terminal value (``truncated:12`` is ``--belief-base policy``), ``critic:H`` the discounted rollout
ending on the critic (``envs.belief_mpc.TerminalValue``, ``H`` rounds), and ``KIND:H:Z`` either with a margin of
``Z`` standard errors (``envs.belief_mpc.kept_unless_clear``; ``critic:4:1`` is ``--belief-base policy_critic``),
the other settings BeliefMPC's defaults. Each player's records go to ``DIR/<player>.json`` as it finishes (a later call
with the same episodes reuses them), and the table (reward per step, each minus the policy paired over the
episodes with its 95% interval, the seconds each took) to ``DIR/table.md``; the CPU and its load are printed first.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import envs
from benchmarks.machine import print_machine
from trainer.arguments import OneLineParser
from trainer.evaluation.episodes import (
    evaluation_seeds,
    held_out_env_kwargs,
    policy_actions,
    run_episodes,
    validation_seeds,
)
from trainer.evaluation.policies import critic_refusal, critic_value, trained_model
from trainer.evaluation.report import plus_minus
from trainer.evaluation.statistics import paired_difference, summarize

KINDS = ("truncated", "critic")


def parsed_players(text: str) -> list[tuple[str, int, float]]:
    """``--players``: ``kind:horizon[:margin]`` triples, comma-separated (``margin``: BeliefMPC's, in standard
    errors; 0 where not given).

    >>> parsed_players("truncated:12,critic:4:1")
    [('truncated', 12, 0.0), ('critic', 4, 1.0)]
    """
    players = []
    for item in text.split(","):
        if not (match := re.fullmatch(r"([a-z]+):(\d+)(?::(\d+(?:\.\d*)?))?", item)) or match[1] not in KINDS or \
                not 1 <= int(match[2]) <= 32 or not 0 <= float(match[3] or 0) < 100:
            raise ValueError(f"--players {item!r}: use KIND:H[:Z], KIND one of {', '.join(KINDS)}, H in 1..32, Z "
                             "a margin in standard errors, 0 to 100")
        players.append((match[1], int(match[2]), float(match[3] or 0)))
    return players


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m benchmarks.rollout_critic", description=__doc__)
    p.add_argument("run", help="run directory or checkpoint file (a PPO run on a synthetic VR-edge cell)")
    p.add_argument("--out", required=True, help="where the records and table.md go")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (default: %(default)s)")
    p.add_argument("--pick", choices=("best", "latest"), default="best")
    p.add_argument("--players", default="truncated:12,critic:12")
    p.add_argument("--validation", action="store_true",
                   help="play validation episodes (the seed branch settings are chosen on) instead of held-out ones")
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
    args.seeds = (validation_seeds if args.validation else evaluation_seeds)(args.seed, args.episodes)
    played: dict[str, Any] = {"policy": _cached(out / "policy.json", args, lambda: run_episodes(
        act, env_fn, args.episodes, args.seed, seeds=args.seeds))}
    for kind, horizon, margin in players:
        name = f"{kind}:{horizon}" + (f":{margin:g}" if margin else "")
        tail = critic_value(model, cfg) if kind == "critic" else None
        played[name] = _cached(out / f"{name.replace(':', '_')}.json", args, functools.partial(
            _rollout, vr_config, env_fn, args, act, tail, horizon, margin))
    table = _table(played)
    (out / "table.md").write_text(table + "\n")
    print(table)


def _rollout(vr_config: envs.VREdgeConfig, env_fn: Any, args: Any, act: Any, tail: Any, horizon: int, margin: float
             ) -> list[dict[str, float]]:
    """One rollout player's records: BeliefMPC on the policy, ``horizon`` rounds, ending on ``tail`` (or none),
    a candidate kept out unless its lead is ``margin`` standard errors clear."""
    from envs.belief_mpc import BeliefMPC
    from trainer.evaluation.episodes import filter_episodes

    return filter_episodes(BeliefMPC(vr_config, base=act, terminal_value=tail, horizon=horizon, margin=margin),
                           env_fn, args.episodes, args.seed, num_envs=64, seeds=args.seeds)


def _cached(path: Path, args: Any, play: Any) -> dict[str, Any]:
    """A player's records and seconds from ``path`` where it holds these episodes, else played and written."""
    if path.exists():
        held = json.loads(path.read_text())
        if held["episodes"] == args.episodes and held["seed"] == args.seed and \
                held.get("validation", False) == args.validation:
            return held
    start = time.perf_counter()
    records = play()
    held = {"episodes": args.episodes, "seed": args.seed, "validation": args.validation,
            "seconds": time.perf_counter() - start,
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
