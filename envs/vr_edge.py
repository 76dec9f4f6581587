"""Synthetic multi-user VR edge-rendering workload: dynamics and the single env.

The dynamics are written once, as NumPy functions over a leading batch axis ``B``
of independent envs; :class:`SyntheticVREdgeEnv` runs them with ``B = 1`` and
:class:`envs.vector.VREdgeVectorEnv` with ``B = num_envs``. See ``envs/README.md``
for the model and the reward formula.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np

import envs
from envs import rng
from envs.arguments import KINDS, is_number
from envs.settings import ConfigError, check_limits, setting
from envs.traces import TRACE_SPLITS, TraceSet, load_link_traces, load_traces

REGIMES = ("good", "fair", "poor")
USER_FEATURES = ("buffer", "last_level", "throughput", "download_time", "stall", "cum_stall", "channel")
# where the cell is masked (VREdgeConfig.masked): each user's features end with this flag (1 active, 0 not: an
# inactive slot's features are all 0), and the cell's with these two
ACTIVE_FEATURE = "active"
MASK_CELL_FEATURES = ("airtime_share", "load")  # 1 / active users; active users / users drawn for the episode
# the 8-byte leaves of an env's state (initial_state): one per user each, and one per env each (besides the
# capacity history, a trace's file and window, and the fade flag)
_STATE_PER_USER = ("channel_logit", "buffer", "level", "throughput", "download_time", "stall", "cum_stall")
_STATE_PER_ENV = ("key", "counter", "t", "regime", "noise", "ep_quality", "ep_stall", "ep_switches")
_EPISODE_DRAWS = ("users", "churn")  # what a varying cell draws at reset and keeps for the episode
# the arguments that size what a run holds per env: its state and observation (state_bytes, obs_dim), its
# action (one level per user) and the scores a policy gives the actions (num_users x levels)
MEMORY_ARGUMENTS = ("num_users", "history", "bitrates_mbps")
_OBS_HIGH = 10.0
_THROUGHPUT_EWMA = 0.5
# the synthetic channel's mean quality, 0.25 + 0.75 E[sigmoid(logit)] with a logit symmetric about 0: what a
# users' trace set's mean rate maps to (user_traces)
MEAN_CHANNEL_QUALITY = 0.625
QOE_LIN_REBUFFER_PENALTY = 4.3  # QoE_lin (Pensieve and successors): Mbps - 4.3 x rebuffer s - |change| Mbps


@dataclass(frozen=True)
class VREdgeConfig:
    """Parameters of the VR-edge workload, each declared with its help and limits (:func:`envs.settings.setting`);
    on construction one rule checks every field's limits (:func:`envs.settings.check_limits`), after its type and
    before the rules between fields (:func:`_check_ladder`, :func:`_check_cell`, :func:`_check_traces`,
    :func:`users_range`): a :class:`envs.settings.ConfigError` such as ``num_users must be >= 1, got 0``.

    The cell has ``num_users`` user slots. ``users`` are active at reset (a number, or a range ``"LOW-HIGH"``
    drawn uniformly per episode; empty: every slot), ``churn`` makes them leave and join during an episode, and
    the episode's nominal capacity is its drawn users times ``capacity_per_user_mbps``. Where the users vary
    (:attr:`varies`) the observation is masked (:attr:`masked`): each slot's features end with its active flag
    (:attr:`active_user_feature`) and the cell's with ``1 / active users`` and ``active users / users drawn``.
    The default (all slots, no churn) is the fixed cell, its random streams included.

    Example:
        >>> cfg = VREdgeConfig(num_users=12, users="4-12", churn=0.05)
        >>> cfg.varies, cfg.users_range, cfg.active_user_feature, head_observation_layout(cfg)
        (True, (4, 12), 7, (8, 7))
        >>> VREdgeConfig().varies, VREdgeConfig().active_user_feature, VREdgeConfig().obs_dim
        (False, None, 61)
    """

    num_users: int = setting(8, "user slots of the cell (the most users at once)", at_least=1)
    users: int | str = setting("", "active users at reset: a number, or a range 'LOW-HIGH' drawn uniformly per "
                               "episode, within 1..num_users (empty: all num_users)")
    churn: float | str = setting(0.0, "probability that each active user leaves, per step, or a range 'LOW-HIGH' "
                                 "drawn uniformly per episode, within 0..1 (free slots are joined at the rate that "
                                 "keeps the episode's drawn count expected)")
    observe_active: bool = setting(False, "append each user's active flag and the active count to the observation "
                                   "(on by itself where users or churn make the cell vary)")
    bitrates_mbps: tuple[float, ...] = setting((5.0, 10.0, 20.0, 35.0, 55.0, 80.0), "the bitrate ladder, Mbit/s, "
                                               "strictly increasing", above=0)
    segment_s: float = setting(1.0, "seconds of video per segment", above=0)
    max_buffer_s: float = setting(4.0, "seconds a user's buffer holds (at least segment_s)", above=0)
    initial_buffer_s: float = setting(2.0, "seconds buffered at reset", at_least=0)
    capacity_per_user_mbps: float = setting(100.0, "the cell's nominal capacity per user, Mbit/s", above=0)
    regime_multipliers: tuple[float, float, float] = setting((1.35, 0.9, 0.45), "capacity multipliers of the good, "
                                                             "fair and poor regimes", above=0)
    regime_stay_prob: float = setting(0.95, "probability that the regime stays put, per step", at_least=0, at_most=1)
    noise_corr: float = setting(0.9, "AR(1) correlation of the capacity's log-normal noise", at_least=0, at_most=1)
    noise_std: float = setting(0.15, "stationary standard deviation of that noise", at_least=0)
    fade_prob: float = setting(0.02, "probability that a deep fade starts, per step", at_least=0, at_most=1)
    fade_end_prob: float = setting(0.35, "probability that a deep fade ends, per step", at_least=0, at_most=1)
    fade_depth: float = setting(0.3, "capacity multiplier during a deep fade", above=0, at_most=1)
    channel_corr: float = setting(0.98, "AR(1) correlation of each user's channel quality", at_least=0, at_most=1)
    channel_std: float = setting(1.0, "stationary standard deviation of the channel quality", at_least=0)
    quality_weight: float = setting(1.0, "reward weight of quality", at_least=0)
    stall_weight: float = setting(4.0, "reward weight of stall seconds", at_least=0)
    switch_weight: float = setting(1.0, "reward weight of quality switches", at_least=0)
    abandon_stall_s: float = setting(10.0, "cumulative stall seconds past which a user abandons (the episode ends)",
                                     above=0)
    max_steps: int = setting(300, "steps per episode (then truncated)", at_least=1)
    history: int = setting(4, "past capacities in the observation", at_least=1)
    step_cost_us: float = setting(0.0, "busy-wait per env step, microseconds (stands in for a heavy simulator)",
                                  at_least=0)
    capacity_trace: str = setting("", "trace set whose throughput the cell's capacity replays: a shipped set's "
                                  "name (pensieve), a folder (with train/ and test/ folders, or flat) or a file "
                                  "(empty: the synthetic cell)")
    user_traces: str = setting("", "trace set (as capacity_trace) each user's link quality replays, a file and start "
                               "of its own, the set's mean at the synthetic channel's mean (empty: synthetic links)")
    trace_split: str = setting("auto", "which of the trace files: train or test (a set's own folders, else a hash "
                               "of a folder's file names), all, or auto (a set's train folder, else all)",
                               choices=TRACE_SPLITS)
    trace_column: str = setting("", "the column of a CSV trace (with a header, one row per second) that gives the "
                                "throughput in Mbit/s (empty: the trace files are not CSV)")
    trace_key: str = setting("", "columns of a CSV trace, comma-separated, whose values make one trace each (e.g. "
                             "one per run; empty: one trace per file)")
    trace_scale: float = setting(0.0, "multiply a trace's Mbit/s by this", at_least=0,
                                 zero="scale each trace to a mean of the nominal capacity")
    reveal_hidden_state: bool = setting(False, "append the regime (one-hot) and the fade flag to the observation (a "
                                        "diagnostic; synthetic cell only)")
    _ladder: np.ndarray = field(init=False, repr=False, compare=False)
    _quality: np.ndarray = field(init=False, repr=False, compare=False)
    _regime_mult: np.ndarray = field(init=False, repr=False, compare=False)
    _traces: TraceSet | None = field(init=False, repr=False, compare=False)
    _user_traces: TraceSet | None = field(init=False, repr=False, compare=False)
    _users_range: tuple[int, int] = field(init=False, repr=False, compare=False)
    _churn_range: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_kinds(self)  # first: a limit compared with segment_s='abc' (from --env-kwargs) is a bare TypeError
        check_limits(self, flags=False)
        _check_ladder(self)
        _check_cell(self)
        object.__setattr__(self, "_users_range", users_range(self.users, self.num_users))
        object.__setattr__(self, "_churn_range", churn_range(self.churn))
        _check_traces(self)
        ladder = tuple(self.bitrates_mbps)
        ladder_arr = np.asarray(ladder, dtype=np.float64)
        object.__setattr__(self, "bitrates_mbps", ladder)
        object.__setattr__(self, "_ladder", ladder_arr)
        object.__setattr__(self, "_regime_mult", np.asarray(self.regime_multipliers, dtype=np.float64))
        # log utility scaled to [0, 1]; a one-level ladder has constant quality 1
        span = math.log(ladder[-1] / ladder[0]) if len(ladder) > 1 else 1.0
        object.__setattr__(self, "_quality", np.log(ladder_arr / ladder[0]) / span if len(ladder) > 1
                           else np.ones(1))
        traces = (load_traces(self.capacity_trace, self.segment_s, self.trace_split, self.trace_scale or None,
                              self.nominal_capacity_mbps, self.trace_column, self.trace_key)
                  if self.capacity_trace else None)
        object.__setattr__(self, "_traces", traces)
        links = (load_link_traces(self.user_traces, self.segment_s, self.trace_split, MEAN_CHANNEL_QUALITY,
                                  self.trace_column, self.trace_key) if self.user_traces else None)
        object.__setattr__(self, "_user_traces", links)

    @property
    def num_levels(self) -> int:
        return len(self.bitrates_mbps)

    @property
    def varies(self) -> bool:
        """Whether the cell's active users vary: fewer users than slots, a range drawn per episode, or churn. Only
        then does the env draw more per step and keep the active set in its state (the default is unchanged).

        >>> VREdgeConfig().varies, VREdgeConfig(users="4-8").varies, VREdgeConfig(churn=0.05).varies
        (False, True, True)
        """
        return self._users_range != (self.num_users, self.num_users) or self.churn_range[1] > 0

    @property
    def churn_varies(self) -> bool:
        """Whether ``churn`` is a range drawn per episode: then each env's state keeps its episode's ``churn``.

        >>> VREdgeConfig(churn="0-0.1").churn_varies, VREdgeConfig(churn=0.05).churn_varies
        (True, False)
        """
        return self.churn_range[0] < self.churn_range[1]

    @property
    def masked(self) -> bool:
        """Whether the observation carries the active flags and counts (:data:`ACTIVE_FEATURE`, the two cell
        features :data:`MASK_CELL_FEATURES`): with ``observe_active``, and wherever the cell :attr:`varies`."""
        return self.observe_active or self.varies

    @property
    def num_user_features(self) -> int:
        """Features per user slot: :data:`USER_FEATURES`, and the active flag when :attr:`masked`."""
        return len(USER_FEATURES) + (1 if self.masked else 0)

    @property
    def active_user_feature(self) -> int | None:
        """Index of the active flag within a user's features when :attr:`masked`; ``None``: every slot is active."""
        return len(USER_FEATURES) if self.masked else None

    @property
    def obs_dim(self) -> int:
        return self.num_user_features * self.num_users + self.num_cell_features

    @property
    def num_cell_features(self) -> int:
        """Features of the cell: the capacity history, the episode's progress, with ``reveal_hidden_state`` the
        regime (one-hot) and the fade flag, and when :attr:`masked` ``1 / active users`` and ``active users /
        users drawn for the episode`` (:data:`MASK_CELL_FEATURES`)."""
        return (self.history + 1 + (len(REGIMES) + 1 if self.reveal_hidden_state else 0)
                + (len(MASK_CELL_FEATURES) if self.masked else 0))

    @property
    def state_bytes(self) -> int:
        """Bytes of one env's state (:func:`initial_state`'s leaves): 8 per user for each of ``_STATE_PER_USER``
        (and its trace's file and window with ``user_traces``), 8 per step of capacity history, 8 for each of
        ``_STATE_PER_ENV`` (and a cell trace's file and window), and the fade flag; where the cell :attr:`varies`,
        8 for each of the episode's draws (``users``, and ``churn`` where that is a range) and one per slot for
        ``active``. Computed, not allocated: a run checks what its envs need against the machine's memory before
        it builds one.

        >>> cfg, varied = VREdgeConfig(num_users=3, history=5), VREdgeConfig(num_users=3, users="1-3", churn=0.1)
        >>> zero, ranged = np.zeros(1, np.uint64), VREdgeConfig(num_users=3, churn="0-0.1")
        >>> [c.state_bytes == sum(v.nbytes for v in initial_state(c, zero, zero).values())
        ...  for c in (cfg, varied, ranged)]
        [True, True, True]
        """
        per_env = (len(_STATE_PER_ENV) + (2 if self.capacity_trace else 0) + (1 if self.varies else 0)
                   + (1 if self.churn_varies else 0))
        per_user = len(_STATE_PER_USER) + (2 if self.user_traces else 0)  # a user's trace and window
        active = self.num_users if self.varies else 0  # one bool per slot, and the episode's drawn count
        return 8 * (per_user * self.num_users + self.history + per_env) + 1 + active

    @property
    def block_size(self) -> int:
        """Uniform draws per env per step (and per reset): the cell's 5, two per user for its channel, and where
        the cell :attr:`varies` one more for the reset's user count and one per slot for leaving or joining."""
        return 5 + 2 * self.num_users + (1 + self.num_users if self.varies else 0)

    @property
    def users_range(self) -> tuple[int, int]:
        """The active users at reset, ``(low, high)``: drawn uniformly from ``low..high`` per episode."""
        return self._users_range

    @property
    def churn_range(self) -> tuple[float, float]:
        """The churn, ``(low, high)``: drawn uniformly from ``low..high`` per episode (equal: a fixed churn)."""
        return self._churn_range

    @property
    def nominal_capacity_mbps(self) -> float:
        """The nominal capacity with every slot active; an episode's is :func:`episode_nominal` (its drawn users
        times ``capacity_per_user_mbps``)."""
        return self.num_users * self.capacity_per_user_mbps

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def users_range(users: int | str, num_users: int) -> tuple[int, int]:
    """``users`` (a number, a range ``"LOW-HIGH"``, or ``""``: all slots) as ``(low, high)`` within
    ``1..num_users``; a :class:`envs.settings.ConfigError` otherwise.

    >>> users_range("4-12", 16), users_range(3, 8), users_range("", 8)
    ((4, 12), (3, 3), (8, 8))
    >>> users_range("9-3", 8)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: users must be a number or a range 'LOW-HIGH' within 1..num_users (8), got '9-3'
    """
    if users == "":
        return num_users, num_users
    text = str(users).strip()
    low, sep, high = text.partition("-")
    bounds = (low, high) if sep else (text, text)
    if all(re.fullmatch(r"[0-9]+", b.strip()) for b in bounds):  # not isdigit: "²" is a digit that int() refuses
        low_n, high_n = (int(b) for b in bounds)
        if 1 <= low_n <= high_n <= num_users:
            return low_n, high_n
    raise ConfigError("users", users, f"must be a number or a range 'LOW-HIGH' within 1..num_users ({num_users})",
                      flag=False)


