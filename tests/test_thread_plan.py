"""Threads chosen by measuring (issue 39): the planner's choices on given timings, and a planned run through the
Python API on a simulated machine and through the command line, stopped and resumed."""

import json
import subprocess
import sys

import pytest
import torch

from checkpoints.run_dir import checkpoint_files, checkpoint_iteration
from checkpoints.store import load
from collectors.resources import usable_cores
from trainer.config import TrainConfig
from trainer.run_layout import Machine, run_layout
from trainer.thread_plan import (
    BASELINE,
    COLLAPSE,
    DRIFT_RUN,
    PLAN_MIN_ITERATIONS,
    RunThreads,
    ThreadPlanner,
    candidate_counts,
)


def planned(planner: ThreadPlanner, seconds: dict[str, dict[int, float]], limit: int = 50) -> list[dict[str, int]]:
    """Feed ``planner`` the time each count takes per phase until it chooses; returns the counts it tried."""
    tried = []
    planner.record(9.9, 9.9)  # warm-up
    while planner.chosen is None and len(tried) < limit:
        counts = planner.threads()
        tried.append(counts)
        planner.record(seconds["collect"][counts["collect"]], seconds["learn"][counts["learn"]])
    return tried


@pytest.mark.parametrize("cap, counts", [(1, [1]), (2, [1, 2]), (12, [1, 2, 4, 8, 12]), (16, [1, 2, 4, 8, 16])])
def test_candidates_double_up_to_the_cap(cap, counts):
    assert candidate_counts(cap) == counts


def test_each_phase_gets_its_fastest_count():
    planner = ThreadPlanner(collect_cap=4, learn_cap=4, machine="m")
    planned(planner, {"collect": {1: 1.0, 2: 1.2, 4: 1.3}, "learn": {1: 3.0, 2: 2.0, 4: 1.5}})
    assert planner.chosen == {"collect": 1, "learn": 4}
    assert planner.state()["chosen"] == planner.chosen and "learn" in planner.describe()


def test_the_upward_sweep_stops_past_the_bottom_of_the_u():
    """On 64 cores, a count 25% slower than the best ends the sweep: 16, 32 and 64 threads are never run."""
    times = {1: 1.0, 2: 0.6, 4: 0.5, 8: 0.7, 16: 5.0, 32: 9.0, 64: 20.0}
    planner = ThreadPlanner(collect_cap=64, learn_cap=64, machine="m")
    tried = planned(planner, {"collect": times, "learn": times})
    assert planner.chosen == {"collect": 4, "learn": 4}
    assert max(t["learn"] for t in tried) == 8
    assert sorted(t["learn"] for t in tried) == [1, 1, 2, 2, 4, 4, 8, 8]  # each tried count measured twice


def test_no_team_larger_than_the_cores_other_processes_leave_free():
    """Next to two busy processes on 2 cores, 2 threads are never tried (a team that cannot all run waits on its
    descheduled half at every op); on a quiet machine they are."""
    for elsewhere, most in [(1.4, 1), (0.2, 2)]:
        planner = ThreadPlanner(collect_cap=2, learn_cap=2, machine="m")
        planner.record(9.9, 9.9)
        tried = []
        while planner.chosen is None:
            tried.append(planner.threads()["learn"])
            planner.record(0.5, 1.0, busy_elsewhere=elsewhere)
        assert max(tried) == most


def test_a_noisy_trial_is_measured_again():
    """The faster of two times decides: one trial slowed by another process does not lose its count."""
    planner = ThreadPlanner(collect_cap=1, learn_cap=2, machine="m")
    planner.record(9.9, 9.9)
    for collect_s, learn_s in [(0.1, 1.0), (0.1, 5.0), (0.1, 0.5), (0.1, 1.0)]:  # 1, 2 (slowed), then 2, 1
        planner.record(collect_s, learn_s)
    assert planner.chosen == {"collect": 1, "learn": 2}


def test_a_slowdown_that_lasts_plans_again_and_a_spike_does_not():
    planner = ThreadPlanner(collect_cap=2, learn_cap=2, machine="m")
    planned(planner, {"collect": {1: 1.0, 2: 0.5}, "learn": {1: 1.0, 2: 0.5}})
    assert planner.chosen == {"collect": 2, "learn": 2}
    for _ in range(BASELINE):
        assert planner.record(0.5, 0.5) == ""
    assert planner.record(0.5, 1.0) == "" and planner.record(0.5, 0.5) == ""  # one spike
    assert planner.chosen is not None
    lines = [planner.record(0.5, 1.0) for _ in range(DRIFT_RUN)]  # the cores were taken
    assert lines[-1] and not any(lines[:-1])
    assert planner.chosen is None and planner.threads() == {"collect": 1, "learn": 1}  # a new sweep from 1


def test_a_collapse_plans_again_at_once():
    planner = ThreadPlanner(collect_cap=2, learn_cap=2, machine="m")
    planned(planner, {"collect": {1: 1.0, 2: 0.5}, "learn": {1: 1.0, 2: 0.5}})
    for _ in range(BASELINE):
        planner.record(0.5, 0.5)
    assert planner.record(0.5, 0.5 * COLLAPSE + 0.1) and planner.chosen is None


