"""``trainer.evaluate --reference bound``: the certified upper bound on each held-out episode, the bracket it makes
with the best causal player, ``optimality_gap``; its refusals; and evaluations without it exactly as before. Played
through the command line on the landed 2-user, 12-step run (``tests/data/landed/ppo-vredge-distilled``)."""

import contextlib
import functools
import io
import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.hindsight import HindsightBound, episode_future, future_from_state, lagrangian_bound
from envs.vector import VREdgeVectorEnv
from tests.messages import exits
from trainer import evaluate as evaluate_cli
from trainer.evaluation import evaluation_seeds, policy_actions, run_episodes
from trainer.evaluation.bracket import BOUND_ITERATIONS, bound_records
from trainer.evaluation.episodes import episodes_counted
from trainer.evaluation.policies import trained_model

LANDED = Path(__file__).resolve().parent / "data" / "landed"
BEFORE = Path(__file__).resolve().parent / "data" / "evaluation_before_bound"  # written before the bound existed
CELL = dict(num_users=2, max_steps=12)  # the landed run's cell
EPISODES = 4


def evaluated(run: Path, *flags: str) -> tuple[dict, str]:
    """``trainer.evaluate --checkpoint run --json FLAGS`` as a user runs it: its JSON (stdout), its table (stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        evaluate_cli.main(["--checkpoint", str(run), "--json", *flags])
    return json.loads(out.getvalue()), err.getvalue()


def landed_copy(tmp: Path, name: str = "ppo-vredge-distilled") -> Path:
    return Path(shutil.copytree(LANDED / name, tmp / name))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return landed_copy(tmp_path_factory.mktemp("bracket"))


@pytest.fixture(scope="module")
def bracketed(run) -> tuple[dict, str]:
    return evaluated(run, "--episodes", str(EPISODES), "--reference", "clairvoyant,belief,bound")


def players_records(run: Path) -> dict[str, list[dict[str, float]]]:
    """Every causal player's records on the held-out episodes, played here without the evaluation: the policy and
    each baseline."""
    cfg = envs.VREdgeConfig(**CELL)
    env_fn = functools.partial(gym.make, "VREdge-v0", **CELL)
    played = {"policy": run_episodes(policy_actions(trained_model(run, "best")[0], True), env_fn, EPISODES, 0)}
    for name in envs.baselines.BASELINES:
        played[name] = run_episodes(envs.make_baseline(name, cfg), env_fn, EPISODES, 0)
    return played


def test_the_bound_reads_the_future_of_the_episodes_every_player_plays():
    # the evaluation plays episode i in a batched env reset with evaluation_seeds(0)[i]; the bound reads
    # episode_future of that seed: the same capacity, channels and start, row by row
    cfg = envs.VREdgeConfig(**CELL)
    seeds = evaluation_seeds(0, EPISODES)
    env = VREdgeVectorEnv(EPISODES, **CELL)
    env.reset(seed=seeds)
    state = env.get_state()
    for i, seed in enumerate(seeds):
        played = future_from_state(cfg, {k: v[i:i + 1] for k, v in state.items()})
        read = episode_future(cfg, seed)
        for field in ("capacity", "channel", "buffer", "level", "cum_stall"):
            np.testing.assert_array_equal(getattr(played, field), getattr(read, field), err_msg=field)
    env.close()


def test_the_bound_is_above_the_policy_and_every_baseline_episode_by_episode(run, bracketed):
    payload, table = bracketed
    cfg = envs.VREdgeConfig(**CELL)
    per_episode = payload["bracket"]["bound"]["per_episode"]
    expected = [lagrangian_bound(cfg, episode_future(cfg, s), iterations=BOUND_ITERATIONS).value / CELL["max_steps"]
                for s in evaluation_seeds(0, EPISODES)]
    assert per_episode == pytest.approx(expected, rel=1e-12)  # the bound of the held-out episodes themselves
    played = players_records(run)
    for name, records in played.items():
        for i, record in enumerate(records):
            assert record["return"] <= per_episode[i] * CELL["max_steps"] + 1e-9, (name, i)
    assert payload["bracket"]["bound_holds"] == {"episodes": EPISODES, "held": EPISODES, "below": []}
    assert payload["reference"]["bound"]["reward_per_step"] == pytest.approx(np.mean(per_episode))
    assert "bound" not in payload["paired_reward_per_step"]  # (the bound is paired in the bracket)
    assert f"the bound is at least every player's return in {EPISODES}/{EPISODES} episodes" in table


def test_the_optimality_gap_is_the_bound_minus_the_policy_paired(run, bracketed):
    payload, table = bracketed
    played = players_records(run)
    bound = np.array(payload["bracket"]["bound"]["per_episode"])
    policy = np.array([r["reward_per_step"] for r in played["policy"]])
    gap = payload["optimality_gap"]
    assert gap["mean"] == pytest.approx(np.mean(bound - policy)) and gap["episodes"] == EPISODES
    # Student t, 3 degrees of freedom: 3.1824463 (tables)
    assert gap["ci95"] == pytest.approx(3.1824463 * np.std(bound - policy, ddof=1) / np.sqrt(EPISODES), rel=1e-6)
    # the best causal player: the highest of the policy, the best baseline and the causal reference (belief)
    best = payload["bracket"]["best_causal"]["name"]
    means = {"policy (greedy)": payload["policy"]["reward_per_step"],
             payload["best_baseline"]: payload["baselines"][payload["best_baseline"]]["reward_per_step"],
             "belief": payload["reference"]["belief"]["reward_per_step"]}
    assert best == max(means, key=means.get)
    best_mean = means[best]
    assert payload["bracket"]["width"]["mean"] == pytest.approx(np.mean(bound) - best_mean)
    assert payload["bracket"]["policy_below_best_causal"]["mean"] == pytest.approx(best_mean - np.mean(policy))
    assert "bracket:" in table and "optimality gap" in table or "the policy is the best causal player" in table


def test_a_bound_below_a_causal_return_fails_the_check(tmp_path, monkeypatch):
    run = landed_copy(tmp_path)
    lowered = 10.0  # the bound less 10 a episode: below the policy's return (checked below)

    def below(config, future, **kwargs):
        true = lagrangian_bound(config, future, **kwargs)
        return HindsightBound(true.value - lowered, true.prices, true.grid_s, true.values)

    monkeypatch.setattr("envs.hindsight.lagrangian_bound", below)  # (what envs.hindsight.episode_bound calls)
    payload, table = evaluated(run, "--episodes", "2", "--baselines", "fair_share", "--reference", "bound")
    policy = [r["return"] for r in players_records(run)["policy"][:2]]
    per_episode = payload["bracket"]["bound"]["per_episode"]
    assert all(p > b * CELL["max_steps"] for p, b in zip(policy, per_episode))  # the premise: a causal return above
    assert payload["optimality_gap"]["mean"] < 0 and payload["bracket"]["width"]["mean"] < 0
    holds = payload["bracket"]["bound_holds"]
    assert holds["held"] == 0 and {"episode": 0, "player": "policy (greedy)"} in holds["below"]
    assert "THE BOUND FAILED" in table and "2/2 episodes" in table


def test_the_bound_moves_the_bar_episode_by_episode():
    counted = []
    with episodes_counted(counted.append):
        bound_records(envs.VREdgeConfig(num_users=2, max_steps=6), 3, 0)
    assert counted == [1, 1, 1]


def test_a_cell_whose_users_vary_is_refused_in_one_line(tmp_path, capsys):
    run = landed_copy(tmp_path, "ppo-cells-set")  # users "2-4", churn "0-0.05"
    with exits(2, "--reference bound", "users", "churn", "drop bound", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(run), "--episodes", "1", "--reference", "bound"])
    with exits(2, "--reference bound", "--users", "drop bound", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(run), "--users", "2", "--reference", "bound"])


def _same_numbers(ours, before, where: str = "") -> None:
    """``ours`` has ``before``'s keys and items, its numbers equal to 1e-9 relative (not to the last bit: another
    CPU's exp and matmul may round otherwise), its strings equal."""
    if isinstance(before, dict):
        assert isinstance(ours, dict) and set(ours) == set(before), (where, sorted(set(ours) ^ set(before)))
        for key in before:
            _same_numbers(ours[key], before[key], f"{where}.{key}")
    elif isinstance(before, list):
        assert isinstance(ours, list) and len(ours) == len(before), where
        for i, (a, b) in enumerate(zip(ours, before)):
            _same_numbers(a, b, f"{where}[{i}]")
    elif isinstance(before, float):
        assert ours == pytest.approx(before, rel=1e-9, abs=1e-12), where
    else:
        assert ours == before, where


