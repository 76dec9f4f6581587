"""--overlap: the next rollout is collected in a separate process while the learner learns on this one.

Promises under test: a fixed lag of exactly one update; runs as deterministic as alternating
ones; exact resume whatever stops them (signals in any phase, an env error or a dead
collecting process during the rollout in flight), with no process left behind.
"""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from collectors import EnvError, RolloutCollector, WorkerDiedError, make_collector
from collectors.background import BackgroundCollector
from tests import factories as f
from tests.messages import raises
from tests.test_durability import ITERATIONS, VR, assert_same_run, final_state, metrics, run
from trainer.config import TrainConfig
from trainer.ppo.model import ActorCritic
from trainer.run_layout import Machine, run_layout

OVERLAP = ["--overlap", "true"]
ROOT = Path(__file__).resolve().parent.parent


def vr_policy(seed=0):
    env = f.vr_edge()
    return ActorCritic(env.observation_space, env.action_space, seed=seed)


# ---------------------------------------------------------------------------- the collecting process

@pytest.mark.parametrize("backend, kw", [("sync", {}),
                                         pytest.param("async", {"num_workers": 1}, marks=pytest.mark.slow)])
def test_background_rollouts_equal_those_collected_here(backend, kw):
    env_fns = [f.vr_edge, f.vr_edge, f.vr_edge_batch]
    with RolloutCollector(env_fns, vr_policy(), backend=backend, num_steps=25, seed=4, **kw) as here:
        expected = [here.collect() for _ in range(3)]
        state = here.get_state()
    with BackgroundCollector(env_fns, vr_policy(), backend=backend, num_steps=25, seed=4, **kw) as there:
        got = []
        for _ in range(3):
            there.start()
            got.append(there.wait())
        assert there.get_state()["observations"].tolist() == state["observations"].tolist()
    assert any(r.episodes for r in expected)
    for a, b in zip(expected, got):
        assert a.batch.keys() == b.batch.keys()
        for k in a.batch.keys():
            assert torch.equal(a.batch[k], b.batch[k]), k
        assert torch.equal(a.next_observations, b.next_observations) and a.episodes == b.episodes


def test_weights_reach_the_collecting_process_and_versions_count():
    acting, learner = vr_policy(0), vr_policy(1)
    with RolloutCollector([f.vr_edge] * 2, vr_policy(0), num_steps=10, seed=1) as here, \
            make_collector([f.vr_edge] * 2, acting, background=True, num_steps=10, seed=1) as there:
        for c in (here, there):
            c.collect()
            c.update_policy(learner.state_dict())
        a, b = here.collect(), there.collect()
        assert b.policy_version == there.policy_version == 1
        assert torch.equal(a.batch["actions"], b.batch["actions"])  # collected with the learner's weights
        assert torch.equal(a.batch["log_probs"], b.batch["log_probs"])


