"""The Ape-X tier: replay (sum tree, priorities, eviction, weights), n-step targets, double DQN, the epsilon
schedule, the acting policy, training, resume and evaluation."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import checkpoints
from envs.settings import ConfigError
from tests.factories import settings_file
from tests.messages import exits, names, raises
from trainer import evaluate as evaluate_cli
from trainer import train as train_module
from trainer.apex.dqn import double_dqn_targets, dqn_loss, priorities
from trainer.apex.exploration import EpsilonGreedy, apex_epsilons
from trainer.apex.nstep import STEP_KEYS, NStepBuilder, nstep_transitions
from trainer.apex.q_network import QNetwork
from trainer.apex.replay import PrioritizedReplay, SumTree
from trainer.common.policy_layout import PolicyLayout
from trainer.flags import parse_args

# upper 0.1% quantiles of the chi-square distribution (df: value), so a correct sampler fails 1 run in 1000;
# the seeds are fixed, so a run that passes always passes
CHI2_999 = {4: 18.467, 5: 20.515}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------------------------------------- replay
def test_sum_tree_samples_in_proportion_to_priorities():
    tree = SumTree(6)  # 8 leaves: two padding slots that must never come out
    p = np.array([1.0, 2.0, 3.0, 4.0, 0.0, 10.0])
    tree.update(np.arange(6), p)
    rng = np.random.default_rng(0)
    slots = tree.find(rng.uniform(0, tree.total, 40_000))
    counts = np.bincount(slots, minlength=6)
    assert counts[4] == 0  # priority 0: never sampled
    keep = p > 0
    assert chi_square(counts[keep], p[keep] / p.sum()) < CHI2_999[4]
    # and the test can fail: the same counts against uniform probabilities are far outside
    assert chi_square(counts[keep], np.full(5, 0.2)) > 100 * CHI2_999[4]


def test_sum_tree_updates_keep_every_partial_sum():
    tree = SumTree(5)
    tree.update(np.array([0, 1, 2, 3, 4]), np.array([1.0, 1.0, 1.0, 1.0, 1.0]))
    tree.update(np.array([2, 2, 4]), np.array([7.0, 3.0, 0.5]))  # a repeated slot: the last write wins
    assert tree.total == pytest.approx(1 + 1 + 3 + 1 + 0.5)
    leaves = tree.leaves
    for node in range(1, leaves):  # every inner node is the sum of its children
        assert tree.tree[node] == pytest.approx(tree.tree[2 * node] + tree.tree[2 * node + 1])
    assert tree.find(np.array([2.5, 4.99, 5.2, 6.2])).tolist() == [2, 2, 3, 4]  # prefix sums 1, 2, 5, 6, 6.5


def example() -> TensorDict:
    return TensorDict({"observations": torch.zeros(2), "actions": torch.zeros((), dtype=torch.int64)}, [])


def items(values) -> TensorDict:
    v = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"observations": v[:, None].expand(len(v), 2).clone(),
                       "actions": v.long()}, [len(v)])


def test_replay_samples_stratified_in_proportion_to_priority_to_the_alpha():
    replay = PrioritizedReplay(8, example(), alpha=0.5, seed=0)
    p = torch.tensor([1.0, 4.0, 9.0, 16.0, 25.0, 36.0])
    replay.add(items(range(6)), p)
    counts = np.zeros(6)
    for _ in range(400):
        batch, slots, ids, _ = replay.sample(64, beta=0.4)
        assert torch.equal(batch["actions"], torch.as_tensor(slots))  # the transitions of the sampled slots
        counts += np.bincount(slots, minlength=6)
    expected = (p.numpy() + 1e-6) ** 0.5
    assert chi_square(counts, expected / expected.sum()) < CHI2_999[5]


def test_importance_weights_by_hand():
    replay = PrioritizedReplay(4, example(), alpha=1.0, eps=0.0, seed=1)
    replay.add(items(range(4)), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    _, slots, _, weights = replay.sample(32, beta=0.5)
    probs = np.array([0.1, 0.2, 0.3, 0.4])[slots]
    raw = (4 * probs) ** -0.5
    assert np.allclose(weights.numpy(), raw / raw.max(), rtol=1e-6)
    assert set(slots.tolist()) == {0, 1, 2, 3} and weights.max() == 1.0


def test_fifo_eviction_and_stale_priority_updates_are_ignored():
    replay = PrioritizedReplay(4, example(), alpha=1.0, eps=0.0, seed=0)
    replay.add(items([0, 1, 2]), torch.ones(3))
    _, slots, ids, _ = replay.sample(8, beta=1.0)
    replay.add(items([3, 4, 5]), torch.full((3,), 2.0))  # overwrites the two oldest (0 and 1)
    assert replay.size == 4 and sorted(replay.storage["actions"].tolist()) == [2, 3, 4, 5]
    set_ = replay.update_priorities(slots, ids, torch.full((len(slots),), 100.0))
    survivors = slots == 2  # the only sampled slot that still holds what was sampled
    assert set_ == int(survivors.sum()) > 0
    assert replay.tree.priorities(np.array([0, 1, 3])).tolist() == [2.0, 2.0, 2.0]  # new ones keep theirs
    assert replay.tree.priorities(np.array([2]))[0] == 100.0
    assert replay.tree.total == pytest.approx(106.0)


def test_replay_states_its_memory_and_round_trips_through_a_state_dict():
    replay = PrioritizedReplay(10, example(), seed=3)
    assert replay.bytes_per_transition >= 2 * 4 + 8  # observations and action at least
    assert "10 transitions" in replay.describe()
    replay.add(items(range(7)), torch.rand(7))
    copy = PrioritizedReplay(10, example(), seed=99)
    copy.load_state_dict(replay.state_dict())
    a, b = replay.sample(5, 0.4), copy.sample(5, 0.4)
    assert np.array_equal(a[1], b[1]) and torch.equal(a[3], b[3]) and copy.added == 7


@pytest.mark.parametrize("save_replay", [False, True])
def test_the_memory_check_counts_the_copies_a_saved_replay_makes(monkeypatch, save_replay):
    from trainer.apex import algorithm as apex
    from trainer.apex.replay import replay_bytes
    needed = replay_bytes(10**6, example())
    monkeypatch.setattr(apex.psutil, "virtual_memory", lambda: type("Memory", (), {"available": 2 * needed}))
    apex.check_replay_fits(10**6 // 4, example(), save_replay)  # 4 copies of a quarter fit in twice the replay
    if not save_replay:
        apex.check_replay_fits(10**6, example(), save_replay)
        return
    with raises(ConfigError, "4 x", "save_replay", key="replay_capacity", value=10**6):  # the copies counted
        apex.check_replay_fits(10**6, example(), save_replay)


@pytest.mark.slow
def test_a_saved_replay_peaks_within_the_copies_the_memory_check_counts(tmp_path):
    """The peak memory of a run whose every checkpoint holds the replay, over one with a tiny replay, is at most
    ``SAVED_REPLAY_COPIES`` replays (and more than one: the copies the check counts are real)."""
    import re
    import subprocess
    import sys

    from trainer.apex.algorithm import SAVED_REPLAY_COPIES

    def run(capacity: int) -> tuple[int, int]:
        """Peak resident bytes, and the replay's bytes per transition as the run prints them."""
        code = ("import resource, sys; from trainer import train; train.main(sys.argv[1:]); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")  # KiB on Linux
        args = ["--algo", "apex", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps",
                "64", "--learning-starts", "16", "--device", "cpu", "--backend", "sync",
                "--config", settings_file("save_replay"),
                "--checkpoint-every", "1", "--replay-capacity", str(capacity),
                "--run-dir", str(tmp_path / str(capacity))]
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1]) * 1024, int(re.search(r"transitions x (\d+) bytes", done.stderr)[1])

    capacity = 8 * 10**6  # large enough that what both runs allocate besides the replay does not count
    (big, per_transition), (small, _) = run(capacity), run(1000)
    replay = capacity * per_transition
    assert 1.5 * replay < big - small <= SAVED_REPLAY_COPIES * replay, (big - small) / replay