def churn_range(churn: float | str) -> tuple[float, float]:
    """``churn`` (a probability, or a range ``"LOW-HIGH"`` drawn uniformly per episode) as ``(low, high)`` within
    ``0..1``; a :class:`envs.settings.ConfigError` otherwise.

    >>> churn_range(0.05), churn_range("0-0.1"), churn_range("0.02")
    ((0.05, 0.05), (0.0, 0.1), (0.02, 0.02))
    >>> churn_range("0.2-0.1")
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: churn must be a probability (>= 0 and <= 1) or a range 'LOW-HIGH' of them, got '0.2-0.1'
    """
    text = str(churn).strip()
    low, sep, high = text.partition("-") if not is_number(churn) else (text, "", "")
    try:
        low_p, high_p = float(low), float(high if sep else low)
    except ValueError:
        low_p = high_p = math.nan
    if 0 <= low_p <= high_p <= 1:
        return low_p, high_p
    raise ConfigError("churn", churn, "must be a probability (>= 0 and <= 1) or a range 'LOW-HIGH' of them",
                      flag=False)


def _check_kinds(cfg: VREdgeConfig) -> None:
    """Each argument is of its field's type: ``int``, ``float``, ``str``, ``bool`` (``KINDS``), or a list of
    numbers."""
    for f in fields(cfg):
        if not f.init:
            continue
        value = getattr(cfg, f.name)
        ok, kind = KINDS.get(str(f.type), (_numbers, "a list of numbers"))
        if not ok(value):
            raise ConfigError(f.name, value, f"must be {kind}", flag=False)


