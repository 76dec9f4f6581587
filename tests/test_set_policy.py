"""The set policy (``policy_arch = "set"``): one network for any number of user slots, acting for the active users
only; auto picks it where the env's user count varies; it trains, resumes, exports and loads at any slot count."""

import io
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import checkpoints
import trainer
from envs.settings import ConfigError
from tests.factories import HostSyncs, MaskedCellEnv, settings_file
from tests.messages import raises
from trainer import train as train_module
from trainer.common.moments import merged_moments, weighted_batch_moments
from trainer.common.policy_layout import PolicyLayout
from trainer.config import TrainConfig
from trainer.evaluation.policies import make_model, trained_model
from trainer.flags import parse_args
from trainer.ppo.model import ActorCritic
from trainer.ppo.set_model import SetActorCritic, split_observations

F, C, LEVELS, ACTIVE = 8, 6, 4, 7  # the masked VR-edge contract: 7 features + the active flag, 2 more cell ones
LAYOUT = PolicyLayout("set", F, C, ACTIVE)


def set_model(slots: int, layout: PolicyLayout = LAYOUT, seed: int = 0, shared_trunk: bool = False) -> SetActorCritic:
    space = gym.spaces.Box(-np.inf, np.inf, (slots * layout.features + layout.shared,), np.float32)
    return SetActorCritic(space, gym.spaces.MultiDiscrete([LEVELS] * slots), layout, seed=seed,
                          shared_trunk=shared_trunk)


def cell_observations(batch: int, slots: int, seed: int = 0, active_share: float = 0.6) -> torch.Tensor:
    """``[batch, slots * F + C]``: random features, about ``active_share`` of the slots active (at least slot 0),
    an inactive slot's features all 0, as the env gives them."""
    g = torch.Generator().manual_seed(seed)
    users = torch.randn(batch, slots, F, generator=g) * 3 + 1
    active = torch.rand(batch, slots, generator=g) < active_share
    active[:, 0] = True
    users[..., ACTIVE] = 1.0
    users = users * active[..., None]
    return torch.cat([users.reshape(batch, -1), torch.randn(batch, C, generator=g)], dim=1)


def trained_like(model: SetActorCritic, seed: int = 1) -> SetActorCritic:
    """``model`` with weights far from their init (the actor's init gain 0.01 makes every head nearly uniform, where
    a test of greedy actions would show little) and with observation statistics of its own."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.norm.update(cell_observations(256, 12, seed=seed))
    return model.eval()


def permuted(obs: torch.Tensor, perm: torch.Tensor, layout: PolicyLayout = LAYOUT) -> torch.Tensor:
    users, cell = split_observations(obs, layout)
    return torch.cat([users[:, perm].reshape(len(obs), -1), cell], dim=1)


@pytest.mark.parametrize("shared", [False, True], ids=["separate encoders", "shared encoder"])
def test_permuting_the_users_permutes_actions_and_log_probabilities_and_keeps_the_value(shared):
    """Pooled in float32, whose sum rounds with the users' order: the value and every user's log-probabilities
    within 1e-5, under permutations that mix active and inactive slots; greedy actions exactly, where no head's two
    best levels are within 1e-4 of each other (a tie that rounding may break either way)."""
    model = trained_like(set_model(10, shared_trunk=shared))
    obs = cell_observations(64, 10, seed=2)
    a, p, v = model.exported(obs)
    best_two = p.log().topk(2, dim=-1).values
    untied = best_two[..., 0] - best_two[..., 1] > 1e-4  # [B, U]
    assert untied.float().mean() > 0.95 and len(set(a[:, 0].tolist())) > 1 and p.std() > 0.05  # says something
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        perm = torch.randperm(10, generator=g)
        pa, pp, pv = model.exported(permuted(obs, perm))
        torch.testing.assert_close(pv, v, atol=1e-5, rtol=0)
        torch.testing.assert_close(pp.log(), p.log()[:, perm], atol=1e-5, rtol=0)
        assert torch.equal(pa[untied[:, perm]], a[:, perm][untied[:, perm]])
        log_p = model.evaluate(obs, a)[0]  # the summed log-probability of permuted actions
        torch.testing.assert_close(model.evaluate(permuted(obs, perm), a[:, perm])[0], log_p, atol=1e-5, rtol=0)
    keys, steps = torch.arange(64), torch.full((64,), 5)
    assert model.act(obs, keys, steps)["action"].shape == (64, 10)


class Dtypes(TorchDispatchMode):
    """The dtypes of every tensor the ops return while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.seen |= {t.dtype for t in outs if isinstance(t, torch.Tensor)}
        return out


