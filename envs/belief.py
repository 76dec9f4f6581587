"""What a causal controller can know of the VR-edge cell: the exact posterior over its hidden state, from
observations only, and futures of the cell sampled from it.

The synthetic cell's capacity is ``nominal x multiplier[regime] x fade_depth^fade x exp(noise - std^2 / 2)``
(:func:`envs.vr_edge_dynamics.synthetic_capacity`): a 3-regime Markov chain times a 2-state fade chain (6 hidden
states ``h = 2 regime + fade``), and AR(1) noise in log space. The observation shows the newest capacity over the
episode's nominal capacity (the last entry of the capacity history; the ratio needs no nominal, whatever the users
drawn), so given a hidden state the noise is fixed:
``noise_t(h) = log ratio_t - log(multiplier x fade factor) + std^2 / 2``. The likelihood of the observed capacities
given a path of hidden states is then a product of Gaussian densities
(the stationary one at reset, the AR(1) innovation's after), and the forward recursion over the 6 states

    alpha_t(h) = sum_g alpha_{t-1}(g) T(g, h) N(noise_t(h); corr noise_{t-1}(g), (1 - corr^2) std^2)

is the exact posterior (the Jacobian from noise to log capacity is 1 for every ``h``, so it cancels). Users'
channels are observed exactly (an active user's channel quality inverts to its AR(1) logit).
"""

from __future__ import annotations

import copy
import functools
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from envs import rng
from envs.settings import ConfigError
from envs.vr_edge_config import REGIMES, USER_FEATURES, VREdgeConfig
from envs.vr_edge_draws import Draw
from envs.vr_edge_dynamics import cell_round, synthetic_capacity

FADES = 2  # a deep fade is on or off
HIDDEN = len(REGIMES) * FADES  # hidden state h = FADES * regime + fade
_REGIME_OF = np.repeat(np.arange(len(REGIMES)), FADES)  # [6]
_FADE_OF = np.tile(np.arange(FADES), len(REGIMES)).astype(bool)  # [6]
_CHANNEL = USER_FEATURES.index("channel")


def regime_transition(cfg: VREdgeConfig) -> np.ndarray:
    """``[3, 3]``: P(next regime | regime) of the env's step (:func:`envs.vr_edge_dynamics.cell_round`): it stays with
    ``regime_stay_prob``, else moves to either other regime alike."""
    move = (1 - cfg.regime_stay_prob) / (len(REGIMES) - 1)
    return np.where(np.eye(len(REGIMES), dtype=bool), cfg.regime_stay_prob, move)


def fade_transition(cfg: VREdgeConfig) -> np.ndarray:
    """``[2, 2]``: P(next fade | fade) of the env's step: a fade starts with ``fade_prob``, ends with
    ``fade_end_prob``."""
    return np.array([[1 - cfg.fade_prob, cfg.fade_prob], [cfg.fade_end_prob, 1 - cfg.fade_end_prob]])


def hidden_transition(cfg: VREdgeConfig) -> np.ndarray:
    """``[6, 6]``: P(next h | h), the regime and the fade chains being independent."""
    return np.kron(regime_transition(cfg), fade_transition(cfg))


def initial_hidden(cfg: VREdgeConfig) -> np.ndarray:
    """``[6]``: the law of h at reset (:func:`envs.vr_edge_dynamics.initial_state`): any regime alike, no fade."""
    return np.where(_FADE_OF, 0.0, 1.0 / len(REGIMES))


def noise_given_hidden(cfg: VREdgeConfig, log_ratio: np.ndarray) -> np.ndarray:
    """``[B, 6]``: the capacity's noise term in each hidden state, given the observed log capacity ratios ``[B]``
    (the env's :func:`envs.vr_edge_dynamics.synthetic_capacity` at zero noise is what the noise multiplies)."""
    at_zero_noise = synthetic_capacity(cfg, _REGIME_OF, np.zeros(HIDDEN), _FADE_OF, 1.0)
    return np.asarray(log_ratio, dtype=np.float64)[:, None] - np.log(at_zero_noise)


def innovation_std(cfg: VREdgeConfig) -> float:
    """Standard deviation of the noise's AR(1) step: ``sqrt(1 - corr^2) std`` (stationary std ``noise_std``)."""
    return math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std


def log_normal_density(x: np.ndarray, mean: np.ndarray | float, std: float) -> np.ndarray:
    """``log N(x; mean, std^2)``."""
    z = (x - mean) / std
    return -0.5 * z * z - math.log(std) - 0.5 * math.log(2 * math.pi)


