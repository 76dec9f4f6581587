"""Where each PPO iteration's rollout comes from: collected after the last update, or during it (``--overlap``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from collectors import Collector, Rollout
from trainer.common.state import cpu_copy


class Alternating:
    """Collect, learn, send the weights, collect again: every rollout is collected with the newest
    weights (policy lag 0; IMPALA-style Ray collection has its own lag)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def next_rollout(self) -> Rollout:
        return self.collector.collect()

    def learned(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The model after an update; the next rollout acts with it."""
        self.collector.update_policy(weights)

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to continue exactly: the collector's state."""
        return {"collector": self.collector.get_state()}

    def restore(self, saved: dict[str, Any], weights: Mapping[str, torch.Tensor], reseed: int) -> bool:
        """Continue from a checkpoint whose model has ``weights``; whether the envs were restored exactly."""
        self.collector.update_policy(weights)
        return self.collector.set_state(saved["collector"], reseed=reseed)


class Overlapped:
    """Collect the next rollout in the background while learning on this one (``--overlap``).

    The rollout learned at iteration ``k + 1`` is collected while iteration ``k`` learns (and
    writes its snapshot and metrics), with the weights from before update ``k``: the lag is
    exactly one update, every iteration after the first, so a run is as deterministic as an
    alternating one. A snapshot after iteration ``k`` holds the collector state from before
    the rollout in flight and the weights collecting it; resuming collects that rollout again
    (same envs, same weights, same numbers) and carries on. An error in the rollout in flight
    surfaces in the iteration that would learn from it, so iteration ``k`` stays complete.

    Example (the trainer's loop, reduced: the policy's own weights stand in for an update's):
        >>> import functools, gymnasium as gym
        >>> from collectors import make_collector
        >>> from trainer.ppo.model import ActorCritic
        >>> env = gym.make("CartPole-v1")
        >>> policy = ActorCritic(env.observation_space, env.action_space)
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 2
        >>> with make_collector(env_fns, policy, num_steps=8, background=True) as collector:
        ...     pipeline = Overlapped(collector, policy.state_dict())
        ...     first = pipeline.next_rollout()  # the next one is being collected from here on
        ...     pipeline.learned(policy.state_dict())  # sent out once the rollout in flight is in
        ...     second = pipeline.next_rollout()  # collected during the "update": with the old weights
        >>> first.policy_version, second.policy_version, collector.policy_version
        (0, 0, 1)
    """

    def __init__(self, collector: Collector, weights: Mapping[str, torch.Tensor]) -> None:
        if not hasattr(collector, "start"):
            raise TypeError(f"--overlap needs a collector that collects in the background, not {type(collector)}")
        self.collector = collector
        self.in_flight = False
        self.in_flight_from: dict[str, Any] | None = None  # collector state from before the rollout in flight
        self.acting = cpu_copy(weights)  # the weights collecting it (at first: the collector's policy's)
        self.pending: dict[str, torch.Tensor] | None = None  # newer weights, sent once it is in

    def next_rollout(self) -> Rollout:
        """This iteration's rollout; the next one is collecting before this returns."""
        rollout = self.collector.wait() if self.in_flight else self.collector.collect()  # first: nothing to overlap
        self.in_flight = False
        if self.pending is not None:
            self._send(self.pending)
            self.pending = None
        self.in_flight_from = self.collector.get_state()
        self.collector.start()
        self.in_flight = True
        return rollout

    def learned(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The model after an update; the rollout after the one in flight acts with it."""
        self.pending = cpu_copy(weights)

    def _send(self, weights: dict[str, torch.Tensor]) -> None:
        self.acting = weights
        self.collector.update_policy(weights)

    def state(self) -> dict[str, Any]:
        """The collector state from before the rollout in flight (before the first: the current one)
        and the weights collecting it."""
        collector = self.in_flight_from if self.in_flight_from is not None else self.collector.get_state()
        return {"collector": collector, "acting_model": self.acting}

    def restore(self, saved: dict[str, Any], weights: Mapping[str, torch.Tensor], reseed: int) -> bool:
        """Continue from a checkpoint whose model has ``weights``: the rollout that was in flight is
        collected again with its own weights, then ``weights`` go out (a checkpoint of an alternating
        run has no rollout in flight: ``weights`` collect the next one)."""
        acting = saved.get("acting_model")
        self._send(cpu_copy(acting if acting is not None else weights))
        self.pending = cpu_copy(weights) if acting is not None else None
        exact = self.collector.set_state(saved["collector"], reseed=reseed)
        self.in_flight_from = saved["collector"] if exact else self.collector.get_state()
        return exact


Pipeline = Alternating | Overlapped


def make_pipeline(collector: Collector, weights: Mapping[str, torch.Tensor], overlap: bool) -> Pipeline:
    """``Overlapped`` for ``--overlap`` (the collector must collect in the background; ``weights`` are those its
    policy holds), else ``Alternating``."""
    return Overlapped(collector, weights) if overlap else Alternating(collector)
