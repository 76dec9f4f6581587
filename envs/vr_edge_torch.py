"""VR-edge on torch tensors of any device: the dynamics of :mod:`envs.vr_edge_dynamics`, ported, and the batched env.

A separate port rather than one source for NumPy and torch: the NumPy dynamics write
observations into views and index with ``put_along_axis``, and the torch ones must avoid both
(in-place writes into views and data-dependent indexing break ``torch.compile(fullgraph=True)``
and force host synchronisation). ``tests/test_vr_edge_torch.py`` holds the two to the same
trajectories: identical random draws (SplitMix64 on ``int64`` with masked shifts gives the bits
of NumPy's ``uint64``), terminations and truncations; rewards and observations equal to within
1e-12 (torch's and NumPy's ``exp``/``log``/``cos`` may differ in the last bit).

State leaves are float64 (as in NumPy) and ``int64``; ``key`` and ``counter`` hold the bit
patterns of NumPy's ``uint64``. A step never synchronises with the host: autoreset selects
every leaf with ``torch.where``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from envs import rng
from envs.traces import TraceSet
from envs.vector import init_batched, reset_keys
from envs.vr_edge_config import (
    EPISODE_DRAWS,
    OBS_HIGH,
    QOE_LIN_REBUFFER_PENALTY,
    REGIMES,
    THROUGHPUT_EWMA,
    VREdgeConfig,
    torch_env_refusal,
)
from envs.vr_edge_draws import Draw
from envs.vr_edge_dynamics import checked_state


def _int64(c: int) -> int:
    """The int64 with the bit pattern of the uint64 ``c`` (int64 multiplication wraps like uint64's)."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GAMMA = _int64(int(rng._GAMMA))
_MIX1 = _int64(int(rng._MIX1))
_MIX2 = _int64(int(rng._MIX2))


def _shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits: the arithmetic shift, with the smeared sign bits masked off."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def uniform_block(keys: torch.Tensor, counters: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[B, block_size]`` float64 uniforms in (0, 1): exactly :func:`envs.rng.uniform_block`'s numbers.

    ``keys`` and ``counters`` are ``int64 [B]`` holding the uint64 bit patterns.
    """
    index = counters[:, None] * block_size + torch.arange(1, block_size + 1, dtype=torch.int64, device=keys.device)
    z = keys[:, None] + index * _GAMMA
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return (_shift_right(z, 11).to(torch.float64) + 0.5) / rng._TWO_POW_53


def _normals(u1: torch.Tensor, u2: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def check_config(cfg: VREdgeConfig) -> None:
    """Raise ``ValueError`` for settings the torch env cannot run, naming the alternative."""
    if why := torch_env_refusal(step_cost_us=cfg.step_cost_us, condition_grid=cfg.condition_grid):
        raise ValueError(why)


class TraceTensors:
    """A :class:`envs.traces.TraceSet` as tensors on ``device``: the same starts, steps and rates (gathers, no host
    synchronisation), on ``[B]`` or ``[B, U]`` indices."""

    def __init__(self, traces: TraceSet, device: torch.device) -> None:
        self.count = len(traces.files)
        # copies: the set's arrays are read-only, shared by every config that names its files (envs.traces)
        self.rates = torch.tensor(traces.rates, dtype=torch.float64, device=device)
        self.offsets = torch.tensor(traces.offsets, dtype=torch.int64, device=device)
        self.lengths = torch.tensor(traces.lengths, dtype=torch.int64, device=device)

    def start(self, u_file: torch.Tensor, u_offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """File index and start window from two tensors of uniforms (as :meth:`envs.traces.TraceSet.start`)."""
        trace = torch.clamp((u_file * self.count).to(torch.int64), max=self.count - 1)
        length = self.lengths[trace]
        return trace, torch.minimum((u_offset * length).to(torch.int64), length - 1)

    def next_position(self, trace: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return (pos + 1) % self.lengths[trace]

    def capacity(self, trace: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.rates[self.offsets[trace] + pos]


class TorchDynamics:
    """The VR-edge dynamics of one config as pure functions of torch state dicts on ``device``.

    Example:
        >>> import torch
        >>> from envs.vr_edge import VREdgeConfig
        >>> dyn = TorchDynamics(VREdgeConfig(num_users=2), "cpu")
        >>> s = dyn.initial_state(torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64))
        >>> out = dyn.step(s, torch.zeros(2, 2, dtype=torch.int64))
        >>> s, obs, reward, terminated, truncated, final_obs, metrics = out
        >>> obs.shape, reward.shape, final_obs.shape, sorted(metrics)
        (torch.Size([2, 19]), torch.Size([2]), torch.Size([2, 19]), ['abandoned', 'quality', 'stall_s', 'switches'])

    Shapes: state leaves ``[B, ...]`` (``B`` envs), actions ``int64 [B, num_users]``,
    observations float32 ``[B, obs_dim]``, rewards float64 ``[B]``.
    """

    def __init__(self, cfg: VREdgeConfig, device: str | torch.device) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.device = torch.device(device)
        self.ladder = torch.as_tensor(cfg.ladder, dtype=torch.float64, device=self.device)
        self.quality = torch.as_tensor(cfg.quality, dtype=torch.float64, device=self.device)
        self.draws = cfg.draws  # where each uniform of a block goes: read here, not inside a compiled step
        self.regime_mult = torch.as_tensor(cfg.regime_multiplier, dtype=torch.float64, device=self.device)
        self.fade_factor = torch.tensor([1.0, cfg.fade_depth], dtype=torch.float64, device=self.device)
        self.outage_factor = torch.tensor([1.0, cfg.outage_depth], dtype=torch.float64, device=self.device)
        self.regimes = torch.arange(len(REGIMES), device=self.device)
        self.user_ranks = torch.arange(cfg.num_users - 1, -1, -1, dtype=torch.int64, device=self.device)
        self.slots = torch.arange(cfg.num_users, device=self.device)
        self.cell_traces = TraceTensors(cfg.traces, self.device) if cfg.traces is not None else None
        self.user_traces = TraceTensors(cfg.link_traces, self.device) if cfg.link_traces is not None else None

    def _capacity(self, regime: torch.Tensor, noise: torch.Tensor, fade: torch.Tensor,
                  nominal: float | torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        lognormal = torch.exp(noise - 0.5 * cfg.noise_std**2)
        return nominal * self.regime_mult[regime] * lognormal * self.fade_factor[fade.to(torch.int64)]

    def _nominal(self, s: dict[str, torch.Tensor]) -> float | torch.Tensor:
        """Each episode's nominal capacity (as :func:`envs.vr_edge_dynamics.episode_nominal`)."""
        return (s["users"].to(torch.float64) * self.cfg.capacity_per_user_mbps if self.cfg.varies
                else self.cfg.nominal_capacity_mbps)

    def _trace_capacity(self, trace: torch.Tensor, pos: torch.Tensor, nominal: float | torch.Tensor) -> torch.Tensor:
        """A cell trace window's capacity (as :func:`envs.vr_edge_dynamics.trace_capacity`)."""
        capacity = self.cell_traces.capacity(trace, pos)
        cfg = self.cfg
        return capacity * (nominal / cfg.nominal_capacity_mbps) if cfg.varies and not cfg.trace_scale else capacity

    def _trace_start(self, u: torch.Tensor, nominal: float | torch.Tensor) -> tuple[dict[str, torch.Tensor],
                                                                                   torch.Tensor | None]:
        """The traces' leaves of fresh episodes (as :func:`envs.vr_edge_dynamics.initial_state`'s) and the cell trace's
        first capacity (``None`` without a cell trace)."""
        leaves, capacity = self._user_trace_start(u), None
        if self.cell_traces is not None:  # NEXT_REGIME and FADE are free at reset: the trace's file and start window
            trace, pos = self.cell_traces.start(u[:, Draw.NEXT_REGIME], u[:, Draw.FADE])
            leaves.update(trace=trace, trace_pos=pos)
            capacity = self._trace_capacity(trace, pos, nominal)
        return leaves, capacity

    def _user_trace_start(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each user's trace and start window (as :func:`envs.vr_edge_dynamics._user_trace_start`); ``{}`` without."""
        if self.user_traces is None:
            return {}
        trace, pos = self.user_traces.start(u[:, self.draws.channel], u[:, self.draws.channel_pair])
        return {"user_trace": trace, "user_trace_pos": pos}

    def _channel(self, s: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each user's link quality in the round ``s`` last played (as :func:`envs.vr_edge_dynamics.channel_of`)."""
        if self.user_traces is not None:
            return self.user_traces.capacity(s["user_trace"], s["user_trace_pos"])
        return 0.25 + 0.75 / (1.0 + torch.exp(-s["channel_logit"]))

    def _drawn_users(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """The users at reset where the cell varies, ``users`` and ``active`` (as
        :func:`envs.vr_edge_dynamics._drawn_users`); ``{}`` otherwise."""
        if not self.cfg.varies:
            return {}
        low, high = self.cfg.users_range
        users = torch.clamp(low + (u[:, self.draws.users] * (high - low + 1)).to(torch.int64), max=high)
        drawn = {"users": users, "active": self.slots < users[:, None]}
        if self.cfg.churn_varies:
            low_p, high_p = self.cfg.churn_range
            drawn["churn"] = low_p + u[:, self.draws.episode_churn] * (high_p - low_p)
        return drawn

    def _drawn_network(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """The episode's ``outage_prob`` and ``capacity_scale`` where each is a range (as
        :func:`envs.vr_edge_dynamics._drawn_network`: uniform and log-uniform); ``{}`` where neither is."""
        cfg, drawn = self.cfg, {}
        if cfg.outage_varies:
            low_p, high_p = cfg.outage_range
            drawn["outage_prob"] = low_p + u[:, self.draws.outage] * (high_p - low_p)
        if cfg.scale_varies:
            low_s, high_s = cfg.scale_range
            drawn["capacity_scale"] = low_s * torch.exp(u[:, self.draws.scale] * math.log(high_s / low_s))
        return drawn

    def _scale(self, s: dict[str, torch.Tensor]) -> float | torch.Tensor:
        """Each episode's capacity scale (as :func:`envs.vr_edge_dynamics.episode_scale`)."""
        return s["capacity_scale"] if self.cfg.scale_varies else self.cfg.scale_range[0]

    def _drawn(self, keys: torch.Tensor, counters: torch.Tensor) -> dict[str, torch.Tensor]:
        """The leaves of fresh episode states that come from block ``counters``'s random draws."""
        cfg = self.cfg
        u = uniform_block(keys, counters, cfg.block_size)
        regime = torch.clamp((u[:, Draw.REGIME] * 3).to(torch.int64), max=2)
        noise = cfg.noise_std * _normals(u[:, Draw.NOISE], u[:, Draw.NOISE_PAIR])
        users, network = self._drawn_users(u), self._drawn_network(u)
        cap = self._capacity(regime, noise, torch.zeros_like(regime, dtype=torch.bool), self._nominal(users))
        traces, trace_cap = self._trace_start(u, self._nominal(users))
        cap = cap if trace_cap is None else trace_cap
        if cfg.scaled:  # over whatever sets the capacity (as envs.vr_edge_dynamics.initial_state)
            cap = cap * self._scale(network)
        return {"counter": counters + 1, "regime": regime, "noise": noise,
                "channel_logit": cfg.channel_std * _normals(u[:, self.draws.channel], u[:, self.draws.channel_pair]),
                "cap_history": cap[:, None].repeat(1, cfg.history), **users, **traces, **network}

    def _constant_leaves(self) -> dict[str, tuple[bool | int | float, torch.dtype, bool]]:
        """The leaves every fresh episode starts with the same value: ``(value, dtype, one per user)``."""
        cfg, f64 = self.cfg, torch.float64
        return {"t": (0, torch.int64, False), "fade": (False, torch.bool, False),
                "buffer": (cfg.initial_buffer_s, f64, True), "level": (0, torch.int64, True),
                "throughput": (cfg.bitrates_mbps[0], f64, True), "download_time": (0.0, f64, True),
                "stall": (0.0, f64, True), "cum_stall": (0.0, f64, True), "ep_quality": (0.0, f64, False),
                "ep_stall": (0.0, f64, False), "ep_switches": (0.0, f64, False),
                **({"outage": (False, torch.bool, False)} if cfg.outages else {})}

    def initial_state(self, keys: torch.Tensor, counters: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh states for ``[B]`` envs, drawn from block ``counters`` (as
        :func:`envs.vr_edge_dynamics.initial_state`)."""
        b, n_users = keys.shape[0], self.cfg.num_users
        constants = {k: torch.full((b, n_users) if per_user else (b,), value, dtype=dtype, device=keys.device)
                     for k, (value, dtype, per_user) in self._constant_leaves().items()}
        return {"key": keys, **constants, **self._drawn(keys, counters)}

    def observe(self, s: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[B, obs_dim]`` float32 observations (as :func:`envs.vr_edge_dynamics.observe`)."""
        cfg = self.cfg
        b = s["t"].shape[0]
        users = torch.stack([
            s["buffer"] / cfg.max_buffer_s,
            s["level"].to(torch.float64) / max(cfg.num_levels - 1, 1),
            s["throughput"] / cfg.bitrates_mbps[-1],
            s["download_time"] / cfg.segment_s,
            s["stall"] / cfg.segment_s,
            s["cum_stall"] / cfg.abandon_stall_s,
            self._channel(s),
        ], dim=-1)
        progress = s["t"].to(torch.float64) / cfg.max_steps
        nominal = self._nominal(s)
        history = s["cap_history"] / (nominal[:, None] if cfg.varies else nominal)
        parts = [history, progress[:, None]]
        if cfg.reveal_hidden_state:
            parts += [(self.regimes == s["regime"][:, None]).to(torch.float64), s["fade"].to(torch.float64)[:, None]]
        if cfg.masked:
            users, mask_cell = self._observe_mask(s, users)
            parts.append(mask_cell)
        # rounded to float32 before the clip, as NumPy's assignment into a float32 array does
        return torch.clamp(torch.cat([users.reshape(b, -1), *parts], dim=1).to(torch.float32), max=OBS_HIGH)

    def _observe_mask(self, s: dict[str, torch.Tensor], users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The users' features ``[B, U, F]`` with the active flag last (an inactive slot's all 0) and the cell's
        two mask features ``[B, 2]`` (as :func:`envs.vr_edge_dynamics._observe_mask`)."""
        cfg = self.cfg
        active = s["active"] if cfg.varies else torch.ones(users.shape[:2], dtype=torch.bool, device=users.device)
        flag = active.to(torch.float64)
        users = torch.cat([users, torch.ones_like(users[..., :1])], dim=-1) * flag[..., None]
        count = flag.sum(dim=1)
        drawn = s["users"].to(torch.float64) if cfg.varies else float(cfg.num_users)
        return users, torch.stack([1.0 / count, count / drawn], dim=1)

    def _processor_sharing_times(self, work: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(work, dim=-1, stable=True)
        w = torch.gather(work, -1, order)
        finish_sorted = torch.cumsum(w, dim=-1) + self.user_ranks * w
        return torch.empty_like(work).scatter(-1, order, finish_sorted)

    def _step_state(self, s: dict[str, torch.Tensor], actions: torch.Tensor):
        """Advance every env by one segment round: ``(state, reward, terminated, truncated, parts)``, as
        :func:`envs.vr_edge_dynamics.step_state` does."""
        cfg = self.cfg
        u = uniform_block(s["key"], s["counter"], cfg.block_size)
        cell, capacity, channel = self._cell_round(s, u)
        active = s["active"] if cfg.varies else None
        if active is not None:
            actions = torch.where(active, actions, 0)  # an inactive slot's action is ignored
        r = self._download_round(s, capacity, channel, actions, active)
        switched = (actions != s["level"]).to(torch.float64)
        users = self._users_after_round(s, r, actions, switched, capacity, active)
        t = s["t"] + 1
        terminated = torch.any(users["cum_stall"] > cfg.abandon_stall_s, dim=1)
        truncated = (t >= cfg.max_steps) & ~terminated
        new = {"key": s["key"], "counter": s["counter"] + 1, "t": t, **cell, **users,
               **{k: s[k] for k in EPISODE_DRAWS if k in s}}
        reward = self._user_mean(r["user_reward"], active)
        parts = self._reward_parts(s, r, switched, capacity)
        if active is not None:
            new.update(self._churned(new, active, u, terminated | truncated))
        return new, reward, terminated, truncated, parts

    def _user_mean(self, x: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        """The mean ``[B]`` of ``x`` ``[B, U]`` over the ``active`` users (as
        :func:`envs.vr_edge_dynamics.user_mean`)."""
        if active is None:
            return x.sum(dim=1) * (1.0 / self.cfg.num_users)
        return (x * active).sum(dim=1) / active.sum(dim=1)

    def _churned(self, s: dict[str, torch.Tensor], active: torch.Tensor, u: torch.Tensor, done: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
        """The users after the round's leaves and joins (as :func:`envs.vr_edge_dynamics._churned`)."""
        cfg = self.cfg
        draws = u[:, self.draws.churn]
        users, churn = s["users"], s["churn"] if cfg.churn_varies else cfg.churn_range[0]
        join = torch.where(users >= cfg.num_users, 1.0,
                           torch.clamp(users * churn / torch.clamp(cfg.num_users - users, min=1), max=1.0))
        leave = active & (draws < (churn[:, None] if cfg.churn_varies else churn))
        after = (active & ~leave) | (~active & (draws < join[:, None]))
        keeper = torch.argmax(torch.where(leave, draws, -1.0), dim=1)  # the leaver with the highest draw
        after = after | (~after.any(dim=1)[:, None] & (self.slots == keeper[:, None]))
        after = torch.where(done[:, None], active, after)
        start = {**{k: value for k, (value, _, per_user) in self._constant_leaves().items() if per_user},
                 **self._user_trace_start(u)}  # a joiner draws a trace of its own
        stayed = active & after  # a joiner was inactive in the round: it starts afresh
        return {"active": after, **{k: torch.where(stayed, s[k], v) for k, v in start.items()}}

    def _cell_round(self, s: dict[str, torch.Tensor], u: torch.Tensor):
        """The cell in the round the uniform draws ``u`` give: ``(cell, capacity, channel)``, the cell's state
        leaves, its capacity ``[B]`` and the users' channel qualities ``[B, U]``."""
        cfg = self.cfg
        leave = u[:, Draw.REGIME] >= cfg.regime_stay_prob
        regime = torch.where(leave, (s["regime"] + 1 + (u[:, Draw.NEXT_REGIME] * 2).to(torch.int64)) % 3, s["regime"])
        noise = cfg.noise_corr * s["noise"] + math.sqrt(1 - cfg.noise_corr**2) * cfg.noise_std * _normals(
            u[:, Draw.NOISE], u[:, Draw.NOISE_PAIR])
        fade = torch.where(s["fade"], u[:, Draw.FADE] >= cfg.fade_end_prob, u[:, Draw.FADE] < cfg.fade_prob)
        logit = cfg.channel_corr * s["channel_logit"] + math.sqrt(1 - cfg.channel_corr**2) * cfg.channel_std * (
            _normals(u[:, self.draws.channel], u[:, self.draws.channel_pair]))
        cell = {"regime": regime, "noise": noise, "fade": fade, "channel_logit": logit}
        capacity = self._capacity(regime, noise, fade, self._nominal(s))
        if self.cell_traces is not None:  # a recorded trace replaces the synthetic capacity; the draws stay the same
            cell.update(trace=s["trace"], trace_pos=self.cell_traces.next_position(s["trace"], s["trace_pos"]))
            capacity = self._trace_capacity(cell["trace"], cell["trace_pos"], self._nominal(s))
        if self.user_traces is not None:
            cell.update(user_trace=s["user_trace"],
                        user_trace_pos=self.user_traces.next_position(s["user_trace"], s["user_trace_pos"]))
        if cfg.scaled:  # the episode's scale, then the Gilbert-Elliott chain (as envs.vr_edge_dynamics.cell_round)
            capacity = capacity * self._scale(s)
        if cfg.outages:
            draw = u[:, self.draws.outage]
            start = s["outage_prob"] if cfg.outage_varies else cfg.outage_range[0]
            cell["outage"] = torch.where(s["outage"], draw >= cfg.outage_end_prob, draw < start)
            capacity = capacity * self.outage_factor[cell["outage"].to(torch.int64)]
        return cell, capacity, self._channel(cell)

    def _download_round(self, s: dict[str, torch.Tensor], capacity: torch.Tensor, channel: torch.Tensor,
                        actions: torch.Tensor, active: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """One segment round for every user (:func:`envs.vr_edge_dynamics.download_round`'s leaves, ``[B, U]``); a slot
        not ``active`` has no work."""
        cfg, buffer = self.cfg, s["buffer"]
        bitrate = self.ladder[actions]
        work = bitrate * cfg.segment_s / (capacity[:, None] * channel)
        if active is not None:
            work = torch.where(active, work, 0.0)
        dl_time = self._processor_sharing_times(work)
        stall = torch.clamp(dl_time - buffer, min=0.0)
        quality = self.quality[actions]
        return {"bitrate_mbps": bitrate, "download_time": dl_time, "stall_s": stall,
                "buffer": torch.clamp(torch.clamp(buffer - dl_time, min=0.0) + cfg.segment_s, max=cfg.max_buffer_s),
                "quality": quality,
                "user_reward": (cfg.quality_weight * quality - cfg.stall_weight * stall
                                - cfg.switch_weight * torch.abs(quality - self.quality[s["level"]]))}

    def _users_after_round(self, s: dict[str, torch.Tensor], r: dict[str, torch.Tensor], actions: torch.Tensor,
                           switched: torch.Tensor, capacity: torch.Tensor, active: torch.Tensor | None
                           ) -> dict[str, torch.Tensor]:
        """The users' state leaves after the download round ``r``, the episode's running figures with them (means
        over the ``active`` users)."""
        stall = r["stall_s"]
        download = r["download_time"] if active is None else torch.where(active, r["download_time"], 1.0)
        return {
            "buffer": r["buffer"],
            "level": actions,
            "throughput": THROUGHPUT_EWMA * s["throughput"] + (1 - THROUGHPUT_EWMA) * r["bitrate_mbps"]
            / download,
            "download_time": r["download_time"],
            "stall": stall,
            "cum_stall": s["cum_stall"] + stall,
            "cap_history": torch.cat([s["cap_history"][:, 1:], capacity[:, None]], dim=1),
            "ep_quality": s["ep_quality"] + self._user_mean(r["quality"], active),
            "ep_stall": s["ep_stall"] + self._user_mean(stall, active),
            "ep_switches": s["ep_switches"] + self._user_mean(switched, active),
        }

    def _reward_parts(self, s: dict[str, torch.Tensor], r: dict[str, torch.Tensor], switched: torch.Tensor,
                      capacity: torch.Tensor) -> dict[str, torch.Tensor]:
        """The round's reward components per user, its capacity, and the linear QoE."""
        bitrate, stall = r["bitrate_mbps"], r["stall_s"]
        return {"quality": r["quality"], "stall_s": stall, "switches": switched, "capacity_mbps": capacity,
                "bitrate_mbps": bitrate,
                "qoe_lin": bitrate - QOE_LIN_REBUFFER_PENALTY * stall - torch.abs(bitrate - self.ladder[s["level"]])}

    def _episode_metrics(self, s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        steps = torch.clamp(s["t"], min=1)
        return {"quality": s["ep_quality"] / steps, "stall_s": s["ep_stall"] / steps,
                "switches": s["ep_switches"] / steps,
                "abandoned": torch.any(s["cum_stall"] > self.cfg.abandon_stall_s, dim=1).to(torch.float64)}

    def step(self, s: dict[str, torch.Tensor], actions: torch.Tensor):
        """One step of every env with same-step autoreset and no host synchronisation.

        Returns ``(state, observations, rewards, terminated, truncated, final_observations,
        episode_metrics)``: ``observations`` are the next episode's first where one ended;
        ``final_observations`` (zero elsewhere) and ``episode_metrics`` (``[B]`` each) describe
        the episode that ended.
        """
        new, reward, terminated, truncated, _ = self._step_state(s, actions)
        obs = self.observe(new)
        done = terminated | truncated
        metrics = self._episode_metrics(new)
        # every env draws a fresh episode and every leaf is selected: a branch on `done` would synchronise
        fresh = {**{k: value for k, (value, _, _) in self._constant_leaves().items()},
                 **self._drawn(new["key"], new["counter"])}
        state = {"key": new["key"], **{k: torch.where(done.view(-1, *([1] * (v.dim() - 1))), fresh[k], v)
                                       for k, v in new.items() if k != "key"}}
        # observations are row by row: the reset rows of observe(state) are the fresh episodes' first
        return (state, self.observe(state), reward, terminated, truncated, torch.where(done[:, None], obs, 0.0),
                metrics)


class VREdgeTorchEnv(gym.vector.VectorEnv):
    """``num_envs`` VR-edge envs as torch tensors on ``device``: :class:`envs.VREdgeVectorEnv`'s semantics.

    ``reset`` and ``step`` take and return torch tensors on the env's device; a step never
    synchronises with the host (rollouts stay on a GPU). ``compile=True`` (or a ``torch.compile``
    mode, e.g. ``"reduce-overhead"`` for CUDA graphs) runs the step through
    ``torch.compile(fullgraph=True, dynamic=False)``.

    Example:
        >>> import torch, envs
        >>> venv = envs.VREdgeTorchEnv(3, num_users=2)
        >>> obs, info = venv.reset(seed=[1, 2, 3])
        >>> obs.shape, obs.dtype
        (torch.Size([3, 19]), torch.float32)
        >>> obs, rew, term, trunc, info = venv.step(torch.zeros(3, 2, dtype=torch.int64))
        >>> rew.shape, info["final_obs"].shape, info["_final_obs"].dtype
        (torch.Size([3]), torch.Size([3, 19]), torch.bool)

    Shapes: observations float32 ``[N, obs_dim]``, actions int64 ``[N, num_users]``, rewards
    float64 ``[N]``, ``terminated`` / ``truncated`` bool ``[N]``; ``info["final_obs"]`` ``[N, obs_dim]``
    (zero where no episode ended, mask ``info["_final_obs"]``) and
    ``info["final_info"]["episode_metrics"]`` (``[N]`` tensors). ``get_state`` gives CPU tensors;
    ``set_state`` also takes :meth:`envs.VREdgeVectorEnv.get_state`'s arrays. Keyword arguments
    are :class:`envs.VREdgeConfig`'s, less ``step_cost_us``; recorded traces (``capacity_trace``, ``user_traces``)
    are replayed from tensors on the env's device.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, num_envs: int, num_users: int = 8, seed: int | None = None, device: str | torch.device = "cpu",
                 compile: bool | str = False, **config: Any) -> None:
        init_batched(self, num_envs, VREdgeConfig(num_users=num_users, **config), seed)
        check_config(self.config)
        self._compile = compile
        self._state: dict[str, torch.Tensor] | None = None
        self.to(device)

    def to(self, device: str | torch.device) -> VREdgeTorchEnv:
        """Move the env (constants and state) to ``device``; returns ``self``."""
        self.device = torch.device(device)
        self.dynamics = TorchDynamics(self.config, self.device)
        mode = None if self._compile is True else self._compile
        self._step = (torch.compile(self.dynamics.step, fullgraph=True, dynamic=False, mode=mode) if self._compile
                      else self.dynamics.step)
        if self._state is not None:
            self._state = {k: v.to(self.device) for k, v in self._state.items()}
        return self

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None):
        bits = reset_keys(self, seed)
        if bits is None:
            keys, counters = self._state["key"], self._state["counter"]
        else:
            keys = torch.from_numpy(bits.view(np.int64)).to(self.device)
            counters = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._state = self.dynamics.initial_state(keys, counters)
        return self.dynamics.observe(self._state), {}

    def step(self, actions: torch.Tensor):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        want = (self.num_envs, self.config.num_users)
        if not isinstance(actions, torch.Tensor) or tuple(actions.shape) != want or actions.dtype != torch.int64:
            got = (f"{tuple(actions.shape)} {actions.dtype}" if isinstance(actions, torch.Tensor)
                   else type(actions).__name__)
            raise ValueError(f"VREdgeTorchEnv.step takes an int64 tensor of shape {want} (one bitrate level per "
                             f"user), got {got}")
        # levels are not range-checked here: that would synchronise with the device every step
        out = self._step(self._state, actions.to(self.device))
        if self._compile == "reduce-overhead":  # CUDA graphs: copied out of the graphs' pool, which the next graphed
            # call may free and overwrite while the state is still read (pytorch#152887, #160281)
            out = tuple({k: v.clone() for k, v in x.items()} if isinstance(x, dict) else x.clone() for x in out)
        self._state, obs, reward, terminated, truncated, final_obs, metrics = out
        done = terminated | truncated
        infos = {"final_obs": final_obs, "_final_obs": done,
                 "final_info": {"episode_metrics": metrics, "_episode_metrics": done}, "_final_info": done}
        return obs, reward, terminated, truncated, infos

    def get_state(self) -> dict[str, torch.Tensor]:
        """The state of all envs as CPU tensors (``key``/``counter``: int64 holding uint64 bits)."""
        if self._state is None:
            raise RuntimeError("call reset() before get_state()")
        return {k: v.detach().to("cpu", copy=True) for k, v in self._state.items()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s tensors, or :meth:`envs.VREdgeVectorEnv.get_state`'s arrays, on any device."""
        arrays = {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in state.items()} \
            if isinstance(state, dict) else state
        checked = checked_state(self.config, arrays, self.num_envs)
        self._state = {k: torch.from_numpy(v.view(np.int64) if v.dtype == np.uint64 else v).to(self.device)
                       for k, v in checked.items()}