@pytest.mark.parametrize("shared", [False, True], ids=["separate encoders", "shared encoder"])
def test_acting_and_the_update_run_in_float32_without_a_host_sync(shared):
    """No float64 on the hot path (acting, the loss's forward and backward), and nothing that makes the host wait
    for a device (a CUDA graph captures the step): the masked slots cost no data-dependent shape."""
    model = trained_like(set_model(12, shared_trunk=shared)).train()
    obs = cell_observations(32, 12, seed=13)
    actions = torch.randint(0, LEVELS, (32, 12), generator=torch.Generator().manual_seed(14))
    with Dtypes() as dtypes, HostSyncs() as syncs:
        model.act(obs, torch.arange(32), torch.zeros(32, dtype=torch.int64))
        log_p, entropy, value = model.evaluate(obs, actions)
        (log_p.sum() + entropy.sum() + value.sum()).backward()
    assert torch.float32 in dtypes.seen and torch.float64 not in dtypes.seen, dtypes.seen
    assert not syncs.count, syncs.count
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_an_inactive_slots_features_change_nothing():
    model = trained_like(set_model(10))
    obs = cell_observations(64, 10, seed=4)
    users, cell = split_observations(obs, LAYOUT)
    active = users[..., ACTIVE] > 0.5
    noisy = users + torch.randn(users.shape) * 100 * ~active[..., None]  # only inactive slots change
    noisy[..., ACTIVE] = users[..., ACTIVE]  # (and stay inactive)
    other = torch.cat([noisy.reshape(64, -1), cell], dim=1)
    assert not torch.equal(other, obs)
    actions = torch.randint(0, LEVELS, (64, 10), generator=torch.Generator().manual_seed(5))
    for got, want in zip(model.evaluate(other, actions), model.evaluate(obs, actions)):  # log-prob, entropy, value
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert torch.equal(model.act_deterministic(other), model.act_deterministic(obs))
    keys, steps = torch.arange(64), torch.zeros(64, dtype=torch.int64)
    sampled, again = model.act(obs, keys, steps), model.act(other, keys, steps)
    assert torch.equal(sampled["action"], again["action"]) and not sampled["action"][~active].any()  # inactive: 0
    torch.testing.assert_close(sampled["log_prob"], again["log_prob"], atol=1e-6, rtol=0)


def test_inactive_slots_add_nothing_to_the_log_probability_or_the_entropy():
    model = trained_like(set_model(6))
    obs = cell_observations(32, 6, seed=6, active_share=0.0)  # slot 0 alone is active
    one_slot = torch.cat([obs[:, :F], obs[:, -C:]], dim=1)  # the same cell as one slot
    actions = torch.randint(0, LEVELS, (32, 6), generator=torch.Generator().manual_seed(7))
    log_p, entropy, value = model.evaluate(obs, actions)
    alone = model.evaluate(one_slot, actions[:, :1])
    for got, want in zip((log_p, entropy, value), alone):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    other_actions = actions.clone()
    other_actions[:, 1:] = (actions[:, 1:] + 1) % LEVELS  # an inactive slot's action is not the policy's
    torch.testing.assert_close(model.evaluate(obs, other_actions)[0], log_p, atol=0, rtol=0)
    all_active = obs.clone()
    all_active[:, ACTIVE:6 * F:F] = 1.0
    probs = model.action_probs(all_active)  # every user active: every head's entropy and log-probability counts
    log_p, entropy, _ = model.evaluate(all_active, actions)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum((-1, -2)), atol=1e-5, rtol=0)
    torch.testing.assert_close(log_p, probs.gather(-1, actions[..., None]).log().sum((-1, -2)), atol=1e-5, rtol=0)


