"""VR-edge's dynamics: pure NumPy functions over a batch of envs' states.

A state is a dict of arrays with a leading batch axis ``B`` of independent envs; every function here is pure (the
same state and draws give the same result). :class:`envs.vr_edge.SyntheticVREdgeEnv` runs them with ``B = 1``,
:class:`envs.vector.VREdgeVectorEnv` with ``B = num_envs``; the belief filter (:mod:`envs.belief`), the belief MPC
(:mod:`envs.belief_mpc`) and the planners step the cell with them, and :mod:`envs.vr_edge_torch` ports them. Each
step reads one block of uniforms, laid out by :mod:`envs.vr_edge_draws`. See ``envs/README.md`` for the model and
the reward formula.

Example:
    >>> from envs.vr_edge_config import VREdgeConfig
    >>> cfg, key = VREdgeConfig(num_users=2), np.zeros(1, dtype=np.uint64)
    >>> state = initial_state(cfg, key, key)
    >>> state, reward, terminated, truncated, parts = step_state(cfg, state, np.array([[0, 5]]))
    >>> observe(cfg, state).shape, reward.shape, parts["quality"]
    ((1, 19), (1,), array([[0., 1.]]))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from envs import rng
from envs.vr_edge_config import (
    EPISODE_DRAWS,
    MASK_CELL_FEATURES,
    OBS_HIGH,
    QOE_LIN_REBUFFER_PENALTY,
    REGIMES,
    THROUGHPUT_EWMA,
    USER_FEATURES,
    VREdgeConfig,
)
from envs.vr_edge_draws import Draw


def channel_quality(logit: np.ndarray) -> np.ndarray:
    """Spectral efficiency of a user's link relative to the best one, in [0.25, 1]."""
    return 0.25 + 0.75 / (1.0 + np.exp(-logit))


def synthetic_capacity(cfg: VREdgeConfig, regime: np.ndarray, noise: np.ndarray, fade: np.ndarray,
                       nominal: float | np.ndarray) -> np.ndarray:
    """The synthetic cell's capacity ``[B]``, Mbit/s, around the episodes' ``nominal`` capacity."""
    mult = cfg.regime_multiplier[regime]
    lognormal = np.exp(noise - 0.5 * cfg.noise_std**2)  # mean-one fluctuation
    return nominal * mult * lognormal * np.where(fade, cfg.fade_depth, 1.0)