def test_a_new_policy_brings_its_own_weights_and_a_state_dict_of_the_wrong_shape_is_refused():
    env = f.vr_edge()

    def narrow(seed):
        return ActorCritic(env.observation_space, env.action_space, hidden=(16,), seed=seed)

    with RolloutCollector([f.vr_edge] * 2, vr_policy(0), num_steps=10, seed=1) as here, \
            BackgroundCollector([f.vr_edge] * 2, vr_policy(0), num_steps=10, seed=1) as there:
        for c in (here, there):
            c.update_policy(narrow(3))
            c.update_policy(narrow(5).state_dict())  # into the new policy's weights, not the old one's
        a, b = here.collect(), there.collect()
        assert torch.equal(a.batch["log_probs"], b.batch["log_probs"]) and there.policy_version == 2
        with raises(RuntimeError, "size mismatch", lines=None):  # torch's own words, as torch says them
            there.update_policy(vr_policy(0).state_dict())
        assert torch.equal(there.collect().batch["log_probs"][0], here.collect().batch["log_probs"][0])


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_weights_updates_go_through_shared_memory_not_the_resource_sharer():
    """An update writes into the shared copy the collecting process got at spawn. Sent over the pipe, weights
    went through multiprocessing's resource sharer, whose thread here printed a traceback when the
    collecting process was stopped (SIGSTOP) half-way through fetching them and then timed out."""
    script = textwrap.dedent("""
        import multiprocessing.resource_sharer as sharer
        from collectors.background import BackgroundCollector
        from tests import factories as f
        from tests.test_overlap import vr_policy
        if __name__ == "__main__":
            learner = vr_policy(1)
            with BackgroundCollector([f.vr_edge] * 2, vr_policy(0), num_steps=10, seed=1) as c:
                for _ in range(3):
                    c.collect()
                    c.update_policy(learner.state_dict())
                print("version", c.collect().policy_version, "sharer", sharer._resource_sharer._thread is not None)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "version 3 sharer False" in out.stdout, out.stdout + out.stderr


def test_misuse_is_refused_with_what_to_do():
    with BackgroundCollector([f.cartpole] * 2, f.RandomPolicy(2), num_steps=5) as c:
        with raises(RuntimeError, "wait()", "start()"):
            c.wait()
        c.start()
        with raises(RuntimeError, "start()", "wait()"):  # the call refused, and the one to make first
            c.start()
        with raises(RuntimeError, "update_policy", "wait()"):
            c.update_policy(f.RandomPolicy(2))
        assert c.policy_version == 0
        c.wait()
    with raises(TypeError, "policy", "AttributeError", "nn.Module"):  # what, why, and what to pass instead
        BackgroundCollector([f.cartpole], lambda obs: obs, num_steps=5)
    with raises(ValueError, "background=True", "serial", "sync", "async"):  # the backends it is for
        make_collector([f.cartpole], f.RandomPolicy(2), backend="ray", background=True)


def test_an_env_error_in_the_collecting_process_is_raised_here_and_nothing_is_left():
    c = BackgroundCollector([f.cartpole, f.exploding], f.RandomPolicy(2), num_steps=50)
    c.start()
    with raises(EnvError, "env 1", "simulator exploded", lines=None) as info:  # the env's own error, traceback
        c.wait()
    assert info.value.env_index == 1
    assert not mp.active_children()


def test_a_dead_collecting_process_is_noticed_at_once():
    c = BackgroundCollector([f.cartpole] * 2, f.RandomPolicy(2), backend="async", num_workers=1, num_steps=50)
    grandchildren = psutil.Process(c._process.pid).children(recursive=True)
    c._process.kill()
    with raises(WorkerDiedError, "collecting process", f"pid {c._process.pid}"):
        c.start()  # (its send may already find the pipe closed)
        c.wait()
    _, alive = psutil.wait_procs(grandchildren, timeout=10)  # its async worker sees the pipe close and exits
    assert not alive and not mp.active_children()


@pytest.mark.parametrize("then", ["update_policy",
                                  *(pytest.param(t, marks=pytest.mark.slow) for t in ("get_state", "start"))])
def test_a_collecting_process_killed_while_this_one_learns_is_named_by_the_next_command(then):
    c = BackgroundCollector([f.cartpole] * 2, f.RandomPolicy(2), backend="sync", num_steps=8)
    c.collect()
    pid = c._process.pid
    c._process.kill()
    c._process.join(timeout=10)
    with raises(WorkerDiedError, "collecting process", f"pid {pid}", "SIGKILL"):
        if then == "update_policy":
            c.update_policy(f.RandomPolicy(2, seed=1))
        else:
            getattr(c, then)()
            c.wait()
    assert not mp.active_children()


def test_closing_with_a_rollout_in_flight_stops_everything():
    c = BackgroundCollector([f.vr_edge] * 2, vr_policy(), backend="async", num_workers=1, num_steps=2000)
    processes = [psutil.Process(c._process.pid), *psutil.Process(c._process.pid).children(recursive=True)]
    c.start()
    c.close()
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive


# ---------------------------------------------------------------------------- the trainer

# async inside the collecting process: the same trainer path with workers beneath it (slow; the collecting
# process over async workers is covered by the tests above and tests/test_hung_workers.py)
@pytest.fixture(scope="module", params=["sync", pytest.param("async", marks=pytest.mark.slow)])
def straight_overlap(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp(f"overlap_{request.param}")
    extra = ["--backend", request.param] + (["--num-workers", "1"] if request.param == "async" else [])
    run(VR + OVERLAP + extra + ["--run-dir", str(run_dir)])
    return extra, run_dir


def test_overlapped_runs_lag_one_update_and_are_deterministic(straight_overlap, tmp_path):
    extra, straight = straight_overlap
    rows = metrics(straight)
    assert [r["policy_lag"] for r in rows] == [0] + [1] * (ITERATIONS - 1)
    run(VR + OVERLAP + extra + ["--run-dir", str(tmp_path / "again")])
    assert_same_run(straight, tmp_path / "again")
    alternating = tmp_path / "alternating"
    run(VR + extra + ["--run-dir", str(alternating)])
    collected = ("reward_per_step", "episodes", "episode_return", "quality", "stall_s", "switches")
    alt = metrics(alternating)
    first = [{k: r[0].get(k) for k in collected} for r in (alt, rows)]
    assert first[0] == first[1]  # the first rollout is the same: nothing to overlap with yet
    assert [r["reward_per_step"] for r in alt[1:]] != [r["reward_per_step"] for r in rows[1:]]  # one update old


def test_overlapped_resume_is_exact_and_keeps_the_rollout_in_flight(straight_overlap, tmp_path):
    extra, straight = straight_overlap
    run(VR + OVERLAP + extra + ["--run-dir", str(tmp_path)], max_iterations=3)
    saved = final_state(tmp_path)
    assert saved["acting_model"] is not None  # the weights the rollout in flight is collected with
    assert not torch.equal(saved["acting_model"]["critic_head.weight"], saved["model"]["critic_head.weight"])
    run(["--resume", str(tmp_path)])
    assert_same_run(straight, tmp_path)


PHASES = {  # phase: (owner, function, call on which the signal arrives, iterations completed)
    "waiting_for_the_rollout_in_flight": (BackgroundCollector, "wait", 5, 4),
    "update": (torch.nn.utils, "clip_grad_norm_", 4 * 4 + 2, 4),
}


# the update phase, overlapped or not, takes test_durability's path: slow here
@pytest.mark.parametrize("phase", ["waiting_for_the_rollout_in_flight", pytest.param("update", marks=pytest.mark.slow)])
# SIGTERM takes the same path as SIGINT (StopSignals), with another exit status: slow
@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_during_an_overlapped_iteration_keeps_the_last_completed_one(
        straight_overlap, tmp_path, monkeypatch, phase, signum):
    import os

    from trainer import train as train_module
    extra, straight = straight_overlap
    owner, name, target, completed = PHASES[phase]
    real, calls = getattr(owner, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == target:
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapped)
    with pytest.raises(train_module.TrainingStopped) as stopped:
        run(VR + OVERLAP + extra + ["--run-dir", str(tmp_path)])
    monkeypatch.undo()
    assert stopped.value.exit_status == 128 + signum
    assert final_state(tmp_path)["iteration"] == len(metrics(tmp_path)) == completed
    assert not mp.active_children()
    run(["--resume", str(tmp_path)])
    assert_same_run(straight, tmp_path)


def test_an_error_in_the_rollout_in_flight_keeps_the_iteration_before(straight_overlap, tmp_path, monkeypatch):
    extra, straight = straight_overlap
    real, calls = BackgroundCollector.wait, []

    def failing(self):
        calls.append(1)
        if len(calls) == 4:  # the rollout iteration 4 would learn from
            self.close()
            raise EnvError(2, "step()", "simulated env bug")
        return real(self)
    monkeypatch.setattr(BackgroundCollector, "wait", failing)
    with raises(EnvError, "simulated env bug", lines=None):
        run(VR + OVERLAP + extra + ["--run-dir", str(tmp_path), "--checkpoint-every", "10"])
    monkeypatch.undo()
    assert final_state(tmp_path)["iteration"] == 3 == len(metrics(tmp_path))
    assert not mp.active_children()
    run(["--resume", str(tmp_path)])
    assert_same_run(straight, tmp_path)


def test_an_overlapped_checkpoint_resumes_only_overlapped(tmp_path):
    run(VR + OVERLAP + ["--run-dir", str(tmp_path)], max_iterations=2)
    with raises(ValueError, "--overlap", "False", "True"):  # given, and the run's
        run(["--resume", str(tmp_path), "--overlap", "false"])


@pytest.mark.parametrize("flags, key, named", [
    (dict(backend="ray", overlap=True), "overlap", ["--overlap", "serial", "sync", "async"]),  # what it works with
    (dict(overlap_targets="retrace"), "overlap_targets", ["overlap_targets", "'retrace'", "gae", "vtrace"]),
])
def test_bad_overlap_settings_are_refused(flags, key, named):
    with raises(ValueError, *named, key=key):
        TrainConfig.from_dict(flags).validate()


@pytest.mark.parametrize("backend, cores, expected", [
    # (workers, collecting-process threads, learner threads)
    ("sync", 2, (0, 1, 1)),
    ("sync", 16, (0, 1, 15)),
    ("async", 16, (14, 1, 1)),  # 14 workers + the collecting process collect while the learner learns
    ("async", 64, (62, 1, 1)),
    ("async", 2, (1, 1, 1)),
])
def test_overlap_layout_gives_the_learner_what_collection_leaves(backend, cores, expected):
    layout = run_layout(TrainConfig(backend=backend, overlap=True, num_envs=64), Machine(cores))
    assert (layout.workers, layout.collect_threads, layout.learn_threads) == expected
    assert layout.collector_kwargs()["background"] is True
    assert "while this process learns" in layout.describe()


@pytest.mark.parametrize("delay", [1.5, *(pytest.param(d, marks=pytest.mark.slow) for d in (2.5, 3.5))])
def test_a_stop_signal_while_the_processes_start_leaves_nothing_behind(tmp_path, delay):
    """SIGTERM while the collecting process and its workers are still starting: exit 143, no orphans."""
    import time

    from tests.test_durability import cli
    proc = cli(VR + OVERLAP + ["--backend", "async", "--num-workers", "1", "--run-dir", str(tmp_path / "run")],
               tmp_path)
    time.sleep(delay)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert proc.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM), err  # (-: before its handlers exist)
    assert not alive, f"left behind: {alive}"
    trainer_lines = [line for line in err.splitlines()
                     if line.startswith("stopped by") or line.startswith("SIGTERM while starting: nothing to save")]
    assert proc.returncode != 128 + signal.SIGTERM or trainer_lines, err  # the trainer says what happened
    # known, left open: a worker killed mid-way through its own start-up may still print the
    # "pickle data was truncated" traceback of multiprocessing's spawn (see the issue 12 note)


def test_a_signal_after_the_run_finished_stops_nothing():
    import os

    from trainer.interrupts import StopSignals
    with StopSignals() as signals:
        signals.finish()
        os.kill(os.getpid(), signal.SIGTERM)  # would raise Interrupted before finish()
        assert signals.finished
