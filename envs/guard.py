"""A guard for a VR-edge policy on networks it never saw: where the cell's capacity has jumped more often than it
did on any of the policy's training episodes, the lowest level plays out the episode.

Why this signal (issue 64, docs/traces.md "Networks it never saw"): on a heavy-tailed network a round requested
at a high level during an outage stalls its user for longer than the buffer holds (4 s), so a policy bold enough
to win where users can be served loses them within ~30 rounds there, and only ``lowest`` keeps them. Outages come
without warning, but the rounds between them differ: the capacity of a heavy-tailed network jumps by more than
``JUMP`` (in log) from one round to the next in about half the rounds, of Pensieve's test traces and the synthetic
cell in a few percent. The share of such rounds, a running mean over the episode, tells the two apart within
some rounds; the guard plays ``lowest`` until it has seen ``HEDGE_ROUNDS`` rounds and for good once the share
passes the threshold: the highest share the policy's own training network showed (``peak`` of a guard that never
acts, played on its validation episodes), so that it does not act there.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from envs.vr_edge_config import VREdgeConfig

Act = Callable[[np.ndarray], np.ndarray]

JUMP = 0.35  # a round whose capacity differs from the last by more than this in log (x1.42 either way) jumped
MEMORY = 0.97  # the share's running mean keeps this much of itself a round (a memory of ~33 rounds)
HEDGE_ROUNDS = 8  # by default, the rounds at an episode's start that play lowest while the share has little
# evidence; whatever the hedge, the share counts this many rounds without a jump before the episode's first, so that
# an early jump moves it little


class VolatilityGuard:
    """``act`` guarded: each row of one natively batched VR-edge env plays ``act``'s levels until the share of its
    episode's rounds whose cell capacity jumped (:data:`JUMP`) passes ``threshold``, then every user's lowest level
    to the episode's end; every row plays the lowest level in its episode's first ``hedge_rounds`` rounds
    (:data:`HEDGE_ROUNDS`; a longer hedge is safer on a network like no training one and costs its rounds on every
    network: docs/traces.md, "How long to hedge").

    It keeps a row per env, so it must see every row at every step, rows whose episodes ended included
    (``trainer.evaluation.filter_episodes``); a row's episode starts where its observation's round is 0. Shapes:
    ``guard(obs [B, obs_dim]) -> actions [B, U]``; ``share`` ``[B]`` and ``guarded`` ``[B]`` (bool) after each call;
    ``peak``: the highest share seen from round ``hedge_rounds`` on, every row and call so far (with
    ``threshold=math.inf`` the guard only hedges and measures: its peak calibrates another's threshold).

        >>> import numpy as np
        >>> from envs.guard import VolatilityGuard
        >>> from envs.vector import VREdgeVectorEnv
        >>> env = VREdgeVectorEnv(num_envs=2, num_users=3)
        >>> top = lambda obs: np.full((len(obs), 3), 5)
        >>> guard = VolatilityGuard(top, env.config, threshold=0.3)
        >>> obs, _ = env.reset(seed=[1, 2])
        >>> guard(obs).tolist()  # the first rounds are hedged
        [[0, 0, 0], [0, 0, 0]]
        >>> for _ in range(10):
        ...     obs, *_ = env.step(guard(obs))
        >>> guard(obs).tolist(), guard.guarded.tolist()  # the synthetic cell barely jumps: the policy plays
        ([[5, 5, 5], [5, 5, 5]], [False, False])
    """

    def __init__(self, act: Act, cfg: VREdgeConfig, threshold: float, hedge_rounds: int = HEDGE_ROUNDS) -> None:
        if not threshold >= 0:
            raise ValueError(f"VolatilityGuard needs threshold >= 0, got {threshold!r}: a share of rounds (0: any "
                             "jump past the hedge trips it)")
        try:  # any integer (numpy's too), not a bool
            hedge = -1 if isinstance(hedge_rounds, bool) else operator.index(hedge_rounds)
        except TypeError:
            hedge = -1
        if hedge < 0:
            raise ValueError(f"VolatilityGuard needs hedge_rounds a whole number >= 0, got {hedge_rounds!r}: the "
                             "rounds at an episode's start that play the lowest level")
        if hedge >= cfg.max_steps:
            raise ValueError(f"VolatilityGuard hedge_rounds={hedge} covers the whole episode (max_steps "
                             f"{cfg.max_steps}): the policy would never play; give fewer rounds")
        self.act, self.cfg, self.threshold, self.hedge_rounds = act, cfg, float(threshold), hedge
        users = cfg.num_user_features * cfg.num_users  # the observation's per-user features come first
        self._history = slice(users, users + cfg.history)
        self._round = self._history.stop  # the episode's progress, t / max_steps
        self._mean = np.zeros(0)
        self._tripped = np.zeros(0, dtype=bool)
        self.share = np.zeros(0)
        self.guarded = np.zeros(0, dtype=bool)
        self.peak = 0.0

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.ndim != 2 or obs.shape[1] != self.cfg.obs_dim:
            raise ValueError(f"VolatilityGuard needs observations [B, {self.cfg.obs_dim}] (one row per env of the "
                             f"config it was given), got shape {list(obs.shape)}: pass every row of one batched env "
                             "of that config")
        rounds = self._observe(obs)
        self.guarded = self._tripped | (rounds < self.hedge_rounds)
        actions = np.array(self.act(obs), copy=True)
        actions[self.guarded] = 0  # every user's lowest level
        return actions

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        """Move each row's share on by this round (a row whose round is 0 starts afresh); its rounds ``[B]``."""
        if len(self._mean) != len(obs):
            self._mean, self._tripped = np.zeros(len(obs)), np.zeros(len(obs), dtype=bool)
        rounds = np.rint(obs[:, self._round].astype(np.float64) * self.cfg.max_steps)
        self._mean, self.share = running_share(self._mean, rounds, jumped(obs[:, self._history]))
        past_hedge = rounds >= self.hedge_rounds
        if past_hedge.any():
            self.peak = max(self.peak, float(self.share[past_hedge].max()))
        self._tripped = np.where(rounds == 0, False, self._tripped | ((self.share > self.threshold) & past_hedge))
        return rounds


def jumped(history: np.ndarray) -> np.ndarray:
    """Whether each row's capacity jumped in the last round ``[B]`` (float 0/1), from its capacity history
    ``[B, history]`` (oldest first, any common scale): ``|log c_t - log c_{t-1}| > JUMP``. A capacity of 0 (never
    in VR-edge, whose outages keep a share of it) counts as a millionth of the nominal."""
    logs = np.log(np.maximum(np.asarray(history, dtype=np.float64)[:, -2:], 1e-6))
    return (np.abs(logs[:, 1] - logs[:, 0]) > JUMP).astype(np.float64)


def running_share(mean: np.ndarray, rounds: np.ndarray, jump: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The running mean of jumps ``mean`` moved on by this round, and the share it estimates ``[B]``.

    ``mean`` is the exponential moving average (:data:`MEMORY`) of ``jump`` over the episode's rounds 1..t (round
    0 has no last round to differ from; its mean is 0). The share is that average with the weight of the rounds
    seen, plus :data:`HEDGE_ROUNDS` pseudo-rounds without a jump: ``mean / (1 - m^t + HEDGE (1 - m))``."""
    started = rounds > 0
    mean = np.where(started, MEMORY * mean + (1 - MEMORY) * jump, 0.0)
    weight = 1 - MEMORY ** np.maximum(rounds, 0) + HEDGE_ROUNDS * (1 - MEMORY)
    return mean, mean / weight
