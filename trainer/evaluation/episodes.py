"""Playing a policy over whole episodes: the held-out seeds (test episodes for ``trainer.evaluate``, validation
episodes during training), the env arguments they are played with, and one record per episode."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from collectors.resources import torch_threads
from envs.profiles import profile_of
from trainer.evaluation.statistics import jain_index

Act = Callable[[np.ndarray], np.ndarray]
Plan = Callable[[np.ndarray, Sequence[gym.Env]], np.ndarray]  # a reference's: (obs, the envs of its rows) -> actions
Records = list[dict[str, float]]  # one per episode (run_episodes)
_EVAL_STREAM = 0x5EED_E7A1  # spawn key that separates evaluation seeds from training seeds
_VALIDATION_STREAM = 0x5EED_7A11  # and validation seeds (model selection during training) from both
_DISTILL_STREAM = 0x5EED_D157  # and the episodes a policy plays to be distilled from all three
_CURRICULUM_STREAM = 0x5EED_C0DE  # and the episodes a curriculum measures on (trainer.curriculum) from all four
EPISODE_BATCH = 16  # the envs run_episodes plays in lockstep by default (at most: one per episode); see Player.batch
_PLAYED: contextvars.ContextVar[Callable[[Fraction | int], None] | None] = contextvars.ContextVar("played",
                                                                                                  default=None)


@contextlib.contextmanager
def episodes_shown(total: int, what: str = "episodes") -> Iterator[None]:
    """For the block, a progress bar of ``total`` episodes that the episodes :func:`run_episodes` and
    :func:`play_together` play move (on standard error: where it is a terminal, redrawn; in a pipe or a log, a line
    now and then, none in the first 20 s: :func:`trainer.common.progress.progress_bar`): by each step of a batched
    env (a step of ``n`` episodes of ``T`` steps is ``n / T`` of an episode, the bar showing the whole episodes'
    worth played), else by each episode finished.

    Why: an evaluation plays every player's episodes, then the baselines' validation episodes, for minutes
    without a line; the commands know the total, the players' code need not know the bar. By the step: the
    episodes of a batched env end together, so a bar moved only as they end stood still for a whole cell.
    """
    from trainer.common.progress import progress_bar

    bar = progress_bar(total, what, unit="ep")
    try:
        with episodes_counted(bar.update):
            yield
    finally:
        bar.close()


@contextlib.contextmanager
def episodes_counted(played: Callable[[int], None]) -> Iterator[None]:
    """For the block, ``played(n)`` as the episodes :func:`run_episodes` and :func:`play_together` play add up to
    ``n`` more whole episodes (a bar of the caller's): a batched env's steps count as fractions of an episode
    (:func:`episodes_shown`), summed until they make a whole one, so that every episode played counts 1 in all."""
    owed = Fraction(0)  # played, not yet counted: less than an episode

    def add(amount: Fraction | int) -> None:
        nonlocal owed
        owed += amount
        if (whole := int(owed)) > 0:
            played(whole)
            owed -= whole

    token = _PLAYED.set(add)
    try:
        yield
    finally:
        _PLAYED.reset(token)


def evaluation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per evaluation episode, from a ``SeedSequence`` branch that training never uses."""
    return _branch_seeds(seed, episodes, _EVAL_STREAM)


def validation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per validation episode: a branch that neither training nor :func:`evaluation_seeds` uses."""
    return _branch_seeds(seed, episodes, _VALIDATION_STREAM)


def distillation_seeds(seed: int, episodes: int) -> list[int]:
    """One env seed per episode a policy plays to be labelled by an expert (``trainer.ppo.distillation``): a branch that
    neither training, :func:`evaluation_seeds` nor :func:`validation_seeds` uses."""
    return _branch_seeds(seed, episodes, _DISTILL_STREAM)


def curriculum_seeds(seed: int, episodes: int, update: int) -> list[int]:
    """One env seed per episode of a curriculum's ``update`` (``trainer.curriculum``: the iteration it follows), a
    fresh branch each, which neither training nor the branches above use."""
    return _branch_seeds(seed, episodes, _CURRICULUM_STREAM, update)


def _branch_seeds(seed: int, episodes: int, *stream: int) -> list[int]:
    children = np.random.SeedSequence(seed, spawn_key=stream).spawn(episodes)
    return [int(c.generate_state(1)[0]) for c in children]


def policy_actions(model: torch.nn.Module, deterministic: bool) -> Act:
    """``act(obs [B, *obs]) -> actions`` (NumPy) of a trained model (its ``act_deterministic``, or its ``act``'s
    sampled ``action``), on one torch thread.

    Why one: episodes are played in batches of at most 16 rows, where a second thread gains nothing (0.17 s for a
    policy's 16 VR-edge episodes either way, 2-core AMD EPYC) and, next to two busy processes, makes it 30x slower
    (17 s against 0.5 s) as the threads wait for each other.
    """
    def act(obs: np.ndarray) -> np.ndarray:
        obs_t = torch.from_numpy(obs)
        with torch_threads(1):
            return (model.act_deterministic(obs_t) if deterministic else model.act(obs_t)["action"]).numpy()
    return act


def say_played(amount: Fraction | int = 1) -> None:
    """Move the bar of :func:`episodes_shown`, where there is one, by ``amount`` episodes."""
    if (played := _PLAYED.get()) is not None:
        played(amount)


class _StepsShown:
    """What a batched env's steps add to the bar: each step ``1 / max_steps`` of an episode per row playing, the
    rest of an episode as it ends (one that ended early); whole episodes as they end where the env names no
    ``max_steps``."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        self.max_steps = getattr(getattr(env, "config", None), "max_steps", None)

    def stepped(self, rows: int) -> None:
        if self.max_steps:
            say_played(Fraction(rows, self.max_steps))

    def ended(self, length: int) -> None:
        say_played(Fraction(max(self.max_steps - length, 0), self.max_steps) if self.max_steps else 1)


def run_episodes(act: Act, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                 num_envs: int = EPISODE_BATCH, seeds: list[int] | None = None) -> Records:
    """A policy's or a heuristic's records of ``episodes`` whole episodes, episode ``i`` reset with
    ``evaluation_seeds(seed)[i]`` (or ``seeds[i]``): ``act(obs [n, *obs]) -> actions [n, ...]`` on the ``n <=
    num_envs`` rows playing, in one batched env where the env's profile declares one (:func:`native_vector_env`).
    A record: ``return``, ``length``, ``reward_per_step``, the env's ``episode_metrics`` and, where ``info`` has
    per-user ``qoe_lin`` and ``quality`` (VR-edge), ``qoe_lin`` and ``fairness`` over the active users."""
    seeds = _episode_seeds(episodes, seed, seeds)
    make = native_vector_env(env_fn)
    if make is None:
        return _single_records(_on_rows(act), env_fn, seeds, num_envs)
    return _batched_records(_on_rows(act), make, seeds, num_envs)


def reference_episodes(plan: Plan, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                       num_envs: int = EPISODE_BATCH, seeds: list[int] | None = None) -> Records:
    """A reference's records (as :func:`run_episodes`'), played in up to ``num_envs`` single envs in lockstep:
    ``plan(obs [n, *obs], envs) -> actions [n, ...]``, ``envs`` the ``n`` envs of the rows playing, whose state it
    reads (the clairvoyant, :class:`envs.planner.ClairvoyantPlanner`)."""
    return _single_records(_reading_envs(plan), env_fn, _episode_seeds(episodes, seed, seeds), num_envs)


def filter_episodes(act: Act, env_fn: Callable[[], gym.Env], episodes: int, seed: int, num_envs: int = EPISODE_BATCH,
                    seeds: list[int] | None = None) -> Records:
    """A stateful controller's records (as :func:`run_episodes`'), played in one natively batched env of
    ``num_envs`` rows: ``act(obs [num_envs, *obs])`` sees every row at every step, rows whose episodes ended
    included (their actions moot), so that it keeps a row per env (a filter: :class:`envs.belief_mpc.BeliefMPC`)."""
    return told_filter_episodes(lambda obs, playing: act(obs), env_fn, episodes, seed, num_envs, seeds)


def told_filter_episodes(act: Callable[[np.ndarray, np.ndarray], np.ndarray], env_fn: Callable[[], gym.Env],
                         episodes: int, seed: int, num_envs: int = EPISODE_BATCH, seeds: list[int] | None = None
                         ) -> Records:
    """As :func:`filter_episodes`, the controller told which rows play an episode that is recorded: ``act(obs
    [num_envs, *obs], playing [num_envs] bool)`` (what a guard counts its share of the steps over)."""
    make = _natively_batched(env_fn, "filter_episodes")
    return _batched_records(_on_every_row(act), make, _episode_seeds(episodes, seed, seeds), num_envs)


def batched_reference_episodes(plan: Plan, env_fn: Callable[[], gym.Env], episodes: int, seed: int,
                               num_envs: int = EPISODE_BATCH, seeds: list[int] | None = None) -> Records:
    """A reference's records played as :func:`filter_episodes` plays a filter: ``plan(obs [num_envs, *obs],
    [env])`` every row at every step, ``env`` the one batched env whose state it reads (a stateful reference:
    :class:`envs.foresight.ForesightMPC`; the clairvoyant's plans, each row's own, at a batched env's cost)."""
    make = _natively_batched(env_fn, "batched_reference_episodes")
    return _batched_records(_every_row_reading_env(plan), make, _episode_seeds(episodes, seed, seeds), num_envs)


def _episode_seeds(episodes: int, seed: int, seeds: list[int] | None) -> list[int]:
    """One env seed per episode: ``seeds``, or ``evaluation_seeds(seed, episodes)``; a count that is not one each
    refused."""
    seeds = evaluation_seeds(seed, max(episodes, 0)) if seeds is None else list(seeds)
    if episodes < 1 or len(seeds) != episodes:
        raise ValueError(f"got {len(seeds)} seeds to play episodes={episodes}: must be >= 1, one seed each")
    return seeds


def _natively_batched(env_fn: Callable[[], gym.Env], what: str) -> Callable[..., gym.vector.VectorEnv]:
    """``env_fn``'s batched env (:func:`native_vector_env`); one without refused in one line that names it."""
    make = native_vector_env(env_fn)
    if make is None:
        name = made[0] if (made := made_env(env_fn)) else env_fn
        raise ValueError(f"{what} needs an env batched natively, and {name!r} has none (its profile declares no "
                         f"vector_env): play it with run_episodes or reference_episodes")
    return make


# How a mode calls its player: (obs [rows, *obs], the rows playing [rows] bool, the envs the rows are) -> the rows
# it acted on (an index into the rows) and their actions. The two loops below (single envs: the modes that act on
# the rows playing; one batched env: every mode) are each the same for every mode.
_Call = Callable[[np.ndarray, np.ndarray, Sequence[gym.Env]], tuple[Any, np.ndarray]]


def _on_rows(act: Act) -> _Call:
    return lambda obs, playing, envs: (playing, act(obs[playing]))


def _reading_envs(plan: Plan) -> _Call:
    return lambda obs, playing, envs: (playing, plan(obs[playing], [e for e, p in zip(envs, playing) if p]))


def _on_every_row(act: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> _Call:
    return lambda obs, playing, envs: (slice(None), act(obs, playing))


def _every_row_reading_env(plan: Plan) -> _Call:
    return lambda obs, playing, envs: (slice(None), plan(obs, envs))


def _single_records(call: _Call, env_fn: Callable[[], gym.Env], seeds: list[int], num_envs: int) -> Records:
    """The records of ``seeds``' episodes, played in up to ``num_envs`` single envs in lockstep, the player called
    as ``call`` says on the envs playing."""
    episodes = len(seeds)
    envs = [env_fn() for _ in range(min(num_envs, episodes))]
    obs = [None] * len(envs)
    current = np.full(len(envs), -1)  # episode index each env is playing, -1 when idle
    stats = [_EpisodeStats() for _ in envs]
    records: list[dict[str, float] | None] = [None] * episodes
    next_episode = 0
    for i, env in enumerate(envs):
        obs[i], _ = env.reset(seed=seeds[next_episode])
        current[i], next_episode = next_episode, next_episode + 1
    try:
        while (current >= 0).any():
            playing = current >= 0
            _, actions = call(np.stack(obs), playing, envs)
            for j, i in enumerate(np.flatnonzero(playing)):
                obs[i], reward, terminated, truncated, info = envs[i].step(actions[j])
                stats[i].add(float(reward), info)
                if terminated or truncated:
                    records[current[i]] = {**stats[i].record(),
                                           **{k: float(v) for k, v in info.get("episode_metrics", {}).items()}}
                    stats[i] = _EpisodeStats()
                    say_played()
                    if next_episode < episodes:
                        obs[i], _ = envs[i].reset(seed=seeds[next_episode])
                        current[i], next_episode = next_episode, next_episode + 1
                    else:
                        current[i] = -1
    finally:
        for env in envs:
            env.close()
    return records  # type: ignore[return-value]


def native_vector_env(env_fn: Callable[[], gym.Env]) -> Callable[..., gym.vector.VectorEnv] | None:
    """``make(num_envs=n)``: ``n`` of ``env_fn``'s envs natively batched, where ``env_fn`` is ``gym.make`` of an env
    whose profile declares a batched env (VR-edge, whose batched env ``i`` reset with seed ``s_i`` plays exactly the
    single env's episode); else ``None``.

    Why: VR-edge's single env costs ~0.3 ms a step in Python, its batched env about that for all at once: a
    heuristic's 16 episodes take 0.15 s instead of 0.8 s.
    """
    made = made_env(env_fn)
    batched = None if made is None else profile_of(made[0]).vector_env_class()
    return None if batched is None else functools.partial(batched, **made[1])


def made_env(env_fn: Callable[[], gym.Env]) -> tuple[str, dict[str, Any]] | None:
    """The env id and arguments of ``env_fn`` where it is ``functools.partial(gym.make, id, **arguments)`` (how the
    trainer makes an env it plays); ``None`` for any other factory.

    >>> made_env(functools.partial(gym.make, "CartPole-v1", sutton_barto_reward=True))
    ('CartPole-v1', {'sutton_barto_reward': True})
    """
    if isinstance(env_fn, functools.partial) and env_fn.func is gym.make and len(env_fn.args) == 1:
        return env_fn.args[0], dict(env_fn.keywords)
    return None


def _batched_records(call: _Call, make: Callable[..., gym.vector.VectorEnv], seeds: list[int], num_envs: int
                     ) -> Records:
    """The records of ``seeds``' episodes, its ``num_envs`` envs one batched env, the player called as ``call``
    says: an env whose episode ends starts the next seed's (its state spliced in from a fresh env reset with that
    seed); an idle env plays on, unrecorded (its actions moot)."""
    env = make(num_envs=min(num_envs, len(seeds)))
    shown = _StepsShown(env)
    try:
        obs, _ = env.reset(seed=seeds[:env.num_envs])
        current = np.arange(env.num_envs)  # episode index each env is playing, -1 when idle
        next_episode = env.num_envs
        stats = [_EpisodeStats() for _ in current]
        records: list[dict[str, float]] = [{}] * len(seeds)
        actions = np.zeros((env.num_envs, *env.single_action_space.shape), dtype=env.single_action_space.dtype)
        while (current >= 0).any():
            playing = current >= 0
            rows, acted = call(obs, playing, [env])
            actions[rows] = acted
            obs, reward, terminated, truncated, info = env.step(actions)
            shown.stepped(int(playing.sum()))
            parts = {k: v for k, v in info.items() if not k.startswith(("_", "final_"))}
            for i in np.flatnonzero(playing):
                stats[i].add(float(reward[i]), {k: v[i] if v.ndim > 1 else float(v[i]) for k, v in parts.items()})
                if not (terminated[i] or truncated[i]):
                    continue
                metrics = info["final_info"].get("episode_metrics", {})
                records[current[i]] = {**stats[i].record(), **{k: float(v[i]) for k, v in metrics.items()}}
                shown.ended(stats[i].length)
                stats[i] = _EpisodeStats()
                if next_episode < len(seeds):
                    obs[i] = _restarted(env, i, make, seeds[next_episode])
                    current[i], next_episode = next_episode, next_episode + 1
                else:
                    current[i] = -1
    finally:
        env.close()
    return records


class Player(NamedTuple):
    """One player of :func:`play_together`: how it acts, and the episodes it plays (one env seed each)."""

    act: Act
    seeds: list[int]
    batch: int | None = None  # at most this many of its rows per call of ``act``, its episodes in order (None: all)
    # Why a trained policy plays in batches of EPISODE_BATCH: its matrix products take other kernels for a batch of
    # 1 to 3 rows (logits 1e-6 apart, measured with the cells recipe's set policy; from 4 rows on, the same to the
    # last bit), so batches of 16 in episode order (the last one 50 - 48 = 2 rows, as run_episodes' last envs)
    # keep its records those of run_episodes, which trainer.compare and benchmarks.cells_table play. A baseline
    # acts on each row alone: any batch gives the same actions.


def play_together(players: Sequence[Player], env_fn: Callable[[], gym.Env]) -> list[Records]:
    """Each player's records (as :func:`run_episodes` makes them, in the order of its seeds), all of them played in
    one natively batched env (:func:`native_vector_env`), one row per episode: every row steps at once, and each
    player acts on the rows of its episodes still playing (a row whose episode ended plays on, unrecorded); an env
    that is not batched natively plays each player's episodes with :func:`run_episodes`.

    Why: VR-edge's batched env steps 512 rows in about three times the time of 16 (10 ms against 3, 2-core AMD
    EPYC), so the players of a cell (the policy and 7 baselines, 50 episodes each) step together in about a tenth
    of the time they took one after another, 16 envs at a time; and no env is made anew for each episode. The same
    episodes (env ``i`` reset with its seed plays exactly that seed's episode), so a deterministic player's records
    are those of :func:`run_episodes`; a player that draws random numbers (``random``, a sampling policy) draws them
    in another order.
    """
    if not players or not all(p.seeds for p in players):
        raise ValueError("play_together needs players, each with at least one episode (seed) to play")
    make = native_vector_env(env_fn)
    if make is None:
        return [run_episodes(p.act, env_fn, len(p.seeds), 0, num_envs=p.batch or EPISODE_BATCH, seeds=p.seeds)
                for p in players]
    ends = np.cumsum([len(p.seeds) for p in players])
    env = make(num_envs=int(ends[-1]))
    shown = _StepsShown(env)
    try:
        obs, _ = env.reset(seed=[s for p in players for s in p.seeds])
        playing = np.ones(env.num_envs, dtype=bool)
        stats = _RowStats(env.num_envs)
        records: list[dict[str, float]] = [{}] * env.num_envs
        actions = np.zeros((env.num_envs, *env.single_action_space.shape), dtype=env.single_action_space.dtype)
        while playing.any():
            for player, end in zip(players, ends):
                _act_on_rows(player, end - len(player.seeds), playing, obs, actions)
            obs, reward, terminated, truncated, info = env.step(actions)
            shown.stepped(int(playing.sum()))
            stats.add(playing, reward, info)
            for i in np.flatnonzero(playing & (terminated | truncated)):
                metrics = info["final_info"].get("episode_metrics", {})
                records[i] = {**stats.record(i), **{k: float(v[i]) for k, v in metrics.items()}}
                playing[i] = False
                shown.ended(int(stats.length[i]))
    finally:
        env.close()
    return [records[end - len(p.seeds):end] for p, end in zip(players, ends)]


def _act_on_rows(player: Player, start: int, playing: np.ndarray, obs: np.ndarray, actions: np.ndarray) -> None:
    """``player``'s actions into ``actions``, for its rows (from ``start``) still ``playing``, in its batches."""
    rows = len(player.seeds)
    batch = player.batch or rows
    for first in range(start, start + rows, batch):
        live = first + np.flatnonzero(playing[first:min(first + batch, start + rows)])
        if len(live):
            actions[live] = player.act(obs[live])


class _RowStats:
    """:class:`_EpisodeStats` for every row of a batched env at once (the same sums, added in the same order: the
    same numbers to the last bit), for the rows playing."""

    def __init__(self, rows: int) -> None:
        self.ret, self.length = np.zeros(rows), np.zeros(rows, dtype=np.int64)
        self.qoe_lin = self.quality = self.active = None  # [rows, U] where info has per-user QoE
        self.masked = False

    def add(self, playing: np.ndarray, reward: np.ndarray, info: dict[str, Any]) -> None:
        self.ret[playing] += reward[playing]
        self.length[playing] += 1
        if "qoe_lin" not in info or "quality" not in info:
            return
        quality = np.asarray(info["quality"], dtype=np.float64)
        if self.quality is None:
            self.qoe_lin, self.quality, self.active = (np.zeros(quality.shape) for _ in range(3))
        self.masked = self.masked or "active" in info
        active = np.asarray(info["active"], dtype=np.float64) if "active" in info else np.ones_like(quality)
        self.qoe_lin[playing] += np.asarray(info["qoe_lin"], dtype=np.float64)[playing]
        self.quality[playing] += quality[playing]
        self.active[playing] += active[playing]

    def record(self, i: int) -> dict[str, float]:
        """Row ``i``'s episode record (:meth:`_EpisodeStats.record`)."""
        episode = _EpisodeStats()
        episode.ret, episode.length = float(self.ret[i]), int(self.length[i])
        if self.quality is not None:
            episode.per_user, episode.masked = True, self.masked
            episode.qoe_lin, episode.quality, episode.active = self.qoe_lin[i], self.quality[i], self.active[i]
        return episode.record()


def _restarted(env: gym.vector.VectorEnv, i: int, make: Callable[..., gym.vector.VectorEnv], seed: int
               ) -> np.ndarray:
    """Env ``i`` of ``env`` put at the start of the episode of ``seed``; its first observation."""
    fresh = make(num_envs=1)
    first, _ = fresh.reset(seed=[seed])
    state, start = env.get_state(), fresh.get_state()
    fresh.close()
    for key, value in state.items():
        value[i] = start[key][0]
    env.set_state(state)
    return first[0]


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


def held_out_env_kwargs(env: str, trained: dict[str, Any], given: str | dict[str, Any] = "", split: str = ""
                        ) -> dict[str, Any]:
    """The arguments ``env``'s held-out episodes are played with: the run's own (``trained``) with ``given`` over
    them (``trainer.evaluate --env-kwargs``), as the env's profile chooses them (VR-edge: a trace set's test split,
    :func:`envs.vr_edge_profile.held_out_arguments`; an env without a profile: its own arguments).

    >>> held_out_env_kwargs("CartPole-v1", {"sutton_barto_reward": True}, {})
    {'sutton_barto_reward': True}
    """
    return profile_of(env).held_out(trained, given, split)
