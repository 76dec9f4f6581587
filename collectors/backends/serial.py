"""The reference backend: plain Gymnasium calls, one env after another, results stacked per step.

Deliberately independent of :class:`~collectors.env_group.EnvGroup`, so that the
equality tests between backends check two implementations against each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from collectors.env_group import (
    EnvError,
    EpisodeInfo,
    StepViews,
    build_env,
    check_same_spaces,
    close_envs,
    env_states,
    restore_env_states,
    spaces_of,
)


class SerialStepper:
    """Steps each env (or each natively batched env) in turn in this process."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.envs: list[Any] = []
        try:
            for i, fn in enumerate(env_fns):
                self.envs.append(build_env(fn, i))
            spaces = [spaces_of(e) for e in self.envs]
            check_same_spaces(spaces)
        except BaseException:
            self.close()
            raise
        self.observation_space, self.action_space = spaces[0][0], spaces[0][1]
        self.sizes = [n for _, _, n in spaces]
        self.num_envs = sum(self.sizes)

    def _unbatched(self):
        """Yield ``(env, first rollout index, is_vector)`` for each hosted env."""
        start = 0
        for env, n in zip(self.envs, self.sizes):
            yield env, start, isinstance(env, gym.vector.VectorEnv)
            start += n

    def reset(self, seeds: Sequence[int], obs_out: np.ndarray) -> None:
        results = []
        for env, start, is_vector in self._unbatched():
            n = env.num_envs if is_vector else 1
            try:
                obs, _ = env.reset(seed=list(seeds[start:start + n]) if is_vector else seeds[start])
            except Exception:
                raise EnvError.raised(start, "reset()") from None
            results.extend(obs if is_vector else [obs])
        obs_out[:] = np.stack(results)

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        rows: list[tuple] = []  # (next_obs, reward, terminated, truncated, final_obs or None)
        episodes: list[EpisodeInfo] = []
        for env, start, is_vector in self._unbatched():
            if is_vector:
                n = env.num_envs
                obs, rew, term, trunc, info = self._call(start, env.step, actions[start:start + n])
                metrics = info.get("final_info", {}).get("episode_metrics")
                for j in range(n):
                    done = bool(term[j] or trunc[j])
                    rows.append((obs[j], rew[j], term[j], trunc[j], np.array(info["final_obs"][j]) if done else None))
                    if done and isinstance(metrics, dict):
                        episodes.append((start + j, {k: float(v[j]) for k, v in metrics.items()}))
                continue
            obs, rew, term, trunc, info = self._call(start, env.step, actions[start])
            final = None
            if term or trunc:
                final = np.array(obs)
                if isinstance(info.get("episode_metrics"), dict):
                    episodes.append((start, {k: float(v) for k, v in info["episode_metrics"].items()}))
                obs, _ = self._call(start, env.reset)
            rows.append((obs, rew, term, trunc, final))
        out.next_obs[:] = np.stack([r[0] for r in rows])
        out.rewards[:] = [r[1] for r in rows]
        out.terminated[:] = [r[2] for r in rows]
        out.truncated[:] = [r[3] for r in rows]
        out.final_mask[:] = [r[4] is not None for r in rows]
        for i, r in enumerate(rows):
            if r[4] is not None:
                out.final_obs[i] = r[4]
        return episodes

    @staticmethod
    def _call(index: int, fn, *args):
        try:
            return fn(*args)
        except Exception:
            raise EnvError.raised(index, f"{getattr(fn, '__name__', 'call')}()") from None

    def get_env_states(self) -> list[Any]:
        return env_states(self.envs)

    def set_env_states(self, states: Sequence[Any]) -> None:
        restore_env_states(self.envs, states)

    def close(self) -> None:
        close_envs(self.envs)
        self.envs = []
