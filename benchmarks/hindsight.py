"""How far from the hindsight optimum are the players? Exact on small cells, bounded on the default one.

    python -m benchmarks.hindsight small [--users 2] [--rounds 8] [--episodes 20] [--penalty]
    python -m benchmarks.hindsight default [--episodes 10] [--iterations 40] [--belief] [--sharing N] [--penalty]
    python -m benchmarks.hindsight cost [--bound-episodes 2] [--belief-episodes 50] [--episodes 50]

``small``: on small cells (``--users`` users, ``--rounds`` rounds), the exact hindsight optimum
(:func:`envs.hindsight.exact_hindsight`) against the clairvoyant reference (``ClairvoyantPlanner``, lookahead 5, 2
sweeps), ``fair_share`` and the two Lagrangian bounds (:func:`envs.hindsight.lagrangian_bound`, any schedule;
:func:`envs.hindsight.sharing_bound`, processor sharing kept), episode by episode. ``default``: on the default
cell (8 users, 300 rounds), the airtime bound (``--iterations``) and, with ``--sharing N``, the sharing bound (``N``
iterations aimed at the clairvoyant's return; minutes an episode) against the clairvoyant, ``fair_share`` and,
with ``--belief``, ``BeliefMPC`` (its defaults; minutes). Both play the held-out episodes ``trainer.evaluate``
plays (``evaluation_seeds(0, N)``); nothing here was tuned on them (the bound's step was chosen on raw seeds 0-1).
``cost``: what ``trainer.evaluate --reference bound`` adds on the default cell against ``--reference belief``,
each reference played as the evaluation plays it (:func:`trainer.evaluation.bracket.bound_records`;
:func:`trainer.evaluation.contenders.belief_records`, every episode's row in one batched env), side by side in one
process: the bound on ``--bound-episodes`` (one episode after another: the time scales with the episodes) and
BeliefMPC on ``--belief-episodes`` (batched: timed whole), both extrapolated to ``--episodes`` where fewer were timed.
Every figure is a return per round (the episode's return over its rounds); the check column counts the episodes
where the bound is at least every player's return (it must be all of them). ``--penalty``: the bound less
:func:`envs.hindsight.information_penalty` (its defaults) too, reported apart: it bounds every causal player's mean
over episodes, not each episode, and not the clairvoyant (docs/ceiling.md, "The penalty").
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import envs
from envs.baselines import make_baseline
from envs.belief_mpc import BeliefMPC
from envs.hindsight import (
    PENALTY_SCALE,
    episode_future,
    episode_penalty,
    exact_hindsight,
    lagrangian_bound,
    sharing_bound,
)
from envs.planner import ClairvoyantPlanner
from trainer.evaluation import evaluation_seeds

Player = Callable[[np.ndarray, envs.SyntheticVREdgeEnv], np.ndarray]


def players(config: envs.VREdgeConfig, belief: bool = False) -> dict[str, Callable[[], Player]]:
    """Fresh players by name, each ``player(obs [1, obs_dim], env) -> levels [1, U]``: the clairvoyant,
    ``fair_share`` and, with ``belief``, BeliefMPC on ``fair_share`` (stateful: one per episode)."""
    def clairvoyant() -> Player:
        planner = ClairvoyantPlanner(config)
        return lambda obs, env: planner(obs, [env])

    def reading(make: Callable[[], Callable[[np.ndarray], np.ndarray]]) -> Callable[[], Player]:
        def player() -> Player:
            act = make()
            return lambda obs, env: act(obs)
        return player

    made: dict[str, Callable[[], Player]] = {
        "clairvoyant": clairvoyant, "fair_share": reading(lambda: make_baseline("fair_share", config))}
    if belief:
        made["belief_mpc"] = reading(lambda: BeliefMPC(config))
    return made


def episode_return(config: envs.VREdgeConfig, seed: int, player: Player) -> float:
    """The return of ``player`` on the episode ``SyntheticVREdgeEnv(seed=seed)`` plays."""
    env = envs.SyntheticVREdgeEnv(seed=seed, **config.to_dict())
    obs, _ = env.reset()
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(player(obs[None], env)[0])
        total, done = total + reward, terminated or truncated
    return total


def _row(name: str, values: list[float], rounds: int, seconds: float, extra: str = "") -> str:
    per_round = np.asarray(values) / rounds
    ci = 1.96 * per_round.std(ddof=1) / np.sqrt(len(per_round)) if len(per_round) > 1 else 0.0
    return f"{name:>14} {per_round.mean():>9.4f} ± {ci:.4f} {seconds:>9.1f}  {extra}"


def small(users: int, rounds: int, episodes: int, seed: int, penalty: bool = False,
          scale: float = PENALTY_SCALE) -> None:
    """Exact optimum, bound and players on ``episodes`` small episodes (and with ``penalty`` the penalised bound,
    which may fall below the exact optimum: it bounds the causal players' mean, not the hindsight optimum)."""
    config = envs.VREdgeConfig(num_users=users, max_steps=rounds)
    seeds = evaluation_seeds(seed, episodes)
    made = players(config)
    scores: dict[str, list[float]] = {name: [] for name in ("exact", "bound", "sharing", *made)}
    if penalty:
        scores["penalised"], scores["penalised sharing"] = [], []
    seconds = dict.fromkeys(scores, 0.0)
    certified, states = 0, 0
    for s in seeds:
        future = episode_future(config, s)
        start = time.perf_counter()
        best = exact_hindsight(config, future, max_states=1_000_000)
        seconds["exact"] += time.perf_counter() - start
        scores["exact"].append(best.value)
        certified, states = certified + best.exact, max(states, best.states)
        start = time.perf_counter()
        scores["bound"].append(lagrangian_bound(config, future, grid_s=0.05).value)
        seconds["bound"] += time.perf_counter() - start
        start = time.perf_counter()
        scores["sharing"].append(sharing_bound(config, future, grid_s=0.05, delay_grid_s=0.01, iterations=30).value)
        seconds["sharing"] += time.perf_counter() - start
        if penalty:
            start = time.perf_counter()
            charged = episode_penalty(config, s, grid_s=0.05, scale=scale)
            scores["penalised"].append(lagrangian_bound(config, future, grid_s=0.05, penalty=charged).value)
            seconds["penalised"] += time.perf_counter() - start
            start = time.perf_counter()
            scores["penalised sharing"].append(sharing_bound(config, future, grid_s=0.05, delay_grid_s=0.01,
                                                             iterations=30, penalty=charged).value)
            seconds["penalised sharing"] += time.perf_counter() - start
        for name, make in made.items():
            start = time.perf_counter()
            scores[name].append(episode_return(config, s, make()))
            seconds[name] += time.perf_counter() - start
    exact = np.asarray(scores["exact"])
    print(f"{users} users, {rounds} rounds, {episodes} episodes (evaluation_seeds({seed}, {episodes})); "
          f"exact certified in {certified}/{episodes}, at most {states} states at one round")
    print(f"{'player':>14} {'per round':>9}   {'95% CI':<6} {'seconds':>9}  vs exact (paired, per round)")
    for name, values in scores.items():
        gap = (np.asarray(values) - exact) / rounds
        ci = 1.96 * gap.std(ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else 0.0
        if name.startswith("penalised"):
            print(_row(name, values, rounds, seconds[name], f"{gap.mean():+.4f} ± {ci:.4f} (in expectation: no "
                       "side to keep; below exact is possible)"))
            continue
        side = gap >= -1e-9 / rounds if name in ("bound", "sharing") else gap <= 1e-9 / rounds
        said = "at least" if name in ("bound", "sharing") else "at most"
        print(_row(name, values, rounds, seconds[name], f"{gap.mean():+.4f} ± {ci:.4f} ({said} exact: "
                                                        f"{int(side.sum())}/{episodes})"))


def default(episodes: int, iterations: int, sharing: int, belief: bool, seed: int, penalty: bool = False,
            scale: float = PENALTY_SCALE) -> None:
    """The bounds and the players on ``episodes`` episodes of the default cell."""
    config = envs.VREdgeConfig()
    seeds = evaluation_seeds(seed, episodes)
    made = players(config, belief)
    bounds = ["bound", "sharing"] if sharing else ["bound"]
    scores: dict[str, list[float]] = {name: [] for name in (*bounds, *made)}
    seconds = dict.fromkeys(scores, 0.0)
    if penalty:  # beside the bounds, not among them: they bound the causal players' mean, not each episode
        scores["penalised"], seconds["penalised"] = [], 0.0
        if sharing:
            scores["penalised sharing"], seconds["penalised sharing"] = [], 0.0
    for s in seeds:
        for name, make in made.items():
            start = time.perf_counter()
            scores[name].append(episode_return(config, s, make()))
            seconds[name] += time.perf_counter() - start
        future = episode_future(config, s)
        start = time.perf_counter()
        scores["bound"].append(lagrangian_bound(config, future, iterations=iterations).value)
        seconds["bound"] += time.perf_counter() - start
        if penalty:
            start = time.perf_counter()
            charged = episode_penalty(config, s, scale=scale)
            scores["penalised"].append(lagrangian_bound(config, future, iterations=iterations,
                                                        penalty=charged).value)
            seconds["penalised"] += time.perf_counter() - start
            if sharing:
                start = time.perf_counter()
                scores["penalised sharing"].append(sharing_bound(config, future, iterations=sharing,
                                                                 penalty=charged).value)
                seconds["penalised sharing"] += time.perf_counter() - start
        if sharing:
            start = time.perf_counter()
            scores["sharing"].append(sharing_bound(config, future, iterations=sharing, final_grid_s=0.05,
                                                   target=scores["clairvoyant"][-1]).value)
            seconds["sharing"] += time.perf_counter() - start
    bound = np.min([scores[name] for name in bounds], axis=0)  # each is a bound: so is the lower
    above = int(sum(np.all([np.asarray(scores[name]) >= np.asarray(v) for name in bounds for n, v in scores.items()
                            if n not in bounds and not n.startswith("penalised")], axis=0)))
    rounds = config.max_steps
    print(f"default cell, {episodes} episodes (evaluation_seeds({seed}, {episodes})), bound: {iterations} "
          f"iterations, sharing: {sharing}; bound above every player in {above}/{episodes} episodes (the last "
          "column: the lower bound's lead)")
    print(f"{'player':>14} {'per round':>9}   {'95% CI':<6} {'seconds':>9}  bound - player (paired, per round)")
    for name, values in scores.items():
        if name.startswith("penalised"):
            continue
        gap = (bound - np.asarray(values)) / rounds
        ci = 1.96 * gap.std(ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else 0.0
        print(_row(name, values, rounds, seconds[name], f"{gap.mean():+.4f} ± {ci:.4f}"))
    if penalty:
        _penalised_rows(scores, seconds, rounds)


def _penalised_rows(scores: dict[str, list[float]], seconds: dict[str, float], rounds: int) -> None:
    """Each penalised bound against each player, paired: a bound on every *causal* player's mean only (not episode
    by episode, and not on the clairvoyant, which sees the future)."""
    for bound_name in [name for name in scores if name.startswith("penalised")]:
        penalised = np.asarray(scores[bound_name])
        print(f"{bound_name} bound (information_penalty): {penalised.mean() / rounds:.4f} a round, "
              f"{seconds[bound_name] / len(penalised):.1f} s an episode; a bound on each causal player's mean, in "
              "expectation (the clairvoyant is not causal)")
        print(f"{'player':>18} {bound_name + ' - player (paired, per round)':>46}")
        for name, values in scores.items():
            if name == bound_name:
                continue
            gap = (penalised - np.asarray(values)) / rounds
            ci = 1.96 * gap.std(ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else 0.0
            print(f"{name:>18} {gap.mean():>+30.4f} ± {ci:.4f}")


def cost(bound_episodes: int, belief_episodes: int, episodes: int, seed: int) -> None:
    """Seconds of the bound's and BeliefMPC's references on the default cell's held-out episodes, side by side."""
    import functools

    import gymnasium as gym

    from trainer.evaluation.bracket import BOUND_SOLVER, bound_records
    from trainer.evaluation.contenders import belief_records

    config = envs.VREdgeConfig()
    env_fn = functools.partial(gym.make, "VREdge-v0", **config.to_dict())
    start = time.perf_counter()
    bound_records(config, bound_episodes, seed)
    bound_s = time.perf_counter() - start
    start = time.perf_counter()
    belief_records(config, env_fn, belief_episodes, seed)
    belief_s = time.perf_counter() - start
    print(f"default cell, held-out episodes of seed {seed}; bound: {BOUND_SOLVER}; belief: BeliefMPC on fair_share")
    for name, seconds, timed in (("bound", bound_s, bound_episodes), ("belief", belief_s, belief_episodes)):
        said = "timed" if timed == episodes else f"extrapolated from {timed} x {episodes / timed:.1f}"
        print(f"{name:>8}: {seconds:7.1f} s for {timed} episodes ({seconds / timed:.1f} s an episode); "
              f"{seconds * episodes / timed / 60:.1f} min for {episodes} ({said})")
    print(f"bound / belief on {episodes} episodes: {bound_s / bound_episodes / (belief_s / belief_episodes):.1f}x")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hindsight", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="which", required=True)
    s = sub.add_parser("small", help="exact optimum against the players on small cells")
    s.add_argument("--users", type=int, default=2)
    s.add_argument("--rounds", type=int, default=8)
    s.add_argument("--episodes", type=int, default=20)
    s.add_argument("--penalty", action="store_true", help="the penalised bound too (information_penalty's defaults)")
    d = sub.add_parser("default", help="the bound against the players on the default cell")
    d.add_argument("--episodes", type=int, default=10)
    d.add_argument("--iterations", type=int, default=40)
    d.add_argument("--sharing", type=int, default=0, help="iterations of the sharing bound (0: not computed)")
    d.add_argument("--belief", action="store_true", help="play BeliefMPC too (its defaults: minutes)")
    d.add_argument("--penalty", action="store_true", help="the penalised bound too (information_penalty's defaults)")
    c = sub.add_parser("cost", help="--reference bound's cost against --reference belief's on the default cell")
    c.add_argument("--bound-episodes", type=int, default=2)
    c.add_argument("--belief-episodes", type=int, default=50)
    c.add_argument("--episodes", type=int, default=50, help="the evaluation's episodes the times are given for")
    for q in (s, d, c):
        q.add_argument("--seed", type=int, default=0, help="evaluation seed (as trainer.evaluate)")
    for q in (s, d):
        q.add_argument("--penalty-scale", type=float, default=PENALTY_SCALE,
                       help="the penalty's scale (information_penalty's scale)")
    args = p.parse_args(argv)
    print(f"CPU: {_cpu()}")
    if args.which == "small":
        small(args.users, args.rounds, args.episodes, args.seed, args.penalty, args.penalty_scale)
    elif args.which == "cost":
        cost(args.bound_episodes, args.belief_episodes, args.episodes, args.seed)
    else:
        default(args.episodes, args.iterations, args.sharing, args.belief, args.seed, args.penalty,
                args.penalty_scale)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
