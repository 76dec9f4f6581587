"""n-step transitions from ``[T, N]`` rollouts, for the Ape-X replay.

A transition starting at step ``t`` of an env holds ``observations[t]``, ``actions[t]``, the discounted
reward sum ``sum_k gamma^k r[t+k]`` over up to ``n`` steps, and what to bootstrap from:

- the episode goes on for ``n`` steps: ``next_observations`` = the observation ``n`` steps later,
  ``discounts`` = ``gamma^n``, ``done`` = False;
- it is truncated at step ``t + k`` (``k < n``): the true final observation, ``gamma^(k+1)``, not done
  (a time limit is not an end of the task: bootstrap);
- it terminates at step ``t + k``: ``done`` = True (no bootstrap), ``discounts`` = 0.

Rewards after an episode's end (the next episode's, after the same-step autoreset) are never summed.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from collectors import Rollout

STEP_KEYS = ("observations", "actions", "rewards", "terminated", "truncated", "final_observations")


def nstep_transitions(steps: dict[str, torch.Tensor], after: torch.Tensor, n: int, gamma: float) -> TensorDict:
    """The n-step transitions starting at steps ``0 .. W - n`` of a ``[W, N]`` window (``W >= n``).

    Args:
        steps: ``STEP_KEYS`` of the window, each ``[W, N, ...]`` (a rollout batch's keys).
        after: ``[N, *obs]``, the observations that follow the window.

    Returns a ``TensorDict`` of ``[(W - n + 1) * N]`` transitions (time-major): ``observations``,
    ``actions``, ``rewards``, ``next_observations``, ``done``, ``discounts``.

    Example:
        >>> w = {"observations": torch.arange(4.).reshape(4, 1, 1), "actions": torch.zeros(4, 1, dtype=torch.int64),
        ...      "rewards": torch.ones(4, 1), "terminated": torch.zeros(4, 1, dtype=torch.bool),
        ...      "truncated": torch.zeros(4, 1, dtype=torch.bool), "final_observations": torch.zeros(4, 1, 1)}
        >>> t = nstep_transitions(w, torch.full((1, 1), 4.), n=2, gamma=0.5)
        >>> t["rewards"].tolist(), t["next_observations"].flatten().tolist(), t["discounts"].tolist()
        ([1.5, 1.5, 1.5], [2.0, 3.0, 4.0], [0.25, 0.25, 0.25])
    """
    window = steps["rewards"].shape[0]
    if window < n:
        raise ValueError(f"a window of {window} steps holds no {n}-step transition")
    s = window - n + 1
    obs_after = torch.cat([steps["observations"], after.unsqueeze(0)])  # [W + 1, N, ...]
    returns = torch.zeros_like(steps["rewards"][:s])
    alive = torch.ones_like(steps["terminated"][:s])
    done = torch.zeros_like(alive)
    discounts = torch.full_like(returns, gamma**n)
    bootstrap = obs_after[n:n + s].clone()
    for k in range(n):
        ended_k = steps["terminated"][k:k + s] | steps["truncated"][k:k + s]
        returns += torch.where(alive, gamma**k * steps["rewards"][k:k + s], 0.0)
        ends_here = alive & ended_k
        term_here = alive & steps["terminated"][k:k + s]
        done |= term_here
        discounts = torch.where(ends_here, torch.where(term_here, 0.0, gamma ** (k + 1)), discounts)
        mask = ends_here.reshape(*ends_here.shape, *([1] * (bootstrap.dim() - 2)))
        bootstrap = torch.where(mask, steps["final_observations"][k:k + s], bootstrap)
        alive &= ~ended_k
    flat = s * returns.shape[1]
    return TensorDict({"observations": steps["observations"][:s].reshape(flat, *steps["observations"].shape[2:]),
                       "actions": steps["actions"][:s].reshape(flat, *steps["actions"].shape[2:]),
                       "rewards": returns.reshape(flat), "next_observations": bootstrap.reshape(flat, *after.shape[1:]),
                       "done": done.reshape(flat), "discounts": discounts.reshape(flat)}, batch_size=[flat])


class NStepBuilder:
    """Turns consecutive rollouts of the same envs into n-step transitions, none lost between rollouts.

    The last ``n - 1`` steps of a rollout cannot complete their ``n`` steps yet: they are kept and
    completed with the next rollout. So the first rollout gives ``(T - n + 1) x N`` transitions and
    every later one ``T x N``. ``state_dict`` holds those kept steps (for exact resume).

    Example:
        >>> import functools, gymnasium as gym
        >>> from collectors import make_collector
        >>> policy = lambda obs: torch.zeros(len(obs), dtype=torch.int64)
        >>> builder = NStepBuilder(n=3, gamma=0.99)
        >>> with make_collector([functools.partial(gym.make, "CartPole-v1")] * 2, policy, num_steps=8) as c:
        ...     first, second = builder.add(c.collect()), builder.add(c.collect())
        >>> first.batch_size, second.batch_size
        (torch.Size([12]), torch.Size([16]))
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n={n} is invalid: must be >= 1")
        self.n, self.gamma = n, gamma
        self.kept: dict[str, torch.Tensor] | None = None  # the last n - 1 steps, not yet complete

    def add(self, rollout: Rollout) -> TensorDict:
        """The transitions this rollout completes (on the rollout's device)."""
        steps = {k: rollout.batch[k] for k in STEP_KEYS}
        if self.kept is not None:
            steps = {k: torch.cat([self.kept[k].to(v.device), v]) for k, v in steps.items()}
        self.kept = {k: v[max(0, v.shape[0] - (self.n - 1)):].clone() for k, v in steps.items()}
        if steps["rewards"].shape[0] < self.n:
            return _empty(steps)
        return nstep_transitions(steps, rollout.next_observations, self.n, self.gamma)

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        return None if self.kept is None else {k: v.cpu() for k, v in self.kept.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor] | None) -> None:
        self.kept = None if state is None else dict(state)


def _empty(steps: dict[str, torch.Tensor]) -> TensorDict:
    """No transitions (a first rollout shorter than ``n``), with the right keys and trailing shapes."""
    o, a = steps["observations"], steps["actions"]
    return TensorDict({"observations": o.new_zeros((0, *o.shape[2:])), "actions": a.new_zeros((0, *a.shape[2:])),
                       "rewards": torch.zeros(0), "next_observations": o.new_zeros((0, *o.shape[2:])),
                       "done": torch.zeros(0, dtype=torch.bool), "discounts": torch.zeros(0)}, batch_size=[0])
