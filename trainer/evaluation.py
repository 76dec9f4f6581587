"""Evaluate a policy over whole episodes on held-out seeds, with 95% confidence intervals."""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=256)
def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: a two-sided 95% CI is mean ± this x SE.

    The normal 1.96 understates the interval for few episodes (df 1: 12.71, df 4: 2.78, df 15:
    2.13). Solved by bisection on the CDF, whose integral of the density from 0 is taken with
    Simpson's rule on the substitution ``x = tan(theta)`` (a finite, smooth integrand for every df).
    """
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def half_mass(x: float) -> float:  # P(0 < T < x), integrating over theta in [0, atan x]
        top, n = math.atan(x), 400
        h = top / n

        def f(theta: float) -> float:
            t = math.tan(theta)
            return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df)) * (1 + t * t)
        inner = sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
        return h / 3 * (f(0.0) + inner + f(top))

    lo, hi = 0.0, 100.0  # df 1's quantile is 12.71; every larger df has a smaller one
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if half_mass(mid) < 0.475 else (lo, mid)
    return 0.5 * (lo + hi)


def _ci95(values: np.ndarray) -> float:
    """Half-width of the 95% CI of the mean of ``values`` (Student's t; NaN for fewer than two)."""
    n = len(values)
    return t_quantile_975(n - 1) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else float("nan")


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
    method (a ratio of paired means; Student's t quantile for the number of episodes). 0: no better than the
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
    return {"fraction": fraction, "ci95": _ci95(a - fraction * g) / gap, "gap": gap, "episodes": len(a)}


def summarize(records: list[dict[str, float]]) -> dict[str, Any]:
    """Mean and 95% confidence half-width (Student's t) of every numeric field."""
    out: dict[str, Any] = {"episodes": len(records)}
    for key in records[0]:
        values = np.array([r[key] for r in records if key in r], dtype=np.float64)
        name = "mean_" + key if key in ("return", "length") else key
        out[name] = float(values.mean())
        out[name + "_ci95"] = _ci95(values)
    return out


def paired_difference(a: list[dict[str, float]], b: list[dict[str, float]],
                      key: str = "reward_per_step") -> dict[str, float]:
    """``a - b`` per episode, for two policies that played the same episodes (same seeds, same order).

    Differencing removes what the episodes share (how hard each one's cell is), so the
    95% CI is much narrower than the overlap of the two separate CIs suggests. Returns
    ``mean``, ``ci95`` (Student's t), ``wins`` (episodes where ``a`` is higher) and ``episodes``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same episodes, got {len(a)} and {len(b)} records")
    d = np.array([x[key] - y[key] for x, y in zip(a, b)], dtype=np.float64)
    return {"mean": float(d.mean()), "ci95": _ci95(d), "wins": int((d > 0).sum()), "episodes": len(d)}
