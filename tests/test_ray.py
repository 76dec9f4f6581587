import ast
import os
import subprocess
import sys
import time

import pytest
import torch

from collectors import make_collector
from tests import factories as f
from tests.factories import settings_file
from tests.messages import names, raises
from trainer.ppo.model import ActorCritic

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    """One two-node Ray cluster on this host for this module's Ray tests (small CPUs and object stores), shut down at
    the module's end: a Ray left running in the test process makes a later test's ray.init join it."""
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    store = {"object_store_memory": 80 * 2**20}  # loopback only: see conftest.py
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, **store})
    second = c.add_node(num_cpus=2, resources={"second_node": 1}, **store)
    ray.init(address=c.address, log_to_driver=False)
    yield c, second
    ray.shutdown()
    c.shutdown()


def vr_spaces():
    env = f.vr_edge()
    return env.observation_space, env.action_space


def batches(backend, policy_fn, rollouts=2, **kw):
    with make_collector([f.vr_edge] * 4, policy_fn(), backend=backend, num_steps=30, seed=3, **kw) as c:
        return [c.collect().batch for _ in range(rollouts)]


def test_sync_ray_matches_serial_for_a_deterministic_policy(cluster):
    policy = lambda: f.greedy_policy(*vr_spaces())  # noqa: E731
    serial = batches("serial", policy)
    remote = batches("ray", policy, num_workers=2, envs_per_worker=2, cpus_per_worker=0.25)
    assert any(a["final_observation_mask"].any() for a in serial)
    for a, b in zip(serial, remote):
        for k in ("observations", "actions", "rewards", "terminated", "truncated", "final_observations",
                  "final_observation_mask"):
            assert torch.equal(a[k], b[k]), k
        for k in ("log_probs", "values"):
            assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_stochastic_ray_runs_are_reproducible(cluster):
    policy = lambda: ActorCritic(*vr_spaces(), seed=0)  # noqa: E731
    kw = dict(num_workers=2, envs_per_worker=2, cpus_per_worker=0.25)
    a, b = batches("ray", policy, **kw), batches("ray", policy, **kw)
    for x, y in zip(a, b):
        assert torch.equal(x["actions"], y["actions"]) and torch.equal(x["log_probs"], y["log_probs"])


def test_worker_pinned_to_the_second_node(cluster):
    _, second = cluster
    with make_collector([f.vr_edge] * 2, ActorCritic(*vr_spaces()), backend="ray", num_workers=2, num_steps=5,
                          cpus_per_worker=0.25, worker_options=[{}, {"resources": {"second_node": 0.5}}]) as c:
        c.collect()
        assert ray.get(c.workers.actors[1].node_id.remote()) == second.node_id


def test_killed_actor_is_replaced_and_the_rollout_retried(cluster, caplog):
    with make_collector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", num_workers=2, num_steps=10,
                          cpus_per_worker=0.25) as c:
        c.collect()
        ray.kill(c.workers.actors[1])
        with caplog.at_level("WARNING", logger="collectors.ray"):
            batch = c.collect().batch
        assert batch.batch_size == torch.Size([10, 4])
        assert c.workers.restarts == 1 and "died" in c.workers.events[0]
        assert "replaced" in caplog.text
        assert c.collect().batch.batch_size == torch.Size([10, 4])  # and it keeps going


def test_keep_collecting_returns_worker_slices_with_the_versions_that_collected_them(cluster):
    """Whatever order the actors finish in, a rollout returned after an update was launched before it:
    its lag is at least 1, and it names the version of the weights it was collected with."""
    acting, learner = ActorCritic(*vr_spaces(), seed=0), ActorCritic(*vr_spaces(), seed=1)
    with make_collector([f.vr_edge] * 4, acting, backend="ray", num_workers=2, num_steps=8,
                        cpus_per_worker=0.25, keep_collecting=True) as c:
        lags = []
        for _ in range(6):
            rollout = c.collect()
            assert rollout.batch.batch_size == torch.Size([8, 2]) and "log_probs" in rollout.batch.keys()
            assert rollout.next_observations.shape[0] == 2 and rollout.envs in (slice(0, 2), slice(2, 4))
            assert all(rollout.envs.start <= e["env"] < rollout.envs.stop for e in rollout.episodes)
            lags.append(c.policy_version - rollout.policy_version)
            c.update_policy(learner.state_dict())
        assert lags[0] == 0 and all(lag >= 1 for lag in lags[1:])


