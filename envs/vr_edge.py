"""Synthetic multi-user VR edge-rendering workload: dynamics and the single env.

The dynamics are written once, as NumPy functions over a leading batch axis ``B``
of independent envs; :class:`SyntheticVREdgeEnv` runs them with ``B = 1`` and
:class:`envs.vector.VREdgeVectorEnv` with ``B = num_envs``. See ``envs/README.md``
for the model and the reward formula.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np

import envs
from envs import rng
from envs.arguments import KINDS, is_number
from envs.settings import ConfigError, check_limits, setting
from envs.traces import TRACE_SPLITS, TraceSet, load_traces

REGIMES = ("good", "fair", "poor")
USER_FEATURES = ("buffer", "last_level", "throughput", "download_time", "stall", "cum_stall", "channel")
# the 8-byte leaves of an env's state (initial_state): one per user each, and one per env each (besides the
# capacity history, a trace's file and window, and the fade flag)
_STATE_PER_USER = ("channel_logit", "buffer", "level", "throughput", "download_time", "stall", "cum_stall")
_STATE_PER_ENV = ("key", "counter", "t", "regime", "noise", "ep_quality", "ep_stall", "ep_switches")
# the arguments that size what a run holds per env: its state and observation (state_bytes, obs_dim), its
# action (one level per user) and the scores a policy gives the actions (num_users x levels)
MEMORY_ARGUMENTS = ("num_users", "history", "bitrates_mbps")
_OBS_HIGH = 10.0
_THROUGHPUT_EWMA = 0.5
QOE_LIN_REBUFFER_PENALTY = 4.3  # QoE_lin (Pensieve and successors): Mbps - 4.3 x rebuffer s - |change| Mbps


@dataclass(frozen=True)
class VREdgeConfig:
    """Parameters of the VR-edge workload, each declared with its help and limits (:func:`envs.settings.setting`);
    on construction one rule checks every field's limits (:func:`envs.settings.check_limits`), after its type and
    before the rules between fields (:func:`_check_ladder`, :func:`_check_cell`, :func:`_check_traces`): a
    :class:`envs.settings.ConfigError` such as ``num_users must be >= 1, got 0``."""

    num_users: int = setting(8, "users sharing the cell", at_least=1)
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
    capacity_trace: str = setting("", "trace file or directory whose throughput the cell's capacity replays "
                                  "(empty: the synthetic cell)")
    trace_split: str = setting("all", "which of the trace files, by file: all, train or test", choices=TRACE_SPLITS)
    trace_scale: float = setting(0.0, "multiply a trace's Mbit/s by this", at_least=0,
                                 zero="scale each trace to a mean of the nominal capacity")
    reveal_hidden_state: bool = setting(False, "append the regime (one-hot) and the fade flag to the observation (a "
                                        "diagnostic; synthetic cell only)")
    _ladder: np.ndarray = field(init=False, repr=False, compare=False)
    _quality: np.ndarray = field(init=False, repr=False, compare=False)
    _regime_mult: np.ndarray = field(init=False, repr=False, compare=False)
    _traces: TraceSet | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_kinds(self)  # first: a limit compared with segment_s='abc' (from --env-kwargs) is a bare TypeError
        check_limits(self, flags=False)
        _check_ladder(self)
        _check_cell(self)
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
        traces = (load_traces(self.capacity_trace, self.segment_s, self.trace_split,
                              self.trace_scale or None, self.nominal_capacity_mbps) if self.capacity_trace else None)
        object.__setattr__(self, "_traces", traces)

    @property
    def num_levels(self) -> int:
        return len(self.bitrates_mbps)

    @property
    def obs_dim(self) -> int:
        return len(USER_FEATURES) * self.num_users + self.num_cell_features

    @property
    def num_cell_features(self) -> int:
        """Features of the cell: the capacity history, the episode's progress, and with
        ``reveal_hidden_state`` the regime (one-hot) and the fade flag."""
        return self.history + 1 + (len(REGIMES) + 1 if self.reveal_hidden_state else 0)

    @property
    def state_bytes(self) -> int:
        """Bytes of one env's state (:func:`initial_state`'s leaves): 8 per user for each of ``_STATE_PER_USER``,
        8 per step of capacity history, 8 for each of ``_STATE_PER_ENV`` (and a trace's file and window), and the
        fade flag. Computed, not allocated: a run checks what its envs need against the machine's memory before it
        builds one.

        >>> cfg = VREdgeConfig(num_users=3, history=5)
        >>> cfg.state_bytes == sum(v.nbytes for v in initial_state(cfg, np.zeros(1, np.uint64),
        ...                                                           np.zeros(1, np.uint64)).values())
        True
        """
        per_env = len(_STATE_PER_ENV) + (2 if self.capacity_trace else 0)
        return 8 * (len(_STATE_PER_USER) * self.num_users + self.history + per_env) + 1

    @property
    def block_size(self) -> int:
        """Uniform draws per env per step (and per reset)."""
        return 5 + 2 * self.num_users

    @property
    def nominal_capacity_mbps(self) -> float:
        return self.num_users * self.capacity_per_user_mbps

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


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
    if cfg.trace_split != "all" and not cfg.capacity_trace:
        raise ConfigError("trace_split", cfg.trace_split, "must be 'all' unless capacity_trace is given (the split "
                          "applies to trace files)", flag=False)
    if cfg.trace_scale and not cfg.capacity_trace:
        raise ConfigError("trace_scale", cfg.trace_scale, "must be 0 unless capacity_trace is given (the scale "
                          "applies to a trace)", flag=False)


def torch_env_refusal(capacity_trace: str | None = None, step_cost_us: float = 0.0, **_: Any) -> str:
    """Why the torch VR-edge env (``--backend device``) cannot run these arguments, naming the alternative; ``""``
    when it can. Without torch, so that a command line is checked before trace files are read."""
    if capacity_trace:
        return "capacity_trace is not supported by the torch VR-edge env (--backend device): replay traces with " \
               "--backend sync or async"
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
    return len(USER_FEATURES), cfg.num_cell_features


def action_space(cfg: VREdgeConfig) -> gym.spaces.MultiDiscrete:
    return gym.spaces.MultiDiscrete([cfg.num_levels] * cfg.num_users)


# ---------------------------------------------------------------- batched dynamics
# A state is a dict of arrays with leading batch axis B; all functions below are pure.

def _channel_quality(logit: np.ndarray) -> np.ndarray:
    """Spectral efficiency of a user's link relative to the best one, in [0.25, 1]."""
    return 0.25 + 0.75 / (1.0 + np.exp(-logit))


def _capacity(cfg: VREdgeConfig, regime: np.ndarray, noise: np.ndarray, fade: np.ndarray) -> np.ndarray:
    mult = cfg._regime_mult[regime]
    lognormal = np.exp(noise - 0.5 * cfg.noise_std**2)  # mean-one fluctuation
    return cfg.nominal_capacity_mbps * mult * lognormal * np.where(fade, cfg.fade_depth, 1.0)


def initial_state(cfg: VREdgeConfig, keys: np.ndarray, counters: np.ndarray) -> dict[str, np.ndarray]:
    """Return fresh episode states for ``[B]`` envs, drawn from block ``counters``."""
    u = rng.uniform_block(keys, counters, cfg.block_size)
    b, n_users = len(keys), cfg.num_users
    regime = np.minimum((u[:, 0] * 3).astype(np.int64), 2)
    noise = cfg.noise_std * rng.normals(u[:, 2], u[:, 3])
    fade = np.zeros(b, dtype=bool)
    logit = cfg.channel_std * rng.normals(u[:, 5:5 + n_users], u[:, 5 + n_users:])
    cap = _capacity(cfg, regime, noise, fade)
    trace_keys = {}
    if cfg._traces is not None:  # draws 1 and 4 are free at reset: the trace file and its start window
        trace, pos = cfg._traces.start(u[:, 1], u[:, 4])
        cap = cfg._traces.capacity(trace, pos)
        trace_keys = {"trace": trace, "trace_pos": pos}
    return {
        "key": keys.copy(),
        "counter": counters + np.uint64(1),
        "t": np.zeros(b, dtype=np.int64),
        "regime": regime,
        "noise": noise,
        "fade": fade,
        "channel_logit": logit,
        "buffer": np.full((b, n_users), cfg.initial_buffer_s),
        "level": np.zeros((b, n_users), dtype=np.int64),
        "throughput": np.full((b, n_users), cfg.bitrates_mbps[0]),
        "download_time": np.zeros((b, n_users)),
        "stall": np.zeros((b, n_users)),
        "cum_stall": np.zeros((b, n_users)),
        "cap_history": np.repeat(cap[:, None], cfg.history, axis=1),
        "ep_quality": np.zeros(b),
        "ep_stall": np.zeros(b),
        "ep_switches": np.zeros(b),
        **trace_keys,
    }


def observe(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> np.ndarray:
    """Return ``[B, obs_dim]`` float32 observations scaled to roughly unit range."""
    b, n_user_feat = len(s["t"]), len(USER_FEATURES) * cfg.num_users
    obs = np.empty((b, cfg.obs_dim), dtype=np.float32)  # float64 results are rounded on assignment
    users = obs[:, :n_user_feat].reshape(b, cfg.num_users, len(USER_FEATURES))  # a view: columns fill obs
    users[:, :, 0] = s["buffer"] / cfg.max_buffer_s
    users[:, :, 1] = s["level"] / max(cfg.num_levels - 1, 1)
    users[:, :, 2] = s["throughput"] / cfg.bitrates_mbps[-1]
    users[:, :, 3] = s["download_time"] / cfg.segment_s
    users[:, :, 4] = s["stall"] / cfg.segment_s
    users[:, :, 5] = s["cum_stall"] / cfg.abandon_stall_s
    users[:, :, 6] = _channel_quality(s["channel_logit"])
    progress = n_user_feat + cfg.history
    obs[:, n_user_feat:progress] = s["cap_history"] / cfg.nominal_capacity_mbps
    obs[:, progress] = s["t"] / cfg.max_steps
    if cfg.reveal_hidden_state:  # a diagnostic: what a policy could gain from knowing the hidden cell state
        obs[:, progress + 1:progress + 1 + len(REGIMES)] = np.arange(len(REGIMES)) == s["regime"][:, None]
        obs[:, -1] = s["fade"]
    return np.minimum(obs, _OBS_HIGH, out=obs)  # every feature is >= 0 by construction


def decode_observation(cfg: VREdgeConfig, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Invert :func:`observe` for ``[B, obs_dim]`` observations: features in physical units.

    Per-user entries are ``[B, U]``: ``buffer`` (s), ``last_level``, ``throughput``
    (Mbps, recent EWMA), ``download_time`` and ``stall`` (s), ``cum_stall`` (s), ``channel``
    (relative link quality). ``cap_history`` is ``[B, history]`` in Mbps, oldest first.
    """
    obs = np.asarray(obs, dtype=np.float64)
    n_user_feat = len(USER_FEATURES) * cfg.num_users
    users = obs[:, :n_user_feat].reshape(len(obs), cfg.num_users, len(USER_FEATURES))
    scale = (cfg.max_buffer_s, max(cfg.num_levels - 1, 1), cfg.bitrates_mbps[-1], cfg.segment_s, cfg.segment_s,
             cfg.abandon_stall_s, 1.0)
    out = {name: users[:, :, i] * scale[i] for i, name in enumerate(USER_FEATURES)}
    out["last_level"] = np.rint(out["last_level"]).astype(np.int64)
    out["cap_history"] = obs[:, n_user_feat:n_user_feat + cfg.history] * cfg.nominal_capacity_mbps
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
    ``switches`` (``[B, U]``) and the round's ``capacity_mbps`` (``[B]``).
    """
    u = rng.uniform_block(s["key"], s["counter"], cfg.block_size)
    cell, trace_keys, capacity, channel = _cell_round(cfg, s, u)
    r = download_round(cfg, s["buffer"], s["level"], capacity, channel, actions)
    switched = (actions != s["level"]).astype(np.float64)
    users = _users_after_round(cfg, s, r, actions, switched, capacity)
    t = s["t"] + 1
    terminated = np.any(users["cum_stall"] > cfg.abandon_stall_s, axis=1)
    truncated = (t >= cfg.max_steps) & ~terminated
    new = {"key": s["key"], "counter": s["counter"] + np.uint64(1), "t": t, **cell, **users, **trace_keys}
    reward = r["user_reward"].sum(axis=1) * (1.0 / cfg.num_users)
    return new, reward, terminated, truncated, _reward_parts(cfg, s, r, switched, capacity)


def _cell_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], u: np.ndarray):
    """The cell in the round the uniform draws ``u`` give: a persistent regime (Markov chain), correlated
    log-normal noise, deep fades and each user's channel. Returns ``(cell, trace_keys, capacity, channel)``: the
    cell's state keys, the trace's (empty without recorded traces), the capacity ``[B]`` (the trace's where there
    is one) and the channel qualities ``[B, U]``."""
    n_users = cfg.num_users
    leave = u[:, 0] >= cfg.regime_stay_prob
    regime = np.where(leave, (s["regime"] + 1 + (u[:, 1] * 2).astype(np.int64)) % 3, s["regime"])
    noise = cfg.noise_corr * s["noise"] + math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std * rng.normals(
        u[:, 2], u[:, 3])
    fade = np.where(s["fade"], u[:, 4] >= cfg.fade_end_prob, u[:, 4] < cfg.fade_prob)
    capacity = _capacity(cfg, regime, noise, fade)
    trace_keys = {}
    if cfg._traces is not None:  # a recorded trace replaces the synthetic capacity; the draws stay the same
        trace_keys = {"trace": s["trace"], "trace_pos": cfg._traces.next_position(s["trace"], s["trace_pos"])}
        capacity = cfg._traces.capacity(s["trace"], trace_keys["trace_pos"])
    logit = cfg.channel_corr * s["channel_logit"] + math.sqrt(1 - cfg.channel_corr**2) * cfg.channel_std * (
        rng.normals(u[:, 5:5 + n_users], u[:, 5 + n_users:]))
    cell = {"regime": regime, "noise": noise, "fade": fade, "channel_logit": logit}
    return cell, trace_keys, capacity, _channel_quality(logit)


def _users_after_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], r: dict[str, np.ndarray], actions: np.ndarray,
                       switched: np.ndarray, capacity: np.ndarray) -> dict[str, np.ndarray]:
    """The users' state keys after the download round ``r``: buffers, levels, throughput estimates, stalls, the
    capacity history and the episode's running figures (per-user means)."""
    inv_users = 1.0 / cfg.num_users
    stall = r["stall_s"]
    return {
        "buffer": r["buffer"],
        "level": actions.astype(np.int64),
        "throughput": _THROUGHPUT_EWMA * s["throughput"] + (1 - _THROUGHPUT_EWMA) * r["bitrate_mbps"]
        / r["download_time"],
        "download_time": r["download_time"],
        "stall": stall,
        "cum_stall": s["cum_stall"] + stall,
        "cap_history": np.concatenate([s["cap_history"][:, 1:], capacity[:, None]], axis=1),
        "ep_quality": s["ep_quality"] + r["quality"].sum(axis=1) * inv_users,
        "ep_stall": s["ep_stall"] + stall.sum(axis=1) * inv_users,
        "ep_switches": s["ep_switches"] + switched.sum(axis=1) * inv_users,
    }


