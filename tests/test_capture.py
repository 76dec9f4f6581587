"""``benchmarks.capture``: each checkpoint's capture of the causal reference, on the same held-out episodes, the
references played once and reused; bad runs are one line."""

import json

import pytest

import checkpoints
from benchmarks import capture
from tests.messages import exits
from trainer.flags import parse_args
from trainer.train import train


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A VR-edge run of 2 users and 20-step episodes that kept a checkpoint at each of its 4 iterations."""
    run = tmp_path_factory.mktemp("capture") / "run"
    train(parse_args(["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--checkpoint-every", "1",
                      "--keep-checkpoints", "10", "--env-kwargs", "num_users=2,max_steps=20", "--eval-episodes", "0",
                      "--threads", "1", "--device", "cpu", "--run-dir", str(run)]).config, progress=False)
    return run


def test_each_checkpoints_capture_is_its_lead_over_fair_share_divided_by_the_ceilings(small_run, tmp_path, capsys):
    capture.main([str(small_run), "--out", str(tmp_path), "--episodes", "3", "--checkpoints", "2"])
    rows = json.loads((tmp_path / "table.json").read_text())
    assert [r["env_steps"] for r in rows] == [64, 256]  # the oldest kept and the newest
    refs = json.loads((tmp_path / "references.json").read_text())["records"]
    lead = sum(b["reward_per_step"] - f["reward_per_step"] for b, f in zip(refs["belief"], refs["fair_share"])) / 3
    for r in rows:
        assert r["capture"] == pytest.approx(r["vs_fair_share"] / lead, rel=1e-9)
    assert (tmp_path / "capture.png").stat().st_size > 0 and "| run | 256 |" in capsys.readouterr().out
    kept = (tmp_path / "references.json").stat().st_mtime_ns
    capture.main([str(small_run), "--out", str(tmp_path), "--episodes", "3", "--checkpoints", "1"])
    assert (tmp_path / "references.json").stat().st_mtime_ns == kept  # the same episodes: not played again
    assert [r["env_steps"] for r in json.loads((tmp_path / "table.json").read_text())] == [256]
    one = sorted((small_run / "checkpoints").glob("ckpt_*.pt"))[1]
    capture.main([str(one), "--out", str(tmp_path), "--episodes", "3"])  # a checkpoint file: that one
    [row] = json.loads((tmp_path / "table.json").read_text())
    assert row["checkpoint"] == str(one) and row["checkpoint_sha256"] == checkpoints.content_hash(one)


def test_a_run_the_ceiling_cannot_judge_is_one_line(tmp_path, capsys):
    cartpole = tmp_path / "cartpole"
    train(parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps", "16",
                      "--threads", "1", "--run-dir", str(cartpole)]).config, progress=False)
    with exits(2, "CartPole-v1", capsys=capsys):
        capture.main([str(cartpole), "--out", str(tmp_path / "out")])
    with exits(2, "nowhere", capsys=capsys):
        capture.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    with exits(2, "--checkpoints", capsys=capsys):
        capture.main([str(cartpole), "--out", str(tmp_path / "out"), "--checkpoints", "0"])


def test_an_out_folder_that_cannot_be_made_is_one_line(small_run, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    with exits(2, "afile", "directory", capsys=capsys):
        capture.main([str(small_run), "--out", str(tmp_path / "afile"), "--episodes", "3"])
