"""Data-parallel PPO under torchrun, on the CPU: ranks spawned as torchrun starts them (gloo), and torchrun itself
through the command line.

The promise under test: ``--num-envs``, ``--total-steps`` and the minibatch plan are the run's, whatever the world
size, so 2 ranks learn what one process learns on the same envs (within float rounding: the gradient is averaged
over ranks), every rank holds the same weights bit for bit, only rank 0 writes, and a checkpoint resumes at any
world size.
"""

import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import checkpoints
from collectors import env_seeds, make_collector
from envs.settings import ConfigError
from tests.factories import HostSyncs
from tests.messages import names
from trainer.common.world import World
from trainer.config import TrainConfig
from trainer.loop import train
from trainer.ppo.update import LearnerSamples
from trainer.registry import algorithm_class
from trainer.run_layout import Machine, run_layout

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 6
RUN = dict(env="VREdge-v0", num_envs=8, num_steps=32, total_steps=8 * 32 * ITERATIONS, seed=3, device="cpu",
           compile="off", checkpoint_every=1, worker_timeout=30.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, size: int, port: int, values: dict, kw: dict, results) -> None:
    """A spawned rank, with the environment torchrun gives it: trains, then reports its final weights (and, with
    ``kw["syncs"]``, the host synchronisations of one more rollout and minibatch step)."""
    syncs = kw.pop("syncs", False)
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import trainer.loop as loop

    seen = {}
    summary_of = loop._summary

    def keeping_weights(run, checkpoint):
        seen["weights"] = torch.cat([p.detach().flatten() for p in run.algorithm.model.state_dict().values()])
        seen["syncs"] = syncs_of_a_rollout_and_a_step(run.algorithm) if syncs else None
        return summary_of(run, checkpoint)

    loop._summary = keeping_weights
    summary = loop.train(TrainConfig.from_dict(values), progress=False, **kw)
    summary["syncs"] = seen["syncs"]
    results.put((rank, summary, seen["weights"].numpy()))  # by value: a tensor would be shared, and this ends


def ranks(size: int, values: dict, **kw) -> list[tuple[dict, torch.Tensor]]:
    """Train with ``size`` spawned ranks; each rank's summary and final weights, in rank order."""
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    procs = [context.Process(target=_rank, args=(r, size, port, values, kw, results)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=240) for _ in range(size)]
        out = {rank: (summary, torch.from_numpy(weights)) for rank, summary, weights in got}
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(size)]


def alone(values: dict, **kw) -> torch.Tensor:
    """Train in this process; the final weights (from the newest checkpoint)."""
    summary = train(TrainConfig.from_dict(values), progress=False, **kw)
    state = checkpoints.latest_loadable(summary["run_dir"])[1]
    return torch.cat([t.flatten() for t in state["model"].values()])


STRAIGHT = {}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> torch.Tensor:
    """One process, the whole run: what any world size must learn (its directory in ``STRAIGHT``)."""
    STRAIGHT["run_dir"] = tmp_path_factory.mktemp("straight") / "run"
    return alone({**RUN, "run_dir": str(STRAIGHT["run_dir"])})


@pytest.mark.slow  # (two ranks under torchrun: 23 s)
def test_two_ranks_learn_what_one_process_learns_and_hold_identical_weights(straight, tmp_path):
    run_dir = tmp_path / "two"
    (first, w0), (second, w1) = ranks(2, {**RUN, "run_dir": str(run_dir)})
    assert torch.equal(w0, w1)  # bit for bit on every rank
    assert (w0 - straight).abs().max().item() < 1e-5
    assert first["env_steps"] == second["env_steps"] == 8 * 32 * ITERATIONS
    # only rank 0 wrote: one row per iteration, the files of a one-process run
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == ITERATIONS
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in STRAIGHT["run_dir"].iterdir())
    assert len(list((run_dir / "checkpoints").iterdir())) == len(list((STRAIGHT["run_dir"] / "checkpoints").iterdir()))
    saved = checkpoints.latest_loadable(run_dir)[1]
    assert torch.equal(torch.cat([t.flatten() for t in saved["model"].values()]), w0)
    assert np.asarray(saved["collector"]["steps"]).shape == (8,)  # every rank's envs, by global index