def _reward_parts(cfg: VREdgeConfig, s: dict[str, np.ndarray], r: dict[str, np.ndarray], switched: np.ndarray,
                  capacity: np.ndarray) -> dict[str, np.ndarray]:
    """The round's reward components per user, its capacity, and the linear QoE (bitrate less the rebuffering
    and switching penalties)."""
    prev_bitrate = cfg._ladder[s["level"]]
    qoe_lin = r["bitrate_mbps"] - QOE_LIN_REBUFFER_PENALTY * r["stall_s"] - np.abs(r["bitrate_mbps"] - prev_bitrate)
    return {"quality": r["quality"], "stall_s": r["stall_s"], "switches": switched, "capacity_mbps": capacity,
            "bitrate_mbps": r["bitrate_mbps"], "qoe_lin": qoe_lin}


def download_round(cfg: VREdgeConfig, buffer: np.ndarray, level: np.ndarray, capacity: np.ndarray,
                   channel: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
    """One segment round for every user, given the round's cell ``capacity`` and ``channel`` qualities.

    Shapes: ``buffer``, ``level`` (previous levels), ``channel`` and ``actions`` are ``[..., U]``,
    ``capacity`` is ``[...]``; any leading axes (a planner adds candidate plans). Returns
    ``[..., U]`` arrays ``bitrate_mbps``, ``download_time``, ``stall_s``, ``buffer`` (after the
    round), ``quality`` and ``user_reward`` (each user's term of the reward).
    """
    bitrate = cfg._ladder[actions]
    work = bitrate * cfg.segment_s / (capacity[..., None] * channel)
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
    """Per-step means ``[B]`` of the QoE components over each env's current episode, and abandonment."""
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