def test_a_plan_is_reused_only_on_the_machine_and_caps_it_was_made_for():
    planner = ThreadPlanner(collect_cap=2, learn_cap=2, machine="cpu A, 2 cores")
    planned(planner, {"collect": {1: 1.0, 2: 0.5}, "learn": {1: 0.5, 2: 1.0}})
    stored = json.loads(json.dumps(planner.state()))  # as config.json and a checkpoint hold it
    assert ThreadPlanner(2, 2, "cpu A, 2 cores", stored).chosen == {"collect": 2, "learn": 1}
    assert ThreadPlanner(2, 2, "cpu B, 2 cores", stored).chosen is None
    assert ThreadPlanner(2, 4, "cpu A, 2 cores", stored).chosen is None


class FakeCollector:
    num_threads = None
    seconds_collecting = 0.0


@pytest.mark.parametrize("threads, device, iterations, planned_", [
    (0, "cpu", PLAN_MIN_ITERATIONS, True),
    (0, "cpu", PLAN_MIN_ITERATIONS - 1, False),  # too short: one thread per phase
    (3, "cpu", 10 * PLAN_MIN_ITERATIONS, False),  # --threads fixes them
    (0, "cuda", 10 * PLAN_MIN_ITERATIONS, False),  # the layout's counts
])
def test_which_runs_are_planned(threads, device, iterations, planned_):
    cfg = TrainConfig(env="CartPole-v1", backend="sync", num_envs=4, threads=threads, device=device)
    layout = run_layout(cfg, Machine(cores=16, gpus=int(device == "cuda")))
    run = RunThreads.for_run(layout, threads, FakeCollector(), iterations, None)
    assert (run.planner is not None) == planned_
    counts = run.apply()
    assert torch.get_num_threads() == counts["learn"]
    if threads:
        assert counts == {"collect": 3, "learn": 3}
    elif not planned_:
        assert counts == ({"collect": layout.collect_threads, "learn": layout.learn_threads} if device == "cuda"
                          else {"collect": 1, "learn": 1})


def test_a_planned_run_on_a_simulated_machine_records_its_threads(tmp_path):
    """Every row names the counts it ran with; config.json holds the plan, within the layout's caps."""
    from trainer.train import train

    before = torch.get_num_threads()
    iterations = PLAN_MIN_ITERATIONS + 10
    cfg = TrainConfig.from_dict(dict(env="CartPole-v1", backend="sync", num_envs=2, num_steps=4,
                                     total_steps=iterations * 8, epochs=1, minibatch_size=8, run_dir=str(tmp_path),
                                     checkpoint_every=1000))
    train(cfg, progress=False, machine=Machine(cores=4))
    assert torch.get_num_threads() == before  # nothing leaks out of train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == iterations
    assert {r["learn_threads"] for r in rows} <= {1, 2, 4} and {r["collect_threads"] for r in rows} <= {1, 2, 4}
    plan = json.loads((tmp_path / "config.json").read_text())["thread_plan"]
    assert plan["caps"] == {"collect": 4, "learn": 4} and plan["chosen"] is not None
    assert plan["chosen"]["learn"] in (1, 2, 4) and set(plan["timings"]["learn"]) <= {"1", "2", "4"}


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="one core: nothing to plan")
def test_a_resumed_run_goes_on_with_its_stored_plan_through_the_command_line(tmp_path):
    """Stopped after the plan was made, a resume on the same machine runs the stored counts from its first
    iteration (no new trials) and says so.

    The resume starts from the newest checkpoint that holds a plan: on a loaded machine the first run may end while
    planning again (the plan watched its times drift), and its last checkpoint then holds no plan to go on with."""
    run = tmp_path / "run"
    (tmp_path / "keep.toml").write_text("keep_checkpoints = 1000\n")
    base = [sys.executable, "-m", "trainer.train", "--env", "CartPole-v1", "--backend", "sync", "--num-envs", "2",
            "--num-steps", "4", "--epochs", "1", "--minibatch-size", "8", "--run-dir", str(run)]
    total = (PLAN_MIN_ITERATIONS + 20) * 8
    first = subprocess.run([*base, "--config", str(tmp_path / "keep.toml"), "--total-steps", str(total),
                            "--checkpoint-every", "1"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    checkpoint, plan = next((f, p) for f in checkpoint_files(run) if (p := load(f)["thread_plan"])["chosen"])
    iteration = checkpoint_iteration(checkpoint)
    resumed = subprocess.run([sys.executable, "-m", "trainer.train", "--resume", str(checkpoint), "--total-steps",
                              str(total + 8 * 8)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "stored plan" in resumed.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = rows[iteration:]
    assert len(after) == PLAN_MIN_ITERATIONS + 28 - iteration
    assert {(r["collect_threads"], r["learn_threads"]) for r in after[:BASELINE]} == \
        {(plan["chosen"]["collect"], plan["chosen"]["learn"])}


@pytest.mark.parametrize("policy_arch, users", [("flat", 8), ("per_head", 8), ("set", "2-8")])
def test_a_runs_first_weights_do_not_depend_on_the_threads_it_starts_under(policy_arch, users):
    """A run starts in a process with the machine's thread count, or its job's share, or whatever an earlier
    run left: its first weights (orthogonal init, a QR that rounds by thread count) must be the same under all."""
    from trainer.ppo.algorithm import PPO

    cfg = TrainConfig.from_dict(dict(env="VREdge-v0", env_kwargs=f"users={users}", policy_arch=policy_arch))
    before = torch.get_num_threads()
    try:
        weights = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            weights.append(PPO.make_model(cfg).state_dict())
    finally:
        torch.set_num_threads(before)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), policy_arch
