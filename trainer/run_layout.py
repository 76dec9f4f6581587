"""The run layout: how one training run is spread over the machine it runs on, decided once.

The rule: busy processes never outnumber the cores this process may use. ``async`` runs
``cores - 1`` worker processes next to the collecting process (which steps a share); Ray gets
as many actors as the cluster's CPUs hold (one CPU kept for the learner where it learns while
actors on its node collect). Workers and actors use one torch thread each; the collecting
process may use the cores the workers leave free while it collects, and all of its cores while it
learns (the workers are idle then): how many of those it uses is measured (``trainer.thread_plan``).
``--num-workers``, ``envs_per_worker`` and ``--threads`` override this; more than the cores is allowed with a
warning.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import psutil
import torch

from collectors import watchdog
from collectors.processes import start_method_of
from collectors.resources import async_workers, cgroup_memory_available, largest_divisor_at_most, usable_cores
from collectors.seeding import env_seeds
from envs.profiles import profile_of, profiled_envs
from envs.settings import ConfigError
from trainer.arguments import counted
from trainer.common.devices import compile_unavailable, learner_device
from trainer.common.spaces import check_env_id
from trainer.common.world import ALONE, World
from trainer.config import TrainConfig, format_env_kwargs
from trainer.registry import algorithm_spec


def memory_available() -> int:
    """Bytes of memory this process may still use: the machine's available memory, or less where a cgroup (a
    container, a SLURM job) limits it."""
    return min(psutil.virtual_memory().available, cgroup_memory_available() or math.inf)  # a job's own limit


@dataclass(frozen=True)
class Machine:
    """What a run may use: cores (affinity and cgroup quota), GPUs, memory, and for Ray the cluster's CPUs.

    Tests build one by hand to simulate machines they do not have:

        >>> Machine(cores=16, gpus=1, memory=128 << 30)
        Machine(cores=16, gpus=1, ray_cpus=None, ray_cpus_here=0.0, memory=137438953472, gpu_memory=None)
    """

    cores: int
    gpus: int = 0
    ray_cpus: float | None = None  # CPUs of the whole Ray cluster (ray backend only)
    ray_cpus_here: float = 0.0  # of those, on this machine: actors there compete with the learner
    memory: int | None = None  # bytes of memory available to the run (None: not known, and not checked)
    gpu_memory: int | None = None  # bytes free on the learner's GPU (None: no GPU, or not known, and not checked)

    @classmethod
    def detect(cls, backend: str = "sync", ray_address: str = "", device: str = "cpu") -> Machine:
        """This machine; for ``backend="ray"`` also connects to (or starts) Ray to read its CPUs; the memory free on
        the GPU the learner's ``device`` (``--device``) names, where that is one."""
        cores, gpus = usable_cores(), torch.cuda.device_count()
        memory = memory_available()
        learner = learner_device(device, gpus) if gpus else "cpu"  # (no GPU: --device cuda is refused elsewhere)
        gpu_memory = torch.cuda.mem_get_info(torch.device(learner))[0] if learner != "cpu" else None
        if backend != "ray":
            return cls(cores, gpus, memory=memory, gpu_memory=gpu_memory)
        from collectors.backends.ray_ import cluster_cpus, connect
        return cls(cores, gpus, *cluster_cpus(connect(ray_address or None, num_cpus=cores)), memory=memory,
                   gpu_memory=gpu_memory)

    def share(self, world: World) -> Machine:
        """What one rank of ``world`` may use of this node: its share of the cores and the memory, and one GPU
        (``cuda:LOCAL_RANK``) where there are any."""
        if world.size == 1:
            return self
        sharing = -(-world.local_size // self.gpus) if self.gpus else 1  # ranks on one GPU
        return dataclasses.replace(self.split(world.local_size), gpus=min(self.gpus, 1),
                                   gpu_memory=self.gpu_memory // sharing if self.gpu_memory is not None else None)

    def split(self, parts: int) -> Machine:
        """What one of ``parts`` processes sharing this node may use: its share of the cores (at least one) and
        of the memory, and of the GPU memory (they share the GPUs).

        >>> Machine(cores=16, gpus=1, memory=64 << 30).split(4)
        Machine(cores=4, gpus=1, ray_cpus=None, ray_cpus_here=0.0, memory=17179869184, gpu_memory=None)
        """
        def part(memory: int | None) -> int | None:
            return memory // parts if memory is not None else None
        return dataclasses.replace(self, cores=max(1, self.cores // parts), memory=part(self.memory),
                                   gpu_memory=part(self.gpu_memory))


@dataclass(frozen=True)
class RunLayout:
    """One run's shape on one machine: env factories, workers, threads. Made by :func:`run_layout`.

        >>> from trainer.config import TrainConfig
        >>> layout = run_layout(TrainConfig(env="VREdge-v0", backend="async", num_envs=64), Machine(cores=16))
        >>> layout.workers, layout.factory_envs[:2], layout.collect_threads, layout.learn_threads
        (15, (4, 4), 1, 16)
    """

    env: str
    env_kwargs: dict[str, Any]  # --env-kwargs
    backend: str
    num_envs: int
    device: str
    factory_envs: tuple[int, ...]  # envs each factory builds (a vector env's size, or 1)
    vectorized: bool  # factories build one natively batched env each
    workers: int  # async worker processes or Ray actors (0: everything in this process)
    main_share: bool  # async: the collecting process steps a share of the envs too
    num_splits: int  # async: env groups stepped double-buffered (1: lockstep)
    factories_per_worker: int  # ray: env factories per actor
    cpus_per_worker: float  # ray: CPUs reserved per actor
    ray_address: str
    worker_timeout: float  # seconds a worker process, the collecting process or an actor may stay silent
    start_method: str  # how async workers and the --overlap collecting process start: forkserver or spawn
    keep_collecting: bool  # Ray actors keep collecting while the learner learns (AlgorithmSpec.keep_collecting)
    overlap: bool  # a separate collecting process keeps collecting while this one learns
    collect_threads: int  # most torch threads of the collecting process while it collects (trainer.thread_plan)
    learn_threads: int  # ... and while it learns
    worker_threads: int  # torch threads of each worker process or actor
    compile: bool  # the acting step (policy, and a torch env's step) runs torch.compile'd (--compile)
    cuda_graphs: bool  # PPO's minibatch step captured as a CUDA graph, and a compiled acting step on CUDA too
    batch_envs: int  # envs in one learner batch of the run, every rank's (keep_collecting: one actor's slice)
    machine: Machine  # this rank's share of its node
    warnings: tuple[str, ...] = ()
    world: World = ALONE  # torchrun's ranks: this one steps num_envs of them, world.envs(batch_envs)

    @property
    def acting_compile(self) -> bool | str:
        """How the acting step is compiled: not (False), as fixed-shape graphs (True), or, on CUDA with
        ``--cuda-graphs``, also captured as CUDA graphs (inductor's ``"reduce-overhead"``)."""
        if self.compile and self.cuda_graphs and self.backend == "device":
            return "reduce-overhead"
        return self.compile

    def env_factories(self) -> list[Callable[[], Any]]:
        """Picklable zero-argument factories, one per entry of ``factory_envs``."""
        if self.backend == "device":
            return [functools.partial(profile_of(self.env).torch_env_class(), self.num_envs,
                                      compile=self.acting_compile, **self.env_kwargs)]
        if self.vectorized:  # natively batched: one vector env per process or actor
            batched = profile_of(self.env).vector_env_class()
            return [functools.partial(batched, n, **self.env_kwargs) for n in self.factory_envs]
        return [functools.partial(gym.make, self.env, **self.env_kwargs)] * len(self.factory_envs)

    def collector_seed(self, seed: int) -> int | list[int]:
        """The collector's ``seed``: the run seed, or under torchrun the seeds this rank's envs have in the run (the
        ones they get in one process: no two ranks share one, on any node)."""
        if self.world.size == 1:
            return seed
        return env_seeds(seed, self.batch_envs)[self.world.envs(self.batch_envs)]

    def collector_kwargs(self) -> dict[str, Any]:
        """The ``make_collector`` options this layout fixes (besides env factories, policy, num_steps, seed)."""
        kw: dict[str, Any] = {"num_threads": self.collect_threads}
        if self.backend != "ray":  # Ray actors act with their own copies, eagerly
            kw["compile_policy"] = self.acting_compile
        if self.overlap:
            kw.update(background=True, worker_timeout=self.worker_timeout, start_method=self.start_method)
        if self.backend in ("serial", "sync"):  # the envs of this process (or of its collecting process)
            kw.update(worker_timeout=self.worker_timeout)
        if self.backend == "async":
            kw.update(worker_timeout=self.worker_timeout, start_method=self.start_method)
            kw.update(num_workers=self.workers, main_share=self.main_share, num_splits=self.num_splits)
        elif self.backend == "ray":
            kw.update(num_workers=self.workers, envs_per_worker=self.factories_per_worker,
                      ray_address=self.ray_address or None, cpus_per_worker=self.cpus_per_worker,
                      keep_collecting=self.keep_collecting, worker_timeout=self.worker_timeout)
        return kw

    def describe(self) -> str:
        """Two lines for the start of a run."""
        m = self.machine
        where = f"{counted(m.cores, 'core')}, {counted(m.gpus, 'GPU')}"
        if m.ray_cpus is not None:
            where += f", Ray cluster {m.ray_cpus:g} CPUs ({m.ray_cpus_here:g} here)"
        sizes = sorted(set(self.factory_envs))
        per = "-".join(str(s) for s in (sizes[0], sizes[-1]) if s) if len(sizes) > 1 else str(sizes[0])
        batched = f"{'VREdgeTorchEnv' if self.backend == 'device' else 'VREdgeVectorEnv'}({per})"
        kind = f"{len(self.factory_envs)} x {batched if self.vectorized else 'gym.make'}"
        here = "the collecting process" if self.overlap else "this process"
        if self.backend == "async":
            procs = counted(self.workers, "worker process", "worker processes")
            procs += " (spawned)" if self.start_method == "spawn" else ""
            procs += f" + {here}" if self.main_share else ""
            if self.num_splits > 1:
                procs += f", {self.num_splits} env groups double-buffered"
        elif self.backend == "ray":
            procs = f"{counted(self.workers, 'Ray actor')} x {self.cpus_per_worker:g} CPU, " \
                    f"{counted(self.factories_per_worker, 'factory', 'factories')} each"
        elif self.backend == "device":
            procs = f"{here}, env stepped as torch tensors next to the acting policy"
        else:
            procs = here
        if self.overlap:
            procs += ", collecting the next rollout while this process learns (--overlap"
            procs += ", spawned)" if self.start_method == "spawn" else ")"
        if self.compile:
            procs += ", acting step compiled (--compile)"
        if self.cuda_graphs:
            procs += (", acting step and " if self.acting_compile == "reduce-overhead" else ", ") + \
                "PPO minibatch step captured as CUDA graphs (--cuda-graphs)"
        arguments = f" ({format_env_kwargs(self.env_kwargs)})" if self.env_kwargs else ""  # from flags or TOML
        envs = counted(self.num_envs, "env") + (f" on each of {self.world.size} ranks" if self.world.size > 1 else "")
        world = f"\n{self.world.describe()}" if self.world.size > 1 else ""
        where += " per rank" if self.world.size > 1 else ""
        return (f"layout: {self.env}{arguments}, {envs} as {kind}; {self.backend}: {procs}; "
                f"{where}; learner on {self.device}\n"
                f"thread limits: {f'{self.worker_threads} per worker, ' if self.workers else ''}{here} at most "
                f"{self.collect_threads} collecting, this process at most {self.learn_threads} learning "
                f"(override: --num-workers, envs_per_worker, --threads){world}")

    def iterations(self, cfg: TrainConfig) -> int:
        """Iterations of the whole run: ``cfg.total_steps`` in learner batches of ``batch_envs x num_steps``."""
        return whole_iterations(cfg.total_steps, self.batch_envs * cfg.num_steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def whole_iterations(total_steps: int, batch: int) -> int:
    """Iterations of ``batch`` env steps a run of ``total_steps`` makes (at least one)."""
    return max(1, total_steps // batch)


def _compiled(cfg: TrainConfig, device: str, notes: list[str]) -> bool:
    """Whether the hot paths run compiled: ``--compile on``; ``auto`` with ``--backend device``, or on a CPU
    backend once the run is long enough for the algorithm's measured gain to pay for compiling
    (``AlgorithmSpec.compile_pays_after``).

    Why: eagerly, a step pays a dispatch for each of ~100 small ops, which inductor fuses; on a
    2-core CPU compiled VR-edge PPO ran 1.39x faster (``sync`` and ``device``), after ~23 s of
    compiling with a cold cache (docs/benchmarks.md): a short run, like most tests, is faster
    eagerly.
    """
    if cfg.compile == "off":
        return False
    if cfg.compile == "auto" and not _long_enough_to_compile(cfg):
        return False
    if cfg.backend == "ray":
        notes.append("--compile on is ignored by --backend ray: its actors act with their own eager copies")
        return False
    why = compile_unavailable(device if cfg.backend == "device" else "cpu")
    if why is None:
        return True
    fix = "install a C++ compiler (e.g. apt install g++) and Python's headers" if device == "cpu" or \
        cfg.backend != "device" else "install Triton (it comes with PyTorch's CUDA wheels)"
    if cfg.compile == "on":
        raise ConfigError("compile", cfg.compile,
                          message=f"--compile on: torch.compile cannot build code here ({why}); {fix}, or use "
                                  "--compile off")
    notes.append(f"--compile auto: torch.compile cannot build code here ({why}), so the acting step runs eagerly "
                 f"(slower); {fix} to compile it, or pass --compile off to silence this")
    return False


def _long_enough_to_compile(cfg: TrainConfig) -> bool:
    """``--compile auto``'s rule of length: always for ``--backend device``, never for Ray (its actors act
    eagerly), else once ``--total-steps`` reaches the algorithm's ``compile_pays_after`` (as typed: 2M is 2M,
    though the run rounds it down to whole iterations)."""
    if cfg.backend in ("device", "ray"):
        return cfg.backend == "device"
    pays_after = algorithm_spec(cfg.algo).compile_pays_after
    return pays_after is not None and cfg.total_steps >= pays_after


def compile_kept_on_resume(cfg: TrainConfig, stored: dict[str, Any],
                           given: Collection[str]) -> tuple[TrainConfig, str]:
    """A resumed run's ``--compile auto`` as the run decided it, with a note; ``(cfg, "")`` where nothing changes.

    ``auto`` weighs the run's length: a resume with another ``--total-steps`` would otherwise switch a compiled run
    to eager (or an eager one to compiled) and its numbers with it, unsaid. Kept as ``on`` or ``off`` in the
    resumed config, so that later resumes keep it too. ``--compile auto`` given decides anew, and says so when the
    decision changes. ``stored``: the checkpoint's config."""
    if cfg.compile != "auto":
        return cfg, ""
    before = stored["compile"] == "on" if stored["compile"] != "auto" else \
        _long_enough_to_compile(dataclasses.replace(cfg, total_steps=stored["total_steps"]))
    now = _long_enough_to_compile(cfg)
    if before == now:
        return cfg, ""
    was = f"the run {'compiled' if before else 'ran eagerly'} so far"
    if "compile" in given:
        return cfg, (f"--compile auto: {was}, and {'compiles' if now else 'runs eagerly'} for --total-steps "
                     f"{cfg.total_steps:,} from here on (compiled kernels round differently: its numbers change)")
    kept = "on" if before else "off"
    return dataclasses.replace(cfg, compile=kept), (
        f"--compile auto: {was}, and goes on so (--compile {kept}; pass --compile auto to decide again by "
        f"--total-steps {cfg.total_steps:,})")


def cuda_graphs_on(cfg: TrainConfig, device: str) -> bool:
    """Whether the algorithm's minibatch step is captured as a CUDA graph: ``--cuda-graphs true`` (a setting of the
    algorithms that capture one) on a CUDA learner (on any other device it is refused, naming the fix)."""
    wanted = getattr(cfg.algo_settings, "cuda_graphs", False)
    if wanted and not device.startswith("cuda"):
        raise ConfigError("cuda_graphs", True, f"needs a CUDA learner, but this run learns on {device}: use --device "
                          "cuda on a machine with a GPU, or --cuda-graphs false")
    return wanted


def run_layout(cfg: TrainConfig, machine: Machine, world: World = ALONE) -> RunLayout:
    """The layout of ``cfg`` on ``machine`` (this rank's share under torchrun: ``world``); ``ConfigError`` if not."""
    check_env_id(cfg.env)
    machine = _rank_share(cfg, machine, world)
    n, notes = cfg.num_envs // world.size, []
    # the algorithm decides whether its Ray actors keep collecting while it learns (IMPALA's and Ape-X's do)
    keep_collecting = cfg.backend == "ray" and algorithm_spec(cfg.algo).keep_collecting(cfg)
    _check_torch_env(cfg)
    vectorized = bool(profile_of(cfg.env).vector_env) and cfg.backend != "serial"
    notes += _ray_settings_ignored(cfg)
    # --overlap: the collecting process (and its workers) keep collecting while this one learns,
    # so collection gets the cores but one, and learning the cores collection leaves
    collect_cores = max(1, machine.cores - 1) if cfg.overlap else machine.cores
    if cfg.backend in ("serial", "sync", "device"):
        processes = _in_process_collection(cfg, n, vectorized, notes)
    elif cfg.backend == "async":
        processes = _async_collection(cfg, n, vectorized, collect_cores, notes)
    else:
        processes = _ray_collection(cfg, n, vectorized, machine, keep_collecting)
    collect_threads, learn_threads = _thread_counts(cfg, machine.cores, collect_cores, processes, notes)
    device = learner_device(cfg.device, machine.gpus)
    return RunLayout(env=cfg.env, env_kwargs=cfg.env_options, backend=cfg.backend, num_envs=n,
                     device=device, compile=_compiled(cfg, device, notes), cuda_graphs=cuda_graphs_on(cfg, device),
                     factory_envs=tuple(processes.factory_envs), vectorized=vectorized, workers=processes.workers,
                     main_share=processes.main_share, num_splits=cfg.num_splits,
                     factories_per_worker=processes.factories_per_worker, cpus_per_worker=processes.cpus_per_worker,
                     ray_address=cfg.ray_address, worker_timeout=cfg.worker_timeout,
                     start_method=_start_method(cfg, notes), keep_collecting=keep_collecting, overlap=cfg.overlap,
                     collect_threads=collect_threads, learn_threads=learn_threads, worker_threads=1,
                     batch_envs=n // processes.workers if keep_collecting else cfg.num_envs,
                     machine=machine, warnings=tuple(notes), world=world)


class _CollectingProcesses(NamedTuple):
    """The processes that step one rank's envs: each factory's env count, the worker processes (or Ray actors)
    and what they are given, and how many of them are busy while this process collects and while it learns."""

    factory_envs: list[int]
    busy_collecting: int
    busy_learning: int
    workers: int = 0
    main_share: bool = False  # the collecting process steps a share of the envs itself (async)
    factories_per_worker: int = 0
    cpus_per_worker: float = 0.0


def _in_process_collection(cfg: TrainConfig, n: int, vectorized: bool, notes: list[str]) -> _CollectingProcesses:
    """``serial``, ``sync`` and ``device``: the collecting process steps every env itself."""
    if cfg.num_workers or cfg.envs_per_worker:
        notes.append(f"--num-workers and envs_per_worker are ignored by --backend {cfg.backend}")
    # collecting: only the collecting process works; with --overlap, it collects while this one learns
    return _CollectingProcesses([n] if vectorized else [1] * n, busy_collecting=0,
                                busy_learning=1 if cfg.overlap else 0)


def _async_collection(cfg: TrainConfig, n: int, vectorized: bool, collect_cores: int,
                      notes: list[str]) -> _CollectingProcesses:
    """``async``: worker processes, and a share of the envs in the collecting process where it has one."""
    workers, main_share = _async_workers(cfg, collect_cores, notes)
    parts = (workers + main_share) * cfg.num_splits  # a factory per process and group
    if parts > n:
        raise ConfigError("num_splits", cfg.num_splits,
                          message=f"num_splits={cfg.num_splits} needs a factory per process and group: {parts} "
                                  f"with {workers + main_share} processes, but --num-envs={n}; lower num_splits "
                                  "or --num-workers")
    sizes = [len(a) for a in np.array_split(np.arange(n), parts)] if vectorized else [1] * n
    if main_share and not watchdog.CAN_BOUND:  # said: the flag's promise does not hold for those envs here
        notes.append(f"this platform cannot interrupt an env step in the collecting process (no "
                     f"signal.pthread_kill): --worker-timeout bounds the worker processes' steps only, not its "
                     f"own share; --num-workers {min(n, collect_cores)} steps every env in a worker process")
    # workers step while the collecting process collects; idle while this one learns
    return _CollectingProcesses(sizes, busy_collecting=workers, busy_learning=workers + 1 if cfg.overlap else 0,
                                workers=workers, main_share=main_share)


def _ray_collection(cfg: TrainConfig, n: int, vectorized: bool, machine: Machine,
                    keep_collecting: bool) -> _CollectingProcesses:
    """``ray``: actors on the cluster's CPUs; IMPALA-style ones (``keep_collecting``) collect while we learn."""
    workers, cpus, busy_here = _ray_workers(cfg, machine, keep_collecting)
    sizes = [n // workers] * workers if vectorized else [1] * n
    return _CollectingProcesses(sizes, busy_collecting=busy_here, busy_learning=busy_here if keep_collecting else 0,
                                workers=workers, factories_per_worker=len(sizes) // workers, cpus_per_worker=cpus)


def _thread_counts(cfg: TrainConfig, cores: int, collect_cores: int, processes: _CollectingProcesses,
                   notes: list[str]) -> tuple[int, int]:
    """The torch threads of this process while it collects and while it learns: the cores its busy workers leave
    (``--threads`` if given)."""
    busy_here, learn_busy = processes.busy_collecting, processes.busy_learning
    collect_threads, learn_threads = max(1, collect_cores - busy_here), max(1, cores - learn_busy)
    if cfg.overlap:  # collecting and learning run at once: the learner takes the threads
        collect_threads = 1
    if cfg.threads:
        collect_threads = learn_threads = cfg.threads
        if cfg.threads + max(busy_here, learn_busy) > cores:
            busy = max(busy_here, learn_busy)
            notes.append(f"--threads={cfg.threads} with {counted(busy, 'busy worker')} exceeds the {cores} cores: "
                         "they will share them (slower)")
    return collect_threads, learn_threads


def _rank_share(cfg: TrainConfig, machine: Machine, world: World) -> Machine:
    """This rank's share of ``machine`` (torchrun), once what a data-parallel run cannot do is refused."""
    check_world(cfg, world)
    return machine.share(world)


def check_world(cfg: TrainConfig, world: World) -> None:
    """``ConfigError`` for what a data-parallel run (``torchrun``, more than one rank) cannot do."""
    if world.size == 1:
        return
    launched = f"under torchrun ({world.size} ranks)"
    if not algorithm_spec(cfg.algo).data_parallel:
        raise ConfigError("algo", cfg.algo, f"does not run {launched}: --algo ppo does, or one process (no torchrun)")
    if cfg.backend == "ray":
        raise ConfigError("backend", "ray", f"does not combine with torchrun ({world.size} ranks): each rank "
                          "collects with --backend sync, async or device; Ray spreads one process's rollouts instead")
    if getattr(cfg.algo_settings, "cuda_graphs", False):  # an all-reduce inside the captured step: not measured
        raise ConfigError("cuda_graphs", True, f"does not combine with torchrun yet ({world.size} ranks): pass "
                          "--cuda-graphs false")
    if cfg.num_envs % world.size:
        lower, upper = cfg.num_envs // world.size * world.size, -(-cfg.num_envs // world.size) * world.size
        raise ConfigError("num_envs", cfg.num_envs, f"must be a multiple of the {world.size} ranks: each steps an "
                          f"equal share; use --num-envs {upper}" + (f" or {lower}" if lower else ""))


def _check_torch_env(cfg: TrainConfig) -> None:
    """With ``--backend device``, ``ConfigError`` unless it can step ``cfg``'s env: one written in torch, with
    settings it can run (checked here, before any write)."""
    if cfg.backend != "device":
        return
    torch_env = profile_of(cfg.env).torch_env_class()
    if torch_env is None:
        raise ConfigError("backend", cfg.backend,
                          message=f"--backend device needs an env written in torch; {cfg.env} has none (these do: "
                                  f"{', '.join(profiled_envs('torch_env'))}): use --backend sync or async")
    try:
        torch_env(1, **cfg.env_options)
    except ValueError as e:
        raise ConfigError("env_kwargs", cfg.env_kwargs, message=f"--backend device: {e}") from None


def _ray_settings_ignored(cfg: TrainConfig) -> list[str]:
    """A note where Ray's settings are given to another backend: said, as --num-workers on sync is (a run meant for
    a cluster runs here)."""
    ray_only = [name for name, given in (("--ray-address", bool(cfg.ray_address)),
                                         ("cpus_per_worker", cfg.cpus_per_worker != TrainConfig.cpus_per_worker))
                if given]
    if not ray_only or cfg.backend == "ray":
        return []
    one = len(ray_only) == 1
    return [f"{' and '.join(ray_only)} {'is' if one else 'are'} ignored by --backend {cfg.backend}: "
            f"{'it is' if one else 'they are'} for --backend ray"]


def _start_method(cfg: TrainConfig, notes: list[str]) -> str:
    """How the run's processes start: ``start_method`` (``auto``: forkserver where the platform has one); a method
    the platform lacks is a ``ConfigError``, one given to a run that starts no processes is said to be ignored."""
    try:
        method = start_method_of(cfg.start_method)
    except ValueError:
        raise ConfigError("start_method", cfg.start_method, "this platform has no forkserver: use spawn or auto",
                          flag=False) from None
    if cfg.start_method != "auto" and not (cfg.backend == "async" or cfg.overlap):
        notes.append("start_method is ignored by --backend ray: Ray starts its actors' processes itself"
                     if cfg.backend == "ray" else f"start_method is ignored by --backend {cfg.backend}"
                     f"{'' if cfg.backend == 'device' else ' without --overlap'}: it starts no processes")
    return method


def _async_workers(cfg: TrainConfig, cores: int, notes: list[str]) -> tuple[int, bool]:
    """Worker processes and whether the collecting process steps a share, for ``--backend async``."""
    n, workers, per = cfg.num_envs, cfg.num_workers, cfg.envs_per_worker
    if per:
        if n % per:
            raise ConfigError("envs_per_worker", per,
                              message=f"envs_per_worker={per} does not divide --num-envs={n}: every process gets the "
                                      "same number of envs; choose a divisor of --num-envs")
        if n // per < 2:
            raise ConfigError("envs_per_worker", per,
                              message=f"envs_per_worker={per} puts all {n} envs in one process; async needs at "
                                      "least 2 (the collecting process and a worker): lower it, or use --backend sync")
        if workers and workers != n // per - 1:
            raise ConfigError("num_workers", workers,
                              message=f"--num-workers={workers} disagrees with envs_per_worker={per}: {n} envs in "
                                      f"{n // per} processes means --num-workers={n // per - 1}; give only one of them")
        workers, main_share = n // per - 1, True
    elif workers:
        if workers > n:
            raise ConfigError("num_workers", workers,
                              message=f"--num-workers={workers} is more than --num-envs={n}: every worker process "
                                      "needs at least one env; lower --num-workers")
        main_share = workers < min(n, cores)  # a core and an env left for the collecting process
    elif cfg.num_splits > 1:  # double-buffered: workers on every core; this process only runs the policy
        return max(1, min(cores, n // cfg.num_splits)), False
    else:
        return async_workers(cores, n)
    busy = workers + main_share
    if busy > cores:
        notes.append(f"{busy} busy processes ({workers} workers{' + this one' if main_share else ''}) on {cores} "
                     "cores, as requested: they will share the cores (slower; lower --num-workers)")
    return workers, main_share


def _ray_workers(cfg: TrainConfig, machine: Machine, keep_collecting: bool) -> tuple[int, float, int]:
    """Ray actors, CPUs per actor, and how many of this machine's cores the actors keep busy."""
    n, cpus, total = cfg.num_envs, cfg.cpus_per_worker, machine.ray_cpus
    if total is None:
        raise ValueError("--backend ray: the machine has no Ray cluster CPUs (Machine.detect connects to Ray)")
    if cfg.envs_per_worker and n % cfg.envs_per_worker:
        raise ConfigError("envs_per_worker", cfg.envs_per_worker,
                          message=f"envs_per_worker={cfg.envs_per_worker} must divide --num-envs={n} for --backend "
                                  "ray (equal slices per actor)")
    workers = cfg.num_workers or (n // cfg.envs_per_worker if cfg.envs_per_worker else 0)
    if cfg.num_workers and cfg.envs_per_worker and cfg.num_workers * cfg.envs_per_worker != n:
        raise ConfigError("num_workers", cfg.num_workers,
                          message=f"--num-workers={cfg.num_workers} x envs_per_worker={cfg.envs_per_worker} must "
                                  f"equal --num-envs={n}; give only one of them")
    if workers and n % workers:
        raise ConfigError("num_workers", workers,
                          message=f"--num-workers={workers} must divide --num-envs={n} for --backend ray (equal "
                                  "slices per actor)")
    if not workers:
        # a learner sharing a node with IMPALA-style actors learns while they collect: keep a CPU for it
        spare = 1.0 if keep_collecting and machine.ray_cpus_here > 0 else 0.0
        fit = math.floor((total - spare) / cpus + 1e-9) or math.floor(total / cpus + 1e-9)
        if fit < 1:
            raise ConfigError("cpus_per_worker", cpus,
                              message=f"cpus_per_worker={cpus:g} is more than the Ray cluster's {total:g} CPUs; "
                                      "lower cpus_per_worker or add nodes")
        workers = largest_divisor_at_most(n, fit)
    if workers * cpus > total + 1e-9:
        raise ConfigError("num_workers", workers,
                          message=f"--num-workers={workers} x cpus_per_worker={cpus:g} need {workers * cpus:g} CPUs "
                                  f"but the Ray cluster has {total:g}; lower --num-workers or cpus_per_worker, or add "
                                  "nodes")
    return workers, cpus, math.ceil(min(machine.ray_cpus_here, workers * cpus) - 1e-9)
