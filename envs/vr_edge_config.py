"""VR-edge's settings and the rules between them: :class:`VREdgeConfig`, what a cell and its observation hold, as
data.

A config is its settings and what follows from them (the ladder's qualities, the observation's size, the layout of
a step's draws). Building one reads no file: the recorded traces it names are read on first use
(:attr:`VREdgeConfig.traces`, or :meth:`VREdgeConfig.read_traces` where an error should come at once), kept by the
config and shared by every config that names the same files (:func:`envs.traces.load_traces`). The dynamics are
in :mod:`envs.vr_edge_dynamics`, the Gymnasium env in :mod:`envs.vr_edge`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np

from envs.arguments import KINDS, is_number
from envs.settings import ConfigError, check_limits, setting
from envs.traces import TRACE_SPLITS, TraceSet, load_link_traces, load_traces
from envs.vr_edge_draws import DrawLayout

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
# what a cell draws at reset and keeps for the episode: a varying cell's users (and churn, where a range), an
# outage_prob range's probability, a capacity_scale range's scale; a condition grid's weights (a curriculum sets them)
EPISODE_DRAWS = ("users", "churn", "outage_prob", "capacity_scale", "condition_weights")
# the arguments that size what a run holds per env: its state and observation (state_bytes, obs_dim), its
# action (one level per user) and the scores a policy gives the actions (num_users x levels)
MEMORY_ARGUMENTS = ("num_users", "history", "bitrates_mbps")
OBS_HIGH = 10.0  # every feature is clipped to [0, OBS_HIGH]
THROUGHPUT_EWMA = 0.5  # the weight of a user's last throughput estimate in the next
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
    trace_quantile: float = setting(0.0, "with trace_scale 0, scale each trace so that this quantile of its windows "
                                    "is the nominal capacity (0.5: its median; for heavy-tailed sets, whose outages "
                                    "leave a cell scaled by its mean starved much of the time)", at_least=0,
                                    at_most=1, zero="its mean")
    reveal_hidden_state: bool = setting(False, "append the regime (one-hot) and the fade flag to the observation (a "
                                        "diagnostic; synthetic cell only)")
    outage_prob: float | str = setting(0.0, "probability per step that an outage starts: the bad state of a "
                                       "two-state Gilbert-Elliott channel, which multiplies the cell's capacity "
                                       "(synthetic or recorded) by outage_depth while it lasts; or a range "
                                       "'LOW-HIGH' drawn uniformly per episode, within 0..1", zero="no outages")
    outage_end_prob: float = setting(0.3, "probability per step that an outage ends (its mean length: 1 / this "
                                     "steps)", above=0, at_most=1)
    outage_depth: float = setting(0.05, "capacity multiplier during an outage", above=0, at_most=1)
    capacity_scale: float | str = setting(1.0, "multiplier of the cell's capacity (synthetic or recorded), or a "
                                          "range 'LOW-HIGH' drawn log-uniformly per episode (0.25-4: starved to "
                                          "generous cells, as many halvings as doublings), each > 0 (1: the cell "
                                          "as it is)")
    condition_grid: int = setting(0, "split the capacity_scale and outage_prob ranges into this many bins each and "
                                  "draw each episode's conditions from the bins by weights kept in the env's state, "
                                  "which a curriculum sets (trainer's curriculum_every; uniform until it does): "
                                  "needs both as ranges", at_least=0, at_most=8, zero="the ranges alone")

    def __post_init__(self) -> None:
        _check_kinds(self)  # first: a limit compared with segment_s='abc' (from --env-kwargs) is a bare TypeError
        check_limits(self, flags=False)
        _check_ladder(self)
        _check_cell(self)
        self.users_range, self.churn_range, self.outage_range, self.scale_range  # noqa: B018 - their rules, now
        _check_traces(self)
        object.__setattr__(self, "bitrates_mbps", tuple(self.bitrates_mbps))
        # nothing is read here: the traces on first use (a file that is missing or unreadable is a one-line error
        # then; the trainer asks for them where it checks --env-kwargs, envs.vr_edge_profile.check_arguments)

    # what follows from the settings: computed on first use and kept (the config is frozen, so they never go
    # stale; a cached_property writes the instance's __dict__ past the frozen __setattr__)
    @cached_property
    def ladder(self) -> np.ndarray:
        """The bitrate ladder ``[levels]``, Mbit/s, float64."""
        return np.asarray(self.bitrates_mbps, dtype=np.float64)

    @cached_property
    def quality(self) -> np.ndarray:
        """Each level's quality ``[levels]``: log utility scaled to [0, 1]; a one-level ladder's is 1."""
        ladder = self.bitrates_mbps
        if len(ladder) == 1:
            return np.ones(1)
        return np.log(self.ladder / ladder[0]) / math.log(ladder[-1] / ladder[0])

    @cached_property
    def regime_multiplier(self) -> np.ndarray:
        """``regime_multipliers`` ``[3]`` as an array, indexed by regime."""
        return np.asarray(self.regime_multipliers, dtype=np.float64)

    @cached_property
    def traces(self) -> TraceSet | None:
        """The recorded capacities the cell replays (``capacity_trace``), read on first use; ``None``: synthetic."""
        if not self.capacity_trace:
            return None
        return load_traces(self.capacity_trace, self.segment_s, self.trace_split, self.trace_scale or None,
                           self.nominal_capacity_mbps, self.trace_column, self.trace_key,
                           quantile=self.trace_quantile)

    @cached_property
    def link_traces(self) -> TraceSet | None:
        """The recorded link qualities the users replay (``user_traces``), read on first use; ``None``: synthetic
        links."""
        if not self.user_traces:
            return None
        return load_link_traces(self.user_traces, self.segment_s, self.trace_split, MEAN_CHANNEL_QUALITY,
                                self.trace_column, self.trace_key)

    def read_traces(self) -> VREdgeConfig:
        """This config, its trace sets read (:attr:`traces`, :attr:`link_traces`): where a missing or unreadable
        file should be its one-line error now (an env's constructor, the trainer's check of ``--env-kwargs``) rather
        than at first use. A set is read once per version of its files (:func:`envs.traces.load_traces`)."""
        self.traces, self.link_traces  # noqa: B018
        return self

    @cached_property
    def draws(self) -> DrawLayout:
        """Where each uniform of a step's (and a reset's) block goes (:mod:`envs.vr_edge_draws`)."""
        return DrawLayout.of(self.num_users, self.varies, self.outages, self.scale_varies)

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
        return self.users_range != (self.num_users, self.num_users) or self.churn_range[1] > 0

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
        ``active``; with outages (:attr:`outages`), the outage flag; 8 for an ``outage_prob`` or ``capacity_scale``
        drawn per episode; 8 for each bin of a ``condition_grid``'s weights. Computed, not allocated: a run checks
        what its envs need against the machine's memory before it builds one.

        >>> cfg, varied = VREdgeConfig(num_users=3, history=5), VREdgeConfig(num_users=3, users="1-3", churn=0.1)
        >>> from envs.vr_edge_dynamics import initial_state
        >>> zero, ranged = np.zeros(1, np.uint64), VREdgeConfig(num_users=3, churn="0-0.1")
        >>> outages = VREdgeConfig(num_users=3, outage_prob=0.1)
        >>> drawn = VREdgeConfig(num_users=3, outage_prob="0-0.1", capacity_scale="0.5-2")
        >>> grid = VREdgeConfig(num_users=3, outage_prob="0-0.1", capacity_scale="0.5-2", condition_grid=3)
        >>> [c.state_bytes == sum(v.nbytes for v in initial_state(c, zero, zero).values())
        ...  for c in (cfg, varied, ranged, outages, drawn, grid)]
        [True, True, True, True, True, True]
        """
        per_env = (len(_STATE_PER_ENV) + (2 if self.capacity_trace else 0) + (1 if self.varies else 0)
                   + (1 if self.churn_varies else 0) + (1 if self.outage_varies else 0)
                   + (1 if self.scale_varies else 0))
        per_user = len(_STATE_PER_USER) + (2 if self.user_traces else 0)  # a user's trace and window
        active = self.num_users if self.varies else 0  # one bool per slot, and the episode's drawn count
        grid = self.condition_grid ** 2  # the condition weights a curriculum sets
        return (8 * (per_user * self.num_users + self.history + per_env + grid) + 1 + active
                + (1 if self.outages else 0))

    @property
    def block_size(self) -> int:
        """Uniform draws per env per step (and per reset): the cell's 5, two per user for its channel, and where
        the cell :attr:`varies` one more for the reset's user count and one per slot for leaving or joining (laid
        out by :attr:`draws`)."""
        return self.draws.size

    @property
    def outages(self) -> bool:
        """Whether the cell has the outage chain (``outage_prob > 0``, or a range above 0): only then does the env
        draw for it and keep its ``outage`` flag in its state (the default is unchanged).

        >>> VREdgeConfig().outages, VREdgeConfig(outage_prob=0.02).outages, VREdgeConfig(outage_prob="0-0.1").outages
        (False, True, True)
        """
        return self.outage_range[1] > 0

    @property
    def outage_varies(self) -> bool:
        """Whether ``outage_prob`` is a range drawn per episode: then each env's state keeps its episode's
        ``outage_prob`` (drawn at reset from the outage chain's draw, which a reset leaves free).

        >>> VREdgeConfig(outage_prob="0-0.1").outage_varies, VREdgeConfig(outage_prob=0.05).outage_varies
        (True, False)
        """
        return self.outage_range[0] < self.outage_range[1]

    @property
    def scaled(self) -> bool:
        """Whether ``capacity_scale`` changes the capacity (not 1): only then is it multiplied in.

        >>> VREdgeConfig().scaled, VREdgeConfig(capacity_scale=0.5).scaled, VREdgeConfig(capacity_scale="1-1").scaled
        (False, True, False)
        """
        return self.scale_range != (1.0, 1.0)

    @property
    def scale_varies(self) -> bool:
        """Whether ``capacity_scale`` is a range drawn per episode: then the block has one more draw (the reset's
        scale) and each env's state keeps its episode's ``capacity_scale``.

        >>> VREdgeConfig(capacity_scale="0.25-4").scale_varies, VREdgeConfig(capacity_scale=2).scale_varies
        (True, False)
        """
        return self.scale_range[0] < self.scale_range[1]

    @cached_property
    def users_range(self) -> tuple[int, int]:
        """The active users at reset, ``(low, high)``: drawn uniformly from ``low..high`` per episode."""
        return users_range(self.users, self.num_users)

    @cached_property
    def churn_range(self) -> tuple[float, float]:
        """The churn, ``(low, high)``: drawn uniformly from ``low..high`` per episode (equal: a fixed churn)."""
        return churn_range(self.churn)

    @cached_property
    def outage_range(self) -> tuple[float, float]:
        """The outage chain's start probability, ``(low, high)``: drawn uniformly per episode (equal: fixed)."""
        return number_range("outage_prob", self.outage_prob, PROBABILITY)

    @cached_property
    def scale_range(self) -> tuple[float, float]:
        """The capacity scale, ``(low, high)``: drawn log-uniformly per episode (equal: a fixed scale)."""
        return number_range("capacity_scale", self.capacity_scale, POSITIVE)

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