def episode_nominal(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> float | np.ndarray:
    """Each episode's nominal capacity, Mbit/s: its drawn users times ``capacity_per_user_mbps`` (``[B]``), fixed
    for the episode; where the cell does not vary, ``cfg.nominal_capacity_mbps`` (a float)."""
    return s["users"] * cfg.capacity_per_user_mbps if cfg.varies else cfg.nominal_capacity_mbps


def trace_capacity(cfg: VREdgeConfig, trace: np.ndarray, pos: np.ndarray, nominal: float | np.ndarray
                   ) -> np.ndarray:
    """A trace window's capacity ``[B]``; a trace scaled to the nominal capacity (``trace_scale=0``) follows the
    episode's drawn users where the cell varies."""
    capacity = cfg.traces.capacity(trace, pos)
    return capacity * (nominal / cfg.nominal_capacity_mbps) if cfg.varies and not cfg.trace_scale else capacity


def _drawn_users(cfg: VREdgeConfig, u: np.ndarray) -> dict[str, np.ndarray]:
    """The users at reset, where the cell varies: their count ``users`` ``[B]``, uniform over ``cfg.users_range``
    from the reset's count draw, and ``active`` ``[B, U]``, the first that many slots; where ``churn`` is a range,
    the episode's ``churn`` ``[B]``, uniform over it from the draw after (a churn draw no reset uses); ``{}`` where
    the cell does not vary."""
    if not cfg.varies:
        return {}
    low, high = cfg.users_range
    users = np.minimum(low + (u[:, cfg.draws.users] * (high - low + 1)).astype(np.int64), high)
    drawn = {"users": users, "active": np.arange(cfg.num_users) < users[:, None]}
    if cfg.churn_varies:
        low_p, high_p = cfg.churn_range
        drawn["churn"] = low_p + u[:, cfg.draws.episode_churn] * (high_p - low_p)
    return drawn


def _drawn_network(cfg: VREdgeConfig, u: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The network conditions drawn at reset for the episode, each ``[B]``: where ``outage_prob`` is a range, the
    episode's ``outage_prob``, uniform over it from the outage chain's draw (which a reset leaves free: every
    episode starts out of an outage); where ``capacity_scale`` is a range, the episode's ``capacity_scale`` from
    the block's scale draw. ``{}`` where neither is a range. With a ``condition_grid``: both from the grid's bins
    by ``weights`` (:func:`_drawn_conditions`)."""
    if cfg.condition_grid:
        return _drawn_conditions(cfg, u, weights)
    drawn = {}
    if cfg.outage_varies:
        low_p, high_p = cfg.outage_range
        drawn["outage_prob"] = low_p + u[:, cfg.draws.outage] * (high_p - low_p)
    if cfg.scale_varies:
        # log-uniform, not uniform: a scale multiplies the capacity, so a range such as 0.25-4 should give as many
        # episodes between a quarter and the nominal cell as between it and four times it (a uniform draw would
        # put four fifths of them above 1 and hardly any starved cell)
        low_s, high_s = cfg.scale_range
        drawn["capacity_scale"] = low_s * np.exp(u[:, cfg.draws.scale] * math.log(high_s / low_s))
    return drawn


def uniform_condition_weights(cfg: VREdgeConfig, batch: int) -> np.ndarray:
    """``[batch, grid**2]``: every bin of the condition grid equally likely (the ranges' own distribution)."""
    bins = cfg.condition_grid ** 2
    return np.full((batch, bins), 1.0 / bins)


def kept_condition_weights(cfg: VREdgeConfig, s: dict[str, np.ndarray] | None, rows: Any = slice(None)
                           ) -> np.ndarray | None:
    """The condition weights ``rows`` of state ``s`` hold, for their next episodes (a reset keeps what a curriculum
    set); ``None`` where there is no grid or no state yet."""
    return s["condition_weights"][rows] if cfg.condition_grid and s is not None else None


def _drawn_conditions(cfg: VREdgeConfig, u: np.ndarray, weights: np.ndarray | None) -> dict[str, np.ndarray]:
    """An episode's ``capacity_scale`` and ``outage_prob`` from the condition grid: bin ``i * grid + j`` (the
    ``i``-th of ``grid`` log-uniform slices of the scale's range, the ``j``-th uniform slice of the outage
    probability's) chosen with probability ``weights[:, bin]`` (``[B, grid**2]``, each row summing to > 0; ``None``:
    uniform), then uniformly within it. The scale draw picks the bin by inversion and, from where it fell inside
    the bin's share, the scale within the bin; the outage chain's free draw the outage probability: two draws, as
    without a grid."""
    k, b = cfg.condition_grid, len(u)
    weights = uniform_condition_weights(cfg, b) if weights is None else weights
    cdf = np.cumsum(weights, axis=1)
    x = u[:, cfg.draws.scale] * cdf[:, -1]
    cell = np.minimum((cdf <= x[:, None]).sum(axis=1), k * k - 1)  # the first bin whose cdf passes x
    rows = np.arange(b)
    share = weights[rows, cell]
    inside = np.clip((x - (cdf[rows, cell] - share)) / np.where(share > 0, share, 1.0), 0.0, np.nextafter(1.0, 0))
    i, j = np.divmod(cell, k)
    low_s, high_s = cfg.scale_range
    low_p, high_p = cfg.outage_range
    return {"capacity_scale": low_s * np.exp((i + inside) / k * math.log(high_s / low_s)),
            "outage_prob": low_p + (j + u[:, cfg.draws.outage]) / k * (high_p - low_p),
            "condition_weights": weights.copy()}


def episode_scale(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> float | np.ndarray:
    """Each episode's capacity scale: its draw ``[B]`` where ``capacity_scale`` is a range, else the setting."""
    return s["capacity_scale"] if cfg.scale_varies else cfg.scale_range[0]


def episode_outage_prob(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> float | np.ndarray:
    """Each episode's outage start probability: its draw ``[B]`` where ``outage_prob`` is a range, else the
    setting (a float)."""
    return s["outage_prob"] if cfg.outage_varies else cfg.outage_range[0]


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
    if cfg.link_traces is None:
        return {}
    trace, pos = cfg.link_traces.start(u[:, cfg.draws.channel], u[:, cfg.draws.channel_pair])
    return {"user_trace": trace, "user_trace_pos": pos}


def channel_of(cfg: VREdgeConfig, s: dict[str, np.ndarray]) -> np.ndarray:
    """Each user's link quality ``[B, U]`` in the round the state ``s`` last played (what the user measured): its
    trace's window (``user_traces``), else the synthetic channel's."""
    if cfg.link_traces is not None:
        return cfg.link_traces.capacity(s["user_trace"], s["user_trace_pos"])
    return channel_quality(s["channel_logit"])


def initial_state(cfg: VREdgeConfig, keys: np.ndarray, counters: np.ndarray, condition_weights: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """Return fresh episode states for ``[B]`` envs, drawn from block ``counters``; with a ``condition_grid``, the
    episodes' conditions drawn by ``condition_weights`` ``[B, grid**2]`` (``None``: uniform), kept in the state
    (a curriculum sets them; each reset draws by the env's own)."""
    u = rng.uniform_block(keys, counters, cfg.block_size)
    b = len(keys)
    regime = np.minimum((u[:, Draw.REGIME] * 3).astype(np.int64), 2)
    noise = cfg.noise_std * rng.normals(u[:, Draw.NOISE], u[:, Draw.NOISE_PAIR])
    fade = np.zeros(b, dtype=bool)
    logit = cfg.channel_std * rng.normals(u[:, cfg.draws.channel], u[:, cfg.draws.channel_pair])
    drawn = {**_drawn_users(cfg, u), **_drawn_network(cfg, u, condition_weights)}
    nominal = episode_nominal(cfg, drawn)
    cap = synthetic_capacity(cfg, regime, noise, fade, nominal)
    trace_keys = _user_trace_start(cfg, u)
    if cfg.traces is not None:  # NEXT_REGIME and FADE are free at reset: the trace's file and start window
        trace, pos = cfg.traces.start(u[:, Draw.NEXT_REGIME], u[:, Draw.FADE])
        cap = trace_capacity(cfg, trace, pos, nominal)
        trace_keys.update(trace=trace, trace_pos=pos)
    if cfg.scaled:  # over whatever sets the capacity, the synthetic cell or a trace
        cap = cap * episode_scale(cfg, drawn)
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
        **({"outage": np.zeros(b, dtype=bool)} if cfg.outages else {}),  # every episode starts out of an outage
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
    return np.minimum(obs, OBS_HIGH, out=obs)  # every feature is >= 0 by construction


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
    cell, trace_keys, capacity, channel = cell_round(cfg, s, u)
    active = s["active"] if cfg.varies else None
    if active is not None:
        actions = np.where(active, actions, 0)  # an inactive slot's action is ignored
    r = download_round(cfg, s["buffer"], s["level"], capacity, channel, actions, active)
    switched = (actions != s["level"]).astype(np.float64)
    users = users_after_round(cfg, s, r, actions, switched, capacity, active)
    t = s["t"] + 1
    terminated = np.any(users["cum_stall"] > cfg.abandon_stall_s, axis=1)  # (an inactive slot never stalls)
    truncated = (t >= cfg.max_steps) & ~terminated
    new = {"key": s["key"], "counter": s["counter"] + np.uint64(1), "t": t, **cell, **users, **trace_keys,
           **{k: s[k] for k in EPISODE_DRAWS if k in s}}
    reward = user_mean(cfg, r["user_reward"], active)
    parts = _reward_parts(cfg, s, r, switched, capacity, active)
    if active is not None:
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
    draws = u[:, cfg.draws.churn]
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


def cell_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], u: np.ndarray
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The cell in the round the uniform draws ``u`` give: a persistent regime (Markov chain), correlated
    log-normal noise, deep fades and each user's channel. Returns ``(cell, trace_keys, capacity, channel)``: the
    cell's state keys, the trace's (empty without recorded traces), the capacity ``[B]`` (the trace's where there
    is one) and the channel qualities ``[B, U]`` (each user's trace's, with ``user_traces``)."""
    leave = u[:, Draw.REGIME] >= cfg.regime_stay_prob
    regime = np.where(leave, (s["regime"] + 1 + (u[:, Draw.NEXT_REGIME] * 2).astype(np.int64)) % 3, s["regime"])
    noise = cfg.noise_corr * s["noise"] + math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std * rng.normals(
        u[:, Draw.NOISE], u[:, Draw.NOISE_PAIR])
    fade = np.where(s["fade"], u[:, Draw.FADE] >= cfg.fade_end_prob, u[:, Draw.FADE] < cfg.fade_prob)
    nominal = episode_nominal(cfg, s)
    capacity = synthetic_capacity(cfg, regime, noise, fade, nominal)
    trace_keys = {}
    if cfg.traces is not None:  # a recorded trace replaces the synthetic capacity; the draws stay the same
        trace_keys = {"trace": s["trace"], "trace_pos": cfg.traces.next_position(s["trace"], s["trace_pos"])}
        capacity = trace_capacity(cfg, s["trace"], trace_keys["trace_pos"], nominal)
    # every slot's channel evolves, active or not (a user's trace plays its next window)
    logit = cfg.channel_corr * s["channel_logit"] + math.sqrt(1 - cfg.channel_corr**2) * cfg.channel_std * (
        rng.normals(u[:, cfg.draws.channel], u[:, cfg.draws.channel_pair]))
    cell = {"regime": regime, "noise": noise, "fade": fade, "channel_logit": logit}
    if cfg.scaled:  # the episode's scale, over whatever sets the capacity (the synthetic cell or a trace)
        capacity = capacity * episode_scale(cfg, s)
    if cfg.outages:  # the Gilbert-Elliott chain, over whatever sets the capacity (the synthetic cell or a trace)
        draw = u[:, cfg.draws.outage]
        cell["outage"] = np.where(s["outage"], draw >= cfg.outage_end_prob, draw < episode_outage_prob(cfg, s))
        capacity = capacity * np.where(cell["outage"], cfg.outage_depth, 1.0)
    if cfg.link_traces is not None:
        trace_keys.update(user_trace=s["user_trace"],
                          user_trace_pos=cfg.link_traces.next_position(s["user_trace"], s["user_trace_pos"]))
    return cell, trace_keys, capacity, channel_of(cfg, {**cell, **trace_keys})


def users_after_round(cfg: VREdgeConfig, s: dict[str, np.ndarray], r: dict[str, np.ndarray], actions: np.ndarray,
                      switched: np.ndarray, capacity: np.ndarray, active: np.ndarray | None) -> dict[str, np.ndarray]:
    """The users' state keys after the download round ``r``: buffers, levels, throughput estimates, stalls, the
    capacity history and the episode's running figures (means over the ``active`` users; ``None``: all). An
    inactive slot's leaves are meaningless until :func:`_churned` puts it back at a user's start."""
    stall = r["stall_s"]
    download = r["download_time"] if active is None else np.where(active, r["download_time"], 1.0)
    return {
        "buffer": r["buffer"],
        "level": actions.astype(np.int64),
        "throughput": THROUGHPUT_EWMA * s["throughput"] + (1 - THROUGHPUT_EWMA) * r["bitrate_mbps"]
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
    prev_bitrate = cfg.ladder[s["level"]]
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
    bitrate = cfg.ladder[actions]
    work = bitrate * cfg.segment_s / (capacity[..., None] * channel)
    if active is not None:
        work = np.where(active, work, 0.0)
    dl_time = processor_sharing_times(work)
    stall = np.maximum(dl_time - buffer, 0.0)
    new_buffer = np.maximum(buffer - dl_time, 0.0) + cfg.segment_s
    new_buffer = np.minimum(new_buffer, cfg.max_buffer_s)  # a full buffer waits before the next request
    quality = cfg.quality[actions]
    quality_change = np.abs(quality - cfg.quality[level])
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