def test_keep_collecting_is_refused_by_local_backends():
    with raises(ValueError, "backend='async'", "keep_collecting"):
        make_collector([f.vr_edge] * 2, ActorCritic(*vr_spaces()), backend="async", keep_collecting=True)


def test_bad_worker_layout_is_rejected(cluster):
    with raises(ValueError, "num_workers=3", "envs_per_worker=2", "4"):  # 3 x 2, and the 4 factories
        make_collector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", num_workers=3,
                         envs_per_worker=2)



@pytest.mark.parametrize("mode", [["--config", settings_file("ray_quarter_cpu")],
                                  ["--keep-collecting", "true", "--config", settings_file("keep_collecting_lag1")]])
def test_training_on_ray_sync_and_async_then_resume(cluster, tmp_path, mode):
    import json

    import checkpoints
    from trainer.flags import parse_args
    from trainer.train import train
    keep_collecting = "--keep-collecting" in mode
    cli = parse_args(["--backend", "ray", "--num-workers", "2", "--num-envs", "4", "--num-steps", "16",
                      "--total-steps", "512", "--checkpoint-every", "2", "--run-dir", str(tmp_path), *mode])
    summary = train(cli.config, progress=False, max_iterations=4)
    assert summary["iterations"] == 4
    saved = checkpoints.latest_loadable(tmp_path)[1]["collector"]
    assert len(saved["env_states"]) == 4 and all(s is not None for s in saved["env_states"])  # per env
    resumed = parse_args(["--resume", str(tmp_path)])
    summary = train(resumed.config, progress=False, resume=resumed.resume, given=resumed.given)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    last = rows[-1]["env_steps"]
    assert summary["env_steps"] == last and last == (512 if not keep_collecting else len(rows) * 2 * 16)
    if keep_collecting:
        assert all(r["policy_lag"] <= 1 for r in rows)
    else:
        assert summary["lags"] == {0: len(rows) - 4}


def test_default_actor_count_fits_the_cluster_cpus(cluster):
    # one actor per factory at 2 CPUs each would need 16 CPUs of the cluster's 4 and wait forever
    with make_collector([f.vr_edge] * 8, ActorCritic(*vr_spaces()), backend="ray", num_steps=5,
                          cpus_per_worker=2) as c:
        assert len(c.workers.actors) == 2 and c.collect().batch.batch_size == torch.Size([5, 8])


@pytest.mark.parametrize("kw, named", [  # what the workers need, and what the cluster has
    (dict(num_workers=4, cpus_per_worker=2), ["8 CPU", "4"]),
    (dict(num_workers=2, cpus_per_worker=0.25, worker_options={"resources": {"big_gpu_node": 1}}),
     ["2 big_gpu_node", "0"]),
])
def test_a_request_the_cluster_cannot_meet_fails_at_once(cluster, kw, named):
    start = time.monotonic()
    with raises(ValueError, *named):
        make_collector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", **kw)
    assert time.monotonic() - start < 5


def test_resources_held_by_others_fail_after_the_placement_timeout(cluster, monkeypatch):
    from ray.util.placement_group import placement_group, remove_placement_group

    from collectors.backends import ray_
    hold = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="SPREAD")  # every CPU of the cluster
    assert hold.wait(timeout_seconds=30)
    monkeypatch.setattr(ray_, "PLACEMENT_TIMEOUT_S", 2.0)
    try:
        start = time.monotonic()
        with raises(ValueError, "2 s", "2 CPU", "0"):  # the timeout, what they need, what is free
            make_collector([f.vr_edge] * 2, ActorCritic(*vr_spaces()), backend="ray", num_workers=2)
        assert time.monotonic() - start < 10
    finally:
        remove_placement_group(hold)