def syncs_of_a_rollout_and_a_step(algorithm) -> dict:
    """The host synchronisations (``tests.factories.HostSyncs``) of one more rollout of ``algorithm``'s collector
    and of one minibatch step of its update."""
    with HostSyncs() as rollout_syncs:
        rollout = algorithm.pipeline.collector.collect()
    zeros = torch.zeros(rollout.batch.shape, device=algorithm.device)
    minibatch = LearnerSamples.from_rollout(rollout.batch, zeros, zeros).flat()
    with HostSyncs() as step_syncs:
        algorithm.step(minibatch.index(slice(0, algorithm.step.settings.minibatch_size)))
    return {"rollout": dict(rollout_syncs.count), "step": dict(step_syncs.count)}


@pytest.mark.parametrize("num_steps", [8, 16])
def test_the_device_backend_rollout_and_the_minibatch_step_wait_on_no_device_per_step(num_steps):
    cfg = TrainConfig.from_dict({**RUN, "backend": "device", "num_steps": num_steps})
    layout = run_layout(cfg, Machine(cores=1))
    algorithm = algorithm_class("ppo").new(cfg, layout)
    with make_collector(layout.env_factories(), algorithm.acting, backend="device", num_steps=num_steps, seed=1,
                        **algorithm.collector_options()) as collector:
        algorithm.attach(collector)
        syncs = syncs_of_a_rollout_and_a_step(algorithm)
    # one per rollout (the episodes that ended: nonzero), whatever its length; none in the update's step
    assert syncs == {"rollout": {"aten::nonzero": 1}, "step": {}}


@pytest.mark.slow  # two ranks started
def test_under_torchrun_too_the_rollout_and_the_step_wait_on_no_device_per_step(tmp_path):
    run = {**RUN, "backend": "device", "total_steps": 8 * 32, "run_dir": str(tmp_path / "run")}
    for summary, _ in ranks(2, run, syncs=True):  # the step's gradient all-reduce adds none
        assert summary["syncs"] == {"rollout": {"aten::nonzero": 1}, "step": {}}


@pytest.mark.slow
def test_a_run_resumes_at_another_world_size_as_if_never_stopped(straight, tmp_path):
    run = {**RUN, "run_dir": str(tmp_path / "run")}
    ranks(2, run, max_iterations=2)
    alone(run, resume=run["run_dir"], max_iterations=4)  # 2 ranks -> 1 process
    (_, weights), _ = ranks(2, run, resume=run["run_dir"])  # -> 2 ranks again
    assert (weights - straight).abs().max().item() < 1e-5


def layouts(world_size: int, per_node: int, **values) -> list:
    cfg = TrainConfig.from_dict({**RUN, **values})
    return [run_layout(cfg, Machine(cores=16, memory=64 << 30), World(size=world_size, rank=r, local_rank=r %
                                                                       per_node, local_size=per_node))
            for r in range(world_size)]


