"""What this process may use (cores allowed by CPU affinity and cgroup quotas) and thread budgets.

    >>> usable_cores() >= 1
    True
    >>> async_workers(cores=16, units=64), async_workers(cores=1, units=64), async_workers(cores=16, units=1)
    ((15, True), (1, False), (1, False))
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> \
        float | None:
    """CPUs this process's cgroup may use per period (v2 ``cpu.max`` or v1 CFS quota); ``None`` if unlimited.

    Containers and schedulers (Docker ``--cpus``, Kubernetes limits, SLURM with cgroups) cap CPU
    time this way without changing the affinity mask, so ``os.cpu_count()`` alone overcounts.
    """
    for where, version in _cgroup_dirs(root, proc_cgroup, "cpu", ("cpu", "cpu,cpuacct")):
        try:
            if version == "v2":
                quota, period = (where / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    return int(quota) / int(period)
            else:
                quota = int((where / "cpu.cfs_quota_us").read_text())
                if quota > 0:
                    return quota / int((where / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None  # the first readable file decides: parents' limits apply to the whole subtree anyway
    return None


def cgroup_memory_available(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
                            ) -> int | None:
    """Bytes this process's cgroup may still allocate (v2 ``memory.max - memory.current``, v1 ``limit_in_bytes -
    usage_in_bytes``); ``None`` if unlimited.

    Why: a container or a SLURM job is killed at its cgroup's limit, while ``psutil.virtual_memory()`` reports the
    whole machine's memory.
    """
    for where, version in _cgroup_dirs(root, proc_cgroup, "memory", ("memory",)):
        try:
            if version == "v2":
                limit = (where / "memory.max").read_text().strip()
                if limit == "max":
                    return None
                return max(0, int(limit) - int((where / "memory.current").read_text()))
            limit = int((where / "memory.limit_in_bytes").read_text())
            if limit >= 1 << 60:  # v1 says "unlimited" with a page-rounded 2**63
                return None
            return max(0, limit - int((where / "memory.usage_in_bytes").read_text()))
        except (OSError, ValueError):
            continue
    return None


def _cgroup_dirs(root: Path, proc_cgroup: Path, controller: str, v1_names: tuple[str, ...]) -> list[tuple[Path, str]]:
    """The folders that may hold this process's cgroup limits of ``controller``, nearest first, each with its
    version (``"v2"``: the unified hierarchy; ``"v1"``: ``controller``'s own, mounted under one of ``v1_names``)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    candidates: list[tuple[Path, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2: one unified hierarchy
            candidates += [(root / rel, "v2"), (root, "v2")]
        elif controller in controllers.split(","):
            for name in (controllers, *v1_names):
                candidates += [(root / name / rel, "v1"), (root / name, "v1")]
    return candidates


def usable_cores() -> int:
    """Cores this process may keep busy: min(CPUs in its affinity mask, cgroup quota, physical cores).

    A SLURM job given 4 cores of a 128-core node gets 4; hyperthreads do not count twice.
    """
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        allowed = len(psutil.Process().cpu_affinity() or []) if hasattr(psutil.Process, "cpu_affinity") else 0
    allowed = allowed or psutil.cpu_count(logical=True) or 1
    limits = [allowed, psutil.cpu_count(logical=False) or allowed]
    quota = cgroup_cpu_limit()
    if quota is not None:
        limits.append(max(1, math.floor(quota)))
    return max(1, min(limits))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows): timings are only comparable on
    the same one."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def async_workers(cores: int, units: int) -> tuple[int, bool]:
    """Default ``(worker processes, main_share)`` for ``units`` env factories on ``cores`` cores.

    One busy process per core: ``cores - 1`` workers plus the collecting process stepping a
    share; with one core or one factory, a single worker and an idle collecting process.
    """
    workers = max(1, min(cores, units) - 1)
    return workers, workers < min(cores, units)


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is ``<= cap`` (at least 1): equal slices per worker."""
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: unchanged), then restore the previous count."""
    before = torch.get_num_threads()
    if n is None:
        yield
        return
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:  # also where the block changed it (the trainer's thread plan does)
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds spent so far on the CPUs this process may run on, and by this process and its children."""

    wall: float
    busy: float  # by everything, on the CPUs of this process's affinity mask
    own: float  # by this process and its live children (worker processes)


def cpu_sample() -> CpuSample:
    """Now's :class:`CpuSample` (a few ms: it lists this process's children)."""
    per_cpu = psutil.cpu_times(percpu=True)
    try:
        allowed = [per_cpu[i] for i in sorted(os.sched_getaffinity(0)) if i < len(per_cpu)]
    except AttributeError:  # macOS, Windows
        allowed = per_cpu
    busy = sum(t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
               for t in allowed)
    me = psutil.Process()
    own = 0.0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child that ended meanwhile
            times = proc.cpu_times()
            own += times.user + times.system
    return CpuSample(time.perf_counter(), busy, own)


def cores_busy_elsewhere(before: CpuSample, after: CpuSample) -> float:
    """Cores other processes kept busy between two samples (0 on an idle machine; 2 next to two busy loops that
    had the cores to themselves)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)
