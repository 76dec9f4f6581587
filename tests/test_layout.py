"""The run layout on machines we do not have: simulated cores, GPUs and Ray clusters."""

import dataclasses
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import sys

import pytest
import torch

from collectors import RolloutCollector
from collectors.resources import cgroup_cpu_limit, cgroup_memory_available, usable_cores
from envs.settings import ConfigError
from tests import factories as f
from tests.messages import names, raises, suggestion
from trainer.common.world import World
from trainer.config import TrainConfig
from trainer.memory import check_memory
from trainer.run_layout import Machine, run_layout
from trainer.train import train

CORES = [1, 2, 4, 16, 64, 128]
ENVS = ["CartPole-v1", "VREdge-v0"]
NUM_ENVS = [1, 3, 8, 64, 1024]


def machines(backend):
    for cores, gpus in itertools.product(CORES, [0, 1]):
        if backend != "ray":
            yield Machine(cores, gpus)
            continue
        for ray_cpus, here in [(1.0, 1.0), (float(cores), float(cores)), (4.0 * cores, float(cores)), (256.0, 0.0)]:
            yield Machine(cores, gpus, ray_cpus, here)


CASES = [(backend, env, n, m, keep) for backend in ("serial", "sync", "async", "ray") for env in ENVS
         for n in NUM_ENVS for m in machines(backend) for keep in ([False, True] if backend == "ray" else [False])]


@pytest.mark.parametrize("backend, env, num_envs, machine, keep_collecting", CASES,
                         ids=[f"{b}-{e}-n{n}-{m.cores}c{m.gpus}g-ray{m.ray_cpus}{'-async' * a}"
                              for b, e, n, m, a in CASES])
def test_default_layout_is_valid_on_every_machine(backend, env, num_envs, machine, keep_collecting):
    cfg = TrainConfig(env=env, backend=backend, num_envs=num_envs, keep_collecting=keep_collecting)
    layout = run_layout(cfg, machine)
    cores = machine.cores
    assert not layout.warnings, layout.warnings
    assert sum(layout.factory_envs) == num_envs and len(layout.env_factories()) == len(layout.factory_envs)
    assert layout.device == ("cuda" if machine.gpus else "cpu")
    assert layout.worker_threads == 1 and 1 <= layout.collect_threads <= cores and 1 <= layout.learn_threads <= cores
    kw = layout.collector_kwargs()
    if backend == "async":
        # what AsyncStepper accepts: each process at least one factory
        assert 1 <= layout.workers and layout.workers + layout.main_share <= len(layout.factory_envs)
        # the thread budget: workers (one thread each) + the collecting process never exceed the cores
        assert layout.workers + (layout.collect_threads if layout.main_share else 0) <= cores
        assert layout.learn_threads == cores
        assert kw["num_workers"] == layout.workers
    elif backend == "ray":
        assert num_envs % layout.workers == 0 and layout.workers * layout.cpus_per_worker <= machine.ray_cpus
        assert layout.factories_per_worker * layout.workers == len(layout.factory_envs)
        assert layout.batch_envs == (num_envs // layout.workers if keep_collecting else num_envs)
        busy_here = min(machine.ray_cpus_here, layout.workers)
        assert layout.collect_threads == max(1, cores - busy_here)
        assert layout.learn_threads == (max(1, cores - busy_here) if keep_collecting else cores)
    else:
        assert layout.workers == 0 and layout.collect_threads == layout.learn_threads == cores
    if layout.vectorized:
        assert env == "VREdge-v0" and backend != "serial"
        assert len(layout.factory_envs) == max(1, layout.workers + layout.main_share)  # one vector env per process
    json.dumps(layout.to_dict())  # goes into config.json


def test_the_layout_line_names_the_env_arguments_it_builds_the_envs_with():
    described = run_layout(TrainConfig(env_kwargs="num_users=6,noise_std=0.25"), Machine(cores=2)).describe()
    assert described.startswith("layout: VREdge-v0 (num_users=6,noise_std=0.25), 64 envs as "), described
    assert run_layout(TrainConfig(), Machine(cores=2)).describe().startswith("layout: VREdge-v0, 64 envs as ")


def test_the_16_core_async_vr_edge_bug_is_gone():
    layout = run_layout(TrainConfig(backend="async"), Machine(cores=16))  # VREdge-v0, 64 envs: failed before
    assert (layout.workers, layout.main_share, len(layout.factory_envs)) == (15, True, 16)
    assert (layout.collect_threads, layout.learn_threads) == (1, 16)


def test_double_buffered_layout_puts_workers_on_every_core_and_groups_in_every_process():
    cartpole = run_layout(TrainConfig(env="CartPole-v1", backend="async", num_envs=8, num_splits=2), Machine(cores=2))
    assert (cartpole.workers, cartpole.main_share, cartpole.factory_envs) == (2, False, (1,) * 8)
    assert cartpole.collector_kwargs()["num_splits"] == 2 and "double-buffered" in cartpole.describe()
    vr = run_layout(TrainConfig(backend="async", num_envs=64, num_splits=2), Machine(cores=16))
    assert (vr.workers, vr.main_share, vr.factory_envs) == (16, False, (2,) * 32)  # a vector env per process and group
    lockstep = run_layout(TrainConfig(backend="async", num_envs=64), Machine(cores=16))
    assert lockstep.collector_kwargs()["num_splits"] == 1
    with raises(ValueError, "num_splits", "2", "16", "--num-envs", "8", key="num_splits"):  # 16 factories needed
        run_layout(TrainConfig(backend="async", num_envs=8, num_workers=7, num_splits=2), Machine(cores=16))
    with raises(ValueError, "num_splits", "2", "--backend async", key="num_splits"):
        TrainConfig(backend="sync", num_splits=2).validate()


def test_slurm_share_of_a_big_node_uses_only_its_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(4)))
    assert usable_cores() <= 4


