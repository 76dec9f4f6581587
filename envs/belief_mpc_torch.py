""":class:`envs.belief_mpc.BeliefMPC` on torch tensors: the same levels, batched over envs x scenarios x candidate
levels on any device.

The filter and the futures stay NumPy's (:class:`envs.belief.RegimeFilter`: a few percent of the work, and the same
draws); the rollout, which is the rest, runs on tensors ``[B, S, K, U]`` (envs, scenarios, candidate levels, users)
in float64, on a CPU as on a GPU: float32 would change which level scores highest wherever two are closer than its
rounding, and the point of the port is to label what the NumPy expert labels. What makes it faster than NumPy's:

* what the base policy (``fair_share``) reads of the cell does not depend on the candidate: its level from the
  capacity and the channel is computed once per (env, scenario, round) and shared by every candidate and every
  user's pass; only its low-buffer step is per row;
* the scenario's tensors broadcast over the candidates instead of being repeated;
* a user's pass plays only the envs where its slot is active (elsewhere every candidate ties: the plan stays);
* a user's pass does not play the plan as it stands again: the last pass played it (the same row, the same bits).

On a CPU the search runs fused instead (:mod:`envs.belief_mpc_kernel`: every pass over the users in one compiled call
per env, the same operations in the same order), which memory and small operations bound less than the tensors.

The same levels, bit for bit on the states tested (``tests/test_belief_mpc_torch.py``): every floating-point
operation of NumPy's rollout is done in its order, its sums included (:func:`numpy_order_sum`: NumPy adds the last
axis of a row pairwise with 8 accumulators, the scenario axis one after the other); the observation the base policy
reads is rounded to float32 as the env's.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import numpy as np
import torch

from envs.baselines import fair_share_policy, only_active
from envs.belief import Futures, RegimeFilter, cell_seen
from envs.belief_mpc import _TIE, BeliefMPCSettings, state_from_observation
from envs.settings import ConfigError
from envs.vr_edge_config import OBS_HIGH, VREdgeConfig
from envs.vr_edge_dynamics import channel_quality

FUSED_MOST_USERS = 128  # the kernel adds a row's users in NumPy's order up to this many (beyond, NumPy halves)


def fused_rollout() -> ModuleType | None:
    """The fused kernels (:mod:`envs.belief_mpc_kernel`), or ``None`` where Numba is not installed: a GPU node that
    carries only the pure-Python dependencies (``docs/device.md``) labels on tensors, which are what a GPU runs
    anyway."""
    try:
        from envs import belief_mpc_kernel
    except ImportError:
        return None
    return belief_mpc_kernel


_FAIR_SHARE = {name: p.default for name, p in inspect.signature(fair_share_policy).parameters.items()
               if p.default is not inspect.Parameter.empty}  # the base's settings: fair_share's own defaults


class TorchBeliefMPC:
    """:class:`envs.belief_mpc.BeliefMPC` with its rollout on torch tensors of ``device``: the same settings, the same
    levels (module docstring); observations in and levels out as NumPy arrays, like any expert.

    Example:
        >>> import envs
        >>> from envs.belief_mpc_torch import TorchBeliefMPC
        >>> venv = envs.VREdgeVectorEnv(2, num_users=3, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> mpc = TorchBeliefMPC(venv.config, device="cpu", horizon=2, scenarios=4)
        >>> mpc(obs).shape   # one row per env, one level per user
        (2, 3)

    Shapes: ``mpc(obs [B, obs_dim]) -> [B, U]`` int64 levels; stateful as BeliefMPC (pass every env's observation at
    every step, in order). The base policy is ``fair_share`` (its defaults), the one base ported: another is refused
    in one line. ``device``: where the rollout runs (a ``torch.device`` or its name). ``fused``: the search as one
    compiled call (:mod:`envs.belief_mpc_kernel`, a CPU's; the same returns to the last bit, several times faster
    there) or on tensors (what a GPU runs); ``None`` (default): fused on a CPU.
    """

    def __init__(self, config: VREdgeConfig, base: str = "fair_share", device: str | torch.device = "cpu",
                 fused: bool | None = None, **settings: Any) -> None:
        if base != "fair_share":
            raise ConfigError("base", base, "is not ported to torch: TorchBeliefMPC plays fair_share as its base "
                              "(envs.belief_mpc.BeliefMPC plays any)", flag=False)
        self.settings = BeliefMPCSettings(**settings)
        self.config = config
        self.device = torch.device(device)
        on_cpu = self.device.type == "cpu" and config.num_users <= FUSED_MOST_USERS
        if fused and not on_cpu:
            raise ConfigError("fused", fused, f"needs a CPU and at most {FUSED_MOST_USERS} users (the kernel is a "
                              "CPU's): leave it None", flag=False)
        self._fused = fused_rollout() if (on_cpu if fused is None else fused) else None
        if fused and self._fused is None:
            raise ConfigError("fused", fused, "needs Numba, which is not installed here: pip install numba, or leave "
                              "it None", flag=False)
        self.filter = RegimeFilter(config, seed=self.settings.seed)
        self.base = fair_share_policy(config)
        f64 = {"dtype": torch.float64, "device": self.device}
        self._ladder = torch.as_tensor(config.ladder, **f64)
        self._segment_bits = torch.as_tensor(config.ladder * config.segment_s, **f64)  # bitrate x segment, per level
        self._quality = torch.as_tensor(config.quality, **f64)
        self._weighted_quality = torch.as_tensor(config.quality_weight * config.quality, **f64)
        self._ranks = torch.arange(config.num_users - 1, -1, -1, **f64)  # users after each sorted one
        self._low_buffer = low_buffer_bound(config)

    @property
    def fused(self) -> bool:
        """Whether the rollout runs fused (:mod:`envs.belief_mpc_kernel`) rather than on tensors."""
        return self._fused is not None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Levels ``[B, U]`` for the next round of the ``B`` envs that show ``obs``."""
        self.filter.update(obs)
        futures = self.filter.futures(obs, self.settings.scenarios, self.settings.horizon,
                                      threads=torch.get_num_threads())  # (the same draws, side by side)
        return self.planned(obs, futures)

    def observe(self, obs: np.ndarray) -> None:
        """Take in the envs' observations ``obs`` of a step it is not asked to label (its filter follows every
        step)."""
        self.filter.update(obs)

    def state(self) -> dict[str, Any]:
        """What it has seen and drawn (its filter's :meth:`envs.belief.RegimeFilter.state`): a checkpoint's share of
        an expert that labels while a run trains."""
        return self.filter.state()

    def load_state(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`'s ``state`` (an expert of the same config, settings and seed)."""
        self.filter.load_state(state)

    def planned(self, obs: np.ndarray, futures: Futures) -> np.ndarray:
        """Levels ``[B, U]``: the base policy's, improved by rollout on the scenarios ``futures`` (as
        :meth:`envs.belief_mpc.BeliefMPC.planned`)."""
        start = self._start(obs)
        cell = self._cell(obs, futures, start)
        plan = torch.as_tensor(np.array(self.base(obs), dtype=np.int64), device=self.device)
        if self._fused is not None:  # every sweep in one compiled loop
            plan = self._fused.fused_planned(self, start, cell, plan)
        for _ in range(0 if self._fused is not None else self.settings.sweeps):
            plan = self._improved(start, cell, plan)
        return only_active(self.config, obs, plan.cpu().numpy())

    # -------------------------------------------------------------------------------------------- what it starts from

    def _start(self, obs: np.ndarray) -> dict[str, torch.Tensor]:
        """The state each env shows (:func:`envs.belief_mpc.state_from_observation`), as tensors ``[B, U]`` or
        ``[B]``: what a round and the base policy read of it."""
        cfg, s = self.config, state_from_observation(self.config, obs)
        keys = ("buffer", "level", "cum_stall", "t") + (("active",) if cfg.varies else ())
        start = {k: torch.as_tensor(s[k], device=self.device) for k in keys}
        start["remaining"] = cfg.max_steps - start.pop("t")
        start["cap_history"] = torch.as_tensor(s["cap_history"][:, -2:], device=self.device)  # what fair_share reads
        # (its last two capacities; one where the history holds one)
        return start

    def _cell(self, obs: np.ndarray, futures: Futures, start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The scenarios' tensors every candidate shares, ``[H, B, S, 1, U]`` (``[B, S, H, U]`` for the fused
        rollout): ``capacity x channel``
        (a download's denominator; infinite for an inactive slot, whose work is then 0), the base policy's segment
        sizes and qualities in rounds 1.. (:meth:`_base_levels`: ``bits``/``quality`` and ``bits_low``/
        ``quality_low`` while the buffer is low); and the scenarios' ``weight`` ``[B, S]``."""
        dev = self.device
        channel = torch.as_tensor(channel_quality(futures.channel_logit), device=dev)  # (NumPy's exp: its bits)
        capacity = torch.as_tensor(futures.capacity, device=dev)
        capacity_channel = capacity[..., None] * channel
        if "active" in start:
            capacity_channel = torch.where(start["active"][:, None, None, :], capacity_channel, torch.inf)
        level, low = self._base_levels(obs, capacity, channel, start)
        per_round = {"capacity_channel": capacity_channel, "bits": self._segment_bits[level],
                     "quality": self._quality[level], "bits_low": self._segment_bits[low],
                     "quality_low": self._quality[low]}
        weight = torch.as_tensor(futures.weight, device=dev)
        if self._fused is not None:  # the kernel reads an env's scenarios as they are, [B, S, H, U]
            return {"weight": weight, **per_round}
        # rounds first, [H, B, S, 1, U]: a round's slice is contiguous and broadcasts over the candidates
        rounds_first = {k: v.permute(2, 0, 1, 3)[:, :, :, None].contiguous() for k, v in per_round.items()}
        return {"weight": weight, **rounds_first}

    def _base_levels(self, obs: np.ndarray, capacity: torch.Tensor, channel: torch.Tensor,
                     start: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``fair_share``'s levels ``[B, S, H, U]`` in round ``h`` (entry 0 unused: the plan plays it), from the
        observation after round ``h - 1`` as the env writes it (float32): the smaller of the last two capacities
        seen times the channel seen, shared among the active users; and one level lower (for a low buffer).
        Inactive slots: 0. None depends on the candidate: computed once for all."""
        cfg = self.config
        seen = cell_seen(cfg, obs)
        b, s, h = capacity.shape
        written, read = self._nominal(seen)  # what the observation divides by, and what decoding multiplies by
        past = start["cap_history"]
        history = torch.cat([past[:, None, :].expand(b, s, past.shape[1]), capacity], dim=2)  # [B, S, H + 2]
        shown = _as_written(history / written[:, None, None]) * read[:, None, None]
        recent = shown[:, :, :h]  # after round h - 1: the smaller of its last two (its one) capacities, [B, S, H]
        for j in range(1, past.shape[1]):
            recent = torch.minimum(recent, shown[:, :, j:j + h])
        channel_shown = _as_written(torch.cat([channel[:, :, :1], channel[:, :, :-1]], dim=2))  # after round h - 1
        active = torch.as_tensor(seen.active, device=self.device)[:, None, None, :]
        count = active.sum(dim=-1, keepdim=True) if cfg.masked else cfg.num_users
        if cfg.masked:
            channel_shown = channel_shown * active  # an inactive slot's features are 0
        rate = _FAIR_SHARE["safety"] * recent[..., None] * channel_shown / count
        level = torch.clamp(torch.searchsorted(self._ladder, rate.contiguous(), right=True) - 1, min=0)
        low = torch.clamp(level - 1, min=0)
        if cfg.masked:
            level, low = level * active, low * active
        return level, low

    def _nominal(self, seen: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The nominal capacity ``[B]`` the rollout's observations are written with (the users the observation shows
        times the capacity per user; the config's where the cell does not vary) and the one decoding reads them with
        (:func:`envs.vr_edge_dynamics.decode_observation`'s, from the active count and the float32 load)."""
        cfg, b = self.config, len(seen.t)
        if not cfg.masked:
            nominal = torch.full((b,), cfg.nominal_capacity_mbps, dtype=torch.float64, device=self.device)
            return nominal, nominal
        users = seen.users if cfg.varies else np.full(b, float(cfg.num_users))
        count = seen.active.sum(axis=1)
        load = (count / users).astype(np.float32).astype(np.float64)
        written = users * cfg.capacity_per_user_mbps if cfg.varies else np.full(b, cfg.nominal_capacity_mbps)
        read = np.rint(count / load) * cfg.capacity_per_user_mbps
        return torch.as_tensor(written, device=self.device), torch.as_tensor(read, device=self.device)

    # ------------------------------------------------------------------------------------------------------ the search

    def _improved(self, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor], plan: torch.Tensor
                  ) -> torch.Tensor:
        """``plan`` ``[B, U]`` after one pass over the users (:meth:`envs.belief_mpc.BeliefMPC._improved`), each pass
        on the envs where the user's slot is active."""
        levels, everyone = self.config.num_levels, torch.arange(len(plan), device=self.device)
        plan_value = torch.full((len(plan),), torch.nan, dtype=torch.float64, device=self.device)  # NaN: not yet
        for u in range(self.config.num_users):
            rows = torch.nonzero(start["active"][:, u]).squeeze(1) if "active" in start else everyone
            if len(rows) == 0:
                continue  # a slot active nowhere: nothing to improve
            own = plan[rows]
            known = plan_value[rows]
            if bool(torch.isnan(known).any()):  # the plan's own return first: every level of this user
                tried = torch.arange(levels, device=self.device).expand(len(rows), levels)
            else:  # the plan itself was played in the last pass: every level but its own (the same numbers)
                others = torch.arange(levels - 1, device=self.device)
                tried = others + (others >= own[:, u, None])  # [b, K - 1]
            candidates = own[:, None, :].repeat(1, tried.shape[1], 1)  # [b, K, U]
            candidates[:, :, u] = tried
            value = torch.empty((len(rows), levels), dtype=torch.float64, device=self.device)
            value[torch.arange(len(rows), device=self.device)[:, None], tried] = self.expected_return(
                _rows(start, rows), _rows(cell, rows, axis={"weight": 0}), candidates)
            picked = torch.arange(len(rows), device=self.device)
            if tried.shape[1] < levels:
                value[picked, own[:, u]] = known
            best = torch.argmax(value, dim=1)
            better = value[picked, best] > value[picked, own[:, u]] + _TIE
            chosen = torch.where(better, best, own[:, u])
            plan[rows, u] = chosen
            plan_value[rows] = value[picked, chosen]
        return plan

    def expected_return(self, start: dict[str, torch.Tensor], cell: dict[str, torch.Tensor], first: torch.Tensor
                        ) -> torch.Tensor:
        """Expected sum of rewards ``[B, K]`` of playing ``first`` ``[B, K, U]`` this round and the base policy after
        (:meth:`envs.belief_mpc.BeliefMPC.expected_return`): by the fused kernel where :attr:`fused`, else on tensors
        ``[B, S, K, U]``."""
        if self._fused is not None:
            return self._fused.fused_expected_return(self, start, cell, first)
        cfg = self.config
        b, k, u = first.shape
        s, horizon = cell["weight"].shape[1], cell["bits"].shape[0]
        buffer = start["buffer"][:, None, None, :]  # [B, 1, 1, U]: broadcast until the first round
        quality_before = self._quality[start["level"]][:, None, None, :]
        cum_stall = start["cum_stall"][:, None, None, :]
        active = start["active"][:, None, None, :] if "active" in start else None
        remaining = start["remaining"][:, None, None]  # [B, 1, 1]
        total = torch.zeros((b, s, k), dtype=torch.float64, device=self.device)
        alive = torch.ones_like(total)
        first = first if active is None else torch.where(active[:, 0], first, 0)
        bits, quality = self._segment_bits[first][:, None], self._quality[first][:, None]  # [B, 1, K, U]
        for h in range(horizon):
            if h:  # fair_share on what the state after the last round shows: its buffer decides the low step
                low = (buffer < self._low_buffer).to(torch.float64)
                bits = _chosen(low, cell["bits_low"][h], cell["bits"][h])
                quality = _chosen(low, cell["quality_low"][h], cell["quality"][h])
            download = self._shared_finish_times(bits / cell["capacity_channel"][h])
            stall = (download - buffer).clamp_(min=0.0)
            buffer = (buffer - download).clamp_(min=0.0).add_(cfg.segment_s).clamp_(max=cfg.max_buffer_s)
            change = torch.abs(quality - quality_before)
            user_reward = cfg.quality_weight * quality - cfg.stall_weight * stall - cfg.switch_weight * change
            reward = self._user_mean(user_reward, active)
            quality_before, cum_stall = quality, cum_stall + stall
            abandoned = torch.amax(cum_stall, dim=-1) > cfg.abandon_stall_s  # (any user over it: faster than any)
            weight = alive * (h < remaining)
            total = total + weight * reward
            abandoned = abandoned & (weight > 0)
            forfeit = abandoned.to(torch.float64) * cfg.quality_weight  # (a bool times a float is float32 in torch)
            total = total - forfeit * torch.clamp(remaining - h - 1, min=0)
            alive = alive * ~abandoned
        weighted = total * cell["weight"][:, :, None]
        value = weighted[:, 0]
        for i in range(1, s):  # NumPy adds a middle axis one slice after the other
            value = value + weighted[:, i]
        return value

    def _shared_finish_times(self, work: torch.Tensor) -> torch.Tensor:
        """:func:`envs.vr_edge_dynamics.processor_sharing_times` with its operations in its order."""
        w, order = torch.sort(work, dim=-1)  # (not stable: equal works are 0, an inactive slot's, whose finish is 0)
        finish = _running_sum(w) + self._ranks * w
        return torch.empty_like(work).scatter_(-1, order, finish)

    def _user_mean(self, x: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        """:func:`envs.vr_edge_dynamics.user_mean` with NumPy's sums."""
        if active is None:
            return numpy_order_sum(x) * (1.0 / self.config.num_users)
        return numpy_order_sum(x * active) / active.sum(dim=-1)


def low_buffer_bound(cfg: VREdgeConfig) -> float:
    """The smallest buffer ``b`` (s) that ``fair_share`` does not take for low, reading it from an observation:
    ``b / max_buffer_s`` rounded to float32, at most ``OBS_HIGH``, times ``max_buffer_s`` (float64), below its
    ``low_buffer_s``. Each of those steps is monotone, so a buffer is low exactly where it is below this bound (found
    by bisection over the float64 numbers, ordered as their bits are for numbers >= 0); one comparison per row.

    >>> cfg = VREdgeConfig()
    >>> b = low_buffer_bound(cfg)
    >>> _low_as_read(cfg, np.nextafter(b, 0.0)), _low_as_read(cfg, b)
    (True, False)
    """
    low, high = 0, int(np.array(np.inf).view(np.int64))  # bit patterns: low is low, high is not (or is infinity)
    if not _low_as_read(cfg, 0.0):
        return 0.0
    while high - low > 1:
        middle = (low + high) // 2
        if _low_as_read(cfg, float(np.array(middle, dtype=np.int64).view(np.float64))):
            low = middle
        else:
            high = middle
    return float(np.array(high, dtype=np.int64).view(np.float64))


def _low_as_read(cfg: VREdgeConfig, buffer: float) -> bool:
    """Whether ``fair_share`` takes ``buffer`` for low, as an observation shows it (its own arithmetic)."""
    shown = min(np.float32(buffer / cfg.max_buffer_s), np.float32(OBS_HIGH))
    return bool(np.float64(shown) * cfg.max_buffer_s < _FAIR_SHARE["low_buffer_s"])


def _chosen(pick: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a`` where ``pick`` (float, 0 or 1) is 1, else ``b``, exactly (finite ``a`` and ``b``): ``torch.lerp`` takes
    ``a - (a - b) x 0`` at a weight of 1 and ``b + 0 x (a - b)`` at 0, on a CPU as on a GPU; several times faster
    than ``torch.where`` on a CPU, measured."""
    return torch.lerp(b, a, pick)


def _rows(tensors: dict[str, torch.Tensor], rows: torch.Tensor, axis: dict[str, int] | None = None
          ) -> dict[str, torch.Tensor]:
    """The envs ``rows`` of every tensor: along its first axis, or its ``axis`` there is one (else the second, the
    envs of a tensor of rounds); the tensors themselves where ``rows`` are all envs."""
    axes = {k: 0 if axis is None else axis.get(k, 1) for k in tensors}
    first = next(iter(tensors))
    if len(rows) == tensors[first].shape[axes[first]]:  # (rows are ascending: all of them is the identity)
        return tensors
    return {k: v.index_select(axes[k], rows) for k, v in tensors.items()}


def _as_written(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an observation holds it and decoding reads it: rounded to float32, at most ``OBS_HIGH``, back in
    float64 (:func:`envs.vr_edge_dynamics.observe`)."""
    return torch.clamp(x.to(torch.float32), max=OBS_HIGH).to(torch.float64)


def _running_sum(x: torch.Tensor) -> torch.Tensor:
    """The running sum of ``x`` along its last axis, one term after the other (NumPy's ``cumsum``): torch's on a
    CPU, which adds in that order; written out elsewhere, where a scan may add in another."""
    return torch.cumsum(x, dim=-1) if x.device.type == "cpu" else running_sum_in_order(x)


def running_sum_in_order(x: torch.Tensor) -> torch.Tensor:
    """The running sum of ``x`` along its last axis, written out one term after the other (on any device).

    >>> running_sum_in_order(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))
    tensor([[1., 3., 6.]], dtype=torch.float64)
    """
    sums = [x[..., 0]]
    for i in range(1, x.shape[-1]):
        sums.append(sums[-1] + x[..., i])
    return torch.stack(sums, dim=-1)


def numpy_order_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over its last axis in NumPy's order, to the last bit: terms one after the other below 8,
    else 8 running sums over blocks of 8 added as a tree, then the rest one after the other (NumPy's pairwise sum;
    beyond 128 terms it halves at a multiple of 8 and adds both halves so).

    >>> x = torch.tensor([[0.1] * 9], dtype=torch.float64)
    >>> float(numpy_order_sum(x)) == float(np.sum(np.full((1, 9), 0.1), axis=-1)[0])
    True
    """
    n = x.shape[-1]
    if n < 8:
        total = x[..., 0]
        for i in range(1, n):
            total = total + x[..., i]
        return total
    if n > 128:
        half = n // 2
        half -= half % 8
        return numpy_order_sum(x[..., :half]) + numpy_order_sum(x[..., half:])
    blocks = n - n % 8
    acc = x[..., :8]
    for i in range(8, blocks, 8):
        acc = acc + x[..., i:i + 8]
    pairs = acc[..., 0::2] + acc[..., 1::2]  # (r0 + r1), (r2 + r3), (r4 + r5), (r6 + r7)
    total = (pairs[..., 0] + pairs[..., 1]) + (pairs[..., 2] + pairs[..., 3])
    for i in range(blocks, n):
        total = total + x[..., i]
    return total
