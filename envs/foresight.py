"""How much of the clairvoyant's lead is foresight: the causal reference told the true next ``known`` rounds.

:class:`ForesightMPC` is :class:`envs.belief_mpc.BeliefMPC` whose scenarios begin with the env's true next ``known``
rounds (the capacity and every user's channel, read from the env's state as :class:`envs.planner.ClairvoyantPlanner`
reads them: :func:`envs.planner.true_rounds`), the same in every scenario, and go on from the filter's posterior
given those rounds too (:meth:`envs.belief.RegimeFilter.futures_after`) up to the horizon. ``known = 0`` is
BeliefMPC, action for action; with ``known >= horizon`` every round is known and one scenario is the future. It
peeks, so it is a reference, not a policy: its score against ``known`` (``python -m benchmarks.foresight``) splits
the clairvoyant's lead over BeliefMPC into what knowing the next rounds is worth and what a better search over them
adds. What it knows is what the env will show (capacities and channels), not the hidden regime and fade; the users'
joins and leaves within the horizon are not foreseen (as BeliefMPC, it plans the users active now).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envs.belief import Futures
from envs.belief_mpc import BeliefMPC, Policy
from envs.planner import env_states, true_rounds
from envs.settings import ConfigError
from envs.vr_edge_config import VREdgeConfig
from envs.vr_edge_dynamics import observe


class ForesightMPC(BeliefMPC):
    """BeliefMPC that knows the true next ``known`` rounds of each env's cell (module docstring): a reference.

    Example:
        >>> import envs
        >>> from envs.foresight import ForesightMPC
        >>> venv = envs.VREdgeVectorEnv(2, num_users=3, seed=0, max_steps=20)
        >>> obs, _ = venv.reset()
        >>> mpc = ForesightMPC(venv.config, known=2, horizon=3, scenarios=4)
        >>> mpc(obs, [venv]).shape   # one row per env, one level per user
        (2, 3)
        >>> mpc.futures(obs, venv.get_state()).capacity.shape   # 2 rounds known, 1 drawn, in 4 scenarios
        (2, 4, 3)

    Shapes: ``mpc(obs [B, obs_dim], envs) -> [B, U]`` int64 levels, ``envs`` the envs whose ``B`` rows ``obs`` are
    (single envs or one ``VREdgeVectorEnv``; ``trainer.evaluation.batched_reference_episodes``). Stateful as
    BeliefMPC (the filter): every env's observation at every step, in order. ``base`` and the keyword
    arguments are BeliefMPC's (:class:`envs.belief_mpc.BeliefMPCSettings`).
    """

    def __init__(self, config: VREdgeConfig, known: int, base: str | Policy = "fair_share", **settings: Any) -> None:
        if not isinstance(known, int) or isinstance(known, bool) or known < 0:
            raise ConfigError("known", known, "must be an integer >= 0 (rounds of the true future known)", flag=False)
        super().__init__(config, base, **settings)
        self.known = known

    def __call__(self, obs: np.ndarray, envs: Sequence[gym.Env]) -> np.ndarray:
        """Levels ``[B, U]`` for the next round of the envs ``envs`` that show ``obs``."""
        self.filter.update(obs)
        return self.planned(obs, self.futures(obs, env_states(envs)))

    def futures(self, obs: np.ndarray, state: dict[str, np.ndarray]) -> Futures:
        """The scenarios of the next ``horizon`` rounds of the envs in ``state`` ``[B]`` (showing ``obs``, the
        filter updated with them): the first ``known`` rounds true in every scenario, the rest drawn from the
        posterior given them; one scenario of weight 1 where every round is known."""
        horizon, scenarios = self.settings.horizon, self.settings.scenarios
        if self.known == 0:
            return self.filter.futures(obs, scenarios, horizon)
        rounds = true_rounds(self.config, state, min(self.known, horizon))
        truth = known_future(rounds)
        if self.known >= horizon:
            return truth
        now = {"active": state["active"]} if self.config.varies else {}  # (its channels: the users planned for)
        seen = [observe(self.config, {**after, **now}) for after, _ in rounds]
        drawn = self.filter.futures_after(seen, scenarios, horizon - self.known)
        return Futures(*(np.concatenate([np.repeat(a, scenarios, axis=1), b], axis=2)
                         for a, b in zip(truth[:4], drawn[:4])), drawn.weight)


def known_future(rounds: list[tuple[dict[str, np.ndarray], np.ndarray]]) -> Futures:
    """The rounds :func:`envs.planner.true_rounds` gives as one scenario of weight 1 (``S = 1``): their capacities,
    channel logits, regimes and fades."""
    capacity = np.stack([c for _, c in rounds], axis=1)[:, None]  # [B, 1, H]
    logit, regime, fade = (np.stack([after[key] for after, _ in rounds], axis=1)[:, None]
                           for key in ("channel_logit", "regime", "fade"))
    return Futures(capacity, logit, regime, fade, np.ones((len(capacity), 1)))
