"""Rollouts on Ray actors: each actor hosts envs and a CPU copy of the policy, and returns whole ``[T, K]`` slices.

Unlike the other backends, the policy runs on the workers: across a cluster, one round
trip per step would cost more than the step. Weights go out once per rollout through the
object store (one ``ray.put`` of NumPy arrays).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from collectors.env_group import EnvGroup, check_same_spaces
from collectors.seeding import env_seeds

log = logging.getLogger("collectors.ray")
_MAX_RESTARTS_PER_ROLLOUT = 3


def require_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("backend='ray' needs Ray: pip install -e '.[ray]' (or pip install 'ray>=2.9')") from None
    return ray


def policy_weights(policy: Any) -> dict[str, np.ndarray] | None:
    """The policy's ``state_dict`` as NumPy arrays (``None`` for a plain callable, which has no weights)."""
    if not isinstance(policy, torch.nn.Module):
        return None
    return {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}


def _count_envs(env_fns: list) -> tuple[int, Any]:
    """Build a worker's envs once to learn how many there are and their spaces."""
    group = EnvGroup(env_fns)
    try:
        return group.num_envs, group.spaces
    finally:
        group.close()


class RolloutWorker:
    """A Ray actor's body: a local ``sync`` :class:`RolloutCollector` over this worker's envs."""

    def __init__(self, env_fns: list, policy: Any, horizon: int, seeds: list[int], first_index: int,
                 policy_seed: int) -> None:
        from collectors.collector import RolloutCollector
        torch.set_num_threads(1)
        if isinstance(getattr(policy, "generator", None), torch.Generator):
            policy.generator.manual_seed(policy_seed)  # sampling streams derived from the run seed
        self.collector = RolloutCollector(env_fns, policy, backend="sync", horizon=horizon, seed=seeds)
        self.first_index = first_index

    def rollout(self, weights: dict[str, np.ndarray] | None, version: int) -> dict[str, Any]:
        if weights is not None:
            self.collector.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
        batch = self.collector.collect()
        episodes = [{**e, "env": e["env"] + self.first_index} for e in self.collector.episodes]
        return {"batch": {k: v.numpy() for k, v in batch.items()},
                "last_observations": self.collector.last_observations.numpy(),
                "episodes": episodes, "version": version,
                "state": self.collector.get_state()}  # travels with the rollout: no extra round trip to save it

    def get_state(self) -> dict[str, Any]:
        return self.collector.get_state()

    def set_state(self, state: dict[str, Any], reseed: int | None) -> bool:
        return self.collector.set_state(state, reseed)

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()


