"""A causal reference for VR-edge: model-predictive control over the belief about the cell, from observations only.

Each step :class:`BeliefMPC` updates the exact filter over the cell's hidden state (:class:`envs.belief.RegimeFilter`),
draws ``scenarios`` futures of the next ``horizon`` rounds from it (the same for every candidate; the first round's
rare fade always among them, weighted), and improves a base policy by multiagent rollout (Bertsekas): user by user,
with the others' levels fixed (the ones already improved, the base's for the rest), it tries every level for that
user in this round, the base policy playing every user in the rounds after, and keeps the level of the highest
expected sum of rewards over the scenarios (the base's level is a candidate, so on the scenarios drawn the plan is
never worse than the base policy's). A plan that makes a user abandon is charged ``quality_weight`` per remaining
round (as :mod:`envs.planner`). In a cell whose users vary it counts the users active now (it does not foresee
churn within the horizon); an inactive slot plays level 0.

With a :class:`TerminalValue` (a trained critic and the discount it was trained with) the rollout estimates the
critic's own quantity instead, the discounted return ``sum_h gamma^h r_h + gamma^H V(s_H)``: the base policy plays
``H = horizon`` rounds, then the critic values the observation of the state reached. The value is added only where
the episode goes on after the horizon and nobody abandoned: past the episode's last round there is no reward to
estimate, and an abandonment ends the episode (the env's termination, after which the critic was trained to expect
nothing), so an abandoning plan keeps the rewards up to its abandonment and forgoes the value the others are
credited with; the flat per-round forfeit, which stands in for the rewards a truncated rollout cannot see, is not
charged on top of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from envs.baselines import make_baseline, only_active
from envs.belief import Futures, RegimeFilter, cell_seen
from envs.settings import ConfigError, Limits, check_limits, setting
from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_dynamics import (
    channel_quality,
    decode_observation,
    download_round,
    observe,
    user_mean,
    users_after_round,
)

Policy = Callable[[np.ndarray], np.ndarray]  # observations [B, obs_dim] -> levels [B, U]
Value = Callable[[np.ndarray], np.ndarray]  # observations [B, obs_dim] -> estimated discounted returns [B]
_TIE = 1e-9  # an expected return higher by less than this is rounding: the level in the plan stays
# The rollout on a trained policy ending on its critic (a TerminalValue): 4 rounds, a level kept unless a candidate's
# lead is one standard error clear (kept_unless_clear). Above the distilled default policy on 3 seeds' held-out
# episodes, chosen on validation episodes (docs/ceiling.md); with the defaults (12 rounds, any lead) it scored below
# the policy, its noise-chosen switches costing for real. trainer.evaluate --belief-base policy_critic plays it, and
# approximate policy iteration labels with it (trainer.distill --expert rollout).
ON_CRITIC = {"horizon": 4, "margin": 1.0}


@dataclass(frozen=True)
class BeliefMPCSettings:
    """How hard :class:`BeliefMPC` searches; defaults measured on validation seeds (``docs/benchmarks.md``).

    >>> BeliefMPCSettings().horizon >= 1
    True
    >>> BeliefMPCSettings(scenarios=1)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: scenarios must be >= 2 and <= 1024, got 1
    """

    horizon: int = setting(12, "rounds each scenario looks ahead: this round's levels by rollout, the base policy "
                           "in the rounds after", at_least=1, at_most=32)
    scenarios: int = setting(16, "futures of the cell drawn per env and step, the same for every candidate (the "
                             "first round's fade stratified)", at_least=2, at_most=1024)
    sweeps: int = setting(1, "passes over the users, each improving one user's level at a time", at_least=1,
                          at_most=8)
    seed: int = setting(0, "seed of the scenarios' counter-based draws", at_least=0)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f.name, value, "must be an integer", flag=False)
        check_limits(self, flags=False)


@dataclass(frozen=True)
class TerminalValue:
    """What :class:`BeliefMPC`'s rollout adds after its horizon (module docstring): ``gamma ** horizon`` times
    ``value`` of the observation reached, with every reward before discounted by ``gamma`` too (the return the value
    estimates). Off (``None``) by default: the truncated, undiscounted rollout.

    >>> tail = TerminalValue(lambda obs: np.zeros(len(obs)), gamma=0.9)   # value: obs [N, obs_dim] -> [N]
    >>> tail.value(np.zeros((4, 7))).shape, tail.gamma
    ((4,), 0.9)
    >>> TerminalValue(lambda obs: np.zeros(len(obs)), gamma=1.5)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: gamma must be > 0 and <= 1, got 1.5
    """

    value: Value = field(metadata={"help": "the estimate of the discounted return from an observation on, the base "
                                           "policy playing (a trained critic: trainer.evaluation.policies)"})
    gamma: float = field(metadata={"help": "the discount the value's return is estimated with (the run's --gamma); "
                                           "the rollout's rewards are discounted by it too",
                                   "limits": Limits(above=0, at_most=1, flag=False)})

    def __post_init__(self) -> None:
        if not callable(self.value):
            raise ConfigError("value", self.value, "must be a function of observations", flag=False)
        if not isinstance(self.gamma, (int, float)) or isinstance(self.gamma, bool):
            raise ConfigError("gamma", self.gamma, "must be a number", flag=False)
        check_limits(self, flags=False)


class BeliefMPC:
    """Belief-state MPC for ``B`` VR-edge envs: observations in, levels out, no env state read (module docstring).

    Example:
        >>> import envs
        >>> from envs.belief_mpc import BeliefMPC
        >>> venv = envs.VREdgeVectorEnv(2, num_users=3, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> mpc = BeliefMPC(venv.config, base="fair_share", horizon=2, scenarios=4)
        >>> mpc(obs).shape   # one row per env, one level per user
        (2, 3)

    Shapes: ``mpc(obs [B, obs_dim]) -> [B, U]`` int64 levels. It is stateful (the filter): pass every env's
    observation at every step, in order (``trainer.evaluation.filter_episodes``). ``base``: a
    baseline's name, or any policy ``obs -> levels`` (a trained one; truncated and sampled, the rollout is not sure
    to improve on it: measured worse on the default policy with the defaults, above it with the critic, 4 rounds
    and ``margin=1``, ``docs/ceiling.md``). ``terminal_value``: a
    :class:`TerminalValue` (the base's critic) the rollout ends on, ``None`` (default): none. ``margin``: a
    candidate replaces the plan's level only where its lead over that level, paired over the scenarios, is more than
    ``margin`` standard errors of that lead (:func:`kept_unless_clear`; 0, the default: any lead, as plain rollout).
    Keyword arguments are :class:`BeliefMPCSettings`; a trace-driven cell is refused
    (:class:`envs.belief.RegimeFilter`).
    """

    def __init__(self, config: VREdgeConfig, base: str | Policy = "fair_share",
                 terminal_value: TerminalValue | None = None, margin: float = 0.0, **settings: Any) -> None:
        self.settings = BeliefMPCSettings(**settings)
        if terminal_value is not None and not isinstance(terminal_value, TerminalValue):
            raise ConfigError("terminal_value", terminal_value, "must be a TerminalValue or None", flag=False)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < float("inf"):
            raise ConfigError("margin", margin, "must be a number of standard errors >= 0 (0 takes any lead)",
                              flag=False)
        self.terminal_value, self.margin = terminal_value, float(margin)
        self.config = config
        self.filter = RegimeFilter(config, seed=self.settings.seed)
        self.base = make_baseline(base, config) if isinstance(base, str) else base

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Levels ``[B, U]`` for the next round of the ``B`` envs that show ``obs``."""
        self.filter.update(obs)
        return self.planned(obs, self.filter.futures(obs, self.settings.scenarios, self.settings.horizon))

    def planned(self, obs: np.ndarray, futures: Futures) -> np.ndarray:
        """Levels ``[B, U]`` for the envs that show ``obs``: the base policy's, improved by rollout on the
        scenarios ``futures`` (``settings.sweeps`` passes over the users); an inactive slot's are 0."""
        start = state_from_observation(self.config, obs)
        plan = np.array(self.base(obs), dtype=np.int64)
        for _ in range(self.settings.sweeps):
            plan = self._improved(start, futures, plan)
        return only_active(self.config, obs, plan)

    def _improved(self, start: dict[str, np.ndarray], futures: Futures, plan: np.ndarray) -> np.ndarray:
        """``plan`` ``[B, U]`` after one pass over the users, each given its level of the highest expected return
        with the others' fixed (its own kept unless another is better by more than :data:`_TIE`, or with a
        ``margin``, unless another's lead is clear: :func:`kept_unless_clear`)."""
        levels, rows = self.config.num_levels, np.arange(len(plan))
        for u in range(self.config.num_users):
            if "active" in start and not start["active"][:, u].any():
                continue  # a slot active nowhere: nothing to improve
            candidates = np.repeat(plan[:, None], levels, axis=1)  # [B, L, U]
            candidates[:, :, u] = np.arange(levels)
            if self.margin:
                returns = self.scenario_returns(start, futures, candidates)
                plan[:, u] = kept_unless_clear(returns, futures.weight, plan[:, u], self.margin)
                continue
            value = self.expected_return(start, futures, candidates)
            best = np.argmax(value, axis=1)
            better = value[rows, best] > value[rows, plan[:, u]] + _TIE
            plan[:, u] = np.where(better, best, plan[:, u])
        return plan

    def expected_return(self, start: dict[str, np.ndarray], futures: Futures, first: np.ndarray) -> np.ndarray:
        """Expected sum of rewards ``[B, K]`` over the next ``horizon`` rounds of playing the levels ``first``
        ``[B, K, U]`` this round and the base policy after, the weighted mean over the scenarios ``futures``; with
        :attr:`terminal_value`, the expected discounted return, the value after the horizon included (module
        docstring)."""
        return (self.scenario_returns(start, futures, first) * futures.weight[:, :, None]).sum(axis=1)

    def scenario_returns(self, start: dict[str, np.ndarray], futures: Futures, first: np.ndarray) -> np.ndarray:
        """:meth:`expected_return`'s sums of rewards (or discounted returns) ``[B, S, K]``, each scenario's own."""
        cfg = self.config
        b, k, _ = first.shape
        scenarios, horizon = futures.weight.shape[1], futures.capacity.shape[2]
        sim = {key: np.repeat(v, scenarios * k, axis=0) for key, v in start.items()}  # [B * S * K, ...]
        cell = {name: _per_candidate(getattr(futures, name), k) for name in
                ("capacity", "channel_logit", "regime", "fade")}  # [B * S * K, H, ...]
        cell["channel"] = _per_candidate(channel_quality(futures.channel_logit), k)  # (once for all candidates)
        actions = np.repeat(first[:, None], scenarios, axis=1).reshape(b * scenarios * k, -1)
        total, alive = np.zeros(len(actions)), np.ones(len(actions))
        remaining = cfg.max_steps - sim["t"]
        tail = self.terminal_value
        for h in range(horizon):
            if h:
                actions = np.asarray(self.base(observe(cfg, sim)), dtype=np.int64)
            sim, reward, abandoned = self._round(sim, {name: v[:, h] for name, v in cell.items()}, actions)
            weight = alive * (h < remaining)
            # with the critic, its return: discounted, and an abandonment ends it (the critic prices what is lost)
            total += weight * (reward if tail is None else tail.gamma ** h * reward)
            abandoned &= weight > 0
            if tail is None:
                total -= abandoned * cfg.quality_weight * np.maximum(remaining - h - 1, 0)  # the rest is forfeit
            alive *= ~abandoned
        if tail is not None:  # where the episode goes on after the horizon and nobody left: the critic's value
            going_on = (alive > 0) & (horizon < remaining)
            value = np.asarray(tail.value(observe(cfg, sim)), dtype=np.float64)
            total += np.where(going_on, tail.gamma ** horizon * value, 0.0)  # (not 0 x a value: it may be NaN there)
        return total.reshape(b, scenarios, k)

    def _round(self, sim: dict[str, np.ndarray], cell: dict[str, np.ndarray], actions: np.ndarray
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """One round of the simulated states ``sim`` in the scenario's ``cell`` (capacity, channel logits and
        qualities, regime, fade), by the env's functions: the states after it, the reward and whether a user
        abandoned."""
        cfg = self.config
        active = sim.get("active")
        actions = actions if active is None else np.where(active, actions, 0)
        r = download_round(cfg, sim["buffer"], sim["level"], cell["capacity"], cell["channel"], actions, active)
        switched = (actions != sim["level"]).astype(np.float64)
        users = users_after_round(cfg, sim, r, actions, switched, cell["capacity"], active)
        after = {**sim, **users, "t": sim["t"] + 1, "channel_logit": cell["channel_logit"], "regime": cell["regime"],
                 "fade": cell["fade"]}
        abandoned = np.any(users["cum_stall"] > cfg.abandon_stall_s, axis=1)
        return after, user_mean(cfg, r["user_reward"], active), abandoned


def kept_unless_clear(returns: np.ndarray, weight: np.ndarray, kept: np.ndarray, margin: float) -> np.ndarray:
    """Each row's level ``[B]``: of the candidates' returns ``[B, S, L]`` on ``S`` weighted scenarios (``weight``
    ``[B, S]``, each row's summing to 1), the level whose lead over the ``kept`` level, paired scenario by scenario,
    is highest less ``margin`` standard errors of that lead, where that is above zero; else ``kept``.

    Why: the rollout's choice among levels is made on a few scenarios, so a candidate whose estimated return beats
    the base's by a hair is as often worse; each such switch costs for real (quality changes are charged). The
    standard error is the weighted spread of the paired lead over the effective number of scenarios,
    ``1 / sum(w^2)``.

    >>> returns = np.array([[[1.0, 1.1, 3.0], [1.0, 0.9, 3.1]]])  # one row, 2 scenarios, 3 levels
    >>> w = np.array([[0.5, 0.5]])
    >>> kept_unless_clear(returns, w, np.array([0]), 1.0).tolist()  # level 2's lead is clear, level 1's is noise
    [2]
    >>> kept_unless_clear(returns[:, :, :2], w, np.array([0]), 1.0).tolist()  # level 1 alone: kept
    [0]
    """
    rows = np.arange(len(kept))
    lead = returns - returns[rows, :, kept][:, :, None]  # [B, S, L], 0 for the kept level
    mean = (lead * weight[:, :, None]).sum(axis=1)
    spread = (weight[:, :, None] * (lead - mean[:, None]) ** 2).sum(axis=1)
    clear = mean - margin * np.sqrt(spread * (weight ** 2).sum(axis=1)[:, None])
    best = np.argmax(clear, axis=1)
    return np.where(clear[rows, best] > _TIE, best, kept)


def _per_candidate(x: np.ndarray, k: int) -> np.ndarray:
    """A scenario array ``[B, S, ...]`` as ``[B * S * k, ...]``: one row per (env, scenario, candidate)."""
    return np.repeat(x, k, axis=1).reshape(-1, *x.shape[2:])


def state_from_observation(cfg: VREdgeConfig, obs: np.ndarray) -> dict[str, np.ndarray]:
    """The env state ``[B]`` an observation shows, as far as a round and :func:`envs.vr_edge_dynamics.observe` read
    it: the users' buffers, levels, throughputs, downloads, stalls and channels, the capacity history, the step, and
    where the cell varies the users drawn and the active ones (the episode's running sums start at 0)."""
    f, seen = decode_observation(cfg, obs), cell_seen(cfg, obs)
    b = len(obs)
    state = {"buffer": f["buffer"], "level": f["last_level"], "throughput": f["throughput"],
             "download_time": f["download_time"], "stall": f["stall"], "cum_stall": f["cum_stall"],
             "channel_logit": seen.channel_logit, "cap_history": f["cap_history"] * np.ones((b, 1)), "t": seen.t,
             "ep_quality": np.zeros(b), "ep_stall": np.zeros(b), "ep_switches": np.zeros(b)}
    if cfg.varies:
        state.update(users=seen.users.astype(np.int64), active=seen.active)
    return state