# ---------------------------------------------------------------------------------------------- n-step
def window(rewards, terminated=(), truncated=()):
    t = len(rewards)
    w = {"observations": torch.arange(t, dtype=torch.float32).reshape(t, 1, 1),
         "actions": torch.zeros(t, 1, dtype=torch.int64),
         "rewards": torch.tensor(rewards, dtype=torch.float32).reshape(t, 1),
         "terminated": torch.zeros(t, 1, dtype=torch.bool), "truncated": torch.zeros(t, 1, dtype=torch.bool),
         "final_observations": torch.zeros(t, 1, 1)}
    for i in terminated:
        w["terminated"][i] = True
        w["final_observations"][i] = -100 - i
    for i in truncated:
        w["truncated"][i] = True
        w["final_observations"][i] = -100 - i
    return w


def test_nstep_targets_by_hand_with_truncation_and_termination():
    # one env, 7 steps, n = 3, gamma = 0.5: truncated at step 1 (final obs -101), terminated at step 4
    g = 0.5
    w = window([1, 2, 4, 8, 16, 32, 64], truncated=[1], terminated=[4])
    t = nstep_transitions(w, torch.full((1, 1), 7.0), n=3, gamma=g)
    assert t.batch_size == torch.Size([5])
    assert t["rewards"].tolist() == [1 + g * 2, 2, 4 + g * 8 + g**2 * 16, 8 + g * 16, 16]
    assert t["next_observations"].flatten().tolist() == [-101, -101, -104, -104, -104]
    assert t["done"].tolist() == [False, False, True, True, True]
    assert t["discounts"].tolist() == [g**2, g, 0, 0, 0]
    # after the termination, a new episode: full n-step returns again
    t2 = nstep_transitions(window([1, 2, 4, 8, 16, 32, 64], terminated=[1]), torch.full((1, 1), 7.0), n=3, gamma=g)
    assert t2["rewards"][2].item() == 4 + g * 8 + g**2 * 16 and t2["discounts"][2].item() == g**3
    assert t2["next_observations"][2].item() == 5.0 and not t2["done"][2]


