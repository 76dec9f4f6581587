"""Evaluation across cells (issue 49, item 4): ``trainer.evaluate --users --churn`` and
:func:`trainer.evaluation.cells.evaluate_cells` play the policy, the baselines and the reference on the same held-out
episodes per (users, churn) pair; QoE_lin and fairness count active users only; validation and ``trainer.compare``
work on runs trained on a cell whose users vary."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import checkpoints
import envs
from envs.planner import ClairvoyantPlanner
from envs.settings import ConfigError
from tests.factories import settings_file
from tests.messages import exits, names, raises, usage_error
from trainer import compare as compare_cli
from trainer import evaluate as evaluate_cli
from trainer.common.policy_layout import FLAT, PolicyLayout
from trainer.config import TrainConfig
from trainer.evaluation import (
    paired_difference,
    policy_actions,
    reference_episodes,
    run_episodes,
    summarize,
    validation_seeds,
)
from trainer.evaluation.baselines import best_baseline
from trainer.evaluation.cells import cell_slots, cells_figure, cells_of, evaluate_cells, plot_band
from trainer.evaluation.contenders import play_contenders
from trainer.evaluation.episodes import Player, episodes_shown, play_together
from trainer.evaluation.policies import trained_model
from trainer.evaluation.report import json_ready
from trainer.evaluation.servable import LOST_IN_MOST_EPISODES, UNSERVABLE
from trainer.flags import parse_args
from trainer.train import train

ROOT = Path(__file__).resolve().parents[1]
VARYING = "num_users=6,users=2-6,churn=0.05,max_steps=20"  # 6 slots; episodes of 20 steps: tiny, fast
TODAYS_KEYS = ["checkpoint", "checkpoint_sha256", "checkpoint_kind", "env", "env_kwargs", "episodes", "seed", "actions",
               "policy", "baselines", "reference", "paired_reward_per_step", "paired_qoe_lin", "best_baseline",
               "best_baseline_picked_on", "gap_closed", "capture", "causal_share", "unservable"]
PER_HEAD = ("--config", settings_file("policy_arch_per_head"))
CELL_KEYS = {"users", "churn", "policy", "baselines", "reference", "paired_reward_per_step", "best_baseline"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Torch in one thread while these tests play: a tiny network's forward pass on two threads that share two
    busy cores waits on them (tens of milliseconds a step, not a tenth of one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(run: Path, env: str, env_kwargs: str, seed: int = 1, *more: str) -> Path:
    """A tiny run (two iterations of 2 envs x 8 steps), validated every iteration."""
    train(parse_args(["--env", env, "--env-kwargs", env_kwargs, "--num-envs", "2", "--num-steps", "8",
                      "--total-steps", "32", "--threads", "1", "--seed", str(seed), "--eval-every", "1",
                      "--eval-episodes", "2", "--run-dir", str(run), *more]).config, progress=False)
    return run


@pytest.fixture(scope="module")
def varying_run(tmp_path_factory) -> Path:
    """A per-head policy trained on 6 slots with 2 to 6 users active and churn (per_head named: where the users
    vary, ``auto`` may pick a set policy)."""
    return _train(tmp_path_factory.mktemp("cells") / "a", "VREdge-v0", VARYING, 1, *PER_HEAD)


def _json(capsys, argv: list[str]) -> dict:
    evaluate_cli.main(argv + ["--json"])
    return json.loads(capsys.readouterr().out)


def _direct(player, users: int, churn: float, episodes: int) -> dict:
    """What ``player(config)`` (an ``act``) scores played straight on the held-out seeds of a cell of ``users`` of 6
    slots (the mask shown, as the run was trained with it)."""
    kwargs = dict(num_users=6, users=users, churn=churn, max_steps=20, observe_active=True)
    act = player(envs.VREdgeConfig(**kwargs))
    return summarize(run_episodes(act, functools.partial(gym.make, "VREdge-v0", **kwargs), episodes, 0))


def test_cells_are_one_entry_per_pair_in_order_each_player_on_the_episodes_a_direct_run_plays(varying_run, capsys):
    model, _, _ = trained_model(varying_run, "best")
    assert model.layout.kind == "per_head"  # a per-head policy: its parameters fix its 6 slots
    payload = _json(capsys, ["--checkpoint", str(varying_run), "--users", "2,4,6", "--churn", "0,0.05",
                             "--episodes", "2", "--baselines", "fair_share", "--reference", "none"])
    cells = payload["cells"]
    assert [(c["users"], c["churn"]) for c in cells] == [(2, 0), (2, 0.05), (4, 0), (4, 0.05), (6, 0), (6, 0.05)]
    assert all(CELL_KEYS <= set(c) for c in cells) and payload["slots"] == 6
    assert not {"policy", "baselines"} & set(payload)  # the results are the cells'
    assert payload["checkpoint_sha256"] == checkpoints.content_hash(payload["checkpoint"])  # what they are of
    fair_share = functools.partial(envs.make_baseline, "fair_share")
    greedy = lambda config: policy_actions(model, deterministic=True)  # noqa: E731
    for c in cells:
        assert c["baselines"]["fair_share"] == _direct(fair_share, c["users"], c["churn"], 2)
        assert c["policy"] == _direct(greedy, c["users"], c["churn"], 2)
        paired = c["paired_reward_per_step"]["fair_share"]["mean"]
        assert paired == pytest.approx(c["policy"]["reward_per_step"] - c["baselines"]["fair_share"]["reward_per_step"])
        assert c["reference"] == {} and c["best_baseline"] == "fair_share"
    assert cells[0]["policy"] != cells[4]["policy"]  # 2 users are not 6
    assert json.loads((varying_run / "evaluation_cells.json").read_text()) == payload
    assert not (varying_run / "evaluation.json").exists()  # the run's own evaluation is another file
    png = varying_run / "evaluation_cells.png"
    try:
        import matplotlib  # noqa: F401
        assert png.read_bytes()[:4] == b"\x89PNG"
    except ImportError:
        assert not png.exists()


def test_the_python_api_gives_the_command_lines_cells_with_the_reference_where_asked_and_ranges(varying_run, capsys):
    model, cfg, _ = trained_model(varying_run, "best")
    entries = evaluate_cells(model, cfg, (3, "2-6"), (0.05,), episodes=2, baselines=("buffer",), reference=True)
    payload = _json(capsys, ["--checkpoint", str(varying_run), "--pick", "best", "--users", "3,2-6", "--churn",
                             "0.05", "--episodes", "2", "--baselines", "buffer", "--reference", "clairvoyant"])
    assert json.loads(json.dumps(json_ready(entries), allow_nan=False)) == payload["cells"]
    assert [e["users"] for e in entries] == [3, "2-6"]
    for e in entries:
        assert set(e["reference"]) == {"clairvoyant"} and set(e["paired_reward_per_step"]) == {"buffer", "clairvoyant"}
        assert e["gap_closed"]["episodes"] == 2 and e["env_kwargs"]["num_users"] == 6
    # not asked for, across cells the reference is not played (it would cost more than every other player)
    unasked = _json(capsys, ["--checkpoint", str(varying_run), "--users", "3", "--churn", "0.05", "--episodes", "2",
                             "--baselines", "buffer"])["cells"][0]
    assert unasked["reference"] == {} and unasked["gap_closed"] is None and set(unasked["paired_reward_per_step"]) == {
        "buffer"}
    assert unasked["policy"] == payload["cells"][0]["policy"]  # the same episodes


def test_without_users_the_evaluation_is_todays(varying_run, capsys):
    payload = _json(capsys, ["--checkpoint", str(varying_run), "--episodes", "2", "--baselines", "bola",
                             "--reference", "none", "--out", str(varying_run / "todays")])
    assert list(payload) == TODAYS_KEYS
    assert payload["checkpoint_sha256"] == checkpoints.content_hash(payload["checkpoint"])
    assert payload["env_kwargs"] == {"num_users": 6, "users": "2-6", "churn": 0.05, "max_steps": 20}
    env_fn = functools.partial(gym.make, "VREdge-v0", **payload["env_kwargs"])  # the run's own cell
    bola = envs.make_baseline("bola", envs.VREdgeConfig(**payload["env_kwargs"]))
    assert payload["baselines"]["bola"] == summarize(run_episodes(bola, env_fn, 2, 0))
    assert not (varying_run / "todays" / "evaluation_cells.json").exists()


@pytest.fixture(scope="module")
def fixed_runs(tmp_path_factory) -> dict[str, Path]:
    """A VR-edge run on 3 users that never vary (no mask), and a CartPole run."""
    root = tmp_path_factory.mktemp("fixed")
    return {"fixed": _train(root / "fixed", "VREdge-v0", "num_users=3,max_steps=20"),
            "cartpole": _train(root / "cartpole", "CartPole-v1", "")}


@pytest.mark.parametrize("flags, things", [
    (["--users", "0"], ["--users", "0"]),
    (["--users", "4,x"], ["--users", "x"]),
    (["--users", "4-2"], ["--users", "4-2", "2-4"]),  # a range that runs backwards: how to write it
    (["--users", "2,2"], ["--users", "2"]),
    (["--users", "²"], ["--users", "²"]),  # a digit to str.isdigit, not to int(): it was a traceback
    (["--users", "2-²"], ["--users", "2-²"]),
    (["--churn", "2"], ["--churn", "2"]),
    (["--users", "2", "--churn", "0,-0.1"], ["--churn", "-0.1"]),
])
def test_bad_users_and_churn_are_one_line_before_anything_loads(flags, things, capsys, tmp_path):
    with exits(2, *things, capsys=capsys):  # (a checkpoint that is not there: answered before it is looked for)
        evaluate_cli.main(["--checkpoint", str(tmp_path / "none"), *flags])


def test_a_per_head_policy_refuses_more_users_than_its_slots_with_one_line(varying_run, capsys):
    with exits(2, "--users", "8", "6", "--users up to 6", "per-head", '"set"', capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(varying_run), "--users", "2,8", "--episodes", "1"])


def test_users_on_another_env_and_varying_users_for_a_policy_without_the_mask_are_one_line(fixed_runs, capsys):
    with exits(2, "--users", "--churn", "VREdge-v0", "CartPole-v1", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(fixed_runs["cartpole"]), "--users", "2", "--episodes", "1"])
    with exits(2, "--users 2", "observe_active=true", "--users 3 --churn 0", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(fixed_runs["fixed"]), "--users", "2,3", "--episodes", "1"])
    with exits(2, "--churn 0.05", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(fixed_runs["fixed"]), "--churn", "0.05", "--episodes", "1"])
    # its own cell (3 users, no churn) it plays; --users alone keeps the run's churn
    payload = _json(capsys, ["--checkpoint", str(fixed_runs["fixed"]), "--users", "3", "--episodes", "1",
                             "--baselines", "none", "--reference", "none"])
    assert [(c["users"], c["churn"]) for c in payload["cells"]] == [(3, 0.0)]
    assert "observe_active" not in payload["cells"][0]["env_kwargs"]


def _limit_memory() -> None:
    """8 GB of address space: what is allocated before a memory check would fail as an allocation, not swap."""
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def test_cells_larger_than_the_memory_are_refused_in_one_line_before_an_env_is_built(tmp_path):
    """Issue 61: a set policy plays any slot count, and ``--users 100000000`` was a numpy allocation error (about 3
    GiB an observation) once the policy had loaded; the memory check refuses it at once, naming the most users that
    fit this machine."""
    run = _train(tmp_path / "set", "VREdge-v0", VARYING, 1, "--config", settings_file("policy_arch_set"))
    proc = subprocess.run([sys.executable, "-m", "trainer.evaluate", "--checkpoint", str(run), "--users",
                           "2,100000000", "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, preexec_fn=_limit_memory)
    line = usage_error(proc.returncode, proc.stderr, "--users", "2,100000000", "memory")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    most = int(re.search(r"at most ([\d,]+) users", line).group(1).replace(",", ""))
    assert 6 < most < 100_000_000, line  # the 6 slots it was trained on fit any machine
    assert not list((tmp_path / "out").glob("*")), "nothing is written"


@pytest.mark.parametrize(("episodes", "rows"), [("20", 60), ("3", 32)])
def test_the_memory_check_counts_the_rows_a_pair_plays_together(varying_run, capsys, monkeypatch, episodes, rows):
    """A pair's policy and baselines play in one batched env, a row per episode (3 players x 20 episodes: 60 rows),
    and its 2 baselines' 16 validation episodes each in another (32): the memory check counts the most of these, not
    the 16 envs at once that run_episodes plays."""
    monkeypatch.setattr("trainer.run_layout.memory_available", lambda: 1)  # nothing fits: the error says the rows
    with exits(2, "--users 2,6", "memory", f"{rows} envs at once", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(varying_run), "--users", "2,6", "--episodes", episodes,
                           "--baselines", "fair_share,bola", "--out", str(varying_run.parent / "memory")])


class _Laid(torch.nn.Module):
    """A model of no class the trainer knows, with a layout: the layout alone says which slots it acts on."""

    def __init__(self, layout: PolicyLayout) -> None:
        super().__init__()
        self.layout = layout


def test_a_policy_for_any_slot_count_plays_in_cells_of_the_most_users_and_a_fixed_one_is_refused():
    cfg = TrainConfig.from_dict({"env": "VREdge-v0", "env_kwargs": VARYING})
    trained = envs.VREdgeConfig(**cfg.env_options)
    cells = cells_of((2, "4-12"), (0.0,))
    assert cell_slots(_Laid(PolicyLayout("set", 8, 7, 7)), cfg, trained, cells) == 12
    for fixed in (_Laid(FLAT), _Laid(PolicyLayout("per_head", 8, 7))):
        assert cell_slots(fixed, cfg, trained, cells_of((2, 4), (0.0,))) == 6  # its own slots, fewer users asked
        with raises(ConfigError, "--users 2,4-12", "6", key="users"):
            cell_slots(fixed, cfg, trained, cells)
    # the model's layout decides, not its config's policy_arch (Ape-X on "auto" branches per head where PPO's
    # auto is a set policy)
    with raises(ConfigError, "--users 2,4-12", "per-head", key="users"):
        cell_slots(_Laid(PolicyLayout("per_head", 8, 7)), dataclasses.replace(cfg, policy_arch="set"), trained,
                   cells)


class _Cell(gym.Env):
    """3 slots over 2 steps: slot 2 never active, slot 1 active on the second step only."""

    observation_space = gym.spaces.Box(0, 1, (1,))
    action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        active = np.array([True, self.t == 2, False])
        info = {"active": active, "qoe_lin": np.array([1.0, 4.0, 0.0]) * active,
                "quality": np.array([0.5, 0.25, 0.0]) * active}
        return np.zeros(1, np.float32), 1.0, False, self.t == 2, info


def test_qoe_lin_and_fairness_count_the_active_users_only():
    record, = run_episodes(lambda obs: np.zeros(len(obs), np.int64), _Cell, 1, 0)
    assert record["qoe_lin"] == pytest.approx((1 + 1 + 4) / 3)  # 3 active user-steps; not 6 / (3 slots x 2)
    assert record["fairness"] == pytest.approx((0.5 + 0.25) ** 2 / (2 * (0.5**2 + 0.25**2)))  # slots 0 and 1


def test_validation_and_compare_work_on_runs_trained_on_a_varying_cell(varying_run, capsys, tmp_path):
    rows = [json.loads(line) for line in (varying_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "val_vs_baseline" in r] == [1, 2]
    assert checkpoints.best_checkpoint(varying_run).is_file()
    other = _train(tmp_path / "b", "VREdge-v0", VARYING, 2, *PER_HEAD)
    compare_cli.main([str(varying_run), str(other), "--episodes", "2", "--out", str(tmp_path / "cmp"), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert payload["env_kwargs"]["users"] == "2-6" and payload["env_kwargs"]["churn"] == 0.05
    assert set(payload["groups"]) == {"a", "b"} and len(payload["pairs"]) == 1
    names(json.dumps(payload["groups"]["a"]["runs"][0]), "the best checkpoint (validation)")


def test_a_set_policy_trained_on_6_slots_plays_in_cells_of_the_most_users_asked(tmp_path, capsys):
    """A set policy, trained with the recipe's file (docs/cells.toml; its cell made tiny by the flag, which wins):
    it acts on any slot count, so the cells have as many slots as the most users asked for, more than it was
    trained with."""
    run = _train(tmp_path / "set", "VREdge-v0", VARYING, 1, "--config", str(ROOT / "docs" / "cells.toml"))
    model, cfg, _ = trained_model(run, "latest")
    assert cfg.policy_arch == "set" and model.layout.kind == "set"
    payload = _json(capsys, ["--checkpoint", str(run), "--pick", "latest", "--users", "2,8", "--churn", "0.05",
                             "--episodes", "2", "--baselines", "fair_share", "--reference", "none"])
    assert payload["slots"] == 8 and [c["env_kwargs"]["num_users"] for c in payload["cells"]] == [8, 8]
    kwargs = dict(num_users=8, users=8, churn=0.05, max_steps=20, observe_active=True)
    greedy = policy_actions(model, deterministic=True)
    direct = summarize(run_episodes(greedy, functools.partial(gym.make, "VREdge-v0", **kwargs), 2, 0))
    assert payload["cells"][1]["policy"] == direct


class _Terminal:
    """Standard error as a terminal shows it (tqdm draws its bar only on one): what was written, kept."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def counts(self) -> set[tuple[int, int]]:
        """The bar's ``done/total`` readings."""
        return {(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[", self.text)}


@pytest.mark.parametrize("flags, total", [
    ([], 2 * 2 + 16),  # the policy's and fair_share's episodes, then fair_share's 16 validation episodes
    (["--users", "2,3", "--churn", "0"], 2 * (2 * 2 + 16)),  # the same per cell
])
def test_evaluate_shows_every_episode_it_plays_in_a_terminal(varying_run, monkeypatch, capsys, flags, total):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    evaluate_cli.main(["--checkpoint", str(varying_run), "--episodes", "2", "--baselines", "fair_share",
                       "--reference", "none", "--out", str(varying_run.parent / "shown"), *flags])
    counts = terminal.counts()
    assert (total, total) in counts and {t for _, t in counts} == {total}, terminal.text[-500:]


def test_compare_shows_every_episode_it_plays_in_a_terminal(varying_run, monkeypatch, capsys, tmp_path):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    compare_cli.main([str(varying_run), "--episodes", "3", "--out", str(tmp_path)])
    counts = terminal.counts()
    assert (3, 3) in counts and {t for _, t in counts} == {3}, terminal.text[-500:]


def _cell(users: int | str, churn: float) -> tuple[envs.VREdgeConfig, functools.partial]:
    """The config and env of a cell of ``users`` of 6 slots (the mask shown, as the varying run was trained)."""
    kwargs = dict(num_users=6, users=users, churn=churn, max_steps=20, observe_active=True)
    return envs.VREdgeConfig(**kwargs), functools.partial(gym.make, "VREdge-v0", **kwargs)


def test_players_played_together_score_each_episode_as_each_played_alone(varying_run):
    """The policy and every baseline play in one batched env, the clairvoyant in one of its own, the validation
    episodes in another: each deterministic player's records are, episode for episode, those it plays alone
    (``run_episodes``: 16 envs, one player), the policy's over 18 episodes (its batches of 16, then 2)."""
    model, _, _ = trained_model(varying_run, "best")
    config, env_fn = _cell("2-6", 0.05)
    greedy = policy_actions(model, deterministic=True)
    played = play_contenders(greedy, "policy", list(envs.BASELINES), config, env_fn, 18, 0, ("clairvoyant",))
    assert list(played) == ["policy", *envs.BASELINES, "clairvoyant"]
    assert played["policy"] == run_episodes(greedy, env_fn, 18, 0)
    deterministic = [n for n in envs.BASELINES if n != "random"]  # (random draws its levels in another order)
    for name in deterministic:
        assert played[name] == run_episodes(envs.make_baseline(name, config), env_fn, 18, 0), name
    assert played["clairvoyant"] == reference_episodes(ClairvoyantPlanner(config), env_fn, 18, 0)
    seeds = validation_seeds(1, 16)
    _, validation = best_baseline("VREdge-v0", list(envs.BASELINES), config.to_dict(), env_fn, seeds)
    for name in deterministic:
        assert validation[name] == run_episodes(envs.make_baseline(name, config), env_fn, 16, 0, seeds=seeds), name
    assert len(played["random"]) == 18 and len(validation["random"]) == 16


def _leads_table(text: str) -> tuple[dict[tuple[str, str], dict[str, str]], int]:
    """The summary table of a cell evaluation's output: the policy's lead ``+0.012±0.034`` over each player, by
    (users, churn) and name (the table whose cells hold intervals); and how many leads it counts above zero."""
    blocks = [b.splitlines() for b in text.split("\n\n")]
    for lines in blocks:
        heads = [i for i, line in enumerate(lines) if line.split()[:2] == ["users", "churn"]]
        if heads and "±" in lines[heads[0] + 1]:
            names_ = lines[heads[0]].split()[2:]
            rows = {tuple(line.split()[:2]): dict(zip(names_, line.split()[2:])) for line in lines[heads[0] + 1:]}
            break
    counted = next(int(m.group(1)) for m in re.finditer(r"in (\d+) of \d+", text))
    return rows, counted


def test_the_summary_is_the_policy_minus_each_baseline_paired_over_each_cells_episodes(varying_run, capsys):
    evaluate_cli.main(["--checkpoint", str(varying_run), "--users", "2,6", "--churn", "0,0.05", "--episodes", "3",
                       "--baselines", "fair_share,bola", "--out", str(varying_run.parent / "summary")])
    table, counted = _leads_table(capsys.readouterr().out)
    model, _, _ = trained_model(varying_run, "best")
    greedy = policy_actions(model, deterministic=True)
    above = 0
    for users, churn in itertools.product((2, 6), (0.0, 0.05)):
        config, env_fn = _cell(users, churn)
        policy = run_episodes(greedy, env_fn, 3, 0)
        for name in ("fair_share", "bola"):
            d = paired_difference(policy, run_episodes(envs.make_baseline(name, config), env_fn, 3, 0))
            assert table[(str(users), f"{churn:g}")][name] == f"{d['mean']:+.3f}±{d['ci95']:.3f}", (users, churn)
            above += d["mean"] - d["ci95"] > 0
    assert len(table) == 4 and counted == above


def _entry(users: int, churn: float, **scores: float) -> dict:
    """A cell entry (``evaluation_cells.json``'s) of the policy's and the baselines' mean rewards per step."""
    result = {n: {"reward_per_step": m, "reward_per_step_ci95": 0.01} for n, m in scores.items()}
    return {"users": users, "churn": churn, "policy": result.pop("policy"), "baselines": result, "reference": {}}


def test_the_plot_shows_the_players_far_below_on_a_panel_of_their_own_and_the_legend_clear_of_every_line():
    pytest.importorskip("matplotlib")
    entries = [_entry(u, c, policy=0.70 + u / 100, random=-0.75 + u / 20, lowest=0.0, throughput=0.66,
                      fair_share=0.69 + u / 100, robust_mpc=0.68) for u, c in itertools.product((2, 8), (0.0, 0.05))]
    assert plot_band(entries).far_below == ("random", "lowest")
    fig = cells_figure(entries)
    main, below = fig.axes[:2], fig.axes[2:]
    for ax in main:  # every competitive player with its interval, and not 0 (lowest) nor below
        assert ax.get_legend_handles_labels()[1] == ["policy", "throughput", "fair_share", "robust_mpc"]
        low, high = ax.get_ylim()
        assert 0.0 < low <= 0.66 - 0.01 and high >= 0.78 + 0.01
    for ax in below:
        assert ax.get_legend_handles_labels()[1] == ["random", "lowest"]
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["policy", *entries[0]["baselines"]]  # each once
    assert not any(legend.overlaps(ax.get_window_extent()) for ax in fig.axes)
    close = [_entry(u, 0.0, policy=0.7, fair_share=0.69) for u in (2, 8)]  # no player far below: one row
    assert plot_band(close).far_below == () and len(cells_figure(close).axes) == 1


def test_a_batched_env_moves_the_bar_by_its_steps_not_only_as_its_episodes_end(monkeypatch):
    """4 episodes of 20 steps, played at once: every 5 steps are an episode's worth, and the bar says so, long before
    the episodes end together."""
    import tqdm

    terminal, events = _Terminal(), []
    monkeypatch.setattr("sys.stderr", terminal)  # (the bar is drawn on a terminal only)
    monkeypatch.setattr(tqdm.tqdm, "update", lambda bar, n=1: events.append(("bar", n)))
    step = envs.VREdgeVectorEnv.step
    monkeypatch.setattr(envs.VREdgeVectorEnv, "step", lambda env, a: (events.append(("step", 1)), step(env, a))[1])
    config, env_fn = _cell(6, 0.0)
    with episodes_shown(4):
        records, = play_together([Player(envs.make_baseline("lowest", config), [1, 2, 3, 4])], env_fn)
    assert [r["length"] for r in records] == [20] * 4  # (the lowest level never stalls: all end at step 20)
    steps_before = [sum(n for kind, n in events[:i] if kind == "step") for i, e in enumerate(events) if e[0] == "bar"]
    assert steps_before == [5, 10, 15, 20] and sum(n for kind, n in events if kind == "bar") == 4


def test_in_a_pipe_the_bar_comes_as_lines_of_how_many_episodes_were_played(monkeypatch, capsys):
    """Standard error no terminal (a log, CI): the bar's state as whole lines, the first once the evaluation has run
    ``HEARTBEAT_S`` (0 here), never a carriage return's redraw."""
    from trainer.common import progress
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    config, env_fn = _cell(6, 0.0)
    with episodes_shown(4):
        play_together([Player(envs.make_baseline("lowest", config), [1, 2, 3, 4])], env_fn)
    err = capsys.readouterr().err
    played = re.findall(r"^episodes: +(\d+)%\|[#0-9 ]+\| (\d+)/4 ", err, re.M)
    assert "\r" not in err and played and played[-1] == ("100", "4"), err


STARVED = 1.0  # Mbit/s per user: below the ladder's lowest bitrate (5), so every player stalls until its users leave


def _lost(summary: dict) -> bool:
    """Whether a player's summary loses its users in most episodes, recomputed from its ``abandoned`` mean."""
    return summary["abandoned"] > LOST_IN_MOST_EPISODES


def test_a_cell_nobody_serves_is_marked_unservable_through_the_python_api_and_a_served_one_is_not(varying_run):
    model, cfg, _ = trained_model(varying_run, "best")
    served = {"num_users": 6, "users": "2-6", "churn": 0.05, "max_steps": 20}
    starved = {**served, "capacity_per_user_mbps": STARVED}
    entries = {name: evaluate_cells(model, cfg, (6,), (0.0,), episodes=2, baselines=("fair_share", "lowest"),
                                    env_kwargs=kwargs)[0] for name, kwargs in (("served", served),
                                                                               ("starved", starved))}
    for name, e in entries.items():  # the rule, from each cell's own numbers: the policy and the best baseline
        best = e["baselines"][e["best_baseline"]]
        assert e["unservable"] == (_lost(e["policy"]) and _lost(best)), name
    assert entries["starved"]["unservable"] is True and entries["served"]["unservable"] is False


def test_the_command_line_says_unservable_in_its_table_json_and_cell_tables(varying_run, capsys):
    flags = ["--checkpoint", str(varying_run), "--episodes", "2", "--baselines", "fair_share,lowest", "--reference",
             "none", "--out", str(varying_run.parent / "starved")]
    for capacity, expected in ((STARVED, True), (100.0, False)):
        evaluate_cli.main([*flags, "--env-kwargs", f"capacity_per_user_mbps={capacity}", "--json"])
        out, err = capsys.readouterr()
        payload = json.loads(out)
        best = payload["baselines"][payload["best_baseline"]]
        assert payload["unservable"] is expected is (_lost(payload["policy"]) and _lost(best)), capacity
        assert (f"{UNSERVABLE}: the policy and the best baseline ({payload['best_baseline']})" in err) is expected
    evaluate_cli.main([*flags, "--env-kwargs", f"capacity_per_user_mbps={STARVED}", "--users", "3,6", "--churn", "0"])
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if line.rstrip().endswith(UNSERVABLE)]
    assert len(marked) == 4 and f"{UNSERVABLE} (2 of 2 cells)" in out  # each cell in each of the two tables
    assert "(cell, baseline) pairs" not in out  # no lead is counted where nobody serves the cell