# what a range setting's bounds must be: the rule that says so, and the test
PROBABILITY = ("a probability (>= 0 and <= 1)", lambda low, high: 0 <= low <= high <= 1)
POSITIVE = ("a number > 0", lambda low, high: 0 < low <= high < math.inf)


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
    return number_range("churn", churn, PROBABILITY)


def number_range(key: str, value: float | str, rule: tuple[str, Any]) -> tuple[float, float]:
    """The setting ``key``'s ``value`` (a number, or a range ``"LOW-HIGH"`` drawn per episode) as ``(low, high)``
    within ``rule`` (:data:`PROBABILITY`, :data:`POSITIVE`); a :class:`envs.settings.ConfigError` otherwise.

    >>> number_range("capacity_scale", "0.25-4", POSITIVE), number_range("outage_prob", 0.1, PROBABILITY)
    ((0.25, 4.0), (0.1, 0.1))
    >>> number_range("capacity_scale", "0-4", POSITIVE)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: capacity_scale must be a number > 0 or a range 'LOW-HIGH' of them, got '0-4'
    """
    text = str(value).strip()
    low, sep, high = text.partition("-") if not is_number(value) else (text, "", "")
    try:
        low_v, high_v = float(low), float(high if sep else low)
    except ValueError:
        low_v = high_v = math.nan
    what, within = rule
    if within(low_v, high_v):
        return low_v, high_v
    raise ConfigError(key, value, f"must be {what} or a range 'LOW-HIGH' of them", flag=False)


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
    """One multiplier per regime, a buffer that holds a segment, and a condition grid over two ranges."""
    if cfg.condition_grid and not (cfg.scale_varies and cfg.outage_varies):
        raise ConfigError("condition_grid", cfg.condition_grid, "needs capacity_scale and outage_prob as ranges "
                          "(e.g. capacity_scale=0.3-2,outage_prob=0-0.1): its bins split them", flag=False)
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
    if cfg.trace_quantile and not (cfg.capacity_trace and not cfg.trace_scale):
        raise ConfigError("trace_quantile", cfg.trace_quantile, "must be 0 unless capacity_trace is given with "
                          "trace_scale 0: the quantile says which of a trace's rates is scaled to the nominal "
                          "capacity, and a trace_scale multiplies the Mbit/s instead", flag=False)
    for name in ("trace_column", "trace_key"):
        if getattr(cfg, name) and not traced:
            raise ConfigError(name, getattr(cfg, name), "must be empty unless capacity_trace or user_traces is "
                              "given (it reads CSV trace files)", flag=False)
    if cfg.trace_key and not cfg.trace_column:
        raise ConfigError("trace_key", cfg.trace_key, "needs trace_column (the CSV column of the throughput)",
                          flag=False)


def torch_env_refusal(step_cost_us: float = 0.0, condition_grid: int = 0, **_: Any) -> str:
    """Why the torch VR-edge env (``--backend device``) cannot run these arguments, naming the alternative; ``""``
    when it can. Without torch, so that a command line is checked before trace files are read."""
    if condition_grid:
        return "condition_grid (a curriculum over network conditions) is drawn by the NumPy env only: use " \
               "--backend sync or async, or leave condition_grid at 0"
    if step_cost_us:
        return "step_cost_us stands in for a CPU simulator's cost and the torch VR-edge env (--backend device) " \
               "burns none: leave it at 0, or use --backend sync or async"
    return ""


def head_observation_layout(cfg: VREdgeConfig) -> tuple[int, int]:
    """``(features per user, shared features)``: the observation is user 0's features, user 1's, ..., then the cell's.

    Learners may use it to share one network across the users' action heads.
    """
    return cfg.num_user_features, cfg.num_cell_features