def test_without_the_bound_an_old_run_evaluates_as_before(tmp_path):
    # what this command wrote before --reference bound existed (tests/data/evaluation_before_bound, the run's path
    # as RUN): the same keys and numbers, no bracket; the table's players the same, no bracket section
    run = landed_copy(tmp_path)
    payload, table = evaluated(run, "--episodes", "3", "--reference", "clairvoyant,belief")
    before = json.loads((BEFORE / "evaluation.json").read_text())
    _same_numbers(json.loads(json.dumps(payload).replace(str(run), "RUN")), before)
    rows = [line.split()[0] for line in table.splitlines() if line[:1].isalpha()]
    rows_before = [line.split()[0] for line in (BEFORE / "table.txt").read_text().splitlines() if line[:1].isalpha()]
    assert rows == rows_before and "bracket:" not in table


@pytest.mark.slow  # (the default cell: a bound episode and a BeliefMPC episode, under a minute)
def test_the_cost_benchmark_times_both_references(capsys):
    from benchmarks.hindsight import main

    main(["cost", "--bound-episodes", "1", "--belief-episodes", "1", "--episodes", "2"])
    out = capsys.readouterr().out
    assert "bound:" in out and "belief:" in out and out.count("extrapolated from 1 x 2.0") == 2
    assert "bound / belief on 2 episodes:" in out