def test_a_state_dict_saved_at_12_slots_loads_at_16_and_acts():
    small = trained_like(set_model(12))
    buffer = io.BytesIO()
    torch.save(small.state_dict(), buffer)
    big = set_model(16, seed=9)
    big.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))  # strict: same tensors
    big.eval()
    obs = cell_observations(16, 12, seed=8)
    padded = torch.cat([obs[:, :-C], torch.zeros(16, 4 * F), obs[:, -C:]], dim=1)  # 4 more slots, inactive
    assert torch.equal(big.act_deterministic(padded)[:, :12], small.act_deterministic(obs))
    torch.testing.assert_close(big.value(padded), small.value(obs), atol=1e-6, rtol=0)
    assert big.act(cell_observations(5, 16))["action"].shape == (5, 16)
    assert all(F * 12 + C not in t.shape and 12 not in t.shape for t in small.state_dict().values())


def test_the_normaliser_keeps_statistics_per_feature_from_active_users_only():
    model = set_model(5)
    obs = cell_observations(200, 5, seed=10)
    model.norm.update(obs)
    users, cell = split_observations(obs.double(), LAYOUT)
    rows = users[users[..., ACTIVE] > 0.5]  # [active users, F]
    assert 200 < len(rows) < 1000  # some slots inactive
    torch.testing.assert_close(model.norm.users.mean, rows.mean(0), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(model.norm.users.var, rows.var(0, unbiased=False), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.norm.cell.mean, cell.mean(0), atol=1e-6, rtol=1e-6)
    assert model.norm.users.mean.shape == (F,) and model.norm.cell.mean.shape == (C,)
    stats = {k: v.clone() for k, v in model.norm.state_dict().items()}
    model.norm.update(cell_observations(3, 5, seed=11, active_share=0.0)[:, F:])  # 4 slots, none active: the
    # users' statistics do not move
    assert torch.equal(model.norm.users.mean, stats["users.mean"])
    assert torch.equal(model.norm.users.count, stats["users.count"])


class TwoRanks:
    """Rank 0 of a two-rank world whose rank 1 holds ``theirs`` (``(samples, weights)``): ``gather_envs`` as
    ``World`` answers it (every rank's tensor, in rank order)."""

    size = 2

    def __init__(self, theirs):
        self.theirs = theirs

    def gather_envs(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        m, v, n = weighted_batch_moments(*self.theirs)
        return torch.cat([t, torch.cat([n.reshape(1), m.reshape(-1), v.reshape(-1)])[None]], dim)


def test_the_moments_of_active_users_merge_across_ranks_of_unequal_counts():
    g = torch.Generator().manual_seed(12)
    ours, theirs = torch.randn(50, 3, generator=g, dtype=torch.float64), torch.randn(40, 3, generator=g,
                                                                                   dtype=torch.float64) + 2
    w_ours, w_theirs = (torch.rand(50, generator=g) < 0.3).double(), (torch.rand(40, generator=g) < 0.9).double()
    mean, var, count = merged_moments(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
                                      torch.tensor(1e-4, dtype=torch.float64), ours, TwoRanks((theirs, w_theirs)),
                                      w_ours)
    rows = torch.cat([ours[w_ours > 0], theirs[w_theirs > 0]])
    torch.testing.assert_close(mean, rows.mean(0), atol=1e-5, rtol=0)  # (the initial 1e-4 count weighs in)
    torch.testing.assert_close(var, rows.var(0, unbiased=False), atol=1e-4, rtol=0)
    assert count.item() == pytest.approx(len(rows) + 1e-4)


def test_auto_picks_set_only_where_the_env_declares_active_user_feature(monkeypatch):
    masked = make_model(TrainConfig.from_dict({"env": "tests.factories:MaskedCell-v0"}))
    assert isinstance(masked, SetActorCritic) and masked.layout == PolicyLayout("set", 4, 2, 3)
    unmasked = make_model(TrainConfig.from_dict({"env": "tests.factories:MaskedCell-v0",
                                                 "env_kwargs": "masked=false"}))
    assert isinstance(unmasked, ActorCritic) and unmasked.layout == PolicyLayout("per_head", 4, 2)  # today's per_head
    vr = make_model(TrainConfig.from_dict({"env": "VREdge-v0"}))  # today's default, bit for bit
    assert isinstance(vr, ActorCritic) and vr.layout == PolicyLayout("per_head", 7, 5)
    default = ActorCritic(gym.make("VREdge-v0").observation_space, gym.make("VREdge-v0").action_space,
                          seed=1, layout=PolicyLayout("per_head", 7, 5))  # (the default seed)
    assert all(torch.equal(a, b) for a, b in zip(vr.state_dict().values(), default.state_dict().values()))
    explicit = make_model(TrainConfig.from_dict({"env": "VREdge-v0", "policy_arch": "set"}))
    assert isinstance(explicit, SetActorCritic) and explicit.layout == PolicyLayout("set", 7, 5)
    with raises(ConfigError, "policy_arch", "'set'", "CartPole-v1", "head_observation_layout", key="policy_arch"):
        make_model(TrainConfig.from_dict({"env": "CartPole-v1", "policy_arch": "set"}))
    with raises(ConfigError, "policy_arch", "PPO", key="policy_arch"):
        make_model(TrainConfig.from_dict({"env": "VREdge-v0", "policy_arch": "set", "algo": "apex"}))
    apex = make_model(TrainConfig.from_dict({"env": "tests.factories:MaskedCell-v0", "algo": "apex"}))
    assert apex.layout == PolicyLayout("per_head", 4, 2)  # Ape-X branches per head at the env's slots


def train(argv: list[str], **kw) -> dict:
    cli = parse_args(argv)
    return train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given, **kw)


SMALL = ["--env", "VREdge-v0", "--num-envs", "4", "--num-steps", "16", "--total-steps", str(4 * 16 * 4),
         "--checkpoint-every", "1", "--seed", "5", "--device", "cpu", "--backend", "sync", "--threads", "1",
         "--config", settings_file("policy_arch_set")]


def test_a_set_policy_trains_checkpoints_and_resumes_exactly_and_loads_at_any_slot_count(tmp_path):
    straight = train(SMALL + ["--run-dir", str(tmp_path / "straight")])
    first = train(SMALL + ["--run-dir", str(tmp_path / "split")], max_iterations=2)
    assert first["iterations"] == 2 and not first["finished"]
    assert train(["--resume", str(tmp_path / "split")])["iterations"] == straight["iterations"] == 4
    a, b = (checkpoints.latest_loadable(tmp_path / run)[1]["model"] for run in ("straight", "split"))
    assert a.keys() == b.keys() and "encoders.weights.0" in a
    assert all(torch.equal(a[k], b[k]) for k in a)
    model, cfg, _ = trained_model(tmp_path / "straight")
    assert isinstance(model, SetActorCritic) and cfg.policy_arch == "set"
    policy = trainer.load_policy(tmp_path / "straight")
    observation, _ = gym.make("VREdge-v0").reset(seed=0)
    assert policy(observation).shape == (8,)
    users, cell = observation[:-5].reshape(8, 7), observation[-5:]
    for slots in (1, 3, 16):
        more = np.concatenate([np.tile(users, (2, 1))[:slots].reshape(-1), cell])
        assert policy(more).shape == (slots,) and policy(np.stack([more] * 2)).shape == (2, slots)
    with raises(ValueError, "[60]", "7 * users + 5"):
        policy(observation[:-1])


def test_a_set_policy_trains_on_a_cell_whose_users_come_and_go(tmp_path):
    train(["--env", "tests.factories:MaskedCell-v0", "--num-envs", "4", "--num-steps", "16", "--total-steps",
           "128", "--device", "cpu", "--backend", "sync", "--threads", "1", "--run-dir", str(tmp_path)])
    model, cfg, _ = trained_model(tmp_path)
    assert isinstance(model, SetActorCritic) and cfg.policy_arch == "auto"
    env = MaskedCellEnv()
    obs, _ = env.reset(seed=1)
    action = model.act_deterministic(torch.from_numpy(obs)[None])[0].numpy()
    inactive = obs[:-2].reshape(5, 4)[:, 3] == 0
    assert not action[inactive].any()
    assert 0 < model.norm.users.count.item() < 4 * 16 * 2 * 5  # active users' rows, not every slot's


@pytest.mark.slow  # two spawned ranks: ~25 s
def test_two_ranks_learn_what_one_process_learns_on_a_cell_whose_users_come_and_go(tmp_path):
    """Each rank's share of the envs has its own number of active users: the normaliser's moments merge as
    counts, and the ranks learn what one process learns."""
    from tests.test_data_parallel import alone, ranks

    run = dict(env="tests.factories:MaskedCell-v0", num_envs=4, num_steps=16, total_steps=4 * 16 * 3, seed=3,
               device="cpu", compile="off", worker_timeout=30.0)
    straight = alone({**run, "run_dir": str(tmp_path / "one")})
    (_, w0), (_, w1) = ranks(2, {**run, "run_dir": str(tmp_path / "two")})
    assert torch.equal(w0, w1)
    assert (w0 - straight).abs().max().item() < 1e-5
    assert not torch.equal(straight, alone({**run, "run_dir": str(tmp_path / "other"), "seed": 4}))


@pytest.mark.parametrize("toml,encoders", [("policy_arch_set", 2), ("policy_arch_set_shared", 1)])
def test_separate_and_shared_encoders_both_train(tmp_path, toml, encoders):
    """``shared_trunk`` picks one encoder pass that the actor and the critic both read; either kind learns: every
    tensor of the model moves in one iteration."""
    train(["--env", "VREdge-v0", "--env-kwargs", "num_users=4,users=\"2-4\"", "--num-envs", "4", "--num-steps", "16",
           "--total-steps", "64", "--seed", "5", "--device", "cpu", "--backend", "sync", "--threads", "1",
           "--compile", "off", "--config", settings_file(toml), "--run-dir", str(tmp_path)])
    model, cfg, source = trained_model(tmp_path)
    assert cfg.algo_settings.shared_trunk is (encoders == 1)
    assert isinstance(model, SetActorCritic) and model.encoders.user_weight.shape[0] == encoders
    fresh = make_model(cfg).state_dict()
    trained = checkpoints.load(source)["model"]
    assert fresh.keys() == trained.keys()
    moved = [k for k, v in fresh.items() if v.is_floating_point() and "norm" not in k]
    assert moved and all(not torch.equal(fresh[k], trained[k]) for k in moved)


def test_a_set_run_of_a_version_before_the_shared_encoder_loads_with_separate_ones(tmp_path):
    """A set run written before ``shared_trunk`` reached set policies (``tests/data/landed/ppo-cells-set``) is
    rebuilt with its separate encoders, strictly, whether its config names ``shared_trunk`` or not."""
    from tests.test_landed_runs import landed

    run_dir = landed("ppo-cells-set", tmp_path)
    model, cfg, source = trained_model(run_dir)
    assert isinstance(model, SetActorCritic) and model.encoders.user_weight.shape[0] == 2
    stored = checkpoints.load(source)
    assert all(torch.equal(v, stored["model"][k]) for k, v in model.state_dict().items())
    without = {k: v for k, v in stored["config"].items() if k != "shared_trunk"}  # as a config before the setting
    assert make_model(TrainConfig.from_dict(without, stored=True)).encoders.user_weight.shape[0] == 2


@pytest.mark.slow  # (22 s; quick: test_export's per_head policy in such a process)
def test_a_shared_encoder_policy_exports_and_the_files_match_it_in_a_process_without_this_package(tmp_path):
    from tests.test_export import RELOAD, fresh_python
    from trainer.export import main as export_main
    from trainer.ppo import export as export_cli

    pytest.importorskip("onnxruntime", reason="needs the export extra")
    train(["--env", "VREdge-v0", "--env-kwargs", "num_users=3", "--num-envs", "4", "--num-steps", "16",
           "--total-steps", "64", "--seed", "3", "--device", "cpu", "--compile", "off",
           "--config", settings_file("policy_arch_set_shared"), "--run-dir", str(tmp_path / "run")])
    export_main(["--checkpoint", str(tmp_path / "run"), "--format", "both"])
    model, _, _ = trained_model(tmp_path / "run")
    assert model.encoders.user_weight.shape[0] == 1
    obs = export_cli.verification_observations(model, "VREdge-v0", seed=11, env_kwargs={"num_users": 3})
    users, cell = obs[:, :-5].reshape(len(obs), 3, 7), obs[:, -5:]
    for part in (obs, np.concatenate([users[:, [2, 0, 1, 0, 2]].reshape(len(obs), -1), cell], 1)):  # 3, 5 slots
        action, probs, value = export_cli.reference_outputs(model, part)
        np.savez(tmp_path / "expected.npz", obs=part, action=action, probs=probs, value=value)
        done = fresh_python(RELOAD, str(tmp_path / "run" / "export"), str(tmp_path / "expected.npz"), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        for name, r in json.loads(done.stdout).items():
            assert r["actions_equal"] and r["prob_diff"] <= export_cli.ATOL and r["value_diff"] <= 1e-4, (name, r)
