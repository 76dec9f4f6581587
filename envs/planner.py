"""A clairvoyant reference for VR-edge: model-predictive control over the true future of an episode.

Not a deployable policy: it reads the env's state (``get_state``), and since the env's
randomness is counter-based and the cell and the users' channels do not depend on the
actions, it rolls the true capacities and channel qualities of the next ``lookahead``
rounds out exactly. It then searches the joint bitrates of all users over those rounds,
under the cell's real sharing (processor sharing) and buffers, for the highest sum of
rewards, by coordinate ascent over users: ``sweeps`` passes over the users, each trying,
with the other users' plans fixed, every change of one user's plan that switches it to one
level from some round on, or changes one round alone, and keeping the best (keeping the
plan is a candidate, so a pass never lowers the plan's value). The search starts from every
user at its equal airtime share of each round's true capacity. It plays the plan's first
round and plans again (receding horizon).

In a cell whose users vary it plans the users active now (a slot's share of the cell is split among
them, and the rewards are their mean); an inactive slot plays level 0. It does not foresee who
leaves or joins in the lookahead.

A plan that makes a user abandon (cumulative stall over ``abandon_stall_s``) forfeits the
rest of the episode; the search charges it ``quality_weight`` per remaining round, the
most that round could have earned.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_dynamics import channel_of, download_round, step_state, user_mean

_START_FACTORS = np.array([0.7, 1.0, 1.3, 1.6, 2.0])


class ClairvoyantPlanner:
    """Receding-horizon planner that sees the true future capacities and channels (a reference, not a policy).

    Example:
        >>> import envs
        >>> from envs.planner import ClairvoyantPlanner
        >>> env = envs.SyntheticVREdgeEnv(num_users=3, seed=0, max_steps=20)
        >>> obs, _ = env.reset()
        >>> planner = ClairvoyantPlanner(env.config, lookahead=3, sweeps=1)
        >>> planner(obs[None], [env]).shape   # one row per env, one level per user
        (1, 3)

    Shapes: :meth:`plan` maps a batched env state (``[B]`` leading axis, as
    ``VREdgeVectorEnv.get_state()`` returns) to levels ``[B, U]``; calling it with
    observations ``[B, obs_dim]`` and the ``B`` envs they came from does the same for
    single envs (``trainer.evaluation.reference_episodes``).
    """

    def __init__(self, config: VREdgeConfig, lookahead: int = 5, sweeps: int = 2) -> None:
        for name, value in (("lookahead", lookahead), ("sweeps", sweeps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ClairvoyantPlanner {name}={value!r} is invalid: must be an integer >= 1")
        self.config, self.lookahead, self.sweeps = config, lookahead, sweeps

    def __call__(self, obs: np.ndarray, envs: Sequence[gym.Env]) -> np.ndarray:
        return self.plan(env_states(envs))

    def plan(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Levels ``[B, U]`` for the next round of ``B`` envs in ``state``."""
        cfg, horizon = self.config, self.lookahead
        capacity, channel = self.future(state)
        b, n_users = state["buffer"].shape
        active = state["active"] if cfg.varies else None
        count = n_users if active is None else active.sum(axis=1)[:, None, None, None]
        # rounds past the episode's end earn nothing; abandoning forfeits the rest of the episode
        remaining = cfg.max_steps - state["t"]
        live = (np.arange(horizon)[None, :] < remaining[:, None]).astype(np.float64)  # [B, H]
        # start: the best of "every user at the level that `factor` times its equal airtime share carries",
        # round by round or held at the horizon's worst round
        share = capacity[:, None, :, None] * channel[:, None] / count * _START_FACTORS[:, None, None]
        starts = np.concatenate([share, np.repeat(share.min(axis=2, keepdims=True), horizon, axis=2)], axis=1)
        starts = np.maximum(np.searchsorted(cfg.ladder, starts, side="right") - 1, 0)  # [B, S, H, U]
        plan = starts[np.arange(b), np.argmax(self.value(state, capacity, channel, live, remaining, starts), axis=1)]
        moves = self._moves(cfg.num_levels, horizon)  # [K, H] new level, -1: keep
        rows = np.arange(b)
        for _ in range(self.sweeps):
            for u in range(n_users):
                if active is not None and not active[:, u].any():
                    continue  # a slot active nowhere: nothing to plan
                candidates = np.repeat(plan[:, None], len(moves), axis=1)  # [B, K, H, U]
                candidates[..., u] = np.where(moves >= 0, moves, candidates[..., u])
                value = self.value(state, capacity, channel, live, remaining, candidates)
                plan = candidates[rows, np.argmax(value, axis=1)]  # keeping the plan is a candidate
        return plan[:, 0] if active is None else np.where(active, plan[:, 0], 0)

    @staticmethod
    def _moves(levels: int, horizon: int) -> np.ndarray:
        """Changes tried for one user's row of the plan, ``[K, H]`` (-1 keeps the entry): first nothing, then
        every level from round ``h`` on (one switch), then every level in round ``h`` alone."""
        moves = [np.full(horizon, -1)]
        for h in range(horizon):
            for level in range(levels):
                suffix, single = np.full(horizon, -1), np.full(horizon, -1)
                suffix[h:], single[h] = level, level
                moves += [suffix, single] if h + 1 < horizon else [suffix]
        return np.stack(moves)

    def future(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """True capacities ``[B, H]`` (Mbit/s) and channel qualities ``[B, H, U]`` of the next ``H`` rounds."""
        rounds = true_rounds(self.config, state, self.lookahead)
        return (np.stack([capacity for _, capacity in rounds], axis=1),
                np.stack([channel_of(self.config, after) for after, _ in rounds], axis=1))

    def value(self, state: dict[str, np.ndarray], capacity: np.ndarray, channel: np.ndarray, live: np.ndarray,
              remaining: np.ndarray, plans: np.ndarray) -> np.ndarray:
        """Sum of rewards ``[B, K]`` of ``K`` candidate plans ``[B, K, H, U]`` over the true future."""
        cfg = self.config
        k = plans.shape[1]
        active = state["active"][:, None] if cfg.varies else None  # [B, 1, U]
        buffer = np.repeat(state["buffer"][:, None], k, axis=1)
        level = np.repeat(state["level"][:, None], k, axis=1)
        cum_stall = np.repeat(state["cum_stall"][:, None], k, axis=1)
        alive = np.ones(plans.shape[:2])
        total = np.zeros(plans.shape[:2])
        for h in range(plans.shape[2]):
            r = download_round(cfg, buffer, level, capacity[:, None, h], channel[:, None, h], plans[:, :, h], active)
            weight = alive * live[:, h, None]
            total += weight * (r["user_reward"].mean(axis=-1) if active is None else
                               user_mean(cfg, r["user_reward"], active))
            cum_stall = cum_stall + r["stall_s"]
            abandoned = np.any(cum_stall > cfg.abandon_stall_s, axis=-1) & (weight > 0)
            total -= abandoned * cfg.quality_weight * np.maximum(remaining - h - 1, 0)[:, None]
            alive = alive * ~abandoned
            buffer, level = r["buffer"], plans[:, :, h]
        return total


def env_states(envs: Sequence[gym.Env]) -> dict[str, np.ndarray]:
    """The state ``[B]`` of ``envs``, their rows in order: single envs (one row each) or batched ones
    (``VREdgeVectorEnv``: one row per env it batches), each read with its ``get_state()``."""
    states = [env.unwrapped.get_state() for env in envs]
    return {k: np.concatenate([s[k] for s in states]) for k in states[0]}


def true_rounds(config: VREdgeConfig, state: dict[str, np.ndarray], rounds: int
                ) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The env's own next ``rounds`` rounds from ``state`` ``[B]`` (a copy moves on; ``state`` does not): per round
    the state after it and the round's capacity ``[B]`` (Mbit/s). Its randomness is counter-based and the cell and
    the users' channels do not depend on the actions (any will do: level 0 is played), so they are the true future;
    the users' buffers and levels in these states are level 0's, not the plan's."""
    sim = {k: v.copy() for k, v in state.items()}
    idle = np.zeros_like(state["level"])
    out = []
    for _ in range(rounds):
        sim, _, _, _, parts = step_state(config, sim, idle)
        out.append((sim, parts["capacity_mbps"]))
    return out
