"""Envs hosted in one process, stepped into caller-provided arrays (sync backend, async workers)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

EpisodeInfo = tuple[int, dict[str, float]]


class EnvError(RuntimeError):
    """An env raised inside ``reset``/``step``; ``env_index`` is its index in the rollout."""

    def __init__(self, env_index: int, where: str, detail: str) -> None:
        super().__init__(f"env {env_index} raised in {where}:\n{detail}")
        self.env_index, self.where, self.detail = env_index, where, detail

    def __reduce__(self):  # rebuilt whole on the other side of a pipe (a collecting process's error)
        return EnvError, (self.env_index, self.where, self.detail)

    @classmethod
    def raised(cls, env_index: int, where: str) -> EnvError:
        """The error for the exception being handled: its traceback is the env's own, which says what broke."""
        return cls(env_index, where, traceback.format_exc())


@dataclass
class StepViews:
    """Where one step's results go: ``[n]`` slices of the rollout storage (or of shared memory)."""

    next_obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    final_mask: np.ndarray

    def slice(self, sl: slice) -> StepViews:
        return StepViews(*(getattr(self, f)[sl] for f in self.__dataclass_fields__))


def build_env(fn: Callable[[], Any], index: int) -> gym.Env | gym.vector.VectorEnv:
    """Call factory ``index`` and check that it built a Gymnasium env we can step."""
    try:
        env = fn()
    except Exception as e:
        raise ValueError(f"env factory {index} ({fn!r}) failed: {type(e).__name__}: {e}") from e
    if isinstance(env, gym.vector.VectorEnv):
        if env.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"env factory {index} built a VectorEnv with autoreset_mode="
                f"{env.metadata.get('autoreset_mode')}; the collector needs same-step autoreset "
                "(pass autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)")
    elif not isinstance(env, gym.Env):
        raise TypeError(f"env factory {index} returned {type(env).__name__}, not a gymnasium.Env or "
                        "gymnasium.vector.VectorEnv; env_fns must be zero-argument callables that build envs")
    return env


def spaces_of(env: gym.Env | gym.vector.VectorEnv) -> tuple[gym.Space, gym.Space, int]:
    """``(single observation space, single action space, number of envs)`` of an env."""
    if isinstance(env, gym.vector.VectorEnv):
        return env.single_observation_space, env.single_action_space, env.num_envs
    return env.observation_space, env.action_space, 1


def check_same_spaces(spaces: Sequence[tuple[gym.Space, gym.Space, int]]) -> None:
    """Raise ``ValueError`` naming the first factory whose spaces differ from factory 0."""
    obs0, act0, _ = spaces[0]
    for i, (obs, act, _) in enumerate(spaces):
        if obs != obs0:
            raise ValueError(f"env factory {i} has observation space {obs}, but factory 0 has {obs0}; "
                             "all envs of one collector must share their spaces")
        if act != act0:
            raise ValueError(f"env factory {i} has action space {act}, but factory 0 has {act0}; "
                             "all envs of one collector must share their spaces")


def _episode_metrics(info: dict[str, Any]) -> dict[str, float] | None:
    metrics = info.get("episode_metrics")
    return {k: float(v) for k, v in metrics.items()} if isinstance(metrics, dict) else None


