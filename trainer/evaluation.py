"""Evaluate a policy over whole episodes on held-out seeds, with 95% confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

Act = Callable[[np.ndarray], np.ndarray]
_EVAL_STREAM = 0x5EED_E7A1  # spawn key that separates evaluation seeds from training seeds


def evaluation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per evaluation episode, from a ``SeedSequence`` branch that training never uses."""
    children = np.random.SeedSequence(seed, spawn_key=(_EVAL_STREAM,)).spawn(episodes)
    return [int(c.generate_state(1)[0]) for c in children]


def run_episodes(act: Act, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                 num_envs: int = 16) -> list[dict[str, float]]:
    """Play ``episodes`` full episodes (episode ``i`` reset with ``evaluation_seeds(seed)[i]``).

    Up to ``num_envs`` envs run in lockstep so that ``act`` sees batches ``[n, *obs]``.
    Each record has ``return``, ``length``, ``reward_per_step`` and the env's
    ``episode_metrics`` (VR-edge: ``quality``, ``stall_s``, ``switches``).
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes} is invalid: must be >= 1")
    seeds = evaluation_seeds(seed, episodes)
    envs = [env_fn() for _ in range(min(num_envs, episodes))]
    obs = [None] * len(envs)
    current = [-1] * len(envs)  # episode index each env is playing, -1 when idle
    stats = [[0.0, 0] for _ in envs]
    records: list[dict[str, float] | None] = [None] * episodes
    next_episode = 0
    for i, env in enumerate(envs):
        obs[i], _ = env.reset(seed=seeds[next_episode])
        current[i], next_episode = next_episode, next_episode + 1
    try:
        while any(c >= 0 for c in current):
            active = [i for i, c in enumerate(current) if c >= 0]
            actions = act(np.stack([obs[i] for i in active]))
            for j, i in enumerate(active):
                obs[i], reward, terminated, truncated, info = envs[i].step(actions[j])
                stats[i][0] += float(reward)
                stats[i][1] += 1
                if terminated or truncated:
                    ret, length = stats[i]
                    records[current[i]] = {"return": ret, "length": length, "reward_per_step": ret / length,
                                           **{k: float(v) for k, v in info.get("episode_metrics", {}).items()}}
                    stats[i] = [0.0, 0]
                    if next_episode < episodes:
                        obs[i], _ = envs[i].reset(seed=seeds[next_episode])
                        current[i], next_episode = next_episode, next_episode + 1
                    else:
                        current[i] = -1
    finally:
        for env in envs:
            env.close()
    return records  # type: ignore[return-value]


def summarize(records: list[dict[str, float]]) -> dict[str, Any]:
    """Mean and 95% confidence half-width (normal approximation) of every numeric field."""
    out: dict[str, Any] = {"episodes": len(records)}
    for key in records[0]:
        values = np.array([r[key] for r in records if key in r], dtype=np.float64)
        half = 1.96 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
        name = "mean_" + key if key in ("return", "length") else key
        out[name] = float(values.mean())
        out[name + "_ci95"] = float(half)
    return out


def paired_difference(a: list[dict[str, float]], b: list[dict[str, float]],
                      key: str = "reward_per_step") -> dict[str, float]:
    """``a - b`` per episode, for two policies that played the same episodes (same seeds, same order).

    Differencing removes what the episodes share (how hard each one's cell is), so the
    95% CI is much narrower than the overlap of the two separate CIs suggests. Returns
    ``mean``, ``ci95`` (normal approximation), ``wins`` (episodes where ``a`` is higher) and ``episodes``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same episodes, got {len(a)} and {len(b)} records")
    d = np.array([x[key] - y[key] for x, y in zip(a, b)], dtype=np.float64)
    half = 1.96 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"mean": float(d.mean()), "ci95": float(half), "wins": int((d > 0).sum()), "episodes": len(d)}
