"""The benchmark scripts run end to end at tiny sizes and print sane reports (no timing is asserted)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import checkpoints
from benchmarks import backends, cell, device_check, double_buffer, env_steps, scaling, worker_start
from tests.factories import replace_weights_in_place, settings_file
from tests.messages import exits

# without a GPU, the check must not read as if it had met the GPU targets
PASSED = "device check: OK" if torch.cuda.is_available() else \
    "device check: OK on the CPU; nothing was measured on a GPU (CUDA is not available here)"
PHASES = {"iteration", "collect", "env", "acting", "gae", "update", "snapshot"}


def device_check_report(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow  # quick: every part at tiny sizes on the CPU (~10 minutes on a busy 2-core machine)
def test_device_check_quick_runs_every_part(capsys, tmp_path):
    assert device_check.main(["--quick", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    for part in device_check.PARTS:  # each section, in the order, and its time
        assert f"[{part}]\n" in out and re.search(rf"^    \({part}: \d+ s\)$", out, re.M), part
    assert [out.index(f"[{p}]\n") for p in device_check.PARTS] == sorted(out.index(f"[{p}]\n")
                                                                         for p in device_check.PARTS)
    assert out.rstrip().endswith(PASSED)
    report = device_check_report(tmp_path / "r.json")
    parts = report["parts"]
    assert report["cut"] == [] and report["failures"] == [] and report["verdict"] == PASSED.split(": ", 1)[1]
    assert parts["tests"]["status"] == "skipped" and parts["tests"]["passed"] is None  # no CUDA here
    for recipe in ("gpu_defaults", "cell_recipe"):  # (2): every phase timed, the labels counted
        profiled = parts["profile"][recipe]
        assert set(profiled["phases_s"]) == PHASES and all(v > 0 for v in profiled["phases_s"].values()), recipe
        assert set(profiled["update_samples_per_s"]) == set(device_check.PRECISIONS)
        assert profiled["labels"]["states"] > 0 and profiled["labels"]["per_s"] > 0
    assert parts["profile"]["cell_recipe"]["num_envs"] == 8  # the tiny run's flags over the recipe's
    assert parts["scale"]["env_steps_per_s"]["32"]["without_cuda_graphs"] > 0  # (3): --quick's "many" envs
    for recipe in ("gpu_defaults", "cell_recipe"):  # (4): the commands a user runs, to their quality line
        ran = parts["whole"][recipe]
        assert ran["exit_status"] == 0 and ran["quality"] and "reward/step" in ran["quality"], ran
        assert ran["wall_s"] > 0 and ran["progress"] == "2 iterations, 256 of 256 env steps"
    assert "--config" in parts["whole"]["cell_recipe"]["command"]
    assert parts["resume"] == {**parts["resume"], "sync": True, "device": True}
    rows = re.findall(r"^\s+8\s+(sync|device|device compiled|async)\s+(\d+)\s+([\d,]+)", out, re.M)
    assert [(b, int(w)) for b, w, _ in rows] == [("sync", 0), ("device", 0), ("device compiled", 0), ("async", 1),
                                                 ("async", 2)]
    assert all(int(r.replace(",", "")) > 0 for _, _, r in rows)
    raw = re.search(r"^\s+64: numpy ([\d,]+), torch eager ([\d,]+)$", out, re.M)
    assert raw and all(int(r.replace(",", "")) > 0 for r in raw.groups())
    assert set(parts["precision"]["reward_per_step"]) == set(device_check.PRECISIONS)
    assert len(parts["precision"]["tf32_minus_fp32"]) == len(parts["precision"]["bf16_minus_fp32"]) == 1
    ranks = re.findall(r"^\s+([12]) ranks?: ([1-9][\d,]*) env steps/s \(([\d.]+)x one\)$", out, re.M)
    assert [k for k, _, _ in ranks] == ["1", "2"] and ranks[0][2] == "1.00"
    decisions = report["decisions"]
    assert decisions["cuda_graphs"]["cuda_tests_passed"] is None  # (with CUDA graphs: measured on CUDA alone)
    assert decisions["cuda_graphs"]["update_samples_per_s"] == {
        "without_cuda_graphs": parts["profile"]["gpu_defaults"]["update_samples_per_s"]["fp32"]}
    assert set(decisions["learner_precision"]["update_samples_per_s"]) == set(device_check.PRECISIONS)


def test_device_check_runs_the_parts_asked_for_in_their_order(capsys, tmp_path):
    # two cheap parts (every part: the slow test above)
    assert device_check.main(["--quick", "--parts", "env,tests", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert out.index("[env]\n") < out.index("[tests]\n") and "[profile]" not in out and "[resume]" not in out
    parts = device_check_report(tmp_path / "r.json")["parts"]
    assert list(parts) == ["env", "tests"] and parts["env"]["64"]["numpy"] > 0
    for wrong in ("env,nope", "env,env", ""):
        with pytest.raises(SystemExit):
            device_check.main(["--quick", "--parts", wrong])
    with pytest.raises(SystemExit):
        device_check.main(["--quick", "--budget", "0"])


def test_parts_past_the_budget_are_cut_and_listed(capsys, tmp_path):
    assert device_check.main(["--quick", "--parts", "profile,env", "--budget", "1", "--json",
                              str(tmp_path / "r.json")]) == 0  # the report keeps back more than 1 s: nothing runs
    out = capsys.readouterr().out
    report = device_check_report(tmp_path / "r.json")
    assert report["cut"] == ["profile: the whole part: the budget is spent", "env: the whole part: the budget is spent"]
    assert report["parts"]["profile"]["status"] == report["parts"]["env"]["status"] == "cut"
    assert "cut: profile: the whole part: the budget is spent" in out and out.rstrip().endswith("(2 cut by the budget)")


def test_a_whole_run_that_would_not_fit_is_skipped_with_the_profiles_estimate(capsys, tmp_path):
    check = device_check.Check(device_check.QUICK, cuda=False, report_path=tmp_path / "r.json", quick=True,
                               budget_s=600)
    profiled = {"start_s": 5.0, "iterations_of_the_whole_run": 1000, "phases_s": {"iteration": 2.0},
                "labels": {"per_s": 100.0}}
    check.report["parts"]["profile"] = {"gpu_defaults": profiled, "cell_recipe": profiled}
    check.run(["whole"], tmp_path)  # 2,000 s of iterations: neither is started
    whole = check.report["parts"]["whole"]
    assert whole["gpu_defaults"]["cut"] == whole["cell_recipe"]["cut"] == "skipped: it would not fit"
    assert whole["gpu_defaults"]["estimate_s"] == device_check.whole_estimate(
        profiled, device_check.recipe_config("gpu_defaults", "cpu", device_check.TINY_RUN)) >= 2005
    assert len(check.report["cut"]) == 2 and "--parts profile,whole --budget" in check.report["cut"][0]
    assert not (tmp_path / "whole" / "gpu_defaults").exists()  # no run was started
    assert json.loads((tmp_path / "r.json").read_text())["parts"]["whole"] == whole


def test_a_whole_run_past_its_deadline_is_stopped_and_said_to_be_cut(tmp_path):
    lines = []
    ran = device_check.whole_run(["--device", "cpu", *device_check.TINY_RUN], tmp_path / "run", 0.5, lines.append)
    assert ran["cut"].startswith("stopped at the budget's end (0 s)") and ran["exit_status"] != 0
    assert ran["quality"] is None and "tail" not in ran  # cut, not failed


@pytest.mark.parametrize("passing", [True, False])
def test_the_cuda_tests_part_says_whether_they_passed(tmp_path, passing):
    test = tmp_path / "test_gpu.py"
    test.write_text(f"import pytest\n\n\n@pytest.mark.cuda\ndef test_it():\n    assert {passing}\n\n\n"
                    "def test_not_cuda():\n    assert False\n")  # not marked cuda: deselected
    ran = device_check.run_cuda_tests([test], timeout_s=120)
    assert ran["passed"] is passing and ("1 passed" if passing else "1 failed") in ran["summary"]
    assert bool(ran["tail"]) is not passing  # the failure's lines, for the report


@pytest.mark.slow  # a tiny profile (~10 s; more on a busy machine)
def test_a_profile_keeps_its_phases_where_an_update_variant_or_the_labels_fail(monkeypatch):
    real = device_check.learner_precision

    def no_bf16(name, device):
        if name == "bf16":
            raise RuntimeError("bf16 autocast: an op without a bfloat16 kernel")
        return real(name, device)

    def no_labels(*args, **kwargs):
        raise ValueError("the expert cannot play this cell")

    monkeypatch.setattr(device_check, "learner_precision", no_bf16)
    monkeypatch.setattr(device_check, "phase_labels", no_labels)
    cfg = device_check.recipe_config("gpu_defaults", "cpu", device_check.TINY_RUN)
    profiled = device_check.profile_recipe(cfg, device_check.QUICK, cuda=False, say=lambda line: None)
    assert set(profiled["phases_s"]) == PHASES and set(profiled["update_samples_per_s"]) == {"fp32", "tf32"}
    assert profiled["update_errors"]["bf16"].startswith("RuntimeError: bf16 autocast: an op without a bfloat16 kernel")
    assert profiled["labels"]["error"].startswith("ValueError: the expert cannot play this cell (test_benchmarks.py:")
    assert device_check.whole_estimate(profiled, cfg) is None  # no labels rate: the whole run is not estimated


def test_learner_precision_sets_tf32_and_bf16_and_restores_float32():
    a = torch.randn(4, 4)
    before = torch.get_float32_matmul_precision()
    with device_check.learner_precision("tf32", "cpu"):
        assert torch.get_float32_matmul_precision() == "high"
    with device_check.learner_precision("bf16", "cpu"):
        assert (a @ a).dtype == torch.bfloat16
    with device_check.learner_precision("fp32", "cpu"):
        assert (a @ a).dtype == torch.float32 and torch.get_float32_matmul_precision() == before
    assert torch.get_float32_matmul_precision() == before and (a @ a).dtype == torch.float32
    with pytest.raises(ValueError, match="precision 'fp16': choose one of fp32, tf32, bf16"):
        with device_check.learner_precision("fp16", "cpu"):
            pass


@pytest.mark.slow  # two device checks in fresh processes
def test_the_device_check_script_runs_the_check_and_keeps_its_report(tmp_path):
    """What a GPU machine runs (benchmarks/device_check.sh): the check's exit status, both reports in $OUT."""
    import os
    import subprocess
    import sys
    script = str(Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.sh")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    run = subprocess.run(["bash", script, "--quick", "--parts", "tests,env"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = (tmp_path / "device_check.txt").read_text()
    assert "[tests]\n" in report and "[env]\n" in report and report.rstrip().endswith(PASSED)
    assert "budget: 460 s" in report  # the script's timeout (480 s) less 20
    assert list(device_check_report(tmp_path / "device_check.json")["parts"]) == ["tests", "env"]
    # cut short by the hard stop (a budget past it), into a folder not made yet
    # 20 s: past the start (~10 s on a busy machine) and short of these parts (32 s at --quick on a quiet 2-core
    # AMD EPYC, torchrun's 15 s the last; 108 s running the suite beside it), so the stop lands inside one of them
    parts = ["resume", "backends", "profile", "precision", "torchrun"]
    env.update(DEVICE_CHECK_TIMEOUT="20", OUT=str(tmp_path / "new"))
    run = subprocess.run(["bash", script, "--quick", "--parts", ",".join(parts), "--budget", "3600"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 124, run.stdout
    report = (tmp_path / "new" / "device_check.txt").read_text()
    assert report == run.stdout and "Traceback" not in report
    last = report.rstrip().splitlines()[-1]
    cut = re.fullmatch(r"device check: cut short \(stopped by SIGHUP\) in part (\w+); the parts before it are "
                       r"complete above, the rest: --parts ([\w,]+)", last)
    assert cut and cut[1] in parts and cut[2] == ",".join(parts[parts.index(cut[1]):]), last
    stopped = device_check_report(tmp_path / "new" / "device_check.json")
    assert stopped["stopped"] == "stopped by SIGHUP" and "decisions" in stopped


def test_a_variant_that_raises_is_reported_and_the_device_check_goes_on(capsys, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    monkeypatch.setattr(device_check, "resume_matches", broken)
    assert device_check.main(["--quick", "--parts", "resume,env", "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^    \(resume\) sync: FAILED: RuntimeError: CUDA error: operation not permitted when stream "
                     r"is capturing \(test_benchmarks.py:\d+\)$", out, re.M)
    assert "(resume) device: FAILED: RuntimeError" in out  # the next variant still ran
    assert re.search(r"^\s+64: numpy [\d,]+", out, re.M)  # and so did the next part
    message = "raised RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert out.rstrip().endswith(f"device check: FAILED: (resume) sync {message}; (resume) device {message}")
    report = device_check_report(tmp_path / "r.json")
    assert report["parts"]["resume"]["status"] == "failed" and report["parts"]["env"]["status"] == "done"
    assert len(report["failures"]) == 2


@pytest.mark.slow  # whole training commands: CI runs it
def test_backends_runs_each_contender_through_the_command_line_side_by_side(capsys):
    backends.main(["--rounds", "1", "--iterations", "2", "--contenders", "sync", "device+compile", "--",
                   "--num-envs", "8", "--num-steps", "16"])
    out = capsys.readouterr().out
    assert "shared flags: --device cpu --total-steps 256 --num-envs 8 --num-steps 16" in out
    rows = re.findall(r"^\| (sync|device\+compile) \| ([\d,]+) \[.*\] \| ([\d.]+)x \| ([\d.]+) \|$", out, re.M)
    assert [name for name, *_ in rows] == ["sync", "device+compile"] and rows[0][2] == "1.000"
    assert all(int(rate.replace(",", "")) > 0 and float(wall) > 0 for _, rate, _, wall in rows)


def test_env_steps_quick_reports_numpy_and_torch_side_by_side(capsys):
    env_steps.main(["--quick"])
    rows = re.findall(r"^\s+(\d+)\s+(numpy|torch eager)\s+([\d,]+)\s+\[.*\]\s+([\d.]+)x numpy$",
                      capsys.readouterr().out, re.M)
    assert [(int(n), name) for n, name, *_ in rows] == [(8, "numpy"), (8, "torch eager"), (64, "numpy"),
                                                         (64, "torch eager")]
    assert all(int(r.replace(",", "")) > 0 and float(x) > 0 for *_, r, x in rows)


@pytest.mark.slow  # whole training commands: CI runs it
def test_scaling_quick_reports_rates_and_efficiency(capsys):
    scaling.main(["--quick"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\s+(\d+)\s+([\d,]+)\s+([\d.]+)x\s+([\d.]+)$", out, re.M)
    assert [int(w) for w, *_ in rows] == [1, 2, 1, 2]  # two workloads, 1 and 2 workers
    assert all(float(e) > 0 for *_, e in rows)


@pytest.mark.slow  # five collectors, four of them with worker processes
def test_double_buffer_quick_reports_every_contender_with_efficiency(capsys):
    double_buffer.main(["--quick"])
    out = capsys.readouterr().out
    rows = re.findall(r"^(sync|async, [\w ,()-]+?|gymnasium AsyncVectorEnv\(shm\))\s+([\d,]+)\s+\[.*?\]\s+([\d.]+) \[",
                      out, re.M)
    names = [name for name, *_ in rows]
    assert names[:3] == ["sync", "async, lockstep (default)", "async, double-buffered"]
    assert names[-1] == "gymnasium AsyncVectorEnv(shm)"
    assert all(int(rate.replace(",", "")) > 0 and float(eff) > 0 for _, rate, eff in rows)


@pytest.mark.slow  # two fresh programs, one of them spawning a worker twice
def test_worker_start_quick_reports_both_start_methods(capsys):
    worker_start.main(["--quick"])
    out = capsys.readouterr().out
    seconds = r"\s+([\d.]+) \[.*?\]"  # a median and its spread
    rows = re.findall(rf"^(forkserver|spawn)\s+1{seconds * 3}\s+(\d+)\s+(\d+)$", out, re.M)
    assert [r[0] for r in rows] == ["forkserver", "spawn"], out
    assert all(float(x) > 0 for r in rows for x in r[1:4]) and all(int(r[5]) > 0 for r in rows), out
    assert re.search(r"^1 workers: spawn / forkserver, first start\s+[\d.]+ \[.*\]x, later starts\s+[\d.]+ ", out, re.M)


def test_worker_counts_reach_the_cores():
    assert scaling.worker_counts(1) == [1]
    assert scaling.worker_counts(16) == [1, 2, 4, 8, 16]
    assert scaling.worker_counts(12) == [1, 2, 4, 8, 12]


@pytest.mark.slow
def test_revisions_compares_two_checkouts_side_by_side(capsys, monkeypatch):
    import subprocess
    from pathlib import Path

    import pytest

    from benchmarks import revisions
    root = Path(revisions.__file__).resolve().parent.parent
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    made, worktree = [], revisions.worktree  # this run's worktree: benchmarks.cell --base may hold one meanwhile

    def recorded(revision, where):
        made.append(str(where))
        return worktree(revision, where)
    monkeypatch.setattr(revisions, "worktree", recorded)
    revisions.main(["--base", "HEAD", "--rounds", "1", "--", "--env", "CartPole-v1", "--num-envs", "2",
                    "--num-steps", "16", "--total-steps", "96", "--device", "cpu"])
    out = capsys.readouterr().out
    assert re.search(r"round 1 base: [\d,]+ env steps/s", out) and re.search(r"round 1 head: [\d,]+", out)
    assert re.search(r"head / base: \d+\.\d{3}", out)
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=root, capture_output=True,
                            text=True).stdout
    assert len(made) == 1 and f"worktree {made[0]}\n" not in listed  # the temporary worktree is removed


def test_iteration_breakdown_times_both_phases_for_both_thread_counts(capsys):
    from benchmarks import iteration_breakdown
    out = iteration_breakdown.main(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"], iterations=2)
    assert set(out) == {1, 2} and all(c > 0 and lr > 0 for c, lr in out.values())
    assert "best possible --overlap gain" in capsys.readouterr().out


def test_iteration_breakdown_names_itself_in_its_help_and_errors(capsys):
    """It takes the trainer's flags, but its usage and its errors are its own, not ``trainer.train``'s; a flag it
    would not honour is refused, and what only the env can tell is a usage error too, not a traceback."""
    from benchmarks import iteration_breakdown
    for argv, status in ((["--help"], 0), (["--num-envz", "3"], 2), (["--algo", "apex"], 2),
                         (["--backend", "async"], 2), (["--overlap", "true"], 2), (["--run-dir", "/tmp/x"], 2),
                         (["--env", "CartPol-v1"], 2),
                         (["--env", "CartPole-v1", "--env-kwargs", "num_users=6"], 2)):
        with pytest.raises(SystemExit) as stopped:
            iteration_breakdown.main(argv)
        printed = capsys.readouterr()
        assert stopped.value.code == status
        assert "python -m benchmarks.iteration_breakdown" in printed.out + printed.err
        assert "trainer.train [" not in printed.out and "trainer.train:" not in printed.err, printed


def test_iteration_breakdown_help_lists_only_the_flags_it_takes(capsys):
    from benchmarks import iteration_breakdown
    with pytest.raises(SystemExit):
        iteration_breakdown.main(["--help"])
    listed = set(re.findall(r"^  (--[a-z-]+)", capsys.readouterr().out, re.MULTILINE))
    refused = {"--" + key.replace("_", "-") for key in iteration_breakdown.RUN_FLAGS} | {"--resume", "--overwrite"}
    refused |= {"--replay-capacity", "--n-step", "--learning-starts", "--replay-ratio"}  # Ape-X's: it times PPO
    assert {"--num-envs", "--num-steps", "--lr", "--env", "--env-kwargs"} <= listed and not listed & refused, listed


def test_the_apex_benchmark_without_one_names_the_choices(capsys):
    from benchmarks import apex
    with exits(2, "cartpole", "ingestion", "vr-edge", capsys=capsys):  # the choices
        apex.main([])


def test_cell_quick_reports_every_cell_against_the_fixed_one_of_as_many_slots(capsys):
    cell.main(["--quick"])
    out = capsys.readouterr().out
    for engine in ("numpy", "torch"):
        block = out[out.index(f"\n{engine}: "):]
        rows = re.findall(r"^\s+(\S.*?)\s+([\d,]+)\s+([\d.]+)x\s+([\d.]+)x$", block, re.M)[:len(cell.CELLS)]
        assert [r[0] for r in rows] == list(cell.CELLS), block
        assert all(float(r[2]) == 1.0 for r in rows if r[0].startswith("fixed")), block  # each against itself
        assert float(rows[0][3]) == 1.0 and all(int(r[1].replace(",", "")) > 0 for r in rows), block


@pytest.mark.slow  # six tiny trainings, each a command
def test_cell_train_quick_times_the_recipe_against_the_defaults_at_its_slots(capsys):
    cell.main(["--train", "--quick", "--base", "HEAD"])  # (HEAD: a revision checked out beside this checkout)
    table = capsys.readouterr().out.split("\ntraining ")[-1]
    rows = re.findall(r"^(\S.*?)\s+([\d,]+) \[[\d,]+ - [\d,]+\]\s+([\d.]+)x$", table, re.M)
    assert [r[0] for r in rows] == [*cell.TRAININGS, *(name + " (base)" for name in cell.BASE)], table
    assert all(int(r[1].replace(",", "")) > 0 for r in rows), table
    ratios = dict((r[0], r[2]) for r in rows)
    assert float(ratios["defaults, 12 slots"]) == float(ratios["defaults, 12 slots (base)"]) == 1.0, table  # each
    # against its own


@pytest.mark.slow  # two tiny trainings, then their episodes
def test_cells_table_pairs_each_run_with_the_baselines_as_evaluate_does(tmp_path, capsys):
    """Two runs of one recipe: each cell's numbers are what ``trainer.evaluate --users --churn`` gives for that run
    (the same held-out episodes, the baselines played once for both), and a second call plays nothing again."""
    from benchmarks import cells_table
    from trainer.evaluation.cells import evaluate_cells
    from trainer.evaluation.policies import trained_model
    from trainer.train import main as train

    recipe = ["--env", "VREdge-v0", "--env-kwargs", "num_users=3,users=2-3,churn=0.05,max_steps=20",
              "--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--compile", "off", "--threads", "1"]
    runs = [tmp_path / "a", tmp_path / "b"]
    for seed, run in enumerate(runs, 1):
        train([*recipe, "--config", settings_file("policy_arch_set"), "--seed", str(seed), "--run-dir", str(run)])
    out = tmp_path / "table"
    argv = [*map(str, runs), "--users", "1,3", "--churn", "0,0.1", "--episodes", "3", "--baselines", "fair_share",
            "--jobs", "1", "--out", str(out)]
    cells_table.main(argv)
    rows = json.loads((out / "table.json").read_text())
    assert [(r["users"], r["churn"], Path(r["run"]).name) for r in rows] == [
        (u, c, r) for u in (1, 3) for c in (0.0, 0.1) for r in ("a", "b")]
    for run in runs:
        model, cfg, _ = trained_model(run, pick="best")
        expected = evaluate_cells(model, cfg, (1, 3), (0.0, 0.1), episodes=3, baselines=("fair_share",),
                                  reference=False)
        mine = [r for r in rows if Path(r["run"]).name == run.name]
        for got, want in zip(mine, expected, strict=True):
            assert got["paired"]["fair_share"] == want["paired_reward_per_step"]["fair_share"]
            assert got["policy"]["mean"] == want["policy"]["reward_per_step"]
    capsys.readouterr()
    cells_table.main(argv)
    assert "0 records to play" in capsys.readouterr().out  # every record kept: nothing played again
    cells_table.main([*argv, "--episodes", "2"])  # asked otherwise: every record played again, as asked now
    assert "12 records to play" in capsys.readouterr().out
    assert {r["paired"]["fair_share"]["episodes"] for r in json.loads((out / "table.json").read_text())} == {2}


def test_cells_table_marks_a_cell_where_the_policy_and_the_best_baseline_lose_their_users(tmp_path):
    """Records as the players wrote them, of two cells: in one the policy and the best baseline (by reward per step)
    each lose their users in most episodes, in the other the best baseline keeps them."""
    import argparse

    from benchmarks import cells_table
    from trainer.evaluation.cells import Cell
    from trainer.evaluation.servable import UNSERVABLE

    def played(abandoned: list[float], reward: float) -> list[dict[str, float]]:
        return [{"return": reward, "length": 1.0, "reward_per_step": reward + i / 10, "abandoned": a}
                for i, a in enumerate(abandoned)]

    records = {Cell(2, 0.0): {"run": played([1, 1, 0], -3.0), "fair_share": played([1, 1, 1], -2.0),
                              "lowest": played([0, 0, 0], -4.0)},  # best is fair_share: lost too
               Cell(4, 0.0): {"run": played([1, 1, 1], -3.0), "fair_share": played([0, 1, 0], -2.0),
                              "lowest": played([1, 1, 1], -4.0)}}  # best is fair_share: served
    for played_in, players in records.items():
        folder = tmp_path / cells_table._cell_name(played_in)
        folder.mkdir()
        for player, episodes in players.items():
            (folder / f"{player}.json").write_text(json.dumps({"played_with": {}, "records": episodes}))
    args = argparse.Namespace(baselines=["fair_share", "lowest"], runs=[Path("run")], episodes=3, seed=0,
                              out=tmp_path)
    runs = cells_table._Runs(2, {}, {Path("run"): {"checkpoint": "c.pt", "checkpoint_sha256": "0" * 64}})
    text, rows = cells_table.table(args, list(records), runs)
    assert [r["unservable"] for r in rows] == [True, False]
    table_rows = [line for line in text.splitlines() if line.startswith("| 2 ") or line.startswith("| 4 ")]
    assert [UNSERVABLE in line for line in table_rows] == [True, False]
    assert f"\n{UNSERVABLE}: the policy and the cell's best baseline lose their users" in text


@pytest.mark.slow  # a tiny training, then its episodes, four times
def test_cells_table_plays_a_run_again_once_its_checkpoint_holds_other_weights(tmp_path, capsys):
    """A run's records are kept by its checkpoint's content, not its path: the same --out after the checkpoint file
    was rewritten with other weights plays the run again (the baseline's records are kept), and the table's numbers
    and checkpoint are the new weights'; records that name no content (an older version's) are played again too."""
    from benchmarks import cells_table
    from trainer.evaluation.cells import evaluate_cells
    from trainer.evaluation.policies import trained_model
    from trainer.train import main as train

    run = tmp_path / "a"
    train(["--env", "VREdge-v0", "--env-kwargs", "num_users=3,users=2-3,churn=0.05,max_steps=20", "--num-envs", "2",
           "--num-steps", "8", "--total-steps", "16", "--compile", "off", "--threads", "1", "--eval-episodes", "0",
           "--config", settings_file("policy_arch_set"), "--run-dir", str(run)])
    out = tmp_path / "table"
    argv = [str(run), "--users", "2", "--churn", "0", "--episodes", "2", "--baselines", "fair_share", "--jobs", "1",
            "--out", str(out)]

    def tabled(plays: int) -> dict:
        cells_table.main(argv)
        assert f"{plays} records to play" in capsys.readouterr().out
        [row] = json.loads((out / "table.json").read_text())
        model, cfg, source = trained_model(run, pick="best")
        assert row["checkpoint"] == str(source) and row["checkpoint_sha256"] == checkpoints.content_hash(source)
        [now] = evaluate_cells(model, cfg, (2,), (0.0,), episodes=2, baselines=("fair_share",), reference=False)
        assert row["policy"]["mean"] == now["policy"]["reward_per_step"]  # the numbers of the weights there now
        return row

    first = tabled(2)
    source = Path(first["checkpoint"])
    replace_weights_in_place(source)
    second = tabled(1)  # the run again, not the baseline
    assert second["checkpoint_sha256"] != first["checkpoint_sha256"]
    assert second["policy"] != first["policy"]
    record = out / "users-2_churn-0" / "a.json"
    kept = json.loads(record.read_text())
    assert kept["played_with"]["checkpoint_sha256"] == second["checkpoint_sha256"]
    del kept["played_with"]["checkpoint_sha256"]  # as an older version wrote it: by path alone
    record.write_text(json.dumps(kept))
    tabled(1)
    asked = {**kept["played_with"], "checkpoint_sha256": first["checkpoint_sha256"]}  # changed since it was checked
    with pytest.raises(cells_table.CheckpointChangedError):  # what a player meets: it plays none of it
        cells_table._checked_model(asked)


@pytest.mark.slow  # a tiny training
def test_cells_table_refuses_runs_it_cannot_pair_in_one_line(tmp_path, capsys):
    from benchmarks import cells_table
    from trainer.train import main as train

    run = tmp_path / "a"
    train(["--env", "VREdge-v0", "--env-kwargs", "num_users=3,users=2-3,churn=0.05,max_steps=20", "--num-envs", "2",
           "--num-steps", "8", "--total-steps", "16", "--compile", "off", "--threads", "1",
           "--config", settings_file("policy_arch_set"), "--run-dir", str(run)])
    (tmp_path / "other").mkdir()
    shutil.copytree(run, tmp_path / "other" / "a")
    training = tmp_path / "training"  # its config is written, no checkpoint yet
    training.mkdir()
    shutil.copy(run / "config.json", training / "config.json")
    cartpole = tmp_path / "cartpole"
    cartpole.mkdir()
    stored = json.loads((run / "config.json").read_text())
    (cartpole / "config.json").write_text(json.dumps({**stored, "config": {**stored["config"], "env": "CartPole-v1",
                                                                            "env_kwargs": ""}}))
    (tmp_path / "file").write_text("")
    tail = ["--users", "2", "--churn", "0", "--episodes", "1", "--out", str(tmp_path / "table")]
    for runs, flags, things in [
        ([run, tmp_path / "other" / "a"], [], ["a", "named apart"]),  # one player name for two runs
        ([training], [], ["training", "--runs-later"]),  # still training: how to go on meanwhile
        ([cartpole], [], ["cartpole", "CartPole-v1", "VREdge-v0"]),
        ([run], ["--out", str(tmp_path / "file")], ["--out", "file"]),
        ([run], ["--episodes", "0"], ["--episodes", "0"]),
    ]:
        with exits(2, *things, capsys=capsys):
            cells_table.main([*map(str, runs), *tail, *flags])
    assert not (tmp_path / "table").exists()  # refused before anything was played


@pytest.mark.parametrize("held, things", [
    ("not JSON {", ["config.json", "not JSON"]),
    ('["config"]', ["config.json", '"config"']),  # JSON of another shape
    ('{"config": {"hidden": "x"}}', ["config.json", "--hidden", "x"]),  # a run's config, one value damaged
])
def test_cells_table_names_a_damaged_config_json_in_one_line(tmp_path, capsys, held, things):
    """Issue 61: a config.json that is not JSON, or not of a run's shape, was a JSONDecodeError (or KeyError)
    traceback with exit status 1."""
    from benchmarks import cells_table

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(held)
    with exits(2, *things, capsys=capsys):
        cells_table.main([str(run), "--users", "2", "--churn", "0", "--out", str(tmp_path / "table")])
    assert not (tmp_path / "table").exists()


def test_cells_table_refuses_a_user_count_int_does_not_read_in_one_line(tmp_path, capsys):
    """Issue 61: ``"²"`` is a digit to ``str.isdigit`` and not to ``int``: a traceback, before."""
    from benchmarks import cells_table

    with exits(2, "--users", "²", capsys=capsys):  # (answered before the run is looked for)
        cells_table.main([str(tmp_path / "none"), "--users", "²", "--out", str(tmp_path / "table")])


@pytest.mark.slow  # a tiny training, then its episodes
def test_cells_table_plays_a_per_head_run_in_its_own_slots_as_evaluate_does(tmp_path):
    """A policy whose parameters fix its slots (per-head, 4 slots) plays 2 and 3 users in cells of 4 slots, not 3."""
    from benchmarks import cells_table
    from trainer.evaluation.cells import evaluate_cells
    from trainer.evaluation.policies import trained_model
    from trainer.train import main as train

    run = tmp_path / "p"
    train(["--env", "VREdge-v0", "--env-kwargs", "num_users=4,users=2-4,churn=0.05,max_steps=20", "--num-envs", "2",
           "--num-steps", "8", "--total-steps", "16", "--compile", "off", "--threads", "1",
           "--config", settings_file("policy_arch_per_head"), "--run-dir", str(run)])
    cells_table.main([str(run), "--users", "2,3", "--churn", "0", "--episodes", "2", "--baselines", "fair_share",
                      "--jobs", "1", "--out", str(tmp_path / "table")])
    rows = json.loads((tmp_path / "table" / "table.json").read_text())
    model, cfg, _ = trained_model(run, pick="best")
    expected = evaluate_cells(model, cfg, (2, 3), (0.0,), episodes=2, baselines=("fair_share",), reference=False)
    assert [r["paired"]["fair_share"] for r in rows] == [e["paired_reward_per_step"]["fair_share"] for e in expected]
    assert "cells of 4 user slots" in (tmp_path / "table" / "table.md").read_text()


def test_snapshot_quick_reports_the_snapshot_and_gae_side_by_side(capsys):
    from benchmarks import snapshot
    out = snapshot.main(["--quick"])
    assert sorted(out) == [8, 32]
    for row in out.values():
        assert set(row) == {"iteration", "snapshot", "states_before", "states_now", "gae_loop", "gae_scan"}
        assert all(v > 0 for v in row.values())
    printed = capsys.readouterr().out
    assert "32 envs x 8 steps on cpu: iteration" in printed and "one dict per env as before" in printed
    assert "GAE loop" in printed and "scan" in printed