class _Rollout:
    def __init__(self, batch, next_observations):
        self.batch, self.next_observations = batch, next_observations


def test_nstep_builder_loses_nothing_between_rollouts():
    w = window([float(i) for i in range(10)], truncated=[5], terminated=[8])
    whole = nstep_transitions(w, torch.full((1, 1), 10.0), n=3, gamma=0.9)
    builder = NStepBuilder(3, 0.9)
    first = builder.add(_Rollout({k: w[k][:4] for k in STEP_KEYS}, w["observations"][4]))
    second = builder.add(_Rollout({k: w[k][4:] for k in STEP_KEYS}, torch.full((1, 1), 10.0)))
    assert (len(first), len(second)) == (2, 6)
    joined = torch.cat([first["rewards"], second["rewards"]])
    assert torch.equal(joined, whole["rewards"])
    assert torch.equal(torch.cat([first["next_observations"], second["next_observations"]]),
                       whole["next_observations"])


# ---------------------------------------------------------------------------------------------- DQN
def test_double_dqn_targets_pick_with_online_and_evaluate_with_target():
    # two heads, three actions; the online net prefers actions (2, 0), the target values them at 4 and 6
    online = lambda obs: torch.tensor([[[0.0, 1.0, 9.0], [5.0, 1.0, 0.0]]]).expand(len(obs), 2, 3)  # noqa: E731
    target = lambda obs: torch.tensor([[[100.0, 100.0, 4.0], [6.0, 100.0, 100.0]]]).expand(len(obs), 2, 3)  # noqa: E731
    batch = TensorDict({"next_observations": torch.zeros(2, 1), "rewards": torch.tensor([1.0, 1.0]),
                        "discounts": torch.tensor([0.25, 0.25]), "done": torch.tensor([False, True])}, [2])
    y = double_dqn_targets(online, target, batch)
    assert y.tolist() == [1 + 0.25 * (4 + 6) / 2, 1.0]  # the mean over heads; no bootstrap when done
    loss, td = dqn_loss(torch.tensor([[1.0, 2.0], [1.0, 1.0]]), y, torch.tensor([1.0, 0.5]))
    assert td.tolist() == [[1.25, 0.25], [0.0, 0.0]]  # targets 2.25 and 1
    assert loss.item() == pytest.approx(((1.25 - 0.5) + 0.5 * 0.25**2) / 2 / 2)  # Huber, head mean, batch mean
    assert priorities(td).tolist() == [0.75, 0.0]


def test_epsilon_schedule_is_apex():
    eps = apex_epsilons(8)
    assert torch.allclose(eps, torch.tensor([0.4 ** (1 + i) for i in range(8)]))  # 7 i / 7 = i
    assert apex_epsilons(1).tolist() == pytest.approx([0.4])
    assert apex_epsilons(5, base=0.5, alpha=4)[2].item() == pytest.approx(0.5**3)