def _numbers(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(map(is_number, value))


def _check_ladder(cfg: VREdgeConfig) -> None:
    """``bitrates_mbps`` is a ladder: at least one level, strictly increasing."""
    ladder = tuple(cfg.bitrates_mbps)
    if not ladder or any(low >= high for low, high in zip(ladder, ladder[1:])):
        raise ConfigError("bitrates_mbps", cfg.bitrates_mbps, "must be non-empty and strictly increasing", flag=False)


def _check_cell(cfg: VREdgeConfig) -> None:
    """One multiplier per regime, and a buffer that holds a segment."""
    if len(cfg.regime_multipliers) != len(REGIMES):
        raise ConfigError("regime_multipliers", cfg.regime_multipliers, f"must hold {len(REGIMES)} numbers "
                          f"({', '.join(REGIMES)})", flag=False)
    if cfg.max_buffer_s < cfg.segment_s:
        raise ConfigError("max_buffer_s", cfg.max_buffer_s, f"must be >= segment_s ({cfg.segment_s})", flag=False)


def _check_traces(cfg: VREdgeConfig) -> None:
    """The trace arguments apply to a trace: ``trace_split`` and ``trace_scale`` need ``capacity_trace``, which
    has no hidden state to reveal."""
    if cfg.reveal_hidden_state and cfg.capacity_trace:
        raise ConfigError("reveal_hidden_state", True, "must be false with capacity_trace (a recorded trace has no "
                          "regime or fade to reveal)", flag=False)
    traced = cfg.capacity_trace or cfg.user_traces
    if cfg.trace_split not in ("auto", "all") and not traced:
        raise ConfigError("trace_split", cfg.trace_split, "must be 'auto' or 'all' unless capacity_trace or "
                          "user_traces is given (the split applies to trace files)", flag=False)
    if cfg.trace_scale and not cfg.capacity_trace:
        raise ConfigError("trace_scale", cfg.trace_scale, "must be 0 unless capacity_trace is given (the scale "
                          "applies to a trace)", flag=False)
    for name in ("trace_column", "trace_key"):
        if getattr(cfg, name) and not traced:
            raise ConfigError(name, getattr(cfg, name), "must be empty unless capacity_trace or user_traces is "
                              "given (it reads CSV trace files)", flag=False)
    if cfg.trace_key and not cfg.trace_column:
        raise ConfigError("trace_key", cfg.trace_key, "needs trace_column (the CSV column of the throughput)",
                          flag=False)


def torch_env_refusal(step_cost_us: float = 0.0, **_: Any) -> str:
    """Why the torch VR-edge env (``--backend device``) cannot run these arguments, naming the alternative; ``""``
    when it can. Without torch, so that a command line is checked before trace files are read."""
    if step_cost_us:
        return "step_cost_us stands in for a CPU simulator's cost and the torch VR-edge env (--backend device) " \
               "burns none: leave it at 0, or use --backend sync or async"
    return ""


def observation_space(cfg: VREdgeConfig) -> gym.spaces.Box:
    return gym.spaces.Box(0.0, _OBS_HIGH, shape=(cfg.obs_dim,), dtype=np.float32)


def head_observation_layout(cfg: VREdgeConfig) -> tuple[int, int]:
    """``(features per user, shared features)``: the observation is user 0's features, user 1's, ..., then the cell's.

    Learners may use it to share one network across the users' action heads.
    """
    return cfg.num_user_features, cfg.num_cell_features


def action_space(cfg: VREdgeConfig) -> gym.spaces.MultiDiscrete:
    return gym.spaces.MultiDiscrete([cfg.num_levels] * cfg.num_users)


# ---------------------------------------------------------------- batched dynamics
# A state is a dict of arrays with leading batch axis B; all functions below are pure.

def _channel_quality(logit: np.ndarray) -> np.ndarray:
    """Spectral efficiency of a user's link relative to the best one, in [0.25, 1]."""
    return 0.25 + 0.75 / (1.0 + np.exp(-logit))


def _capacity(cfg: VREdgeConfig, regime: np.ndarray, noise: np.ndarray, fade: np.ndarray,
              nominal: float | np.ndarray) -> np.ndarray:
    """The synthetic cell's capacity ``[B]``, Mbit/s, around the episodes' ``nominal`` capacity."""
    mult = cfg._regime_mult[regime]
    lognormal = np.exp(noise - 0.5 * cfg.noise_std**2)  # mean-one fluctuation
    return nominal * mult * lognormal * np.where(fade, cfg.fade_depth, 1.0)


def episode_nominal(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> float | np.ndarray:
    """Each episode's nominal capacity, Mbit/s: its drawn users times ``capacity_per_user_mbps`` (``[B]``), fixed
    for the episode; where the cell does not vary, ``cfg.nominal_capacity_mbps`` (a float)."""
    return s["users"] * cfg.capacity_per_user_mbps if cfg.varies else cfg.nominal_capacity_mbps


def _trace_capacity(cfg: VREdgeConfig, trace: np.ndarray, pos: np.ndarray, nominal: float | np.ndarray
                    ) -> np.ndarray:
    """A trace window's capacity ``[B]``; a trace scaled to the nominal capacity (``trace_scale=0``) follows the
    episode's drawn users where the cell varies."""
    capacity = cfg._traces.capacity(trace, pos)
    return capacity * (nominal / cfg.nominal_capacity_mbps) if cfg.varies and not cfg.trace_scale else capacity


def _count_draw(cfg: VREdgeConfig) -> int:
    """Index of the reset's user-count draw in a block (where the cell varies); the churn draws follow it."""
    return 5 + 2 * cfg.num_users


def _drawn_users(cfg: VREdgeConfig, u: np.ndarray) -> dict[str, np.ndarray]:
    """The users at reset, where the cell varies: their count ``users`` ``[B]``, uniform over ``cfg.users_range``
    from the reset's count draw, and ``active`` ``[B, U]``, the first that many slots; where ``churn`` is a range,
    the episode's ``churn`` ``[B]``, uniform over it from the draw after (a churn draw no reset uses); ``{}`` where
    the cell does not vary."""
    if not cfg.varies:
        return {}
    low, high = cfg.users_range
    users = np.minimum(low + (u[:, _count_draw(cfg)] * (high - low + 1)).astype(np.int64), high)
    drawn = {"users": users, "active": np.arange(cfg.num_users) < users[:, None]}
    if cfg.churn_varies:
        low_p, high_p = cfg.churn_range
        drawn["churn"] = low_p + u[:, _count_draw(cfg) + 1] * (high_p - low_p)
    return drawn


def _user_start(cfg: VREdgeConfig, b: int) -> dict[str, np.ndarray]:
    """The per-user leaves ``[b, U]`` of a user who starts (at reset, or joining): the initial buffer, the lowest
    level and its bitrate as throughput, no download, no stall."""
    n_users = cfg.num_users
    return {
        "buffer": np.full((b, n_users), cfg.initial_buffer_s),
        "level": np.zeros((b, n_users), dtype=np.int64),
        "throughput": np.full((b, n_users), cfg.bitrates_mbps[0]),
        "download_time": np.zeros((b, n_users)),
        "stall": np.zeros((b, n_users)),
        "cum_stall": np.zeros((b, n_users)),
    }


def _user_trace_start(cfg: VREdgeConfig, u: np.ndarray) -> dict[str, np.ndarray]:
    """Each user's trace and start window ``[B, U]`` (``user_traces``), from the channel's draws of the block ``u``
    (which the synthetic channel uses, and a traced one leaves free); ``{}`` without user traces."""
    if cfg._user_traces is None:
        return {}
    n_users = cfg.num_users
    trace, pos = cfg._user_traces.start(u[:, 5:5 + n_users], u[:, 5 + n_users:5 + 2 * n_users])
    return {"user_trace": trace, "user_trace_pos": pos}


def channel_of(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> np.ndarray:
    """Each user's link quality ``[B, U]`` in the round the state ``s`` last played (what the user measured): its
    trace's window (``user_traces``), else the synthetic channel's."""
    if cfg._user_traces is not None:
        return cfg._user_traces.capacity(s["user_trace"], s["user_trace_pos"])
    return _channel_quality(s["channel_logit"])


def initial_state(cfg: VREdgeConfig, keys: np.ndarray, counters: np.ndarray) -> dict[str, np.ndarray]:
    """Return fresh episode states for ``[B]`` envs, drawn from block ``counters``."""
    u = rng.uniform_block(keys, counters, cfg.block_size)
    b, n_users = len(keys), cfg.num_users
    regime = np.minimum((u[:, 0] * 3).astype(np.int64), 2)
    noise = cfg.noise_std * rng.normals(u[:, 2], u[:, 3])
    fade = np.zeros(b, dtype=bool)
    logit = cfg.channel_std * rng.normals(u[:, 5:5 + n_users], u[:, 5 + n_users:2 * n_users + 5])
    drawn = _drawn_users(cfg, u)
    nominal = episode_nominal(cfg, drawn)
    cap = _capacity(cfg, regime, noise, fade, nominal)
    trace_keys = _user_trace_start(cfg, u)
    if cfg._traces is not None:  # draws 1 and 4 are free at reset: the trace file and its start window
        trace, pos = cfg._traces.start(u[:, 1], u[:, 4])
        cap = _trace_capacity(cfg, trace, pos, nominal)
        trace_keys.update(trace=trace, trace_pos=pos)
    return {
        "key": keys.copy(),
        "counter": counters + np.uint64(1),
        "t": np.zeros(b, dtype=np.int64),
        "regime": regime,
        "noise": noise,
        "fade": fade,
        "channel_logit": logit,
        **_user_start(cfg, b),
        "cap_history": np.repeat(cap[:, None], cfg.history, axis=1),
        "ep_quality": np.zeros(b),
        "ep_stall": np.zeros(b),
        "ep_switches": np.zeros(b),
        **trace_keys,
        **drawn,
    }


def observe(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> np.ndarray:
    """Return ``[B, obs_dim]`` float32 observations scaled to roughly unit range."""
    b, n_user_feat = len(s["t"]), cfg.num_user_features * cfg.num_users
    obs = np.empty((b, cfg.obs_dim), dtype=np.float32)  # float64 results are rounded on assignment
    users = obs[:, :n_user_feat].reshape(b, cfg.num_users, cfg.num_user_features)  # a view: columns fill obs
    users[:, :, 0] = s["buffer"] / cfg.max_buffer_s
    users[:, :, 1] = s["level"] / max(cfg.num_levels - 1, 1)
    users[:, :, 2] = s["throughput"] / cfg.bitrates_mbps[-1]
    users[:, :, 3] = s["download_time"] / cfg.segment_s
    users[:, :, 4] = s["stall"] / cfg.segment_s
    users[:, :, 5] = s["cum_stall"] / cfg.abandon_stall_s
    users[:, :, 6] = channel_of(cfg, s)
    progress = n_user_feat + cfg.history
    nominal = episode_nominal(cfg, s)
    obs[:, n_user_feat:progress] = s["cap_history"] / (nominal[:, None] if cfg.varies else nominal)
    obs[:, progress] = s["t"] / cfg.max_steps
    if cfg.reveal_hidden_state:  # a diagnostic: what a policy could gain from knowing the hidden cell state
        obs[:, progress + 1:progress + 1 + len(REGIMES)] = np.arange(len(REGIMES)) == s["regime"][:, None]
        obs[:, progress + 1 + len(REGIMES)] = s["fade"]
    if cfg.masked:
        _observe_mask(cfg, s, users, obs[:, cfg.obs_dim - len(MASK_CELL_FEATURES):])
    return np.minimum(obs, _OBS_HIGH, out=obs)  # every feature is >= 0 by construction


def _observe_mask(cfg: VREdgeConfig, s: dict[str, np.ndarray], users: np.ndarray, cell: np.ndarray) -> None:
    """Write the mask into the views ``users`` ``[B, U, F]`` (each slot's active flag last, an inactive slot's
    features all 0) and ``cell`` ``[B, 2]`` (``1 / active users``, ``active users / users drawn``)."""
    active = active_users(cfg, s)
    users[:, :, len(USER_FEATURES)] = 1.0
    users *= active[:, :, None]
    count = active.sum(axis=1)
    cell[:, 0] = 1.0 / count
    cell[:, 1] = count / (s["users"] if cfg.varies else cfg.num_users)


def active_users(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> np.ndarray:
    """Which slots ``[B, U]`` (bool) of the states ``s`` hold an active user (every slot where the cell does not
    vary)."""
    return s["active"] if cfg.varies else np.ones((len(s["t"]), cfg.num_users), dtype=bool)


def decode_observation(cfg: VREdgeConfig, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Invert :func:`observe` for ``[B, obs_dim]`` observations: features in physical units.

    Per-user entries are ``[B, U]``: ``buffer`` (s), ``last_level``, ``throughput``
    (Mbps, recent EWMA), ``download_time`` and ``stall`` (s), ``cum_stall`` (s), ``channel``
    (relative link quality), and where the observation is masked (``cfg.masked``) ``active`` (bool).
    ``cap_history`` is ``[B, history]`` in Mbps, oldest first.
    """
    obs = np.asarray(obs, dtype=np.float64)
    n_user_feat = cfg.num_user_features * cfg.num_users
    users = obs[:, :n_user_feat].reshape(len(obs), cfg.num_users, cfg.num_user_features)
    scale = (cfg.max_buffer_s, max(cfg.num_levels - 1, 1), cfg.bitrates_mbps[-1], cfg.segment_s, cfg.segment_s,
             cfg.abandon_stall_s, 1.0)
    out = {name: users[:, :, i] * scale[i] for i, name in enumerate(USER_FEATURES)}
    out["last_level"] = np.rint(out["last_level"]).astype(np.int64)
    nominal = cfg.nominal_capacity_mbps
    if cfg.masked:  # the episode's nominal capacity: its drawn users are the active count over the load
        out["active"] = users[:, :, len(USER_FEATURES)] > 0.5
        load = obs[:, cfg.obs_dim - 1]
        nominal = (np.rint(out["active"].sum(axis=1) / load) * cfg.capacity_per_user_mbps)[:, None]
    out["cap_history"] = obs[:, n_user_feat:n_user_feat + cfg.history] * nominal
    return out


def processor_sharing_times(work: np.ndarray) -> np.ndarray:
    """Finish times ``[..., U]`` when users share the cell's airtime equally while active.

    ``work[..., u]`` is the time user ``u`` would need with the whole cell. A user who
    finishes frees their share for the others (work-conserving, max-min fair).
    The k-th finisher (ascending work) ends at ``sum(work[<k]) + (U - k) * work[k]``.
    """
    order = np.argsort(work, axis=-1, kind="stable")
    w = np.take_along_axis(work, order, axis=-1)
    n = work.shape[-1]
    finish_sorted = np.cumsum(w, axis=-1) + (n - 1 - np.arange(n)) * w  # cumsum includes w itself
    finish = np.empty_like(work)
    np.put_along_axis(finish, order, finish_sorted, axis=-1)
    return finish


def step_state(cfg: VREdgeConfig, s: dict[str, np.ndarray], actions: np.ndarray):
    """Advance ``[B]`` envs by one segment round; returns ``(state, reward, terminated, truncated, parts)``.

    ``parts`` holds the per-user reward components ``quality``, ``stall_s`` and
    ``switches`` (``[B, U]``, 0 for an inactive slot) and the round's ``capacity_mbps`` (``[B]``),
    and where the cell varies the round's ``active`` users (``[B, U]``). An inactive slot's action
    is ignored; users leave and join (``churn``) after the round, where the episode goes on.
    """
    u = rng.uniform_block(s["key"], s["counter"], cfg.block_size)
    cell, trace_keys, capacity, channel = _cell_round(cfg, s, u)
    active = s["active"] if cfg.varies else None
    if active is not None:
        actions = np.where(active, actions, 0)  # an inactive slot's action is ignored
    r = download_round(cfg, s["buffer"], s["level"], capacity, channel, actions, active)
    switched = (actions != s["level"]).astype(np.float64)
    users = _users_after_round(cfg, s, r, actions, switched, capacity, active)
    t = s["t"] + 1
    terminated = np.any(users["cum_stall"] > cfg.abandon_stall_s, axis=1)  # (an inactive slot never stalls)
    truncated = (t >= cfg.max_steps) & ~terminated
    new = {"key": s["key"], "counter": s["counter"] + np.uint64(1), "t": t, **cell, **users, **trace_keys}
    reward = user_mean(cfg, r["user_reward"], active)
    parts = _reward_parts(cfg, s, r, switched, capacity, active)
    if active is not None:
        new.update({k: s[k] for k in _EPISODE_DRAWS if k in s})
        new.update(_churned(cfg, new, active, u, terminated | truncated))
    return new, reward, terminated, truncated, parts


def user_mean(cfg: VREdgeConfig, x: np.ndarray, active: np.ndarray | None) -> np.ndarray:
    """The mean ``[...]`` of per-user values ``x`` ``[..., U]`` over the ``active`` users (``None``: all).

    >>> user_mean(VREdgeConfig(num_users=3), np.array([[1.0, 2.0, 9.0]]), np.array([[True, True, False]]))
    array([1.5])
    """
    if active is None:
        return x.sum(axis=-1) * (1.0 / cfg.num_users)
    return (x * active).sum(axis=-1) / active.sum(axis=-1)


def _churned(cfg: VREdgeConfig, s: dict[str, np.ndarray], active: np.ndarray, u: np.ndarray, done: np.ndarray
             ) -> dict[str, np.ndarray]:
    """The users after the round's leaves and joins (none where the episode ended): ``active`` and the per-user
    leaves, every slot not active next round back at a user's start (so a joiner starts like a user at reset)."""
    draws = u[:, _count_draw(cfg) + 1:_count_draw(cfg) + 1 + cfg.num_users]
    after = np.where(done[:, None], active, next_active(cfg, active, s["users"], draws, episode_churn(cfg, s)))
    start = {**_user_start(cfg, len(done)), **_user_trace_start(cfg, u)}  # a joiner draws a trace of its own
    stayed = active & after  # a joiner was inactive in the round: it starts afresh
    return {"active": after, **{k: np.where(stayed, s[k], v) for k, v in start.items()}}


def episode_churn(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> float | np.ndarray:
    """Each episode's churn: its draw ``[B]`` where ``churn`` is a range, else the setting (a float)."""
    return s["churn"] if cfg.churn_varies else cfg.churn_range[0]


def next_active(cfg: VREdgeConfig, active: np.ndarray, users: np.ndarray, draws: np.ndarray,
                churn: float | np.ndarray) -> np.ndarray:
    """The active set ``[B, U]`` after one step of churn, from one uniform draw per slot ``draws`` ``[B, U]``.

    An active user leaves when its draw is below the episode's ``churn`` (a float, or ``[B]``); a free slot is
    joined when its draw is below ``q = min(1, n * churn / (U - n))`` (``n``: the episode's drawn ``users``; 1
    where ``n = U``), which keeps the expected active count at ``n``. If everyone would leave and nobody join,
    the leaver with the highest draw stays.

    >>> cfg = VREdgeConfig(num_users=4, churn=0.5)   # n = 2: q = 0.5; both users leave, nobody joins
    >>> next_active(cfg, np.array([[True, True, False, False]]), np.array([2]), np.array([[0.1, 0.3, 0.7, 0.9]]),
    ...             0.5)
    array([[False,  True, False, False]])
    """
    slots = cfg.num_users
    join = np.where(users >= slots, 1.0, np.minimum(1.0, users * churn / np.maximum(slots - users, 1)))
    leave = active & (draws < np.reshape(churn, (-1, 1)))
    after = (active & ~leave) | (~active & (draws < join[:, None]))
    keeper = np.argmax(np.where(leave, draws, -1.0), axis=1)  # the leaver with the highest draw
    nobody = ~after.any(axis=1)
    return after | (nobody[:, None] & (np.arange(slots) == keeper[:, None]))


def _cell_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], u: np.ndarray):
    """The cell in the round the uniform draws ``u`` give: a persistent regime (Markov chain), correlated
    log-normal noise, deep fades and each user's channel. Returns ``(cell, trace_keys, capacity, channel)``: the
    cell's state keys, the trace's (empty without recorded traces), the capacity ``[B]`` (the trace's where there
    is one) and the channel qualities ``[B, U]`` (each user's trace's, with ``user_traces``)."""
    n_users = cfg.num_users
    leave = u[:, 0] >= cfg.regime_stay_prob
    regime = np.where(leave, (s["regime"] + 1 + (u[:, 1] * 2).astype(np.int64)) % 3, s["regime"])
    noise = cfg.noise_corr * s["noise"] + math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std * rng.normals(
        u[:, 2], u[:, 3])
    fade = np.where(s["fade"], u[:, 4] >= cfg.fade_end_prob, u[:, 4] < cfg.fade_prob)
    nominal = episode_nominal(cfg, s)
    capacity = _capacity(cfg, regime, noise, fade, nominal)
    trace_keys = {}
    if cfg._traces is not None:  # a recorded trace replaces the synthetic capacity; the draws stay the same
        trace_keys = {"trace": s["trace"], "trace_pos": cfg._traces.next_position(s["trace"], s["trace_pos"])}
        capacity = _trace_capacity(cfg, s["trace"], trace_keys["trace_pos"], nominal)
    # every slot's channel evolves, active or not (a user's trace plays its next window)
    logit = cfg.channel_corr * s["channel_logit"] + math.sqrt(1 - cfg.channel_corr**2) * cfg.channel_std * (
        rng.normals(u[:, 5:5 + n_users], u[:, 5 + n_users:5 + 2 * n_users]))
    cell = {"regime": regime, "noise": noise, "fade": fade, "channel_logit": logit}
    if cfg._user_traces is not None:
        trace_keys.update(user_trace=s["user_trace"],
                          user_trace_pos=cfg._user_traces.next_position(s["user_trace"], s["user_trace_pos"]))
    return cell, trace_keys, capacity, channel_of(cfg, {**cell, **trace_keys})


def _users_after_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], r: dict[str, np.ndarray], actions: np.ndarray,
                       switched: np.ndarray, capacity: np.ndarray, active: np.ndarray | None
                       ) -> dict[str, np.ndarray]:
    """The users' state keys after the download round ``r``: buffers, levels, throughput estimates, stalls, the
    capacity history and the episode's running figures (means over the ``active`` users; ``None``: all). An
    inactive slot's leaves are meaningless until :func:`_churned` puts it back at a user's start."""
    stall = r["stall_s"]
    download = r["download_time"] if active is None else np.where(active, r["download_time"], 1.0)
    return {
        "buffer": r["buffer"],
        "level": actions.astype(np.int64),
        "throughput": _THROUGHPUT_EWMA * s["throughput"] + (1 - _THROUGHPUT_EWMA) * r["bitrate_mbps"]
        / download,
        "download_time": r["download_time"],
        "stall": stall,
        "cum_stall": s["cum_stall"] + stall,
        "cap_history": np.concatenate([s["cap_history"][:, 1:], capacity[:, None]], axis=1),
        "ep_quality": s["ep_quality"] + user_mean(cfg, r["quality"], active),
        "ep_stall": s["ep_stall"] + user_mean(cfg, stall, active),
        "ep_switches": s["ep_switches"] + user_mean(cfg, switched, active),
    }


def _reward_parts(cfg: VREdgeConfig, s: dict[str, np.ndarray], r: dict[str, np.ndarray], switched: np.ndarray,
                  capacity: np.ndarray, active: np.ndarray | None) -> dict[str, np.ndarray]:
    """The round's reward components per user (0 for a slot not ``active``), its capacity, and the linear QoE
    (bitrate less the rebuffering and switching penalties); with the ``active`` users where the cell varies."""
    prev_bitrate = cfg._ladder[s["level"]]
    qoe_lin = r["bitrate_mbps"] - QOE_LIN_REBUFFER_PENALTY * r["stall_s"] - np.abs(r["bitrate_mbps"] - prev_bitrate)
    parts = {"quality": r["quality"], "stall_s": r["stall_s"], "switches": switched, "capacity_mbps": capacity,
             "bitrate_mbps": r["bitrate_mbps"], "qoe_lin": qoe_lin}
    if active is None:
        return parts
    return {**{k: v if k == "capacity_mbps" else v * active for k, v in parts.items()}, "active": active}


def download_round(cfg: VREdgeConfig, buffer: np.ndarray, level: np.ndarray, capacity: np.ndarray,
                   channel: np.ndarray, actions: np.ndarray, active: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One segment round for every user, given the round's cell ``capacity`` and ``channel`` qualities.

    Shapes: ``buffer``, ``level`` (previous levels), ``channel`` and ``actions`` are ``[..., U]``,
    ``capacity`` is ``[...]``; any leading axes (a planner adds candidate plans). Returns
    ``[..., U]`` arrays ``bitrate_mbps``, ``download_time``, ``stall_s``, ``buffer`` (after the
    round), ``quality`` and ``user_reward`` (each user's term of the reward). A slot that is not
    ``active`` (``[..., U]`` bool; ``None``: all are) has no work in the sharing: it downloads in no
    time, takes no airtime and never stalls.
    """
    bitrate = cfg._ladder[actions]
    work = bitrate * cfg.segment_s / (capacity[..., None] * channel)
    if active is not None:
        work = np.where(active, work, 0.0)
    dl_time = processor_sharing_times(work)
    stall = np.maximum(dl_time - buffer, 0.0)
    new_buffer = np.maximum(buffer - dl_time, 0.0) + cfg.segment_s
    new_buffer = np.minimum(new_buffer, cfg.max_buffer_s)  # a full buffer waits before the next request
    quality = cfg._quality[actions]
    quality_change = np.abs(quality - cfg._quality[level])
    user_reward = cfg.quality_weight * quality - cfg.stall_weight * stall - cfg.switch_weight * quality_change
    return {"bitrate_mbps": bitrate, "download_time": dl_time, "stall_s": stall, "buffer": new_buffer,
            "quality": quality, "user_reward": user_reward}


def episode_metrics(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-step means ``[B]`` of the QoE components (each step's mean over its active users) over each env's
    current episode, and abandonment."""
    steps = np.maximum(s["t"], 1)
    return {
        "quality": s["ep_quality"] / steps,
        "stall_s": s["ep_stall"] / steps,
        "switches": s["ep_switches"] / steps,
        "abandoned": np.any(s["cum_stall"] > cfg.abandon_stall_s, axis=1).astype(np.float64),
    }


def validate_actions(cfg: VREdgeConfig, actions: Any, batch: int) -> np.ndarray:
    """Return actions as an int64 ``[batch, num_users]`` array or raise ``ValueError``."""
    a = np.asarray(actions)
    if a.shape != (batch, cfg.num_users) and not (batch == 1 and a.shape == (cfg.num_users,)):
        want = f"({cfg.num_users},)" if batch == 1 else f"({batch}, {cfg.num_users})"
        raise ValueError(f"VR-edge action has shape {a.shape}; expected {want}: one bitrate level per user")
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(a == np.round(a))):
        raise ValueError(f"VR-edge actions must be integer bitrate levels, got dtype {a.dtype}")
    a = a.astype(np.int64).reshape(batch, cfg.num_users)
    if a.min() < 0 or a.max() >= cfg.num_levels:
        raise ValueError(f"VR-edge action out of range: levels must be in [0, {cfg.num_levels - 1}], "
                         f"got min {a.min()} and max {a.max()}")
    return a


def burn_cpu(microseconds: float) -> None:
    """Busy-wait, standing in for the rendering/encoding cost of a heavy simulator."""
    if microseconds > 0:
        end = time.perf_counter_ns() + int(microseconds * 1000)
        while time.perf_counter_ns() < end:
            pass


class SyntheticVREdgeEnv(gym.Env):
    """Several VR users stream edge-rendered video over one shared, fluctuating cell.

    Each step every user picks a bitrate level; the reward is the mean over users of
    ``quality - stall_weight * stall_s - switch_weight * |quality change|``.

    Example:
        >>> import envs
        >>> env = envs.SyntheticVREdgeEnv(num_users=4, seed=0)
        >>> obs, info = env.reset()
        >>> obs.shape, env.action_space
        ((33,), MultiDiscrete([6 6 6 6]))
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> sorted(info)
        ['bitrate_mbps', 'capacity_mbps', 'qoe_lin', 'quality', 'stall_s', 'switches']

    Shapes: observation ``[7 * num_users + history + 1]`` float32 (see ``USER_FEATURES``),
    action ``[num_users]`` int levels, ``info`` components ``[num_users]``. When an
    episode ends, ``info["episode_metrics"]`` holds per-step means of the components.
    Keyword arguments are the fields of :class:`VREdgeConfig`.

    A cell whose users vary (``users`` below ``num_users`` or a range, ``churn``) is masked: each
    user's features end with its active flag (index ``active_user_feature``; ``None`` where every
    slot is always active), an inactive slot's features are 0, and the cell's end with ``1 / active
    users`` and ``active users / users drawn``:

        >>> env = envs.SyntheticVREdgeEnv(num_users=4, users="2-3", churn=0.05, seed=0)
        >>> obs, info = env.reset()
        >>> obs.shape, env.head_observation_layout, env.active_user_feature
        ((39,), (8, 7), 7)
        >>> obs[7:32:8]   # slots 0..3: the first 2 or 3 are active at reset
        array([1., 1., 1., 0.], dtype=float32)
    """

    metadata = {"render_modes": []}

    def __init__(self, num_users: int = 8, seed: int | None = None, **config: Any) -> None:
        self.config = VREdgeConfig(num_users=num_users, **config)
        if seed is not None:
            rng.key_from_seed(seed)  # validates early
        self._seed = seed
        self.observation_space = observation_space(self.config)
        self.action_space = action_space(self.config)
        self.head_observation_layout = head_observation_layout(self.config)
        self.active_user_feature = self.config.active_user_feature
        self._state: dict[str, np.ndarray] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None and self._state is None:
            seed = self._seed if self._seed is not None else int(self.np_random.integers(2**63))
        if seed is not None:
            key, counter = np.array([rng.key_from_seed(seed)]), np.zeros(1, dtype=np.uint64)
        else:  # next episode continues this env's random stream
            key, counter = self._state["key"], self._state["counter"]
        self._state = initial_state(self.config, key, counter)
        return observe(self.config, self._state)[0], {}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = validate_actions(self.config, action, 1)
        burn_cpu(self.config.step_cost_us)
        self._state, reward, terminated, truncated, parts = step_state(self.config, self._state, actions)
        info: dict[str, Any] = {k: v[0] if v.ndim > 1 else float(v[0]) for k, v in parts.items()}
        if terminated[0] or truncated[0]:
            info["episode_metrics"] = {k: float(v[0]) for k, v in episode_metrics(self.config, self._state).items()}
        return observe(self.config, self._state)[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), info

    def get_state(self) -> dict[str, np.ndarray]:
        """Return a copy of the full env state (RNG position included) as NumPy arrays."""
        if self._state is None:
            raise RuntimeError("call reset() before get_state()")
        return {k: v.copy() for k, v in self._state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore a state from :meth:`get_state`; the next steps repeat exactly."""
        self._state = checked_state(self.config, state, 1)


def checked_state(cfg: VREdgeConfig, state: dict[str, Any], batch: int) -> dict[str, np.ndarray]:
    """Return a copy of ``state`` after checking that it fits ``cfg`` and ``batch`` envs."""
    template = initial_state(cfg, np.zeros(batch, dtype=np.uint64), np.zeros(batch, dtype=np.uint64))
    if not isinstance(state, dict) or set(state) != set(template):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a VR-edge state: expected keys {sorted(template)}, got {got}")
    out = {}
    for k, ref in template.items():
        v = np.asarray(state[k])
        if v.shape != ref.shape:
            raise ValueError(f"VR-edge state[{k!r}] has shape {v.shape}, expected {ref.shape} "
                             f"(num_envs={batch}, num_users={cfg.num_users}, history={cfg.history})")
        out[k] = v.astype(ref.dtype, copy=True)
    return out


envs.register()  # importing the env registers it with Gymnasium
