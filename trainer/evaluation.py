"""Evaluate a policy over whole episodes on held-out seeds, with 95% confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

Act = Callable[[np.ndarray], np.ndarray]
_EVAL_STREAM = 0x5EED_E7A1  # spawn key that separates evaluation seeds from training seeds
_VALIDATION_STREAM = 0x5EED_7A11  # and validation seeds (model selection during training) from both


def evaluation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per evaluation episode, from a ``SeedSequence`` branch that training never uses."""
    return _branch_seeds(seed, episodes, _EVAL_STREAM)


def validation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per validation episode: a branch that neither training nor :func:`evaluation_seeds` uses."""
    return _branch_seeds(seed, episodes, _VALIDATION_STREAM)


def _branch_seeds(seed: int, episodes: int, stream: int) -> list[int]:
    children = np.random.SeedSequence(seed, spawn_key=(stream,)).spawn(episodes)
    return [int(c.generate_state(1)[0]) for c in children]


def policy_actions(model: torch.nn.Module, deterministic: bool) -> Act:
    """``act(obs [B, *obs]) -> actions`` (NumPy) of a trainer ``ActorCritic``: greedy, or sampled."""
    def act(obs: np.ndarray) -> np.ndarray:
        obs_t = torch.from_numpy(obs)
        return (model.act_deterministic(obs_t) if deterministic else model.act(obs_t)["action"]).numpy()
    return act


def run_episodes(act: Act, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                 num_envs: int = 16, seeds: list[int] | None = None,
                 with_envs: bool = False) -> list[dict[str, float]]:
    """Play ``episodes`` full episodes (episode ``i`` reset with ``evaluation_seeds(seed)[i]``, or ``seeds[i]``).

    Up to ``num_envs`` envs run in lockstep so that ``act`` sees batches ``[n, *obs]``;
    with ``with_envs`` it is called as ``act(obs, envs)`` with the ``n`` envs the
    observations came from (a clairvoyant reference reads their state). Each record has
    ``return``, ``length``, ``reward_per_step`` and the env's ``episode_metrics``
    (VR-edge: ``quality``, ``stall_s``, ``switches``); for envs whose ``info`` carries
    per-user ``qoe_lin`` and ``quality`` (VR-edge), also ``qoe_lin`` (per user and segment)
    and ``fairness`` (Jain's index of the users' mean quality).
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes} is invalid: must be >= 1")
    seeds = evaluation_seeds(seed, episodes) if seeds is None else list(seeds)
    if len(seeds) != episodes:
        raise ValueError(f"run_episodes got {len(seeds)} seeds for {episodes} episodes")
    envs = [env_fn() for _ in range(min(num_envs, episodes))]
    obs = [None] * len(envs)
    current = [-1] * len(envs)  # episode index each env is playing, -1 when idle
    stats = [_EpisodeStats() for _ in envs]
    records: list[dict[str, float] | None] = [None] * episodes
    next_episode = 0
    for i, env in enumerate(envs):
        obs[i], _ = env.reset(seed=seeds[next_episode])
        current[i], next_episode = next_episode, next_episode + 1
    try:
        while any(c >= 0 for c in current):
            active = [i for i, c in enumerate(current) if c >= 0]
            batch = np.stack([obs[i] for i in active])
            actions = act(batch, [envs[i] for i in active]) if with_envs else act(batch)
            for j, i in enumerate(active):
                obs[i], reward, terminated, truncated, info = envs[i].step(actions[j])
                stats[i].add(float(reward), info)
                if terminated or truncated:
                    records[current[i]] = {**stats[i].record(),
                                           **{k: float(v) for k, v in info.get("episode_metrics", {}).items()}}
                    stats[i] = _EpisodeStats()
                    if next_episode < episodes:
                        obs[i], _ = envs[i].reset(seed=seeds[next_episode])
                        current[i], next_episode = next_episode, next_episode + 1
                    else:
                        current[i] = -1
    finally:
        for env in envs:
            env.close()
    return records  # type: ignore[return-value]


class _EpisodeStats:
    """Running sums of one episode: return, length and, where ``info`` has them, per-user QoE_lin and quality."""

    def __init__(self) -> None:
        self.ret, self.length = 0.0, 0
        self.qoe_lin: np.ndarray | float = 0.0
        self.quality: np.ndarray | float = 0.0
        self.per_user = False

    def add(self, reward: float, info: dict[str, Any]) -> None:
        self.ret += reward
        self.length += 1
        if "qoe_lin" in info and "quality" in info:
            self.per_user = True
            self.qoe_lin = self.qoe_lin + np.asarray(info["qoe_lin"], dtype=np.float64)
            self.quality = self.quality + np.asarray(info["quality"], dtype=np.float64)

    def record(self) -> dict[str, float]:
        out = {"return": self.ret, "length": self.length, "reward_per_step": self.ret / self.length}
        if self.per_user:
            out["qoe_lin"] = float(np.mean(self.qoe_lin)) / self.length
            out["fairness"] = jain_index(np.asarray(self.quality) / self.length)
        return out


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)`` of non-negative values: 1 when all are equal,
    ``1/n`` when one user has everything (all zero counts as equal)."""
    x = np.asarray(x, dtype=np.float64)
    square_sum = float((x**2).sum())
    return 1.0 if square_sum == 0 else float(x.sum() ** 2 / (len(x) * square_sum))


def gap_closed(policy: list[dict[str, float]], baseline: list[dict[str, float]],
               reference: list[dict[str, float]], key: str = "reward_per_step") -> dict[str, float]:
    """Fraction of the gap between ``baseline`` and ``reference`` that ``policy`` closes, paired over the same episodes.

    ``mean(policy - baseline) / mean(reference - baseline)``, with a 95% CI by the delta
    method (normal approximation of a ratio of paired means). 0: no better than the
    baseline; 1: as good as the reference. Returns ``fraction``, ``ci95``, ``gap`` (the
    reference's mean lead) and ``episodes``.
    """
    if not len(policy) == len(baseline) == len(reference):
        raise ValueError(f"gap_closed needs the same episodes, got {len(policy)}, {len(baseline)} and "
                         f"{len(reference)} records")
    a = np.array([p[key] - b[key] for p, b in zip(policy, baseline)], dtype=np.float64)
    g = np.array([r[key] - b[key] for r, b in zip(reference, baseline)], dtype=np.float64)
    gap = float(g.mean())
    if gap <= 0:
        return {"fraction": float("nan"), "ci95": float("nan"), "gap": gap, "episodes": len(a)}
    fraction = float(a.mean()) / gap
    n = len(a)
    half = 1.96 * (a - fraction * g).std(ddof=1) / (math.sqrt(n) * gap) if n > 1 else float("nan")
    return {"fraction": fraction, "ci95": float(half), "gap": gap, "episodes": n}


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