def test_epsilon_greedy_explores_at_each_envs_rate_whatever_the_grouping():
    q = QNetwork(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([4, 4]), hidden=(8,))
    keys = torch.tensor([5, 6, 7])
    policy = EpsilonGreedy(q, keys, torch.tensor([0.0, 1.0, 0.5]))
    obs = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    greedy = q.act_deterministic(obs)
    actions = []
    for step in range(400):
        steps = torch.full((3,), step)
        a = policy(obs, noise_keys=keys, steps=steps)["action"]
        split = torch.cat([policy(obs[:1], noise_keys=keys[:1], steps=steps[:1])["action"],
                           policy(obs[1:], noise_keys=keys[1:], steps=steps[1:])["action"]])
        assert torch.equal(a, split)
        actions.append(a)
    actions = torch.stack(actions)  # [400, 3 envs, 2 heads]
    assert (actions[:, 0] == greedy[0]).all()  # epsilon 0: always greedy
    assert set(actions[:, 1, 0].tolist()) == {0, 1, 2, 3}  # epsilon 1: uniform over the actions
    differs = (actions[:, 2] != greedy[2]).any(-1).float().mean().item()
    assert 0.3 < differs < 0.55  # epsilon 0.5: random half the time, and random picks greedy 1/16 of those


def test_branching_network_shares_its_advantage_across_heads():
    q = QNetwork(gym.spaces.Box(0, 1, (2 * 3 + 1,)), gym.spaces.MultiDiscrete([5, 5]), hidden=(16, 16),
                 layout=PolicyLayout("per_head", 3, 1))
    obs = torch.rand(4, 7)
    swapped = torch.cat([obs[:, 3:6], obs[:, 0:3], obs[:, 6:]], -1)  # the two users trade places
    out, out_swapped = q(obs), q(swapped)
    assert out.shape == (4, 2, 5)
    # the trunk sees the users in another order, so only the shapes and the dueling identity are fixed
    value = out.mean(-1)  # mean_a Q = V for every head
    assert torch.allclose(value[:, 0], value[:, 1], atol=1e-6) and out_swapped.shape == out.shape
    with raises(TypeError, "--algo ppo"):  # the way out
        QNetwork(gym.spaces.Box(0, 1, (3,)), gym.spaces.Box(0, 1, (2,)))


# ---------------------------------------------------------------------------------------------- training
def run(argv, **kw):
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given,
                              overwrite=cli.overwrite, **kw)


# a small Ape-X run whose every checkpoint holds the replay (save_replay = true, in its TOML file): resumes are exact
SMALL_VR = ["--algo", "apex", "--env", "VREdge-v0", "--env-kwargs", "num_users=2,max_steps=20", "--num-envs", "4",
            "--num-steps", "8", "--total-steps", str(4 * 8 * 8), "--learning-starts", "40", "--minibatch-size", "16",
            "--replay-capacity", "200", "--replay-ratio", "2", "--checkpoint-every", "1", "--seed", "4",
            "--threads", "1", "--hidden", "16", "--config", settings_file("apex_small_saved_replay")]
# ... and one whose checkpoints hold no replay (save_replay's default): a resume refills it
REFILLED = [*SMALL_VR[:-1], settings_file("apex_small")]


def test_stop_and_resume_of_a_learner_run_is_exact_with_the_replay_saved(tmp_path):
    straight = run(SMALL_VR + ["--run-dir", str(tmp_path / "straight")])
    first = run(SMALL_VR + ["--run-dir", str(tmp_path / "split")], max_iterations=3)
    assert first["iterations"] == 3
    second = run(["--resume", str(tmp_path / "split")])
    assert straight["iterations"] == second["iterations"] == 8
    a = checkpoints.latest_loadable(tmp_path / "straight")[1]
    b = checkpoints.latest_loadable(tmp_path / "split")[1]
    assert a["counters"] == b["counters"] and a["counters"]["learner_steps"] > 10
    for part in ("model", "target_model", "acting_model"):
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), (part, k)
    assert torch.equal(a["replay"]["leaves"] if isinstance(a["replay"]["leaves"], torch.Tensor)
                       else torch.from_numpy(a["replay"]["leaves"]), torch.as_tensor(b["replay"]["leaves"]))
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert all("policy_lag" in r for r in rows) and rows[-1]["learner_steps"] == a["counters"]["learner_steps"]


