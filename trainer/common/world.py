"""Data-parallel training under ``torchrun``: which rank this process is, among how many, and the few collectives
the loop and an update need.

A process started without ``torchrun`` is a world of one, where every collective returns its input: the code that
learns is the same at any world size, and a run made with 2 ranks resumes in one process and the other way round.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
_ALIVE = "parallel_rollouts/alive"  # the rendezvous store's keys by which ranks that met a failure say they live


class RankLostError(RuntimeError):
    """Another rank stopped answering (it died, hung or was stopped): what was completed is saved, and the run
    stops. ``lost``: the ranks that did not answer (empty where that could not be told)."""

    def __init__(self, message: str, lost: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.lost = list(lost)


class WorldEnvironmentError(ValueError):
    """The environment that describes a data-parallel run (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``: torchrun sets them) is wrong, or its ranks did not meet there."""


_UNDER_TORCHRUN = ("start the ranks with torchrun, which sets these variables (docs/distributed.md), or unset "
                   "WORLD_SIZE to train in one process")


def _variable(env: Mapping[str, str], name: str, default: int | None, low: int, high: int | None) -> int:
    """The integer environment variable ``name`` (``default`` where unset; ``None``: it must be set), within
    ``low .. high``; :class:`WorldEnvironmentError` naming it otherwise."""
    text = env.get(name)
    if text is None and default is not None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low or high is not None and value > high:
        within = f"an integer >= {low}" if high is None else f"an integer within {low} .. {high}"
        raise WorldEnvironmentError(f"{name}={text!r} in the environment: must be {within}"
                                    + (f" (WORLD_SIZE={env.get('WORLD_SIZE')})" if name != "WORLD_SIZE" else "")
                                    + f"; {_UNDER_TORCHRUN}")
    return value


class LeadFailedError(RuntimeError):
    """What rank 0 was doing for every rank (:meth:`World.from_lead`) failed; rank 0 says why."""


@dataclass(frozen=True)
class World:
    """This process's place in a data-parallel run (``torchrun``'s ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``); ``World()`` is one process alone.

    Rank ``r`` of ``size`` steps the envs :meth:`envs` gives it, out of the run's ``--num-envs``; rank 0 (the
    ``lead``) writes every file and says every line.

    Example:
        >>> world = World(size=4, rank=1, local_rank=1, local_size=2)
        >>> world.envs(64), world.lead, world.nodes
        (slice(16, 32, None), False, 2)
        >>> World().mean_(torch.ones(2)).tolist()  # alone, a collective is the identity
        [1.0, 1.0]
    """

    size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_size: int = 1
    hosts: tuple[str, ...] = ()  # each rank's host, once started

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> World:
        """The world ``torchrun`` describes in the environment; one process alone without it. A
        :class:`WorldEnvironmentError` names the variable that is wrong (set by hand: not an integer, a ``RANK``
        outside ``0 .. WORLD_SIZE - 1``, no ``MASTER_ADDR`` or ``MASTER_PORT`` for the ranks to meet at)."""
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env:
            return cls()
        size = _variable(env, "WORLD_SIZE", None, 1, None)
        world = cls(size=size, rank=_variable(env, "RANK", 0, 0, size - 1),
                    local_size=_variable(env, "LOCAL_WORLD_SIZE", size, 1, size))
        world = replace(world, local_rank=_variable(env, "LOCAL_RANK", 0, 0, world.local_size - 1))
        if size > 1:
            missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name, "").strip()]
            if missing:
                raise WorldEnvironmentError(f"WORLD_SIZE={size} but {' and '.join(missing)} "
                                            f"{'is' if len(missing) == 1 else 'are'} not set: the ranks meet there; "
                                            f"{_UNDER_TORCHRUN}")
            _variable(env, "MASTER_PORT", None, 1, 65535)
        return world

    @property
    def lead(self) -> bool:
        """Rank 0: the one that writes the run's files and says its lines."""
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.size // max(1, self.local_size))

    def envs(self, num_envs: int) -> slice:
        """The global env indices this rank steps: its equal, consecutive share of ``num_envs``."""
        share = num_envs // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def host(self, rank: int) -> str:
        return self.hosts[rank] if rank < len(self.hosts) else "?"

    def describe(self) -> str:
        if self.size == 1:
            return ""
        return (f"world: {self.size} ranks ({self.nodes} node{'s' if self.nodes > 1 else ''} x {self.local_size}), "
                f"rank 0 on {self.host(0)} writes the run's files")

    # ------------------------------------------------------------------ starting and ending
    def started(self, device: str, timeout_s: float) -> World:
        """Join the process group (NCCL for a CUDA learner, gloo on the CPU), this rank bound to
        ``cuda:LOCAL_RANK``; a collective that waits longer than ``timeout_s`` raises, never NCCL's 10 minutes.
        Returns the world with every rank's host."""
        if self.size == 1 or dist.is_initialized():
            return self if self.size == 1 else replace(self, hosts=tuple(self.gather_objects(socket.gethostname())))
        _sigterm_when_torchrun_dies()
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(self.local_rank)
            # a collective that times out raises here (RankLostError) instead of NCCL's watchdog ending the
            # process: rank 0 then saves what was completed
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        timeout = datetime.timedelta(seconds=timeout_s)
        with self._meeting(timeout_s):
            dist.init_process_group("nccl" if cuda else "gloo", store=_attempt_store(self, timeout), rank=self.rank,
                                    world_size=self.size, timeout=timeout,
                                    **({"device_id": torch.device("cuda", self.local_rank)} if cuda else {}))
            return replace(self, hosts=tuple(self.gather_objects(socket.gethostname())))

    @contextlib.contextmanager
    def _meeting(self, timeout_s: float) -> Iterator[None]:
        """The rendezvous, whose failure (no rank 0 at ``MASTER_ADDR:MASTER_PORT``, a port in use, ranks missing
        after ``timeout_s``: torch's 30-frame ``DistStoreError``) is a :class:`WorldEnvironmentError` naming the
        variables, in one line."""
        held = _HeldStderr()
        try:
            with held:
                yield
        except (RuntimeError, OSError, ValueError) as e:  # (torch's DistError kinds are RuntimeErrors)
            if isinstance(e, (RankLostError, WorldEnvironmentError)):
                raise
            where = f"MASTER_ADDR={os.environ.get('MASTER_ADDR')} MASTER_PORT={os.environ.get('MASTER_PORT')}"
            raise WorldEnvironmentError(
                f"rank {self.rank} of WORLD_SIZE={self.size} did not meet the other ranks at {where} within "
                f"--worker-timeout {timeout_s:g} s ({_why(e)}): check WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT "
                f"on every rank, that rank 0 runs and its port is free; {_UNDER_TORCHRUN}") from None

    def close(self) -> None:
        """Leave the process group (after the last collective)."""
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ collectives
    def mean_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks, in place (gradients, a rank's share of a mean over equal shares).

        On gloo (CPU ranks) every rank's ``t`` is gathered and summed here, in rank order: for the gradient of the
        VR-edge model (13,575 floats, 2 ranks) that takes 0.7 ms where gloo's all-reduce takes 1.8 ms
        (docs/benchmarks.md); NCCL's all-reduce is the fast one on GPUs."""
        if self.size == 1:
            return t
        with self._answered():
            if dist.get_backend() == "nccl":
                dist.all_reduce(t, dist.ReduceOp.SUM)
            else:
                everyone = torch.empty(self.size * t.numel(), dtype=t.dtype, device=t.device)
                _all_gather_single(everyone, t.contiguous().view(-1))
                torch.sum(everyone.view(self.size, *t.shape), 0, out=t)
        return t.div_(self.size)

    def most(self, value: int) -> int:
        """The largest of every rank's ``value`` (a stop signal any rank received)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._device())
        with self._answered():
            dist.all_reduce(t, dist.ReduceOp.MAX)
        return int(t.item())

    def gather_envs(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's ``t`` (this rank's envs along ``dim``) concatenated in rank order: the run's envs."""
        if self.size == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        with self._answered():
            dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim)

    def gather_objects(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order (picklable objects: episode records, collector states)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        with self._answered():
            dist.all_gather_object(out, obj)
        return out

    def from_lead(self, make: Callable[[], T]) -> T:
        """What ``make()`` returns on rank 0, on every rank (``make`` runs on rank 0 only); an exception it raises
        is raised on rank 0, and on the others as :class:`LeadFailedError` (rank 0 says it; they stop with it)."""
        if self.size == 1:
            return make()
        box: list[Any] = [None]
        if self.lead:
            try:
                box[0] = ("value", make())
            except Exception as e:
                dist.broadcast_object_list([("error", f"{type(e).__name__}: {e}")], src=0)  # all stop together
                raise
        with self._answered():
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise LeadFailedError(f"rank 0 stopped the run ({value})")
        return value

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Give every rank rank 0's values of ``tensors``, in place (weights at the start and after a resume)."""
        if self.size > 1:
            with self._answered():
                for t in tensors:
                    dist.broadcast(t, src=0)

    def batch_moments(self, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Mean, population variance and count over the first axis of every rank's ``samples`` together (the
        observation normaliser's and the return scaler's statistics of one rollout of the run's envs)."""
        mean, var, count = samples.mean(0), samples.var(0, unbiased=False), samples.shape[0]
        if self.size == 1:
            return mean, var, count
        means, variances = self.gather_envs(mean[None]), self.gather_envs(var[None])  # [size, ...], equal counts
        total_mean = means.mean(0)
        return total_mean, (variances + (means - total_mean) ** 2).mean(0), count * self.size

    @contextlib.contextmanager
    def _answered(self) -> Iterator[None]:
        """A collective whose failure (a rank died: the connection is lost; or hung: the group's timeout) is a
        :class:`RankLostError` naming the ranks that stopped answering, and their hosts."""
        try:
            yield
        except RuntimeError as e:
            if isinstance(e, RankLostError):
                raise
            lost = self._silent_ranks()
            who = ", ".join(f"rank {r} on {self.host(r)}" for r in lost) if lost else "another rank"
            raise RankLostError(f"{who} stopped answering ({_why(e)}); rank {self.rank} stops too", lost) from None

    def _silent_ranks(self, patience_s: float = 3.0) -> list[int]:
        """The ranks that do not say they are alive within ``patience_s`` (each rank that meets a failed collective
        says so in the rendezvous store); ``[]`` where the store cannot tell."""
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(f"{_ALIVE}/{self.rank}", "1")
            deadline = time.monotonic() + patience_s
            while True:
                silent = [r for r in range(self.size) if not store.check([f"{_ALIVE}/{r}"])]
                if not silent or time.monotonic() > deadline:
                    return silent
                time.sleep(0.05)
        except Exception:  # the store went with the failure (its host died): the line says "another rank"
            return []

    def _device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")


# all_gather_into_tensor's new name (torch 2.10); the old one warns that it is deprecated there
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _sigterm_when_torchrun_dies() -> None:
    """A SIGTERM to this rank if its torchrun (its parent, the elastic agent) dies (Linux): torchrun starts each
    rank in a session of its own, so a signal that ends torchrun without being passed on (SIGUSR1 to its group,
    its default action) would leave the ranks training with no one to stop them. With it they agree, save and
    exit."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() == 1:  # it died before the line above: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _attempt_store(world: World, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store (torchrun's agent hosts it; without one, rank 0), its keys under this attempt's name:
    after a ``--max-restarts`` restart, the agent's store still holds the dead attempt's addresses, and a rank that
    read one would connect to a process that is gone."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world.size,
                          is_master=not agent and world.lead, timeout=timeout, multi_tenant=not agent)
    return dist.PrefixStore(f"parallel_rollouts/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


class _HeldStderr:
    """Standard error (the descriptor: c10d's C++ lines, one per failed connection attempt) held in a temporary file
    for a block, and written out after it only where it ends without an exception: a failed rendezvous is said in
    the caller's one line, not under dozens of retry warnings."""

    def __enter__(self) -> _HeldStderr:
        sys.stderr.flush()
        self.saved, self.file = os.dup(2), tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        with self.file:
            if kind is None:
                self.file.seek(0)
                held = self.file.read()
                if held:  # (a test's captured stderr may have no buffer: text then)
                    buffer = getattr(sys.stderr, "buffer", None)
                    buffer.write(held) if buffer is not None else sys.stderr.write(held.decode(errors="replace"))
                    sys.stderr.flush()


def _why(error: RuntimeError) -> str:
    """A failed collective's reason, without the backend's source location and advice: ``"Connection closed by
    peer [10.0.0.2]:4312"``, ``"Timed out waiting 60000ms for recv operation to complete"``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip().splitlines()[0] if str(error).strip() else "")
    return text.split(". ")[0] or type(error).__name__


@contextlib.contextmanager
def joined_world(device: str, timeout_s: float) -> Iterator[World]:
    """This process's :class:`World` for one run: under torchrun, the process group joined for it (``device``:
    the learner's, which picks NCCL or gloo) and left after it, unless the caller had joined one already; alone,
    ``World()``."""
    world = World.from_environment()
    if world.size == 1 or dist.is_initialized():
        yield world.started(device, timeout_s)
        return
    world = world.started(device, timeout_s)
    try:
        yield world
    finally:
        world.close()


ALONE = World()  # one process without torchrun: every collective is the identity
