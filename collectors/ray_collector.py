"""Collecting experience on Ray actors, on one machine or a cluster: :class:`RayCollector`."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from collectors.backends.ray_ import AsyncRollouts, RayWorkers, RolloutWorker
from collectors.base import Collector, Policy, check_env_fns, explicit_seeds
from collectors.collector import merge_states, split_state
from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S
from collectors.env_group import env_state_count
from collectors.rollout import Rollout
from collectors.storage import RolloutStorage, torch_dtype


class RayCollector(Collector):
    """Rollouts from Ray actors, each hosting a slice of the envs and a CPU copy of the policy.

    Example (starts a local Ray instance; pass ``ray_address`` to join a cluster):
        >>> import functools, gymnasium as gym
        >>> from collectors import RayCollector
        >>> from trainer.ppo.model import ActorCritic
        >>> env = gym.make("CartPole-v1")
        >>> policy = ActorCritic(env.observation_space, env.action_space)
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 4
        >>> with RayCollector(env_fns, policy, num_steps=16, num_workers=2) as collector:  # doctest: +SKIP
        ...     rollout = collector.collect()
        >>> rollout.batch.batch_size, rollout.envs  # doctest: +SKIP
        (torch.Size([16, 4]), slice(0, 4, None))

    The same :class:`~collectors.rollout.Rollout` as :class:`~collectors.RolloutCollector`,
    and for a fixed seed and policy the same batch, bit for bit. The policy runs on the
    actors (it must be picklable, e.g. an ``nn.Module``); weights given to
    ``update_policy`` go out once, with the next rollout of each actor.

    Args:
        env_fns, policy, num_steps, seed, device, num_threads: as for ``RolloutCollector``.
        num_workers: actors (default: as many equal slices of the factories as the cluster's CPUs hold).
        envs_per_worker: env factories per actor (default: the factories divided by ``num_workers``).
        ray_address: cluster address (default: reuse a running Ray or start a local one on 127.0.0.1).
        cpus_per_worker: CPUs each actor reserves.
        worker_options: ``.options(...)`` per actor (e.g. ``resources={...}`` to pin nodes).
        keep_collecting: IMPALA-style collection: the actors keep collecting while the learner learns
            (every actor always has a rollout in flight) and ``collect()`` returns the first that is ready,
            a ``[T, K]`` slice (``rollout.envs``) collected with weights ``policy_version - rollout.policy_version``
            updates old. Faster, but a learner must correct for the lag (the trainer uses V-trace).
        worker_cls: the actors' class, a subclass of ``collectors.backends.ray_.RolloutWorker`` whose
            ``rollout`` may return another flat batch (the Ape-X tier's actors return n-step transitions
            with their priorities); ``worker_kwargs`` go to its constructor.
        worker_timeout: seconds an actor's rollout may take before the actor is replaced as if it had
            died (stretched to 20 times the slowest rollout measured; an actor's first gets 120 s).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Policy, num_steps: int = 128,
                 seed: int | Sequence[int] = 0, device: str | torch.device = "cpu", num_workers: int | None = None,
                 envs_per_worker: int | None = None, ray_address: str | None = None, cpus_per_worker: float = 1.0,
                 worker_options: Sequence[dict] | dict | None = None, keep_collecting: bool = False,
                 num_threads: int | None = None, worker_cls: type | None = None,
                 worker_kwargs: dict[str, Any] | None = None,
                 worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S) -> None:
        env_fns = check_env_fns(env_fns)
        super().__init__(policy, num_steps, device, num_threads)
        explicit = explicit_seeds(seed)
        self.workers = RayWorkers(env_fns, policy, num_steps, seed if explicit is None else explicit, num_workers,
                                  envs_per_worker, ray_address, cpus_per_worker, worker_options,
                                  worker_cls or RolloutWorker, worker_kwargs, worker_timeout)
        self._closed = False
        self.num_envs = self.workers.num_envs
        self.observation_space = self.workers.observation_space
        self.action_space = self.workers.action_space
        self.keep_collecting = keep_collecting
        self._in_flight = AsyncRollouts(self.workers) if keep_collecting else None
        self._weights: tuple[int, Any] | None = None  # (version, object-store ref), put once per version
        self.storage: RolloutStorage | None = None

    def update_policy(self, policy_or_state_dict) -> None:
        super().update_policy(policy_or_state_dict)
        self.workers.policy = self.policy  # replaced actors start from it

    def _weights_ref(self) -> Any:
        if self._weights is None or self._weights[0] != self.policy_version:
            self._weights = (self.policy_version, self.workers.put_weights())
        return self._weights[1]

    def _collect(self) -> Rollout:
        """All actors' rollouts as one ``[T, N]`` batch (``keep_collecting``: the first ready actor's ``[T, K]``)."""
        return self._first_ready() if self._in_flight is not None else self._all()

    def _all(self) -> Rollout:
        results = self.workers.rollout_all(self._weights_ref(), self.policy_version)
        if self.storage is None:
            first = results[0]["batch"]
            extras = tuple(k for k in ("log_probs", "values") if k in first)
            self.storage = RolloutStorage(self.num_steps, self.num_envs, self.observation_space.shape,
                                          torch_dtype(first["observations"].dtype),
                                          first["actions"].shape[2:], torch_dtype(first["actions"].dtype),
                                          extras, self.device)
        self.storage.wait_for_transfer()
        for r, envs in zip(results, self.workers.slices):
            self.storage.fill_envs(envs, r["batch"], r["next_observations"])
        episodes = sorted((e for r in results for e in r["episodes"]), key=lambda e: e["env"])
        batch, next_obs = self.storage.to_device()
        return Rollout(batch, next_obs, episodes, self.policy_version, slice(0, self.num_envs))

    def _first_ready(self) -> Rollout:
        worker, r = self._in_flight.next_ready(self._weights_ref(), self.policy_version)
        with warnings.catch_warnings():  # object-store arrays are read-only; consolidate() copies them
            warnings.simplefilter("ignore", UserWarning)
            host = TensorDict({"rollout": TensorDict({k: torch.from_numpy(v) for k, v in r["batch"].items()},
                                                     batch_size=r["batch"]["rewards"].shape),
                               "next_observations": torch.from_numpy(r["next_observations"])}, batch_size=[])
            host = host.consolidate()  # one buffer: one transfer
        moved = host if self.device.type == "cpu" else host.to(self.device, non_blocking=True)
        return Rollout(moved["rollout"], moved["next_observations"], r["episodes"], r["version"],
                       self.workers.slices[worker])

    def get_state(self) -> dict[str, Any]:
        """As ``RolloutCollector.get_state``. Each actor's state comes back with its rollout, so this
        costs no extra round trip; with ``keep_collecting`` it is the state after the rollouts received
        so far (rollouts still in flight are not part of it)."""
        return merge_states(self.workers.env_states())

    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """As ``RolloutCollector.set_state``; each actor restores its slice of the envs."""
        held = env_state_count(state["env_states"])
        if held != self.num_envs:
            raise ValueError(f"collector state has {held} env states for {self.num_envs} envs")
        return self.workers.set_env_states([split_state(state, sl) for sl in self.workers.slices], reseed)

    def _close(self) -> None:
        self.workers.close()