def test_learning_rate_anneals_and_a_resume_may_switch_it_off(tmp_path):
    run(SMALL_VR + ["--lr", "0.002", "--anneal-lr", "true", "--run-dir", str(tmp_path)], max_iterations=4)
    run(["--resume", str(tmp_path), "--anneal-lr", "false"])  # e.g. a run saved before Ape-X annealed
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # 8 iterations of 4 envs x 8 steps: iteration i learns at 0.002 * (1 - (i - 1) / 8)
    assert lrs == pytest.approx([0.002 * (1 - i / 8) for i in range(4)] + [0.002] * 4)


@pytest.mark.parametrize("learning_starts, said", [
    (40, ["--learning-starts", "40 transitions"]),
    # 256 env steps in all, 64 before the stop: the 192 left cannot refill 200
    (200, ["--learning-starts", "200 transitions", "192 env steps", "--total-steps"]),  # and what to raise
])
def test_resume_without_the_replay_says_it_refills(tmp_path, capsys, learning_starts, said):
    argv = REFILLED + ["--run-dir", str(tmp_path), "--learning-starts", str(learning_starts)]
    run(argv, max_iterations=2)
    assert checkpoints.latest_loadable(tmp_path)[1]["replay"] is None
    capsys.readouterr()
    assert run(["--resume", str(tmp_path)])["iterations"] == 8
    names(capsys.readouterr().err, "save_replay = false", *said)  # why it holds no replay


def test_a_resume_takes_the_flags_of_the_runs_own_algorithm(tmp_path, capsys):
    """Which algorithm owns a flag is the resumed run's (its checkpoint's), not the default --algo's: an Ape-X
    run's save_replay (a key of the --config file) may change on resume, its --replay-ratio may not, and PPO's
    --epochs is not its own."""
    run(REFILLED + ["--run-dir", str(tmp_path)], max_iterations=2)
    resumed = run(["--resume", str(tmp_path), "--config", settings_file("save_replay")], max_iterations=3)
    assert resumed["iterations"] == 3
    assert checkpoints.latest_loadable(tmp_path)[1]["replay"] is not None
    capsys.readouterr()
    for flags, named in ((["--replay-ratio", "4"], ["--replay-ratio", "4.0", "2.0"]),  # given, and the run's
                         # below the default --learning-starts, not the run's: a mismatch, not a learning-starts error
                         (["--replay-capacity", "100"], ["--replay-capacity", "100", "200"]),
                         (["--epochs", "2"], ["--epochs", "ppo", "apex"])):  # whose flag, and this run's algorithm
        with exits(2, *named, capsys=capsys):
            train_module.main(["--resume", str(tmp_path), *flags])


def test_evaluate_plays_the_greedy_q_policy_against_the_baselines(tmp_path, capsys):
    run(SMALL_VR + ["--run-dir", str(tmp_path)], max_iterations=2)
    evaluate_cli.main(["--checkpoint", str(tmp_path), "--episodes", "3", "--baselines", "throughput,fair_share",
                       "--reference", "none", "--json"])
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["policy"]["episodes"] == 3
    assert set(payload["paired_reward_per_step"]) == {"throughput", "fair_share"}
    with exits(2, "--stochastic", capsys=capsys):  # a Q policy has no sampling: refused (a usage error), not
        evaluate_cli.main(["--checkpoint", str(tmp_path), "--episodes", "3", "--stochastic"])  # mislabelled


@pytest.mark.parametrize("argv, named", [(["--algo", "dqn"], ["--algo", "dqn"]),
                                         (["--algo", "apex", "--overlap", "true"], ["--overlap", "true"]),
                                         (["--algo", "apex", "--learning-starts", "10", "--replay-capacity", "5"],
                                          ["--learning-starts", "10"]),
                                         (["--algo", "apex", "--learning-starts", "0", "--replay-capacity", "16",
                                           "--minibatch-size", "128"],
                                          ["--minibatch-size", "128", "--replay-capacity", "16"]),
                                         (["--algo", "apex", "--n-step", "0"], ["--n-step", "0"])])
def test_bad_apex_config_is_a_clear_error(argv, named, capsys):
    with exits(2, *named, capsys=capsys):
        parse_args(argv)