def test_machine_reads_the_ray_cluster_cpus(cluster):
    from trainer.run_layout import Machine
    m = Machine.detect("ray")
    assert (m.ray_cpus, m.ray_cpus_here) == (4.0, 2.0)


def test_a_local_ray_started_by_the_project_listens_on_loopback_only():
    script = (
        "import psutil\n"
        "from collectors.backends.ray_ import connect\n"
        "ray = connect(num_cpus=1)\n"
        "ray.get(ray.remote(lambda: 1).remote())\n"
        "ips = {c.laddr.ip for p in psutil.Process().children(recursive=True) for c in p.net_connections('tcp')\n"
        "       if c.status == psutil.CONN_LISTEN}\n"
        "print(sorted(ips), ray.get_runtime_context().gcs_address)\n"
        "ray.shutdown()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=root,
                         env={**env, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    ips, gcs = out.stdout.strip().rsplit(" ", 1)
    assert gcs.startswith("127.0.0.1:")
    assert ips != "[]" and set(ast.literal_eval(ips)) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, ips


def _start_local_ray_run(algo: str, run_dir, home) -> subprocess.Popen:
    """A ``trainer.train`` process on a new local Ray instance, in its own process group (as a scheduler
    starts a job step), returned once it has completed 3 iterations."""
    home.mkdir()
    extra = ["--learning-starts", "200", "--replay-capacity", "2000"] if algo == "apex" else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.train", "--algo", algo, "--env", "CartPole-v1", "--backend", "ray",
         "--num-envs", "2", "--num-workers", "1", "--num-steps", "16", "--total-steps", "100000000",
         "--checkpoint-every", "1000", "--device", "cpu", "--run-dir", str(run_dir), *extra],
        cwd=root, env={**env, "PYTHONPATH": root, "HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    end = time.monotonic() + 240
    while not ((run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 3):
        if proc.poll() is not None or time.monotonic() > end:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            raise AssertionError(proc.communicate())
        time.sleep(0.5)
    return proc


@pytest.mark.parametrize(("algo", "signame", "whole_group"), [
    ("ppo", "SIGTERM", False),
    ("apex", "SIGTERM", True),  # as SLURM signals a job step: Ray's daemons get it too
    pytest.param("ppo", "SIGUSR1", True, marks=pytest.mark.slow),
])
def test_a_stop_signal_on_a_local_ray_run_stops_it_cleanly(tmp_path, algo, signame, whole_group):
    """Issue 24: Ray's own SIGTERM handler used to win (exit 134, no resume line, the lock left behind); a
    signal to the process group killed the daemons and made SIGUSR1 hang. Same stop as on the local backends,
    and the auth token Ray writes is not readable by other users."""
    import signal

    import psutil

    import checkpoints
    run_dir, home = tmp_path / "run", tmp_path / "home"
    proc = _start_local_ray_run(algo, run_dir, home)
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
        signum = getattr(signal, signame)
        if whole_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err
    names(err, signame, f"--resume {run_dir}")
    assert "training failed" not in err and "Traceback" not in err
    assert not (run_dir / "lock").exists()
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n")
    token = home / ".ray" / "auth_token"
    if token.exists():  # this Ray version writes one
        assert token.stat().st_mode & 0o077 == 0, oct(token.stat().st_mode)
    _, alive = psutil.wait_procs(kids, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_nothing_of_a_local_ray_outlives_a_killed_trainer(tmp_path):
    """Issue 24: after a SIGKILL of the trainer, Ray's agents lived 60-70 s on; the reaper it starts with a local
    instance kills them (and whatever else of Ray is left) within seconds."""
    import psutil

    proc = _start_local_ray_run("ppo", tmp_path / "run", tmp_path / "home")
    ray_procs = [p for p in psutil.Process(proc.pid).children(recursive=True) if "ray" in " ".join(p.cmdline())]
    proc.kill()  # the trainer alone, as the OOM killer would
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(ray_procs, timeout=10)
    left = {p: p.name() for p in alive if p.status() != psutil.STATUS_ZOMBIE}
    for p in left:  # nothing left for the next test, whatever the assertion says
        p.kill()
    assert ray_procs and not left, list(left.values())  # some there were: the daemons of the instance