class RayBackend:
    """``num_workers`` Ray actors with ``envs_per_worker`` env factories each."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Any, horizon: int, seed: int,
                 num_workers: int | None, envs_per_worker: int | None, ray_address: str | None,
                 cpus_per_worker: float = 1.0, worker_options: Sequence[dict] | dict | None = None) -> None:
        ray = require_ray()
        n = len(env_fns)
        if num_workers is None and envs_per_worker is None:
            num_workers = n
        if num_workers is None:
            num_workers = n // envs_per_worker if envs_per_worker else n
        envs_per_worker = envs_per_worker or max(1, n // num_workers)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1 \
                or num_workers * envs_per_worker != n:
            raise ValueError(f"num_workers={num_workers!r} x envs_per_worker={envs_per_worker!r} must equal the "
                             f"number of env factories ({n}); e.g. num_workers={n}, envs_per_worker=1")
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address)
            else:
                ray.init(include_dashboard=False)
        self.ray = ray
        self.horizon, self.policy, self.seed = horizon, policy, seed
        self.cpus_per_worker = cpus_per_worker
        opts = worker_options if isinstance(worker_options, (list, tuple)) else [worker_options or {}] * num_workers
        if len(opts) != num_workers:
            raise ValueError(f"worker_options has {len(opts)} entries for {num_workers} workers")
        self.options = [dict(o) for o in opts]
        self.groups = [list(env_fns[w * envs_per_worker:(w + 1) * envs_per_worker]) for w in range(num_workers)]
        count = ray.remote(num_cpus=cpus_per_worker)(_count_envs)
        counted = ray.get([count.options(**o).remote(g) for g, o in zip(self.groups, self.options)])
        spaces = [s for _, group_spaces in counted for s in group_spaces]
        check_same_spaces(spaces)
        self.observation_space, self.action_space, _ = spaces[0]
        sizes = [c for c, _ in counted]
        self.num_envs = sum(sizes)
        starts = np.cumsum([0, *sizes])
        self.slices = [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
        self.seeds = env_seeds(seed, self.num_envs)
        self.restarts = 0
        self.events: list[str] = []
        self.actor_cls = ray.remote(RolloutWorker)
        self.actors = [self._spawn(w, self.seeds[self.slices[w]]) for w in range(num_workers)]
        self.states: list[dict[str, Any] | None] = [None] * num_workers

    def _spawn(self, w: int, seeds: list[int]):
        policy_seed = int(np.random.SeedSequence([self.seed, w, self.restarts]).generate_state(1)[0])
        return self.actor_cls.options(num_cpus=self.cpus_per_worker, **self.options[w]).remote(
            self.groups[w], self.policy, self.horizon, list(seeds), self.slices[w].start, policy_seed)

    def _replace(self, w: int, error: Exception) -> None:
        """Replace a dead actor; its envs restart from seeds derived from the run seed and the restart count."""
        self.restarts += 1
        derived = int(np.random.SeedSequence([self.seed, 10_000 + self.restarts]).generate_state(1)[0])
        message = (f"ray worker {w} (envs {self.slices[w].start}-{self.slices[w].stop - 1}) died "
                   f"({type(error).__name__}); replaced, its envs reseeded, the rollout retried")
        log.warning(message)
        self.events.append(message)
        try:
            self.ray.kill(self.actors[w])
        except Exception:
            pass
        self.actors[w] = self._spawn(w, env_seeds(derived, self.slices[w].stop - self.slices[w].start))
        self.states[w] = None

    def launch(self, w: int, weights_ref: Any, version: int):
        return self.actors[w].rollout.remote(weights_ref, version)

    def put_weights(self) -> Any:
        return self.ray.put(policy_weights(self.policy))

    def rollout_all(self, version: int) -> list[dict[str, Any]]:
        """One synchronous rollout of every worker with the current weights; dead workers are replaced and retried."""
        weights_ref = self.put_weights()
        refs = [self.launch(w, weights_ref, version) for w in range(len(self.actors))]
        results: list[dict[str, Any]] = [None] * len(refs)  # type: ignore[list-item]
        for w, ref in enumerate(refs):
            for attempt in range(_MAX_RESTARTS_PER_ROLLOUT + 1):
                try:
                    results[w] = self.ray.get(ref)
                    self.record(w, results[w])
                    break
                except self.ray.exceptions.RayActorError as e:
                    if attempt == _MAX_RESTARTS_PER_ROLLOUT:
                        raise RuntimeError(f"ray worker {w} died {attempt + 1} times in one rollout") from e
                    self._replace(w, e)
                    ref = self.launch(w, weights_ref, version)
        return results

    def env_states(self) -> list[dict[str, Any]]:
        """Each actor's collector state after its newest received rollout (asked for where none came yet)."""
        missing = [w for w, s in enumerate(self.states) if s is None]
        for w, s in zip(missing, self.ray.get([self.actors[w].get_state.remote() for w in missing])):
            self.states[w] = s
        return list(self.states)

    def record(self, w: int, result: dict[str, Any]) -> None:
        self.states[w] = result["state"]

    def set_env_states(self, states: Sequence[Any], reseed: int | None = None) -> bool:
        exact = all(self.ray.get([a.set_state.remote(s, reseed) for a, s in zip(self.actors, states)]))
        self.states = [None] * len(self.actors)
        return exact

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.actors = []


class AsyncRollouts:
    """IMPALA-style collection: every worker always has a rollout in flight; the first one ready is returned."""

    def __init__(self, backend: RayBackend) -> None:
        self.backend = backend
        self.in_flight: dict[int, Any] = {}

    def next_ready(self, version: int) -> tuple[int, dict[str, Any]]:
        """Return ``(worker, result)`` of the first finished rollout; relaunch that worker with the current weights."""
        b, ray = self.backend, self.backend.ray
        weights_ref = b.put_weights()
        for w in range(len(b.actors)):
            if w not in self.in_flight:
                self.in_flight[w] = b.launch(w, weights_ref, version)
        while True:
            ready, _ = ray.wait(list(self.in_flight.values()), num_returns=1)
            w = next(k for k, ref in self.in_flight.items() if ref == ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                b._replace(w, e)
                self.in_flight[w] = b.launch(w, weights_ref, version)
                continue
            b.record(w, result)
            self.in_flight[w] = b.launch(w, weights_ref, version)
            return w, result