@pytest.mark.parametrize("files, expected", [
    ({"cgroup": "0::/job\n", "job/cpu.max": "400000 100000\n"}, 4.0),
    ({"cgroup": "0::/\n", "cpu.max": "max 100000\n"}, None),
    ({"cgroup": "0::/job\n", "cpu.max": "150000 100000\n"}, 1.5),  # namespaced: the path is not mounted
    ({"cgroup": "2:cpuacct:/\n1:cpu:/\n", "cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"},
     2.0),
    ({"cgroup": "1:cpu,cpuacct:/\n", "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
      "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
])
def test_cgroup_quotas_v1_and_v2(tmp_path, files, expected):
    _cgroup_files(tmp_path, files)
    assert cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc" / "cgroup") == expected


@pytest.mark.parametrize("files, expected", [
    ({"cgroup": "0::/job\n", "job/memory.max": "8589934592\n", "job/memory.current": "1073741824\n"}, 7 << 30),
    ({"cgroup": "0::/\n", "memory.max": "max\n", "memory.current": "5\n"}, None),
    ({"cgroup": "0::/job\n", "memory.max": "4096\n", "memory.current": "8192\n"}, 0),  # over: nothing left
    ({"cgroup": "3:memory:/slurm/job1\n", "memory/slurm/job1/memory.limit_in_bytes": "2147483648\n",
      "memory/slurm/job1/memory.usage_in_bytes": "1073741824\n"}, 1 << 30),
    ({"cgroup": "3:memory:/\n", "memory/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/memory.usage_in_bytes": "1\n"}, None),  # v1's "unlimited"
    ({"cgroup": "1:cpu:/\n"}, None),  # no memory controller
])
def test_cgroup_memory_limits_v1_and_v2(tmp_path, files, expected):
    _cgroup_files(tmp_path, files)
    assert cgroup_memory_available(tmp_path / "fs", tmp_path / "proc" / "cgroup") == expected


def test_a_jobs_memory_limit_below_the_machines_sizes_the_run(monkeypatch):
    monkeypatch.setattr("trainer.run_layout.cgroup_memory_available", lambda: 64 << 20)
    machine = Machine.detect()
    assert machine.memory == 64 << 20
    with pytest.raises(ConfigError) as refused:  # 64 MiB hold no rollout of 64 x 100,000 VR-edge steps
        check_memory(TrainConfig(num_steps=100_000), machine)
    assert refused.value.key == "num_steps"
    check_memory(TrainConfig(num_steps=128), machine)  # 64 x 128 steps do


def test_detected_machine_is_this_one():
    m = Machine.detect("async")
    assert m.cores == usable_cores() and m.gpus == torch.cuda.device_count() and m.ray_cpus is None


@pytest.mark.parametrize("flags, machine, key, named, suggested", [
    (dict(backend="async", num_workers=9, num_envs=8), Machine(16), "num_workers",
     ["--num-workers", "9", "--num-envs", "8"], None),
    (dict(backend="async", envs_per_worker=3, num_envs=8), Machine(16), "envs_per_worker",
     ["envs_per_worker", "3", "--num-envs", "8"], None),
    (dict(backend="async", envs_per_worker=8, num_envs=8), Machine(16), "envs_per_worker",
     ["envs_per_worker", "8"], None),
    (dict(backend="async", envs_per_worker=2, num_workers=2, num_envs=8), Machine(16), "num_workers",
     ["--num-workers", "2", "envs_per_worker", "3"], None),  # 3: the workers --envs-per-worker means
    (dict(backend="ray", num_workers=3, num_envs=8), Machine(4, 0, 64.0), "num_workers",
     ["--num-workers", "3", "--num-envs", "8"], None),
    (dict(backend="ray", num_workers=8, num_envs=8), Machine(4, 0, 4.0), "num_workers",
     ["--num-workers", "cpus_per_worker", "8", "4"], None),  # CPUs needed, and the cluster's
    (dict(backend="ray", cpus_per_worker=8.0), Machine(4, 0, 4.0), "cpus_per_worker",
     ["cpus_per_worker", "8", "4"], None),
    (dict(backend="ray", envs_per_worker=5), Machine(4, 0, 4.0), "envs_per_worker",
     ["envs_per_worker", "5", "--num-envs", "64"], None),
    (dict(device="cuda"), Machine(4, 0), "device", ["--device", "cuda", "cpu"], None),
    (dict(env="NoSuchEnv-v9"), Machine(4), "env", ["'NoSuchEnv-v9'"], None),
    (dict(env="no_such_module_42:Foo-v0"), Machine(4), "env",
     ["--env", "no_such_module_42:Foo-v0", "'no_such_module_42'"], None),
    # a module that imports: the ids it registers, not every registered env's closest
    (dict(env="tests.factories:NaNRewrd-v0"), Machine(4), "env",
     ["--env", "tests.factories", "'NaNRewrd-v0'", "Exploding-v0", "Hanging-v0"], "NaNReward-v0"),
    (dict(env="collectors:Foo-v0"), Machine(4), "env", ["--env", "collectors", "'Foo-v0'"], None),
])
def test_impossible_requests_are_one_line_errors_naming_the_flag(flags, machine, key, named, suggested):
    with raises(ValueError, *named, key=key) as e:
        run_layout(TrainConfig.from_dict(flags), machine)
    assert suggestion(str(e.value)) == suggested


def test_explicit_flags_win_and_oversubscription_is_only_a_warning():
    layout = run_layout(TrainConfig(backend="async", num_workers=6, num_envs=8, threads=3), Machine(2))
    assert (layout.workers, layout.collect_threads, layout.learn_threads) == (6, 3, 3)
    assert len(layout.warnings) == 2 and "6 workers" in layout.warnings[0] and "--threads=3" in layout.warnings[1]
    every_env = run_layout(TrainConfig(backend="async", num_workers=8, num_envs=8), Machine(16))
    assert not every_env.main_share and not every_env.warnings
    per = run_layout(TrainConfig(env="VREdge-v0", backend="async", envs_per_worker=2, num_envs=8), Machine(16))
    assert (per.workers, per.main_share, per.factory_envs) == (3, True, (2, 2, 2, 2))
    ray = run_layout(TrainConfig(backend="ray", envs_per_worker=16, cpus_per_worker=0.5), Machine(4, 0, 2.0, 2.0))
    assert (ray.workers, ray.factory_envs, ray.factories_per_worker) == (4, (16,) * 4, 1)


def test_keep_collecting_keeps_a_cpu_for_a_learner_sharing_the_node():
    cfg = TrainConfig(env="CartPole-v1", backend="ray", keep_collecting=True, num_envs=16)
    assert run_layout(cfg, Machine(16, 0, 16.0, 16.0)).workers == 8  # 15 fit: the largest divisor of 16 is 8
    assert run_layout(cfg, Machine(16, 0, 16.0, 0.0)).workers == 16  # actors elsewhere: all of them


def test_collector_uses_its_thread_count_while_collecting_only():
    seen = []

    def policy(obs):
        seen.append(torch.get_num_threads())
        return torch.zeros(len(obs), dtype=torch.int64)

    before = torch.get_num_threads()
    want = 3 if before != 3 else 2
    with RolloutCollector([f.cartpole] * 2, policy, backend="sync", num_steps=4, num_threads=want) as c:
        c.collect()
    assert set(seen) == {want} and torch.get_num_threads() == before


@pytest.mark.parametrize("env", ["VREdge-v0", pytest.param("CartPole-v1", marks=pytest.mark.slow)])  # the main job
@pytest.mark.parametrize("cores, num_envs", [(16, 3), (64, 4)])
def test_short_async_training_on_simulated_big_machines(tmp_path, capsys, env, cores, num_envs):
    """More worker processes than this box has cores: correctness, not speed."""
    cfg = TrainConfig.from_dict(dict(env=env, backend="async", num_envs=num_envs, num_steps=8,
                                     total_steps=num_envs * 8 * 2, epochs=1, run_dir=str(tmp_path), checkpoint_every=2))
    threads = torch.get_num_threads()
    summary = train(cfg, progress=False, machine=Machine(cores=cores))
    assert summary["iterations"] == 2 and summary["env_steps"] == num_envs * 16
    assert torch.get_num_threads() == threads  # the layout's thread counts do not leak out of train()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert TrainConfig.from_dict(saved["config"]) == cfg
    layout = saved["layout"]
    assert layout["workers"] == num_envs - 1 and layout["machine"]["cores"] == cores
    assert layout["collect_threads"] == cores - (num_envs - 1) and layout["learn_threads"] == cores
    assert f"{num_envs - 1} worker processes + this process; {cores} cores" in capsys.readouterr().err


@pytest.mark.parametrize("given", [{}, pytest.param({"GOMP_SPINCOUNT": "5"}, marks=pytest.mark.slow)])
def test_openmp_wait_settings_are_the_users(given):
    """Threads are chosen by measuring (trainer.thread_plan); OpenMP's spin is no longer overridden (issue 39:
    GOMP_SPINCOUNT=1000 cost 1.7-2.6x on a quiet Intel Xeon)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | given
    code = ("import os, sys, trainer.train; "
            "sys.stdout.write(repr((os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out == repr((given.get("GOMP_SPINCOUNT"), None))


@pytest.mark.parametrize("backend", ["sync", "async", "device"])
def test_ray_flags_on_another_backend_are_said_to_be_ignored(backend):
    cfg = TrainConfig(env="VREdge-v0", backend=backend, num_envs=4, ray_address="10.0.0.1:6379")
    [warning] = run_layout(cfg, Machine(4)).warnings
    names(warning, "--ray-address", f"--backend {backend}", "--backend ray")  # ignored where, and what it is for
    both = TrainConfig(env="VREdge-v0", backend=backend, num_envs=4, ray_address="auto", cpus_per_worker=2.0)
    [warning] = run_layout(both, Machine(4)).warnings  # one warning for both
    names(warning, "--ray-address", "cpus_per_worker", f"--backend {backend}", "--backend ray")  # its TOML key


def test_the_start_method_reaches_the_processes_a_run_starts_and_is_said_ignored_where_none_start():
    spawned = run_layout(TrainConfig(env="VREdge-v0", backend="async", num_envs=4, start_method="spawn"), Machine(4))
    assert spawned.start_method == "spawn" and spawned.collector_kwargs()["start_method"] == "spawn"
    assert "3 worker processes (spawned) + this process" in spawned.describe() and not spawned.warnings
    overlap = run_layout(TrainConfig(env="VREdge-v0", num_envs=4, overlap=True, start_method="spawn"), Machine(4))
    assert overlap.collector_kwargs()["background"] and overlap.collector_kwargs()["start_method"] == "spawn"
    assert "(--overlap, spawned)" in overlap.describe()
    auto = run_layout(TrainConfig(env="VREdge-v0", backend="async", num_envs=4), Machine(4))
    assert auto.start_method == ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    assert "(spawned)" not in auto.describe()
    for backend, words in [("sync", "sync without --overlap"), ("device", "device")]:
        ignored = run_layout(TrainConfig(env="VREdge-v0", backend=backend, num_envs=4, start_method="spawn"),
                             Machine(4))
        [warning] = ignored.warnings
        names(warning, "start_method", f"--backend {words}")
        assert "start_method" not in ignored.collector_kwargs()
    ray = run_layout(TrainConfig(env="VREdge-v0", backend="ray", num_envs=4, start_method="spawn"),
                     Machine(4, 0, 4.0, 4.0))
    [warning] = ray.warnings
    names(warning, "start_method", "--backend ray")


def test_a_platform_without_a_forkserver_spawns_and_refuses_one_asked_for(monkeypatch):
    monkeypatch.setattr(mp, "get_all_start_methods", lambda: ["spawn"])  # Windows
    cfg = TrainConfig(env="VREdge-v0", backend="async", num_envs=4)
    assert run_layout(cfg, Machine(4)).start_method == "spawn"
    with raises(ValueError, "start_method", "'forkserver'", "spawn", "auto", key="start_method"):  # what to use
        run_layout(dataclasses.replace(cfg, start_method="forkserver"), Machine(4))


def test_a_start_method_that_is_not_one_is_a_config_error():
    with raises(ValueError, "start_method", "'fork'", "auto", "forkserver", "spawn", key="start_method"):
        TrainConfig(start_method="fork").validate()
    with raises(ValueError, "start_method", "'spwan'", "auto", "forkserver", key="start_method") as e:
        TrainConfig(start_method="spwan").validate()
    assert suggestion(str(e.value)) == "spawn"


def test_a_gpu_learner_is_sized_by_the_gpus_free_memory_and_the_device_backend_by_its_envs_too():
    """Simulated GPUs (no CUDA here): the learner's copy of the rollout must fit the memory free on its GPU; the
    device backend's envs live there too. Ranks sharing a GPU share its memory."""
    cfg = TrainConfig(num_envs=64, num_steps=128, device="cuda")
    roomy = Machine(cores=8, gpus=1, memory=64 << 30, gpu_memory=1 << 30)
    check_memory(cfg, roomy)
    with pytest.raises(ConfigError) as refused:
        check_memory(cfg.replaced(num_steps=100_000), roomy)  # 64 x 100,000 steps of 559 bytes: 3.3 GiB
    assert refused.value.key == "num_steps" and "GPU" in str(refused.value)
    check_memory(cfg.replaced(num_steps=100_000), Machine(cores=8, gpus=1, memory=64 << 30, gpu_memory=None))
    check_memory(cfg.replaced(num_steps=100_000, device="cpu"), roomy)  # a CPU learner: the GPU is not used
    device = cfg.replaced(backend="device", num_envs=1_000_000, num_steps=1)  # the envs' own state: ~1 KB each
    check_memory(device.replaced(backend="sync"), roomy)
    with pytest.raises(ConfigError):
        check_memory(device, roomy)
    two_ranks = World(size=2, rank=0, local_rank=0, local_size=2)
    assert roomy.share(two_ranks).gpu_memory == 1 << 29  # one GPU, two ranks
    assert dataclasses.replace(roomy, gpus=2).share(two_ranks).gpu_memory == 1 << 30  # a GPU each


def _cgroup_files(tmp_path, files: dict[str, str]) -> None:
    """A simulated ``/proc/self/cgroup`` (``cgroup``) under ``tmp_path/proc`` and cgroup files under ``tmp_path/fs``."""
    for name, text in files.items():
        path = tmp_path / ("proc" if name == "cgroup" else "fs") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