def log_sum_exp(x: np.ndarray, axis: int) -> np.ndarray:
    """``log sum exp(x)`` along ``axis``, stable, ``-inf`` where every term is."""
    top = np.max(x, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(safe, axis) + np.log(np.sum(np.exp(x - safe), axis=axis))


def _log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p)


def filter_refusal(cfg: VREdgeConfig) -> str:
    """Why the hidden state of cells built with ``cfg`` cannot be filtered; ``""`` when it can."""
    return refused_setting(cfg)[1]


def refused_setting(cfg: VREdgeConfig) -> tuple[str, str]:
    """The setting that keeps cells built with ``cfg`` from being filtered and why, or ``("", "")``."""
    if cfg.capacity_trace:
        return "capacity_trace", ("a trace-driven cell (capacity_trace) has no hidden regime or fade to filter: play "
                                  "the synthetic cell")
    if cfg.user_traces:  # the futures drawn for the users' channels would be the synthetic chain's, not the traces'
        return "user_traces", ("users on recorded links (user_traces) follow no channel model to sample futures "
                               "from: play the synthetic users")
    if cfg.outages:  # a third chain the filter's hidden state (regime, fade) does not hold
        return "outage_prob", ("the filter's hidden state is the regime and the fade, not the outage chain "
                               "(outage_prob): play outage_prob=0")
    if cfg.scaled:  # the filter's capacity model is the nominal cell's
        return "capacity_scale", ("the filter models the capacity around the nominal cell, not one scaled by "
                                  "capacity_scale: play capacity_scale=1")
    for key, bad in (("noise_std", cfg.noise_std == 0), ("noise_corr", cfg.noise_corr == 1)):
        if bad:
            return key, "the filter needs capacity noise with a density (noise_std > 0 and noise_corr < 1)"
    return "", ""


class CellSeen(NamedTuple):
    """What an observation shows of the cell and the users (:func:`cell_seen`), each ``[B]`` or ``[B, U]``."""

    log_ratio: np.ndarray  # the newest capacity over the episode's nominal one, in log
    t: np.ndarray  # the step of the episode
    channel_logit: np.ndarray  # each active user's channel logit (0 for an inactive slot)
    active: np.ndarray  # which slots hold a user
    users: np.ndarray  # the users drawn for the episode (its nominal capacity's count)


def cell_seen(cfg: VREdgeConfig, obs: np.ndarray) -> CellSeen:
    """Read observations ``[B, obs_dim]`` (the layout of :func:`envs.vr_edge_dynamics.observe`)."""
    obs = np.asarray(obs, dtype=np.float64)
    n_user = cfg.num_user_features * cfg.num_users
    users = obs[:, :n_user].reshape(len(obs), cfg.num_users, cfg.num_user_features)
    active = users[:, :, cfg.active_user_feature] > 0.5 if cfg.masked else np.ones(users.shape[:2], dtype=bool)
    drawn = np.rint(active.sum(axis=1) / obs[:, -1]) if cfg.masked else np.full(len(obs), float(cfg.num_users))
    logit = np.where(active, channel_logit(np.where(active, users[:, :, _CHANNEL], 0.5)), 0.0)
    return CellSeen(np.log(obs[:, n_user + cfg.history - 1]), np.rint(obs[:, n_user + cfg.history] * cfg.max_steps
                                                                      ).astype(np.int64), logit, active, drawn)


def channel_logit(quality: np.ndarray) -> np.ndarray:
    """The channel logit a quality in ``(0.25, 1)`` comes from: the inverse of
    :func:`envs.vr_edge_dynamics.channel_quality` (float32 observations: qualities within a rounding of 0.25 or 1 are
    taken just inside)."""
    p = np.clip((quality - 0.25) / 0.75, 1e-7, 1 - 1e-7)
    return np.log(p / (1 - p))


# the fewest envs a part of :meth:`RegimeFilter.futures` draws: a smaller part's NumPy calls are short enough that the
# GIL they share costs more than the thread gains (64 envs: 12.4 ms whole, 11.0 in 2 parts, 61 in 16, on a 2-core AMD
# EPYC; 8 envs: 2.7 ms whole, 8.5 in 8 parts)
ENVS_PER_PART = 32