def test_the_bracket_benchmark_gives_each_run_the_evaluations_bracket_and_plays_the_rest_once(
        run, bracketed, tmp_path, monkeypatch, capsys):
    """``benchmarks.bracket`` on two runs: each row is the bracket ``trainer.evaluate --reference bound`` gives the
    run (the same episodes, the same figures), and a second call plays nothing it kept (the bound, BeliefMPC, the
    baselines and each policy are read back)."""
    from benchmarks import bracket as bench

    twins = [Path(shutil.copytree(run, tmp_path / name)) for name in ("s1", "s2")]
    out = tmp_path / "out"
    argv = [*map(str, twins), "--episodes", str(EPISODES), "--out", str(out)]
    bench.main(argv)
    rows = json.loads((out / "bracket.json").read_text())
    expected = {**bracketed[0]["bracket"], "optimality_gap": bracketed[0]["optimality_gap"]}
    assert [r["run"] for r in rows] == [str(t) for t in twins]
    for row in rows:
        assert row["bound"]["per_episode"] == pytest.approx(expected["bound"]["per_episode"], abs=1e-9)
        for key in ("width", "optimality_gap"):
            assert row[key]["mean"] == pytest.approx(expected[key]["mean"], abs=1e-9)
            assert row[key]["ci95"] == pytest.approx(expected[key]["ci95"], abs=1e-9)
        assert row["bound_holds"]["held"] == EPISODES
    table = capsys.readouterr().out
    assert table.count("| s") == 2 and (out / "bracket.md").read_text().strip() in table

    def played_again(*args, **kwargs):
        raise AssertionError("played again: the kept records were not used")
    monkeypatch.setattr(bench, "run_episodes", played_again)
    monkeypatch.setattr(bench, "bound_records", played_again)
    monkeypatch.setattr(bench, "belief_records", played_again)
    bench.main(argv)
    assert json.loads((out / "bracket.json").read_text()) == rows


def test_the_bracket_benchmark_refuses_a_run_it_cannot_load_in_one_line(run, tmp_path, capsys):
    from benchmarks import bracket as bench

    with exits(2, "no-such-run", capsys=capsys):
        bench.main([str(run), str(tmp_path / "no-such-run"), "--out", str(tmp_path / "out")])


@pytest.mark.slow  # (two processes started, a cell of 1,000 user-rounds bounded three times, two episodes each)
def test_a_large_cells_bound_is_the_same_on_one_process_per_core_and_moves_the_bar_per_episode(monkeypatch):
    """Where a cell's episodes are large enough, ``bound_records`` bounds them in one process per usable core: the
    same records, in the episodes' order, as in the evaluation's own process, and every episode counted."""
    from trainer.evaluation import bracket

    cfg = envs.VREdgeConfig(num_users=4, max_steps=250)
    assert cfg.num_users * cfg.max_steps >= bracket.PARALLEL_USER_ROUNDS  # (the parallel path, below)
    monkeypatch.setattr("collectors.resources.usable_cores", lambda: 2)
    counted = []
    with episodes_counted(counted.append):
        parallel = bound_records(cfg, 2, seed=1)  # (an episode for each process: their order is the episodes')
    monkeypatch.setattr(bracket, "PARALLEL_USER_ROUNDS", 10**9)
    serial = bound_records(cfg, 2, seed=1)
    assert parallel == serial and sum(counted) == 2
    assert [r["return"] for r in serial] == [lagrangian_bound(cfg, episode_future(cfg, s), iterations=BOUND_ITERATIONS)
                                             .value for s in evaluation_seeds(1, 2)]


@pytest.mark.slow  # (two processes started)
def test_a_bound_that_does_not_come_back_from_a_worker_ends_the_evaluation_with_a_line(monkeypatch):
    """A worker that dies loses its episode for good: past the deadline the evaluation ends with one line, not a
    wait for ever (here the deadline is shorter than any episode's bound)."""
    from trainer.evaluation import bracket

    monkeypatch.setattr("collectors.resources.usable_cores", lambda: 2)
    monkeypatch.setattr(bracket, "EPISODE_DEADLINE_S", 1e-3)
    with pytest.raises(TimeoutError, match="did not come back"):
        bound_records(envs.VREdgeConfig(num_users=4, max_steps=250), 2, seed=1)