@pytest.mark.parametrize("world_size, per_node", [(2, 1), (4, 2), (8, 8)])  # nodes x ranks: 2x1, 2x2, 1x8
def test_each_rank_steps_its_share_of_the_envs_with_the_seeds_they_have_in_one_process(world_size, per_node):
    shares = layouts(world_size, per_node, num_envs=16)
    seeds = [s for layout in shares for s in layout.collector_seed(RUN["seed"])]
    assert seeds == env_seeds(RUN["seed"], 16)  # disjoint across ranks and nodes: the one-process seeds, split
    assert all(layout.num_envs == 16 // world_size and layout.batch_envs == 16 for layout in shares)
    assert all(layout.machine.cores == 16 // per_node for layout in shares)  # each rank its share of its node
    whole_run = TrainConfig.from_dict({**RUN, "num_envs": 16})  # iterations of the run's 16 envs, not a rank's
    assert all(layout.iterations(whole_run) == ITERATIONS // 2 for layout in shares)


@pytest.mark.parametrize("values, key", [
    ({"num_envs": 6}, "num_envs"),  # 6 envs over 4 ranks
    ({"backend": "ray"}, "backend"),
    ({"algo": "apex", "backend": "sync"}, "algo"),
    ({"cuda_graphs": True}, "cuda_graphs"),
])
def test_what_torchrun_cannot_run_is_refused_naming_the_setting(values, key):
    with pytest.raises(ConfigError) as refused:
        layouts(4, 4, **values)
    assert refused.value.key == key


def test_a_minibatch_that_ranks_cannot_share_equally_is_refused_with_sizes_that_can():
    cfg = TrainConfig.from_dict({**RUN, "minibatch_size": 100})  # 8 envs x 32 steps: 100 is not whole slots of 8
    layout = run_layout(cfg, Machine(cores=4), World(size=2, local_size=2))
    with pytest.raises(ConfigError) as refused:
        algorithm_class("ppo").new(cfg, layout)
    assert refused.value.key == "minibatch_size"
    assert names(str(refused.value), "64", "128")  # whole slots of the 8 envs, the nearest two


# ---------------------------------------------------------------------- torchrun through the command line
def torchrun(args: list[str], launcher: tuple[str, ...] = (), **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             *launcher, "-m", "trainer.train", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def flags(run_dir: Path, iterations: int) -> list[str]:
    return ["--env", "VREdge-v0", "--num-envs", "8", "--num-steps", "32", "--total-steps", str(256 * iterations),
            "--seed", "3", "--device", "cpu", "--compile", "off", "--checkpoint-every", "1000", "--worker-timeout",
            "20", "--run-dir", str(run_dir)]


def rank_pids(launcher: subprocess.Popen) -> list[int]:
    """The trainer processes torchrun started (its children running trainer.train), in start order."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = [c for c in psutil.Process(launcher.pid).children() if "trainer.train" in " ".join(c.cmdline())]
        if len(children) == 2:
            return [c.pid for c in sorted(children, key=lambda c: c.create_time())]
        time.sleep(0.2)
    raise AssertionError("torchrun did not start 2 ranks")


def rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for_rows(run_dir: Path, n: int, launcher: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while rows(run_dir) < n:
        assert launcher.poll() is None and time.monotonic() < deadline, "the run ended or stalled"
        time.sleep(0.1)


def interrupted(args: list[str], after: int, send, launcher: tuple[str, ...] = (), timeout: float = 120,
                **kw) -> tuple[subprocess.Popen, str, list[int]]:
    """torchrun with ``args``; once ``after`` iterations are logged, ``send(torchrun, rank_pids)``; returns torchrun
    (ended), its stderr and the ranks' pids."""
    run_dir = Path(args[args.index("--run-dir") + 1])
    proc = torchrun(args, launcher, **kw)
    try:
        wait_for_rows(run_dir, after, proc)
        pids = rank_pids(proc)
        send(proc, pids)
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc, err, pids


LONG = 40  # iterations of the command-line runs: long enough to be stopped in the middle


@pytest.fixture(scope="module")
def straight_long(tmp_path_factory) -> torch.Tensor:
    """One process, the command-line tests' whole run."""
    return alone({**RUN, "total_steps": 256 * LONG, "checkpoint_every": 1000,
                  "run_dir": str(tmp_path_factory.mktemp("long") / "run")})


def final_weights(run_dir: Path) -> torch.Tensor:
    return torch.cat([t.flatten() for t in checkpoints.latest_loadable(run_dir)[1]["model"].values()])


@pytest.mark.slow
@pytest.mark.parametrize("to", ["rank 0", "rank 1", "the group"])
def test_sigterm_stops_every_rank_with_a_checkpoint_and_the_run_resumes_exactly(straight_long, tmp_path, to):
    run_dir = tmp_path / "run"

    def send(launcher, pids):
        if to == "the group":  # as a scheduler or a terminal's Ctrl-C does: torchrun and every rank
            os.killpg(launcher.pid, signal.SIGTERM)
        else:
            os.kill(pids[int(to[-1])], signal.SIGTERM)

    _, err, _ = interrupted(flags(run_dir, LONG), 3, send, start_new_session=True)
    saved = checkpoints.latest_loadable(run_dir)[1]
    assert 3 <= saved["iteration"] == rows(run_dir) < LONG  # the last completed iteration, saved
    assert len(re.findall(r"^resume: ", err, re.M)) == 1, err  # said once, by rank 0
    assert "SIGTERM" in err
    resumed = torchrun(["--resume", str(run_dir)])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert rows(run_dir) == LONG and (final_weights(run_dir) - straight_long).abs().max().item() < 1e-5


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_with_one_line_naming_it_and_nothing_left(tmp_path):
    run_dir = tmp_path / "run"
    launcher, err, pids = interrupted(flags(run_dir, 400), 3, lambda _, pids: os.kill(pids[1], signal.SIGKILL))
    assert launcher.returncode != 0
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    saved = checkpoints.latest_loadable(run_dir)[1]
    assert saved["iteration"] == rows(run_dir)  # what was completed is saved
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and names(lines[0], "rank 1"), err


@pytest.mark.slow
def test_torchrun_trains_and_a_resume_in_one_process_continues(tmp_path):
    run_dir = tmp_path / "run"
    launcher = torchrun(flags(run_dir, ITERATIONS // 2))
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    assert "world: 2 ranks" in err and out.count("run directory:") == 1  # the layout and the summary, once
    resumed = subprocess.run([sys.executable, "-m", "trainer.train", "--resume", str(run_dir), "--total-steps",
                              str(256 * ITERATIONS)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert rows(run_dir) == ITERATIONS


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_the_run_by_itself_after_a_rank_dies(straight_long, tmp_path):
    run_dir = tmp_path / "run"
    launcher, err, _ = interrupted(flags(run_dir, LONG), 3, lambda _, pids: os.kill(pids[1], signal.SIGKILL),
                                   launcher=("--max-restarts", "1"), timeout=300)
    assert launcher.returncode == 0, err
    assert "resumed from" in err and rows(run_dir) == LONG
    assert (final_weights(run_dir) - straight_long).abs().max().item() < 1e-5


@pytest.mark.slow
def test_torchrun_max_restarts_without_a_run_dir_is_refused(tmp_path):
    args = [a for a in flags(tmp_path, 2) if a not in ("--run-dir", str(tmp_path))]
    launcher = torchrun(args, launcher=("--max-restarts", "1"))
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode != 0
    assert names(err, "--run-dir")
    assert not (REPO / "runs").exists() or not list((REPO / "runs").glob("VREdge-v0-s3-*"))


@pytest.mark.slow
def test_what_rank_0_finds_wrong_for_every_rank_is_said_once(tmp_path):
    launcher = torchrun(["--resume", str(tmp_path / "no-such-run")])
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode != 0
    ours = [line for line in err.splitlines() if "error:" in line and "torch.distributed" not in line]
    assert len(ours) == 1 and names(ours[0], "--resume"), err
    assert "trainer/" not in err  # no traceback of ours (torchrun prints its own report)


@pytest.mark.slow
def test_another_rank_that_meets_rank_0s_mistake_waits_for_rank_0_to_say_it(tmp_path):
    # exiting first, rank 1 would have torchrun stop rank 0 before it said a word (a race CI met)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    code = "import sys, trainer.train as t; print('imported', flush=True); t.main(sys.argv[1:])"
    rank_1 = subprocess.Popen([sys.executable, "-c", code, "--resume", str(tmp_path / "no-such-run")], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert rank_1.stdout.readline() == "imported\n"
    with pytest.raises(subprocess.TimeoutExpired):
        rank_1.wait(timeout=3)  # still there, long after the mistake was found (a parse takes milliseconds)
    rank_1.send_signal(signal.SIGTERM)  # what torchrun sends once rank 0 has said it and exited
    out, err = rank_1.communicate(timeout=30)
    assert rank_1.returncode == 2 and err == "" and out == ""  # rank 0 said it; this rank, nothing


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to rank 1", "SIGUSR1 to torchrun"])
def test_a_stop_under_max_restarts_stays_a_stop_and_leaves_no_rank(tmp_path, how):
    """A signal to one rank stops the run (torchrun --max-restarts does not undo it); a SIGUSR1 that ends torchrun
    itself (its default action) still stops the ranks it leaves behind, each saving as for any stop."""
    run_dir = tmp_path / "run"

    def send(launcher, pids):
        if how.endswith("torchrun"):
            os.kill(launcher.pid, signal.SIGUSR1)
        else:
            os.kill(pids[1], signal.SIGTERM)

    _, _, pids = interrupted(flags(run_dir, LONG * 10), 3, send, launcher=("--max-restarts", "2"))
    deadline = time.monotonic() + 60
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "a rank is still running"
        time.sleep(0.2)
    saved = checkpoints.latest_loadable(run_dir)[1]
    assert 3 <= saved["iteration"] == rows(run_dir) < LONG * 10
    time.sleep(3)  # no restart comes to train on
    assert rows(run_dir) == saved["iteration"]


@pytest.mark.slow
def test_under_max_restarts_a_directory_that_holds_another_run_is_refused_not_resumed(tmp_path):
    run_dir = tmp_path / "run"
    alone({**RUN, "total_steps": 256 * 2, "run_dir": str(run_dir)})
    launcher = torchrun(flags(run_dir, LONG), launcher=("--max-restarts", "1"))
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode != 0 and rows(run_dir) == 2
    assert "resumed from" not in err
    assert len([line for line in err.splitlines() if "error:" in line and "--run-dir" in line]) == 1, err


@pytest.mark.slow
def test_when_rank_0_dies_the_others_say_where_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    args = flags(run_dir, 400)
    args[args.index("--checkpoint-every") + 1] = "2"
    _, err, _ = interrupted(args, 5, lambda _, pids: os.kill(pids[0], signal.SIGKILL))
    mine = [line for line in err.splitlines() if line.startswith(("rank 1: error:", "resume:"))]
    assert len(mine) == 2 and names(mine[0], "rank 0") and str(run_dir) in mine[1], err
    assert checkpoints.latest_loadable(run_dir)[1]["iteration"] >= 2


@pytest.mark.slow
def test_help_under_torchrun_is_printed_once():
    launcher = torchrun(["--help"])
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0 and out.count("usage:") == 1


def test_ray_under_torchrun_is_refused_before_ray_is_started(monkeypatch):
    import trainer.loop as loop

    def no_ray(*args, **kwargs):
        raise AssertionError("Machine.detect was called: it starts Ray")

    monkeypatch.setattr(loop.Machine, "detect", no_ray)
    with pytest.raises(ConfigError) as refused:
        loop._planned_run(TrainConfig.from_dict({**RUN, "backend": "ray"}), "", {}, None, None,
                          World(size=2, local_size=2))
    assert refused.value.key == "backend"


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_under_nccl_learn_what_one_gpu_learns(tmp_path):
    """Run by benchmarks.device_check (its tests part) on a machine with 2 GPUs: NCCL, the device backend, one rank per
    GPU; the GPU's kernels reduce in other orders than the CPU's, hence the looser bound."""
    run = {**RUN, "device": "cuda", "backend": "device", "run_dir": str(tmp_path / "one")}
    one = alone(run)
    launcher = torchrun([*flags(tmp_path / "two", ITERATIONS)[:-2], "--run-dir", str(tmp_path / "two"),
                         "--device", "cuda", "--backend", "device", "--checkpoint-every", "1"])
    _, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    assert "world: 2 ranks" in err
    assert (final_weights(tmp_path / "two") - one).abs().max().item() < 1e-4