class Futures(NamedTuple):
    """Scenarios of the next ``H`` rounds of ``B`` envs, ``S`` each (:meth:`RegimeFilter.futures`); each
    scenario's ``weight`` ``[B, S]`` (summing to 1 per env) makes weighted means over scenarios unbiased."""

    capacity: np.ndarray  # [B, S, H] Mbit/s
    channel_logit: np.ndarray  # [B, S, H, U]
    regime: np.ndarray  # [B, S, H]
    fade: np.ndarray  # [B, S, H] bool
    weight: np.ndarray  # [B, S]


class RegimeFilter:
    """The exact posterior over the cell's hidden (regime, fade) of ``B`` envs, from their observations only, and
    futures of the cell sampled from it (see the module's docstring for the recursion).

    Call :meth:`update` with every observation of every env, in order: a row whose step is 0 starts its episode
    anew (an env's reset, or an autoreset), any other must be the step after the row's last one.

    Example:
        >>> import envs
        >>> from envs.belief import RegimeFilter
        >>> venv = envs.VREdgeVectorEnv(4, num_users=2, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> belief = RegimeFilter(venv.config)
        >>> belief.update(obs).shape               # P(regime, fade) per env
        (4, 3, 2)
        >>> obs, *_ = venv.step(np.zeros((4, 2), dtype=np.int64))
        >>> bool(np.allclose(belief.update(obs).sum(axis=(1, 2)), 1.0))
        True
        >>> f = belief.futures(obs, scenarios=8, horizon=3)
        >>> f.capacity.shape, f.channel_logit.shape, f.weight.shape
        ((4, 8, 3), (4, 8, 3, 2), (4, 8))

    Shapes: :meth:`update` returns ``[B, 3, 2]`` (regime: good, fair, poor; fade: off, on); :attr:`noise` is
    ``[B, 6]``, the noise each hidden state implies now. A trace-driven cell is refused (a
    :class:`envs.settings.ConfigError`): it has no model to filter.
    """

    def __init__(self, config: VREdgeConfig, seed: int = 0) -> None:
        key, refused = refused_setting(config)
        if refused:
            raise ConfigError(key, getattr(config, key), f"cannot be filtered: {refused}", flag=False)
        self.config = config
        self._log_transition = _log(hidden_transition(config))  # [g, h]
        self._log_initial = _log(initial_hidden(config))
        self._key = rng.key_from_seed(seed)
        self._draws = 0  # blocks drawn so far (futures' counter-based streams)
        self.log_posterior: np.ndarray | None = None  # [B, 6]
        self.noise: np.ndarray | None = None  # [B, 6]
        self.t: np.ndarray | None = None  # [B]

    def update(self, obs: np.ndarray) -> np.ndarray:
        """Take in observations ``[B, obs_dim]`` of the ``B`` envs; returns P(regime, fade) ``[B, 3, 2]``."""
        seen = cell_seen(self.config, obs)
        self._check_order(seen.t)
        noise = noise_given_hidden(self.config, seen.log_ratio)
        start = self._log_initial + log_normal_density(noise, 0.0, self.config.noise_std)
        if self.t is not None and len(self.t) == len(seen.t):  # (another number of envs: all start afresh)
            step = self._log_step(noise)
            start = np.where((seen.t == 0)[:, None], start, step)
        self.log_posterior = start - log_sum_exp(start, axis=1)[:, None]
        self.noise, self.t = noise, seen.t
        return self.posterior

    def state(self) -> dict[str, Any]:
        """What this filter has taken in and drawn (copies): :meth:`load_state` of it on a filter of the same config
        and seed goes on exactly as this one would.

        >>> import envs
        >>> venv = envs.VREdgeVectorEnv(2, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> a, b = RegimeFilter(venv.config), RegimeFilter(venv.config)
        >>> _ = a.update(obs)
        >>> b.load_state(a.state())
        >>> bool((a.futures(obs, 4, 3).capacity == b.futures(obs, 4, 3).capacity).all())
        True
        """
        arrays = {k: None if getattr(self, k) is None else getattr(self, k).copy()
                  for k in ("log_posterior", "noise", "t")}
        return {**arrays, "draws": self._draws}

    def load_state(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`'s ``state``."""
        for k in ("log_posterior", "noise", "t"):
            setattr(self, k, None if state[k] is None else np.array(state[k]))
        self._draws = int(state["draws"])

    def _log_step(self, noise: np.ndarray) -> np.ndarray:
        """Unnormalised log alpha ``[B, 6]`` one step on from the posterior, given the noise ``[B, 6]`` each hidden
        state implies now."""
        cfg = self.config
        mean = cfg.noise_corr * self.noise[:, :, None]  # [B, g, 1]
        terms = (self.log_posterior[:, :, None] + self._log_transition[None]
                 + log_normal_density(noise[:, None, :], mean, innovation_std(cfg)))  # [B, g, h]
        return log_sum_exp(terms, axis=1)

    def _check_order(self, t: np.ndarray) -> None:
        """A ``ValueError`` unless every row starts an episode or is the step after its last one."""
        if self.t is not None and len(t) != len(self.t) and (t != 0).any():
            raise ValueError(f"RegimeFilter tracks {len(self.t)} envs, got {len(t)} observations mid-episode: "
                             "pass every env's observation at every step (or start afresh at step 0)")
        if self.t is not None and len(t) == len(self.t):
            skipped = (t != 0) & (t != self.t + 1)
            if skipped.any():
                i = int(np.flatnonzero(skipped)[0])
                raise ValueError(f"RegimeFilter saw step {t[i]} of env {i} after step {self.t[i]}: it must see "
                                 "every step of an episode, in order")
        elif self.t is None and (t != 0).any():
            raise ValueError("RegimeFilter must see each episode from its first observation (step 0), got step "
                             f"{int(t[t != 0][0])}")

    @property
    def posterior(self) -> np.ndarray:
        """P(regime, fade) ``[B, 3, 2]`` after the last :meth:`update`."""
        return np.exp(self.log_posterior).reshape(-1, len(REGIMES), FADES)

    def futures(self, obs: np.ndarray, scenarios: int, horizon: int, threads: int = 1) -> Futures:
        """``scenarios`` futures of the next ``horizon`` rounds for each env of the last :meth:`update` (its
        observations ``obs``): the hidden state now drawn from the posterior, then the env's own step
        (:func:`envs.vr_edge_dynamics.cell_round`) on counter-based draws of this filter's seed. The first round's fade
        outcome is stratified (:func:`stratified_hidden`), so a rare fade is in every env's scenarios. ``threads``:
        the envs drawn in up to that many parts side by side, each of :data:`ENVS_PER_PART` envs or more (NumPy lets
        go of the GIL in its loops; each env's draws are its own counters', so the same numbers)."""
        seen, b = cell_seen(self.config, obs), len(obs)
        first, self._draws = self._draws, self._draws + b * scenarios * (horizon + 1)
        posterior = np.exp(self.log_posterior)
        p_fade = posterior @ fade_transition(self.config)[_FADE_OF.astype(int), 1]  # (one product for all: a
        # part's own would be another BLAS kernel, rounded otherwise)
        bounds = np.linspace(0, b, max(1, min(threads, b // ENVS_PER_PART)) + 1).astype(int)
        parts = [(int(lo), int(hi), seen, posterior, p_fade, first, b, scenarios, horizon)
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        if len(parts) == 1:
            return self._futures_of(*parts[0])
        drawn = list(_pool(len(parts)).map(lambda part: self._futures_of(*part), parts))
        return Futures(*(np.concatenate(x, axis=0) for x in zip(*drawn)))

    def _futures_of(self, lo: int, hi: int, seen: CellSeen, posterior: np.ndarray, p_fade: np.ndarray, first: int,
                    b: int, scenarios: int, horizon: int) -> Futures:
        """:meth:`futures` of the envs ``lo <= env < hi`` of ``b`` (their ``posterior`` and P(fade next) ``p_fade``
        among all's), on the draws from counter ``first`` on: round ``h`` (and, as ``h = horizon``, the draw of now)
        of row ``r = env x scenarios + scenario`` is counter ``first + h x b x scenarios + r``, whatever the part."""
        cfg, n = self.config, (hi - lo) * scenarios
        rows = np.arange(lo * scenarios, hi * scenarios, dtype=np.uint64)
        counters = np.uint64(first) + np.arange(horizon + 1, dtype=np.uint64)[:, None] * np.uint64(b * scenarios) + rows
        keys = np.full(counters.size, self._key, dtype=np.uint64)
        u = rng.uniform_block(keys, counters.ravel(), cfg.block_size).reshape(horizon + 1, n, cfg.block_size)
        hidden, fade_next, weight = stratified_hidden(posterior[lo:hi], fade_transition(cfg)[_FADE_OF.astype(int), 1],
                                                      scenarios, u[horizon][:, 0].reshape(hi - lo, scenarios),
                                                      p_fade[lo:hi])
        state = {"regime": _REGIME_OF[hidden].ravel(), "fade": _FADE_OF[hidden].ravel(),
                 "noise": np.take_along_axis(self.noise[lo:hi], hidden, axis=1).ravel(),
                 "channel_logit": np.repeat(seen.channel_logit[lo:hi], scenarios, axis=0),
                 "users": np.repeat(seen.users[lo:hi], scenarios)}
        u[0][:, Draw.FADE] = fade_draw(cfg, state["fade"], fade_next.ravel(), u[horizon][:, 1])
        rounds = []
        for h in range(horizon):
            cell, _, capacity, _ = cell_round(cfg, state, u[h])
            state.update(cell)
            rounds.append((capacity, cell["channel_logit"], cell["regime"], cell["fade"]))
        capacity, logit, regime, fade = (np.stack(x, axis=1).reshape(hi - lo, scenarios, horizon, *x[0].shape[1:])
                                         for x in zip(*rounds))
        return Futures(capacity, logit, regime, fade, weight)

    def futures_after(self, known: Sequence[np.ndarray], scenarios: int, horizon: int) -> Futures:
        """:meth:`futures` of the ``horizon`` rounds that follow known next rounds: ``known`` are their observations
        ``[B, obs_dim]``, in order, from the step after the last :meth:`update` on (what the env will show: a
        reference that peeks, :class:`envs.foresight.ForesightMPC`). The posterior takes them in on a copy, so this
        filter's own is left as it was; the draws come from this filter's stream."""
        ahead = copy.copy(self)  # (update replaces the arrays it holds, never writes into them)
        for obs in known:
            ahead.update(obs)
        futures = ahead.futures(known[-1], scenarios, horizon)
        self._draws = ahead._draws
        return futures


def stratified_hidden(posterior: np.ndarray, fade_next: np.ndarray, scenarios: int, v: np.ndarray,
                      p: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden states now ``[B, S]`` for ``S`` scenarios, stratified by the fade of the next round: P(fade next)
    ``p = posterior @ fade_next`` (``fade_next[h]``: P(fade next | h)); ``n = round(S p)`` scenarios (at least 1
    where ``p > 0``, at most ``S - 1`` where ``p < 1``) have the fade next, each weighing ``p / n``, the others
    not, each weighing ``(1 - p) / (S - n)``; within a stratum the state is drawn from the posterior given it
    (inverse CDF of the uniforms ``v`` ``[B, S]``; ``p``: that product where the caller has it). Returns
    ``(hidden, fade next, weight)``, each ``[B, S]``."""
    p = posterior @ fade_next if p is None else p  # [B]
    n = np.where(p <= 0, 0, np.where(p >= 1, scenarios, np.clip(np.rint(scenarios * p), 1, scenarios - 1)))
    on = np.arange(scenarios) < n[:, None]  # [B, S]
    given = posterior[:, None, :] * np.where(on[..., None], fade_next, 1 - fade_next)  # [B, S, 6]
    cdf = np.cumsum(given, axis=-1)
    hidden = np.minimum((v[..., None] * cdf[..., -1:] > cdf).sum(axis=-1), HIDDEN - 1)
    weight = np.where(on, (p / np.maximum(n, 1))[:, None], ((1 - p) / np.maximum(scenarios - n, 1))[:, None])
    return hidden, on, weight


def fade_draw(cfg: VREdgeConfig, fade: np.ndarray, fade_next: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The fade's uniform draw that makes the env's step (:func:`envs.vr_edge_dynamics.cell_round`: a fade starts below
    ``fade_prob``, goes on at or above ``fade_end_prob``) go from ``fade`` to ``fade_next``, spread by ``v`` in
    (0, 1) over the interval that does."""
    low = np.where(fade, np.where(fade_next, cfg.fade_end_prob, 0.0), np.where(fade_next, 0.0, cfg.fade_prob))
    high = np.where(fade, np.where(fade_next, 1.0, cfg.fade_end_prob), np.where(fade_next, cfg.fade_prob, 1.0))
    return low + v * (high - low)


def _pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` threads that draw parts of the futures, kept for this process (a forked child starts its own)."""
    return _pools(threads, os.getpid())


@functools.cache
def _pools(threads: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="futures")
