"""Rollouts on Ray actors: each actor hosts envs and a CPU copy of the policy, and returns whole ``[T, K]`` slices.

Unlike the other backends, the policy runs on the workers: across a cluster, one round
trip per step would cost more than the step. New weights go out with the next rollout
through the object store (one ``ray.put`` of NumPy arrays). :class:`collectors.RayCollector`
drives these actors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collectors.collector import RolloutCollector
from collectors.connection import RayConnectError, check_answers
from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S, Deadline
from collectors.env_group import EnvGroup, check_same_spaces
from collectors.processes import WorkerTimeoutError
from collectors.resources import largest_divisor_at_most, usable_cores
from collectors.seeding import env_seeds
from collectors.stop_signals import STOP_SIGNALS, stop_signals_blocked

log = logging.getLogger("collectors.ray")
_MAX_RESTARTS_PER_ROLLOUT = 3
PLACEMENT_TIMEOUT_S = 20.0  # how long the workers' resources may stay taken before we give up instead of hanging
# Ray reads this once, at import: "0" makes a local instance's node IP 127.0.0.1, so that every
# Ray server listens on loopback only (otherwise they listen on all interfaces)
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def require_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("backend='ray' needs Ray: pip install -e '.[ray]' (or pip install 'ray>=2.9')") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None):
    """Initialised Ray: the cluster at ``address``, a Ray already running in this process, or a new
    local instance with ``num_cpus`` CPUs (default: the cores this process may use) bound to 127.0.0.1."""
    if not address and "ray" not in sys.modules:
        os.environ.setdefault(_LOOPBACK_ENV, "0")
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address:
        check_answers(address)
        try:
            with _signals_kept():
                ray.init(address=address)
        except ConnectionError as e:
            if os.environ.get("RAY_AUTH_MODE") == "token":
                raise
            # it answers but refused us: what a cluster with token authentication does to a client without it
            raise RayConnectError(f"the Ray cluster at {address} refused this process ({e}); one started by `ray "
                                  "start` (Ray >= 2.59) uses token authentication: run with RAY_AUTH_MODE=token "
                                  "(the token in ~/.ray/auth_token or RAY_AUTH_TOKEN; docs/distributed.md, "
                                  "Security)") from None
        return ray
    if os.environ.get(_LOOPBACK_ENV) != "0":
        warnings.warn(f"ray was imported before {_LOOPBACK_ENV}=0 was set: the local Ray instance listens on all "
                      "interfaces; set it before importing ray (see docs/distributed.md, Security)", stacklevel=2)
    # "local": a new instance even where `ray start` left one running on this machine
    with _signals_kept(), _private_files():
        ray.init(address="local", num_cpus=num_cpus or usable_cores(), include_dashboard=False)
        _start_reaper()  # inside: it inherits the blocked stop signals, so none reaches it before it ignores them
    return ray


_REAPER: subprocess.Popen | None = None


def _start_reaper() -> None:
    """Start ``ray_reaper.py``: once this process is gone (even SIGKILLed), it kills the local instance's
    daemons and agents still running, which otherwise outlive a killed trainer by a minute."""
    global _REAPER
    if sys.platform.startswith("linux") and _REAPER is None:  # it reads /proc through psutil's children()
        _REAPER = subprocess.Popen([sys.executable, "-I", str(Path(__file__).with_name("ray_reaper.py")),
                                    str(os.getpid())], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)  # not our stdout: `| tee` ends with the trainer


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """``ray.init`` with this process's stop-signal handlers kept.

    Ray replaces the SIGTERM handler (Python: one that calls ``sys.exit``; C++: a crash handler that
    aborts); ours are put back afterwards. Stop signals are blocked meanwhile, and the daemons a
    local instance starts inherit that mask (Ray blocks SIGINT in them already): a scheduler's
    SIGTERM or SIGUSR1 to the whole process group is then this process's to handle, and does not
    kill the Ray instance under the run. A signal that arrives meanwhile is delivered afterwards.
    """
    if threading.current_thread() is not threading.main_thread():  # Ray installs nothing from other threads
        yield
        return
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    with stop_signals_blocked():
        try:
            yield
        finally:  # before the mask is lifted, so that a signal held back meets our handler
            for signum, handler in handlers.items():
                if handler is not None:  # None: installed from C, not by Python; nothing to put back
                    signal.signal(signum, handler)


@contextlib.contextmanager
def _private_files() -> Iterator[None]:
    """Files a new local Ray instance writes (its auth token, ``/tmp/ray/session_*``) are the user's alone."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def cluster_cpus(ray) -> tuple[float, float]:
    """CPUs of the whole Ray cluster, and of the node this process runs on (actors there share its cores)."""
    node = ray.get_runtime_context().get_node_id()
    here = sum(n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"] and n["NodeID"] == node)
    return float(ray.cluster_resources().get("CPU", 0.0)), float(here)


def _bundle(cpus: float, options: dict) -> dict[str, float]:
    """The resources one worker holds: its CPUs plus any custom resources and GPUs from its options."""
    bundle = {"CPU": cpus, **options.get("resources", {})}
    if options.get("num_gpus"):
        bundle["GPU"] = options["num_gpus"]
    return bundle


def _shortfall(bundles: list[dict[str, float]], have: dict[str, float], what: str) -> str:
    """``"8 CPU (cluster has 4)"``-style list of the resources ``bundles`` need beyond ``have``; empty if none."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return ", ".join(f"{v:g} {k} ({what} {have.get(k, 0.0):g})" for k, v in need.items()
                     if v > have.get(k, 0.0) + 1e-9)


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
    """A Ray actor's body: a local ``sync`` :class:`RolloutCollector` over this worker's envs.

    A subclass may return more, or something else, from :meth:`rollout` (``RayCollector(worker_cls=...)``);
    ``worker_kwargs`` reach its constructor.
    """

    def __init__(self, env_fns: list, policy: Any, num_steps: int, seeds: list[int], first_index: int,
                 policy_seed: int) -> None:
        torch.set_num_threads(1)
        if isinstance(getattr(policy, "generator", None), torch.Generator):
            policy.generator.manual_seed(policy_seed)  # sampling streams derived from the run seed
        self.collector = RolloutCollector(env_fns, policy, backend="sync", num_steps=num_steps, seed=seeds)
        self.first_index = first_index

    def rollout(self, weights: dict[str, np.ndarray] | None, version: int) -> dict[str, Any]:
        """One ``[T, K]`` rollout as NumPy arrays; ``weights`` (``None``: unchanged) are those of ``version``."""
        if weights is not None:
            self.collector.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
        rollout = self.collector.collect()
        episodes = [{**e, "env": e["env"] + self.first_index} for e in rollout.episodes]
        return {"batch": self.batch(rollout),
                "next_observations": rollout.next_observations.numpy(),
                "episodes": episodes, "version": version,
                "state": self.collector.get_state()}  # travels with the rollout: no extra round trip to save it

    def batch(self, rollout: Any) -> dict[str, np.ndarray]:
        """What goes back to the learner from a rollout: its ``[T, K]`` batch, as NumPy arrays."""
        return {k: v.numpy() for k, v in rollout.batch.items()}

    def get_state(self) -> dict[str, Any]:
        return self.collector.get_state()

    def set_state(self, state: dict[str, Any], reseed: int | None) -> bool:
        return self.collector.set_state(state, reseed)

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()


class RayWorkers:
    """``num_workers`` Ray actors with ``envs_per_worker`` env factories each.

    A rollout that does not come back within ``worker_timeout`` seconds (stretched to 20 times the
    slowest rollout measured; an actor's first gets at least 120 s) counts as a dead actor: replaced.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Any, num_steps: int, seed: int | list[int],
                 num_workers: int | None, envs_per_worker: int | None, ray_address: str | None,
                 cpus_per_worker: float = 1.0, worker_options: Sequence[dict] | dict | None = None,
                 worker_cls: type = RolloutWorker, worker_kwargs: dict[str, Any] | None = None,
                 worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S) -> None:
        self.deadline = Deadline(worker_timeout)
        ray = connect(ray_address)
        n = len(env_fns)
        total = ray.cluster_resources()
        if num_workers is None and envs_per_worker is None:  # as many equal slices as the cluster's CPUs hold
            num_workers = largest_divisor_at_most(n, int(total.get("CPU", 0.0) // cpus_per_worker + 1e-9))
        if num_workers is None:
            num_workers = n // envs_per_worker if envs_per_worker else n
        envs_per_worker = envs_per_worker or max(1, n // num_workers)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1 \
                or num_workers * envs_per_worker != n:
            raise ValueError(f"num_workers={num_workers!r} x envs_per_worker={envs_per_worker!r} must equal the "
                             f"number of env factories ({n}); e.g. num_workers={n}, envs_per_worker=1")
        self.ray = ray
        self.num_steps, self.policy = num_steps, policy
        self.explicit_seeds = None if isinstance(seed, int) else list(seed)
        self.seed = seed if self.explicit_seeds is None else self.explicit_seeds[0]  # derives restart seeds
        self.cpus_per_worker = cpus_per_worker
        self.worker_cls, self.worker_kwargs = worker_cls, dict(worker_kwargs or {})
        opts = worker_options if isinstance(worker_options, (list, tuple)) else [worker_options or {}] * num_workers
        if len(opts) != num_workers:
            raise ValueError(f"worker_options has {len(opts)} entries for {num_workers} workers")
        self.options = [dict(o) for o in opts]
        if any("scheduling_strategy" in o for o in self.options):
            raise ValueError("worker_options may not set scheduling_strategy: each worker runs in its bundle of "
                             "the workers' placement group; use resources={...} to choose nodes")
        self.groups = [list(env_fns[w * envs_per_worker:(w + 1) * envs_per_worker]) for w in range(num_workers)]
        self.actors: list = []
        self.pg = self._reserve([_bundle(cpus_per_worker, o) for o in self.options], total)
        self.restarts = 0
        self.events: list[str] = []
        try:
            self._start(ray.remote(num_cpus=cpus_per_worker)(_count_envs))
        except BaseException:
            self.close()  # releases the reserved resources
            raise

    def _start(self, count) -> None:
        """Learn the workers' env counts and spaces (one task per bundle), then start the actors."""
        counted = self._get([count.options(**o, scheduling_strategy=self._in_bundle(w)).remote(g)
                             for w, (g, o) in enumerate(zip(self.groups, self.options))], "building their envs")
        spaces = [s for _, group_spaces in counted for s in group_spaces]
        check_same_spaces(spaces)
        self.observation_space, self.action_space, _ = spaces[0]
        sizes = [c for c, _ in counted]
        self.num_envs = sum(sizes)
        starts = np.cumsum([0, *sizes])
        self.slices = [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
        if self.explicit_seeds is not None and len(self.explicit_seeds) != self.num_envs:
            raise ValueError(f"seed has {len(self.explicit_seeds)} entries for {self.num_envs} envs; pass one "
                             "integer or one seed per env")
        self.seeds = self.explicit_seeds or env_seeds(self.seed, self.num_envs)
        self.actor_cls = self.ray.remote(self.worker_cls)
        self.actors = [self._spawn(w, self.seeds[self.slices[w]]) for w in range(len(self.groups))]
        self.versions: list[int | None] = [0] * len(self.actors)  # the policy version each actor holds
        self.launched = [0.0] * len(self.actors)  # when each actor's rollout in flight was launched
        self.states: list[dict[str, Any] | None] = [None] * len(self.actors)

    def _reserve(self, bundles: list[dict[str, float]], total: dict[str, float]):
        """Reserve every worker's resources up front, or raise naming what is missing (never wait forever).

        A placement group holds the resources before any actor starts, so a slow actor start is
        never mistaken for a missing resource, and a replaced actor gets its bundle back.
        """
        from ray.util.placement_group import placement_group, remove_placement_group
        missing = _shortfall(bundles, total, "cluster has")
        if missing:
            raise ValueError(f"ray: {len(bundles)} workers need {missing}; lower num_workers or cpus_per_worker "
                             "(or the resources in worker_options), or add nodes")
        pg = placement_group(bundles, strategy="PACK")
        if not pg.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
            short = _shortfall(bundles, self.ray.available_resources(), "free")
            remove_placement_group(pg)
            raise ValueError(f"ray: {len(bundles)} workers could not be placed within {PLACEMENT_TIMEOUT_S:g} s: "
                             f"they need {short or 'a node that fits each worker whole'}; other actors or jobs "
                             "hold the rest: free them, lower num_workers or cpus_per_worker, or add nodes")
        return pg

    def _in_bundle(self, w: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=w)

    def _spawn(self, w: int, seeds: list[int]):
        policy_seed = int(np.random.SeedSequence([self.seed, w, self.restarts]).generate_state(1)[0])
        return self.actor_cls.options(num_cpus=self.cpus_per_worker, scheduling_strategy=self._in_bundle(w),
                                      **self.options[w]).remote(
            self.groups[w], self.policy, self.num_steps, list(seeds), self.slices[w].start, policy_seed,
            **self.worker_kwargs)

    def _replace(self, w: int, error: Exception) -> None:
        """Replace a dead (or silent) actor; its envs restart from seeds derived from the run seed and the restart
        count."""
        self.restarts += 1
        derived = int(np.random.SeedSequence([self.seed, 10_000 + self.restarts]).generate_state(1)[0])
        what = str(error) if isinstance(error, WorkerTimeoutError) else f"died ({type(error).__name__})"
        message = (f"ray worker {w} (envs {self.slices[w].start}-{self.slices[w].stop - 1}) {what}; replaced, "
                   "its envs reseeded, the rollout retried")
        log.warning(message)
        self.events.append(message)
        try:
            self.ray.kill(self.actors[w])
        except Exception:
            pass
        self.actors[w] = self._spawn(w, env_seeds(derived, self.slices[w].stop - self.slices[w].start))
        self.states[w], self.versions[w] = None, None

    def launch(self, w: int, weights_ref: Any, version: int):
        """Start worker ``w``'s next rollout; the weights travel only to a worker that lacks ``version``."""
        send = weights_ref if self.versions[w] != version else None
        self.versions[w] = version
        self.launched[w] = time.monotonic()
        return self.actors[w].rollout.remote(send, version)

    def limit(self, w: int) -> float:
        """Seconds worker ``w``'s rollout in flight may take (its first, or its first after a restore: start-up)."""
        return self.deadline.limit("start" if self.states[w] is None else "rollout")

    def silent(self, w: int) -> WorkerTimeoutError:
        """The error for worker ``w``, whose rollout in flight is past its deadline."""
        return WorkerTimeoutError(f"has been silent for {time.monotonic() - self.launched[w]:.1f} s during a "
                                  f"rollout (limit {self.limit(w):.3g} s: a hung env step or a stopped process; "
                                  "raise it with --worker-timeout / worker_timeout)")

    def put_weights(self) -> Any:
        return self.ray.put(policy_weights(self.policy))

    def rollout_all(self, weights_ref: Any, version: int) -> list[dict[str, Any]]:
        """One synchronous rollout of every worker with the weights of ``version`` (``weights_ref``);
        dead workers are replaced and retried."""
        refs = [self.launch(w, weights_ref, version) for w in range(len(self.actors))]
        results: list[dict[str, Any]] = [None] * len(refs)  # type: ignore[list-item]
        for w, ref in enumerate(refs):
            for attempt in range(_MAX_RESTARTS_PER_ROLLOUT + 1):
                try:
                    try:
                        results[w] = self.ray.get(ref, timeout=max(0.0, self.launched[w] + self.limit(w)
                                                                   - time.monotonic()))
                    except self.ray.exceptions.GetTimeoutError:
                        raise self.silent(w) from None
                    self.record(w, results[w])
                    break
                except (self.ray.exceptions.RayActorError, WorkerTimeoutError) as e:
                    if attempt == _MAX_RESTARTS_PER_ROLLOUT:
                        raise RuntimeError(f"ray worker {w} died {attempt + 1} times in one rollout") from e
                    self._replace(w, e)
                    ref = self.launch(w, weights_ref, version)
        return results

    def env_states(self) -> list[dict[str, Any]]:
        """Each actor's collector state after its newest received rollout (asked for where none came yet)."""
        missing = [w for w, s in enumerate(self.states) if s is None]
        for w, s in zip(missing, self._get([self.actors[w].get_state.remote() for w in missing], "get_state")):
            self.states[w] = s
        return list(self.states)

    def record(self, w: int, result: dict[str, Any]) -> None:
        """Worker ``w``'s rollout arrived: its time stretches the deadline (start-up aside), its state is kept."""
        if self.states[w] is not None:
            self.deadline.measured(time.monotonic() - self.launched[w])
        self.states[w] = result["state"]

    def set_env_states(self, states: Sequence[Any], reseed: int | None = None) -> bool:
        exact = all(self._get([a.set_state.remote(s, reseed) for a, s in zip(self.actors, states)], "set_state"))
        self.states = [None] * len(self.actors)
        return exact

    def _get(self, refs: list, what: str) -> list[Any]:
        """``ray.get`` of start-up and state calls, bounded: a worker that does not answer stops the collector."""
        limit = self.deadline.limit("start")
        try:
            return self.ray.get(refs, timeout=limit)
        except self.ray.exceptions.GetTimeoutError:
            raise WorkerTimeoutError(f"ray workers did not answer {what} within {limit:g} s (a hung env or a "
                                     "stopped process; raise it with --worker-timeout / worker_timeout)") from None

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.actors = []
        if getattr(self, "pg", None) is not None:
            from ray.util.placement_group import remove_placement_group
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None


class AsyncRollouts:
    """IMPALA-style collection: every worker always has a rollout in flight; the first one ready is returned."""

    def __init__(self, workers: RayWorkers) -> None:
        self.workers = workers
        self.in_flight: dict[int, Any] = {}

    def next_ready(self, weights_ref: Any, version: int) -> tuple[int, dict[str, Any]]:
        """Return ``(worker, result)`` of the first finished rollout; relaunch that worker with the weights
        of ``version`` (``weights_ref``)."""
        b, ray = self.workers, self.workers.ray
        for w in range(len(b.actors)):
            if w not in self.in_flight:
                self.in_flight[w] = b.launch(w, weights_ref, version)
        while True:
            due = min(b.launched[k] + b.limit(k) for k in self.in_flight)
            ready, _ = ray.wait(list(self.in_flight.values()), num_returns=1,
                                timeout=max(0.0, due - time.monotonic()))
            if not ready:  # the first one past its deadline is replaced, as if it had died
                w = min(self.in_flight, key=lambda k: b.launched[k] + b.limit(k))
                b._replace(w, b.silent(w))
                self.in_flight[w] = b.launch(w, weights_ref, version)
                continue
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