def test_replay_beta_anneals_to_one_over_the_run():
    from trainer.apex.algorithm import ApeX
    from trainer.run_layout import Machine, run_layout
    cfg = parse_args(["--algo", "apex", "--env", "CartPole-v1", "--total-steps", "1000",
                      "--replay-capacity", "5000"]).config  # --replay-beta 0.4, the default
    apex = ApeX.new(cfg, run_layout(cfg, Machine(cores=1)))
    betas = []
    for steps in (0, 500, 1000, 5000):
        apex.env_steps = steps
        betas.append(apex.replay_beta())
    assert betas == pytest.approx([0.4, 0.7, 1.0, 1.0])


def test_apex_refuses_a_continuous_action_space(tmp_path):
    with raises(ConfigError, "--algo apex", "Box", "--algo ppo"):  # the space it got, and the way out
        run(["--algo", "apex", "--env", "Pendulum-v1", "--run-dir", str(tmp_path)])


@pytest.mark.slow
def test_cartpole_learns(tmp_path):
    # The command of docs/apex.md (on sync: deterministic on one machine) cut to 128k of its 400k steps, with
    # --eval-every. Its full length reaches 475 on 10/10 seeds (python -m benchmarks.apex cartpole, docs/benchmarks.md,
    # "Ape-X"); at a third of the steps, the best validated checkpoint's greedy return over 10 held-out
    # episodes was 142, 169, 283, 421 and 136 on seeds 1-5 (AMD EPYC, 2026-12-03; an untrained network scores ~10,
    # random actions ~22). The property is that checkpoint's, not the final network's: which network a seed ends on
    # depends on the CPU's float rounding, and DQN's greedy return dips and recovers along a run.
    from benchmarks.apex import CARTPOLE, CARTPOLE_VALIDATION, greedy_return
    steps = CARTPOLE.index("--total-steps") + 1
    short = [*CARTPOLE[:steps], "128000", *CARTPOLE[steps + 1:]]
    summary = run(short + CARTPOLE_VALIDATION + ["--backend", "sync", "--threads", "1", "--seed", "1",
                                                 "--checkpoint-every", "1000", "--run-dir", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    validated = [row["val_return"] for row in rows if "val_return" in row]
    assert summary["finished"] and len(validated) == 8
    assert greedy_return(tmp_path, "best", episodes=10) >= 100


# ---------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
    yield ray
    if started:
        ray.shutdown()


RAY_CARTPOLE = ["--algo", "apex", "--env", "CartPole-v1", "--backend", "ray", "--num-envs", "4", "--num-workers",
                "2", "--num-steps", "8", "--learning-starts", "32",
                "--minibatch-size", "16", "--replay-ratio", "2", "--config", settings_file("apex_ray"),
                "--hidden", "16", "--threads", "1", "--seed", "2"]


@pytest.mark.ray
def test_ray_actor_killed_mid_run_is_replaced_and_learning_goes_on(local_ray, caplog):
    import functools

    from collectors import make_collector
    from trainer.apex.algorithm import ApeX
    from trainer.apex.ray_worker import ApexWorker
    from trainer.run_layout import Machine, run_layout
    cfg = parse_args(RAY_CARTPOLE).config
    run_ = ApeX.new(cfg, run_layout(cfg, Machine(cores=2, ray_cpus=2.0, ray_cpus_here=2.0)))
    with make_collector([functools.partial(gym.make, "CartPole-v1")] * 4, run_.acting, backend="ray", num_steps=8,
                        seed=cfg.seed, num_workers=2, envs_per_worker=2, cpus_per_worker=0.5, keep_collecting=True,
                        worker_cls=ApexWorker, worker_kwargs={"n_step": 3, "gamma": cfg.gamma}) as collector:
        run_.attach(collector)
        start = (0, 0.0)
        rows = [run_.iterate(start) for _ in range(8)]
        assert run_.learner_steps > 0 and all(r["policy_lag"] >= 0 for r in rows)
        before = run_.replay.added
        local_ray.kill(collector.workers.actors[1])
        with caplog.at_level("WARNING", logger="collectors.ray"):
            rows += [run_.iterate(start) for _ in range(8)]
        assert collector.workers.restarts == 1 and "replaced" in caplog.text
        assert run_.replay.added > before + 6 * 2 * (8 - 2)  # both actors keep delivering transitions
        assert collector.policy_version >= 2  # and weights kept going out


@pytest.mark.ray
def test_ray_apex_run_trains_checkpoints_and_resumes(local_ray, tmp_path):
    argv = RAY_CARTPOLE + ["--total-steps", str(4 * 8 * 12), "--checkpoint-every", "4", "--run-dir", str(tmp_path)]
    first = run(argv, max_iterations=8)  # an iteration is one actor's slice: 2 envs x 8 steps
    assert first["iterations"] == 8 and first["env_steps"] == 8 * 2 * 8
    second = run(["--resume", str(tmp_path)])
    assert second["finished"] and second["iterations"] == 24
    state = checkpoints.latest_loadable(tmp_path)[1]
    assert state["counters"]["learner_steps"] > 0 and "target_model" in state


def test_export_refuses_a_q_network_clearly(tmp_path, capsys):
    from trainer import export
    run(SMALL_VR + ["--run-dir", str(tmp_path)], max_iterations=1)
    capsys.readouterr()
    with exits(1, tmp_path, "--algo apex"):
        export.main(["--checkpoint", str(tmp_path), "--format", "torchscript"])
    assert "exporting" not in capsys.readouterr().err  # refused before it says it is exporting


@pytest.mark.parametrize("learning_starts, said", [(40, False), (300, True)])  # 256 env steps in all
def test_a_run_too_short_to_start_learning_says_so_at_its_start(tmp_path, capsys, learning_starts, said):
    summary = run(REFILLED + ["--learning-starts", str(learning_starts), "--replay-capacity", "400",
                              "--run-dir", str(tmp_path)], max_iterations=1)
    err = capsys.readouterr().err
    assert ("this run will not learn; raise --total-steps (or, for a new run, lower --learning-starts)" in err) \
        == said, err
    assert summary["iterations"] == 1  # a note: the run goes on (a smoke test of the pipeline is a use)
    if said:  # a resume without the replay says it once
        run(["--resume", str(tmp_path), "--total-steps", str(4 * 8 * 8 + 32)], max_iterations=2)
        err = capsys.readouterr().err
        assert err.count("will not learn") == 1 and "it refills from new experience" in err, err


def test_n_step_longer_than_a_rollout_waits_for_enough_steps(tmp_path):
    # n = 20 > num_steps = 8: the first two rollouts complete no transition, the third completes 5 per env
    run(SMALL_VR + ["--n-step", "20", "--run-dir", str(tmp_path / "r")], max_iterations=3)
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["replay_size"] for r in rows] == [0, 0, (3 * 8 - 20 + 1) * 4]


def test_flags_of_the_other_algorithm_are_refused(capsys, tmp_path):
    for argv, flag in ((["--algo", "apex", "--epochs", "3"], "--epochs"), (["--n-step", "5"], "--n-step"),
                       (["--algo", "apex", "--gae-lambda", "0.9"], "--gae-lambda")):
        with exits(2, flag, capsys=capsys):
            parse_args(argv)
    (tmp_path / "run.toml").write_text('algo = "apex"\nenv = "CartPole-v1"\nepochs = 2\n')
    with exits(2, tmp_path / "run.toml", "epochs = 2", "ppo", capsys=capsys):  # a key of the file is named as the
        parse_args(["--config", str(tmp_path / "run.toml")])                 # file spells it, with the file


@pytest.mark.parametrize("save_replay", [False, True])
def test_train_longer_names_a_total_that_learns(tmp_path, capsys, save_replay):
    """A finished run too short to learn prints a "train longer" total that lets the learner wait for
    --learning-starts (refilled from scratch where the replay was not saved) and then learn; twice the steps
    would not: 512 here, where a resume without the replay needs 256 + 300 just to start."""
    import shlex

    from trainer import train as train_cli

    train_cli.main((SMALL_VR if save_replay else REFILLED) + ["--learning-starts", "300", "--replay-capacity", "400",
                                                              "--run-dir", str(tmp_path)])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train longer:"))
    argv = shlex.split(line.split(":", 1)[1])[3:]  # less the interpreter and -m trainer.train
    # at least 600 (or 256 + 600), in whole iterations of 32 env steps
    assert argv[argv.index("--total-steps") + 1] == ("608" if save_replay else str(256 + 608))
    train_cli.main(argv)
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    err = capsys.readouterr().err
    assert rows[-1]["learner_steps"] > 0 and "will not learn" not in err and "whole number" not in err, err
