"""Networks a policy never saw (issue 64): the generated heavy-tailed set, and the generalisation table that plays
runs of several recipes on several networks against the baselines (benchmarks.generalisation)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from envs.make_traces import heavy_rates, synthetic_rates, write_traces
from tests.messages import exits
from trainer.config import TrainConfig


def test_the_heavy_set_is_heavy_tailed_and_the_default_kind_is_unchanged(tmp_path):
    """``--kind heavy``: a coefficient of variation near 1 and a sixth of the seconds below a tenth of the mean (the
    regimes kind: about 0.45 and none); the default kind writes the bytes it wrote before there was a kind."""
    def shape(rates_of) -> tuple[float, float]:
        rates = [rates_of(np.random.default_rng(i), 320, 4.0) for i in range(30)]
        return (float(np.mean([r.std() / r.mean() for r in rates])),
                float(np.mean([(r < 0.1 * r.mean()).mean() for r in rates])))

    cv, low = shape(heavy_rates)
    assert 0.85 < cv < 1.3 and 0.1 < low < 0.25
    cv, low = shape(synthetic_rates)
    assert cv < 0.6 and low < 0.01
    heavy = np.random.default_rng(3)
    assert np.isclose(heavy_rates(heavy, 200, 7.0).mean(), 7.0)
    default = [p.read_bytes() for p in write_traces(tmp_path / "a", files=2, seconds=30)]
    regimes = [p.read_bytes() for p in write_traces(tmp_path / "b", files=2, seconds=30, kind="regimes")]
    assert default == regimes
    assert [p.read_bytes() for p in write_traces(tmp_path / "c", files=2, seconds=30, kind="heavy")] != regimes
    with pytest.raises(ValueError, match="bursty"):
        write_traces(tmp_path / "d", kind="bursty")


def _records(abandoned: list[float], rewards: list[float], length: float = 10.0) -> list[dict[str, float]]:
    return [{"return": r * length, "length": length, "reward_per_step": r, "abandoned": a}
            for a, r in zip(abandoned, rewards)]


def test_the_table_averages_the_seeds_per_episode_and_marks_a_network_nobody_serves(tmp_path, monkeypatch):
    """Records as the players wrote them: each recipe's seeds are averaged episode by episode before they are paired
    with a baseline; the seeds above the best baseline are counted by their own intervals; a network where the
    policy and the best baseline lose their users in most episodes is UNSERVABLE, and only there."""
    from benchmarks import generalisation
    from trainer.evaluation.servable import UNSERVABLE

    monkeypatch.setattr(generalisation, "BASELINES", ("fair_share", "robust_mpc"))  # (the best is of these two)
    players = {
        "calm": {"fair_share": _records([0, 0, 0], [0.5, 0.6, 0.7]), "robust_mpc": _records([0, 0, 0], [0.4] * 3),
                 "r-s1": _records([0, 0, 0], [0.6, 0.7, 0.8]), "r-s2": _records([0, 0, 0], [0.5, 0.6, 0.72])},
        "storm": {"fair_share": _records([1, 1, 0], [-2.0, -1.0, -3.0]), "robust_mpc": _records([1, 1, 1], [-4.0] * 3),
                  "r-s1": _records([1, 1, 1], [-2.5, -1.0, -3.0]), "r-s2": _records([1, 0, 1], [-2.0, -1.5, -3.0])},
    }
    for network, records in players.items():
        (tmp_path / network).mkdir()
        for player, episodes in records.items():
            (tmp_path / network / f"{player}.json").write_text(json.dumps({"played_with": {}, "records": episodes}))
    args = argparse.Namespace(networks={"calm": ("calm", {}), "storm": ("storm", {})}, episodes=3, seed=0,
                              out=tmp_path, recipes=[generalisation.Recipe("r", [Path("s1"), Path("s2")])])
    text, rows = generalisation.table(args)
    calm, storm = rows
    assert calm["best"] == "fair_share" and calm["paired"]["fair_share"]["mean"] == pytest.approx(0.16 / 3)
    assert calm["paired"]["robust_mpc"]["mean"] == pytest.approx((0.55 + 0.65 + 0.76) / 3 - 0.4)
    assert calm["paired_best"] == calm["paired"]["fair_share"]
    assert calm["seeds_above_best"] == 1  # s1: +0.1 on every episode; s2: 0, 0, +0.02
    assert calm["unservable"] is False and storm["unservable"] is True
    assert storm["length"] == {"policy": 10.0, "best": 10.0}
    [storm_line] = [line for line in text.splitlines() if line.startswith("| storm")]
    assert UNSERVABLE in storm_line and UNSERVABLE not in text.split("| storm")[0]


def _run_dir(path: Path, **env: object) -> Path:
    """A run directory with a config.json as trainer.train writes it (no checkpoint: enough for the checks)."""
    from trainer.config import format_env_kwargs

    path.mkdir(parents=True)
    cfg = TrainConfig(env="VREdge-v0", env_kwargs=format_env_kwargs(env))
    (path / "config.json").write_text(json.dumps({"config": cfg.to_dict(), "layout": {}, "thread_plan": None}))
    return path


def test_bad_input_is_one_line(tmp_path, capsys):
    """Runs trained in other cells (not only other networks), an unknown network, a recipe without runs: one
    usage line each, naming what was wrong, before anything is played."""
    from benchmarks import generalisation

    a = _run_dir(tmp_path / "a", num_users=3, outage_prob="0-0.1")
    b = _run_dir(tmp_path / "b", num_users=4)
    out = str(tmp_path / "out")
    with exits(2, "num_users", capsys=capsys):
        generalisation.main(["--recipe", f"x={a}", "--recipe", f"y={b}", "--out", out])
    with exits(2, "--networks", "moon", capsys=capsys):
        generalisation.main(["--recipe", f"x={a}", "--networks", "synthetic,moon", "--out", out])
    with exits(2, "robust", capsys=capsys):
        generalisation.main(["--recipe", "robust", "--out", out])
    for hedges, named in (("8,-2", "-2"), ("8,eight", "eight"), ("16,16", "twice"), ("", "''"), ("8,,16", "''"),
                          ("\u00b2", "\u00b2"), ("8,300", "max_steps")):  # (an empty hedge once played no guard; a
        # superscript two crashed; a hedge as long as the episode, the runs' 300 steps, leaves the policy nothing)
        with exits(2, "--volatility-guard", named, capsys=capsys):
            generalisation.main(["--recipe", f"x={a}", "--volatility-guard", hedges, "--out", out])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # (trains two runs, plays 2 networks x 4 players)
def test_each_run_plays_each_network_as_evaluate_plays_it_and_again_plays_nothing(tmp_path, capsys):
    """Two recipes (one with randomised outages and scale): each policy's reward on each network is what its
    greedy policy gets on those episodes played alone (the network's arguments over the runs' cell, not its
    training ranges), the baselines are played once for both, and a second call plays nothing again."""
    import functools

    import gymnasium as gym

    from benchmarks import generalisation
    from trainer.evaluation.episodes import policy_actions, run_episodes
    from trainer.evaluation.policies import trained_model
    from trainer.evaluation.statistics import summarize
    from trainer.train import main as train

    cell = "num_users=3,max_steps=20"
    runs = {"plain": tmp_path / "plain" / "s1", "ranged": tmp_path / "ranged" / "s1"}
    for name, run in runs.items():
        ranges = ",outage_prob=0-0.1,capacity_scale=0.5-2" if name == "ranged" else ""
        train(["--env", "VREdge-v0", "--env-kwargs", cell + ranges, "--num-envs", "4", "--num-steps", "16",
               "--total-steps", "64", "--compile", "off", "--threads", "1", "--run-dir", str(run)])
    out = tmp_path / "table"
    argv = [*(f"--recipe={name}={run}" for name, run in runs.items()), "--networks", "synthetic-outages,heavy-median",
            "--episodes", "2", "--jobs", "1", "--out", str(out)]
    capsys.readouterr()
    generalisation.main(argv)
    assert "16 records to play" in capsys.readouterr().out  # 2 networks x (6 baselines + 2 runs)
    rows = json.loads((out / "table.json").read_text())
    assert [(r["network"], r["recipe"]) for r in rows] == [
        (n, r) for n in ("synthetic-outages", "heavy-median") for r in ("plain", "ranged")]
    known = generalisation.networks(out / "heavy-traces")
    for row in rows:
        model, _, _ = trained_model(runs[row["recipe"]], pick="best")
        kwargs = {"num_users": 3, "max_steps": 20, **known[row["network"]][1]}
        make = functools.partial(gym.make, "VREdge-v0", **kwargs)
        alone = run_episodes(policy_actions(model, deterministic=True), make, 2, 0)
        fair = json.loads((out / row["network"] / "fair_share.json").read_text())["records"]
        assert row["paired"]["fair_share"]["mean"] == pytest.approx(
            summarize(alone)["reward_per_step"] - summarize(fair)["reward_per_step"])
    generalisation.main(argv)
    assert "0 records to play" in capsys.readouterr().out

    def guarded(z: str) -> tuple[dict, list]:
        generalisation.main([*argv, "--guard", z])
        assert "4 records to play" in capsys.readouterr().out  # only the guarded players
        kept = json.loads((out / "heavy-median" / "plain+guard-s1.json").read_text())
        return kept, json.loads((out / "heavy-median" / "plain-s1.json").read_text())["records"]

    never, alone = guarded("1e9")  # nothing leaves a range that wide: the policy's own records
    assert never["guarded_share"] == 0 and never["records"] == alone
    always, _ = guarded("1e-9")  # everything does: the fallback's (robust_mpc's) records
    fallback = json.loads((out / "heavy-median" / "robust_mpc.json").read_text())["records"]
    assert always["guarded_share"] == 1 and always["records"] == fallback

    import envs
    from envs.guard import HEDGE_ROUNDS, VolatilityGuard
    from trainer.evaluation.episodes import filter_episodes, validation_seeds

    generalisation.main([*argv, "--volatility-guard"])
    assert "4 records to play" in capsys.readouterr().out  # only the guarded players
    kept = json.loads((out / "heavy-median" / "ranged+volatility-s1.json").read_text())
    model, _, _ = trained_model(runs["ranged"], pick="best")
    act = policy_actions(model, deterministic=True)
    trained_on = {"num_users": 3, "max_steps": 20, "outage_prob": "0-0.1", "capacity_scale": "0.5-2"}

    def past_hedge(threshold: float, kwargs: dict, seeds: list[int], hedge: int = HEDGE_ROUNDS) -> tuple[int, list]:
        guard, acted = VolatilityGuard(act, envs.VREdgeConfig(**kwargs), threshold, hedge_rounds=hedge), [0]

        def counted(obs):
            actions = guard(obs)
            rounds = np.rint(obs[:, -1] * 20)  # (this cell's last feature: the round over max_steps)
            acted[0] += int((guard.guarded & (rounds >= hedge)).sum())
            return actions
        episodes = len(seeds) if seeds else 2
        records = filter_episodes(counted, functools.partial(gym.make, "VREdge-v0", **kwargs), episodes, 0,
                                  seeds=seeds)
        return acted[0], records

    # its threshold: the highest share on its own training network's first 50 validation episodes, where it then
    # never acts
    threshold = kept["threshold"]
    assert past_hedge(threshold, trained_on, validation_seeds(0, 50))[0] == 0
    assert past_hedge(threshold * 0.99, trained_on, validation_seeds(0, 50))[0] > 0
    heavy = {"num_users": 3, "max_steps": 20, **known["heavy-median"][1]}
    assert kept["records"] == past_hedge(threshold, heavy, None)[1]  # and it played the network with that guard

    generalisation.main([*argv, "--volatility-guard", "8,3"])  # another hedge: only its players play
    assert "4 records to play" in capsys.readouterr().out
    rows = {(r["network"], r["recipe"]) for r in json.loads((out / "table.json").read_text())}
    assert {("heavy-median", "ranged+volatility"), ("heavy-median", "ranged+volatility3")} <= rows
    short = json.loads((out / "heavy-median" / "ranged+volatility3-s1.json").read_text())
    assert short["played_with"]["hedge_rounds"] == 3 and "hedge_rounds" not in kept["played_with"]
    threshold = short["threshold"]  # calibrated past its own hedge, and played with it
    assert past_hedge(threshold, trained_on, validation_seeds(0, 50), hedge=3)[0] == 0
    assert short["records"] == past_hedge(threshold, heavy, None, hedge=3)[1]


@pytest.mark.slow  # (a pool of two spawned players started)
def test_sigterm_while_players_play_stops_them_all_and_keeps_what_finished(tmp_path):
    """SIGTERM (as Ctrl-C) ends the command with one line and 128 + the signal, the players' processes with it
    (they once played on, orphaned, then printed tracebacks); the same command goes on."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    run = _run_dir(tmp_path / "run", num_users=3)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "benchmarks.cells_table", str(run), "--runs-later", "--users", "3", "--churn", "0",
            "--episodes", "2000", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # the machine's lines first
        if "records to play" in line:
            break
    time.sleep(3)  # the players started
    players = psutil.Process(proc.pid).children(recursive=True)
    assert players
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("stopped") and "Traceback" not in err
    gone, alive = psutil.wait_procs(players, timeout=10)
    assert not alive, [p.pid for p in alive]