class EnvGroup:
    """Hosts the envs of a contiguous range of rollout indices and steps them in this process.

    ``first_index`` is the rollout index of this group's first env (for error messages
    and episode records). Results are written into :class:`StepViews`; nothing is
    allocated per step beyond what the envs themselves return.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], first_index: int = 0, first_factory: int = 0) -> None:
        self.first_index = first_index
        self.envs: list[gym.Env | gym.vector.VectorEnv] = []
        self.slices: list[slice] = []
        spaces = []
        start = 0
        try:
            for k, fn in enumerate(env_fns):
                env = build_env(fn, first_factory + k)
                self.envs.append(env)
                spaces.append(spaces_of(env))
                self.slices.append(slice(start, start + spaces[-1][2]))
                start += spaces[-1][2]
            check_same_spaces(spaces)
        except BaseException:
            self.close()
            raise
        self.spaces = spaces
        self.num_envs = start

    def reset(self, seeds: Sequence[int], obs_out: np.ndarray) -> None:
        """Reset every env with its seed; write first observations into ``obs_out[n]``."""
        for env, sl in zip(self.envs, self.slices):
            is_vector = isinstance(env, gym.vector.VectorEnv)
            obs, _ = self._call(sl.start, "reset()", env.reset,
                                seed=list(seeds[sl]) if is_vector else seeds[sl.start])
            obs_out[sl] = obs

    def step(self, actions: np.ndarray, out: StepViews) -> list[EpisodeInfo]:
        """Step every env with ``actions[n]``, autoresetting ended episodes in the same step.

        Returns ``(rollout env index, env-provided episode metrics)`` for episodes that
        ended and whose env reported ``info["episode_metrics"]``.
        """
        episodes: list[EpisodeInfo] = []
        i = 0
        try:  # one try around the loop: no per-env wrapper call in the hot path
            for env, sl in zip(self.envs, self.slices):
                i = sl.start
                if isinstance(env, gym.vector.VectorEnv):
                    self._step_vector(env, sl, actions[sl], out, episodes)
                    continue
                obs, rew, term, trunc, info = env.step(actions[i])
                out.rewards[i] = rew
                out.terminated[i] = term
                out.truncated[i] = trunc
                done = term or trunc
                out.final_mask[i] = done
                if done:
                    out.final_obs[i] = obs  # copied before the reset can touch the env's buffer
                    metrics = _episode_metrics(info)
                    if metrics is not None:
                        episodes.append((self.first_index + i, metrics))
                    obs, _ = env.reset()
                out.next_obs[i] = obs
        except Exception:
            raise EnvError.raised(self.first_index + i, "step()") from None
        return episodes

    def _step_vector(self, env, sl: slice, actions, out: StepViews, episodes: list[EpisodeInfo]) -> None:
        obs, rew, term, trunc, info = env.step(actions)
        out.next_obs[sl] = obs
        out.rewards[sl] = rew
        out.terminated[sl] = term
        out.truncated[sl] = trunc
        done = np.logical_or(term, trunc, out=out.final_mask[sl])
        if done.any():
            final = info["final_obs"]
            for j in np.flatnonzero(done):
                out.final_obs[sl.start + j] = final[j]
            metrics = info.get("final_info", {}).get("episode_metrics")
            if isinstance(metrics, dict):
                for j in np.flatnonzero(done):
                    episodes.append((self.first_index + sl.start + j, {k: float(v[j]) for k, v in metrics.items()}))

    def _call(self, i: int, where: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception:
            raise EnvError.raised(self.first_index + i, where) from None

    def get_states(self) -> list[Any]:
        return env_states(self.envs)

    def set_states(self, states: Sequence[Any]) -> None:
        restore_env_states(self.envs, states)

    def close(self) -> None:
        close_envs(self.envs)
        self.envs = []


def env_states(envs: Sequence[Any]) -> list[Any]:
    """One state per env (``None`` where an env offers no ``get_state()``): the per-env form of :data:`EnvStates`.

    A ``VectorEnv``'s state is split along its env axis, so that a state belongs to one env
    and not to how envs were grouped into processes: a run may be resumed with another
    number of workers. Looked up on ``env.unwrapped``: Gymnasium 1.x wrappers do not
    forward unknown methods.
    """
    states: list[Any] = []
    for env in envs:
        n = env.num_envs if isinstance(env, gym.vector.VectorEnv) else 1
        if not hasattr(env.unwrapped, "get_state"):
            states.extend([None] * n)
        elif isinstance(env, gym.vector.VectorEnv):
            states.extend(per_env_states(checked_vector_state(env, env.unwrapped.get_state())))
        else:
            states.append(env.unwrapped.get_state())
    return states


def checked_vector_state(env: gym.vector.VectorEnv, state: Any) -> dict[str, np.ndarray]:
    """``state`` (``env.unwrapped.get_state()``) as the batched form of :data:`EnvStates`, checked: CPU tensors
    become NumPy arrays without a copy."""
    n = env.num_envs
    if isinstance(state, dict):  # CPU tensors (a torch env's) as NumPy arrays, without a copy
        state = {k: np.asarray(v) for k, v in state.items()}
    if not isinstance(state, dict) or not state or not all(v.ndim >= 1 and v.shape[0] == n for v in state.values()):
        raise ValueError(f"{type(env.unwrapped).__name__}.get_state() must return a dict of arrays (or CPU "
                         f"tensors) with a leading axis of num_envs={n}, so that each env's state is kept on its own")
    return state


def restore_env_states(envs: Sequence[Any], states: Sequence[Any]) -> None:
    """Inverse of :func:`env_states`: ``states`` has one entry per env; ``None`` entries are skipped."""
    total = sum(env.num_envs if isinstance(env, gym.vector.VectorEnv) else 1 for env in envs)
    if len(states) != total:
        raise ValueError(f"got {len(states)} env states for {total} envs (a checkpoint of other envs?)")
    start = 0
    for env in envs:
        if isinstance(env, gym.vector.VectorEnv):
            part = states[start:start + env.num_envs]
            start += env.num_envs
            if any(s is None for s in part):
                continue
            env.unwrapped.set_state({k: np.concatenate([s[k] for s in part]) for k in part[0]})
        else:
            state = states[start]
            start += 1
            if state is not None:
                env.unwrapped.set_state(state)


# ------------------------------------------------------------------ the two forms of a collector state's envs
# A collector state's ``env_states`` holds every env's state by rollout index (by global index under torchrun),
# in one of two forms; whatever reads one goes through the functions below, and either form restores into any
# backend (converted once, when restored):
#   per env:  a list of ``num_envs`` entries, each one env's ``get_state()`` (``None`` where the env has none); a
#             VectorEnv's state is split along its env axis into ``[1, ...]`` arrays. Backends that host envs
#             in groups (serial, sync, async, ray) keep this form, and the device backend did before issue 63
#             (its older checkpoints hold it).
#   batched:  one dict ``{name: array [num_envs, ...]}``, a torch-batched env's ``get_state()`` whole: the device
#             backend's, so that its snapshot each iteration costs a few array copies whatever the number of
#             envs, and a checkpoint stores a few arrays rather than one small dict per env.
EnvStates = list[Any] | dict[str, np.ndarray]


def env_state_count(states: EnvStates) -> int:
    """How many envs ``states`` (either form) holds.

    >>> env_state_count([None, None, None]), env_state_count({"t": np.zeros(4), "buffer": np.zeros((4, 8))})
    (3, 4)
    """
    if isinstance(states, dict):
        return len(next(iter(states.values()), ()))
    return len(states)


def per_env_states(states: EnvStates) -> list[Any]:
    """``states`` in the per-env form: a batched one split along its env axis (one copy per env and array: a
    restore into a backend that hosts envs in groups, or an older reader, pays it once).

    >>> [s["t"].tolist() for s in per_env_states({"t": np.array([5, 6])})]
    [[5], [6]]
    """
    if isinstance(states, dict):
        return [{k: v[j:j + 1].copy() for k, v in states.items()} for j in range(env_state_count(states))]
    return list(states)


def batched_env_states(states: EnvStates) -> dict[str, np.ndarray] | None:
    """``states`` in the batched form (the per-env entries of a VectorEnv's state joined along the env axis);
    ``None`` where some env has no state.

    >>> batched_env_states([{"t": np.array([5])}, {"t": np.array([6])}])["t"].tolist()
    [5, 6]
    """
    if isinstance(states, dict):
        return states
    states = list(states)
    if not states or any(s is None for s in states):
        return None
    return {k: np.concatenate([np.asarray(s[k]) for s in states]) for k in states[0]}


def joined_env_states(parts: Sequence[EnvStates]) -> EnvStates:
    """The states of consecutive env slices (e.g. one per torchrun rank) as one: batched where every part is."""
    if all(isinstance(p, dict) for p in parts):
        return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
    return [s for p in parts for s in per_env_states(p)]


def env_states_of(states: EnvStates, envs: slice) -> EnvStates:
    """The part of ``states`` that belongs to the envs ``envs`` (same form; views, not copies).

    >>> env_states_of({"t": np.arange(4)}, slice(1, 3))["t"].tolist(), env_states_of([7, 8, 9], slice(2, 3))
    ([1, 2], [9])
    """
    if isinstance(states, dict):
        return {k: np.asarray(v)[envs] for k, v in states.items()}
    return list(states)[envs]


def close_envs(envs: Sequence[Any]) -> None:
    """Close every env; best effort, since the env is gone either way."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass
