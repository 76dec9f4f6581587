"""Playing a policy over whole episodes: the held-out seeds (test episodes for ``trainer.evaluate``, validation
episodes during training), the env arguments they are played with, and one record per episode."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from trainer.evaluation.statistics import jain_index

Act = Callable[[np.ndarray], np.ndarray]
_EVAL_STREAM = 0x5EED_E7A1  # spawn key that separates evaluation seeds from training seeds
_VALIDATION_STREAM = 0x5EED_7A11  # and validation seeds (model selection during training) from both
_EPISODE_ENDED: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("episode_ended",
                                                                                          default=None)


@contextlib.contextmanager
def episodes_shown(total: int, what: str = "episodes") -> Iterator[None]:
    """For the block, a progress bar of ``total`` episodes that every episode :func:`run_episodes` finishes moves
    (on standard error, where it is a terminal: a piped or captured run prints nothing more).

    Why: an evaluation plays every player's episodes, then the baselines' validation episodes, for minutes
    without a line; the commands know the total, the players' code need not know the bar.
    """
    from tqdm import tqdm

    bar = tqdm(total=total, unit="ep", desc=what, dynamic_ncols=True, file=sys.stderr,
               disable=not sys.stderr.isatty())
    token = _EPISODE_ENDED.set(bar.update)
    try:
        yield
    finally:
        _EPISODE_ENDED.reset(token)
        bar.close()


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
    """``act(obs [B, *obs]) -> actions`` (NumPy) of a trained model (its ``act_deterministic``, or its ``act``'s
    sampled ``action``)."""
    def act(obs: np.ndarray) -> np.ndarray:
        obs_t = torch.from_numpy(obs)
        return (model.act_deterministic(obs_t) if deterministic else model.act(obs_t)["action"]).numpy()
    return act


def _say_episode_ended() -> None:
    if (ended := _EPISODE_ENDED.get()) is not None:  # within episodes_shown
        ended()


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
    and ``fairness`` (Jain's index of the users' mean quality), both over the active users only where
    ``info["active"]`` says which are (a cell whose users vary).
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
                    _say_episode_ended()
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
    """Running sums of one episode: return, length and, where ``info`` has them, per-user QoE_lin and quality, over
    the steps each user slot was active (``info["active"]``, where the cell's users vary; else every step)."""

    def __init__(self) -> None:
        self.ret, self.length = 0.0, 0
        self.qoe_lin: np.ndarray | float = 0.0
        self.quality: np.ndarray | float = 0.0
        self.active: np.ndarray | float = 0.0  # steps each slot was active
        self.per_user = self.masked = False

    def add(self, reward: float, info: dict[str, Any]) -> None:
        self.ret += reward
        self.length += 1
        if "qoe_lin" in info and "quality" in info:
            self.per_user = True
            quality = np.asarray(info["quality"], dtype=np.float64)
            self.qoe_lin = self.qoe_lin + np.asarray(info["qoe_lin"], dtype=np.float64)  # (0 where inactive)
            self.quality = self.quality + quality
            self.masked = self.masked or "active" in info
            self.active = self.active + np.asarray(info.get("active", np.ones_like(quality)), dtype=np.float64)

    def record(self) -> dict[str, float]:
        """``return``, ``length``, ``reward_per_step`` and, per user, ``qoe_lin`` (the mean over the active users'
        segments) and ``fairness`` (Jain's index of each slot's mean quality over the steps it was active, among
        the slots active at some step)."""
        out = {"return": self.ret, "length": self.length, "reward_per_step": self.ret / self.length}
        if self.per_user:
            if not self.masked:  # every slot active at every step (as before cells varied, to the last bit)
                out["qoe_lin"] = float(np.mean(self.qoe_lin)) / self.length
                out["fairness"] = jain_index(np.asarray(self.quality) / self.length)
                return out
            active = np.asarray(self.active)
            seen = active > 0
            out["qoe_lin"] = float(np.sum(self.qoe_lin)) / float(active.sum())
            out["fairness"] = jain_index(np.asarray(self.quality)[seen] / active[seen])
        return out


def held_out_env_kwargs(trained: dict[str, Any], capacity_trace: str, split: str = "") -> dict[str, Any]:
    """The env arguments to evaluate with: the run's own (``--env-kwargs``), with ``--capacity-trace``
    replacing its traces, played on the files of ``split`` (``--trace-split``) where it is given. Else a set
    that comes split (``train/``, ``test/``; a shipped set) is played on its test folder (and then a flat folder
    beside it, as ``user_traces``, on its hash-split test files: one split applies to both); a folder given as
    ``--capacity-trace`` on all its files; the run's own flat folders on their hash-split held-out (``test``)
    files, as every run trained on them was evaluated.

    >>> held_out_env_kwargs({"num_users": 6, "capacity_trace": "trace.log"}, "")  # one file: all of it
    {'num_users': 6, 'capacity_trace': 'trace.log', 'trace_split': 'all'}
    >>> held_out_env_kwargs({}, "pensieve")["trace_split"]  # a shipped set: its test folder
    'test'
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as traces:  # the run's own folder: its held-out files
    ...     held_out_env_kwargs({"capacity_trace": traces, "trace_split": "train"}, "")["trace_split"]
    'test'
    >>> with tempfile.TemporaryDirectory() as traces:  # a folder given: all of it
    ...     held_out_env_kwargs({"capacity_trace": "t/", "trace_split": "train"}, traces)["trace_split"]
    'all'
    """
    from envs.traces import has_split_folders, trace_root

    kwargs = dict(trained)
    if capacity_trace:
        kwargs["capacity_trace"] = capacity_trace
    sets = [kwargs[k] for k in ("capacity_trace", "user_traces") if kwargs.get(k)]
    if sets:
        came_split = any(has_split_folders(s) for s in sets)  # its train files never played: test for all
        own_folders = not capacity_trace and all(trace_root(s).is_dir() for s in sets)
        kwargs["trace_split"] = split or ("test" if came_split or own_folders else "all")
    return kwargs
