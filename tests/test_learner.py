"""The learner's parts on purpose-built tiny batches with answers computed by hand."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.messages import raises
from trainer.common.moments import merged_moments
from trainer.ppo.model import ActorCritic, RunningNorm
from trainer.ppo.reward_scaling import ReturnScaler
from trainer.ppo.targets import advantages_and_returns, vtrace, vtrace_targets
from trainer.ppo.update import (
    LearnerSamples,
    MinibatchStep,
    PPOLoss,
    UpdateSettings,
    epoch_order,
    ppo_loss,
    ppo_update,
)


def settings(**kw) -> UpdateSettings:
    base = dict(epochs=1, minibatch_size=4, clip_coef=0.2, clip_value=False, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, norm_adv=False, target_kl=None)
    return UpdateSettings(**{**base, **kw})


class FixedOutputs:
    """``evaluate`` returns given log-probs, entropies and values, whatever the observations."""

    def __init__(self, logp, entropy, value):
        self.out = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (logp, entropy, value)]

    def evaluate(self, obs, actions):
        return tuple(self.out)


def samples(n, old_log_probs=None, old_values=None, advantages=None, returns=None) -> LearnerSamples:
    zeros = torch.zeros(n)
    return LearnerSamples(torch.zeros(n, 1), torch.zeros(n, dtype=torch.int64),
                          *(torch.tensor(x, dtype=torch.float32) if x is not None else zeros
                            for x in (old_log_probs, old_values, advantages, returns)))


def test_ppo_loss_clips_the_ratio_on_the_side_the_advantage_favours():
    # ratios 1.5 (advantage +1) and 0.5 (advantage -1), clip 0.2: both are clipped, to 1.2 and 0.8
    model = FixedOutputs([math.log(1.5), math.log(0.5)], [0.3, 0.1], [0.0, 0.0])
    out = ppo_loss(model, samples(2, advantages=[1.0, -1.0]), settings(ent_coef=0.1))
    assert out.policy_loss.item() == pytest.approx(-(1.2 - 0.8) / 2)
    assert torch.allclose(out.log_ratio, torch.tensor([math.log(1.5), math.log(0.5)]))
    assert out.entropy.item() == pytest.approx(0.2)
    assert out.loss.item() == pytest.approx(-0.2 - 0.1 * 0.2 + 0.5 * out.value_loss.item())
    # inside the clip range nothing is clipped: ratio 1.1 with advantage +1 counts in full
    inside = FixedOutputs([math.log(1.1)], [0.0], [0.0])
    assert ppo_loss(inside, samples(1, advantages=[1.0]), settings()).policy_loss.item() == pytest.approx(-1.1)


def test_value_clipping_takes_the_worse_of_the_clipped_and_unclipped_errors():
    # old values 0, new values 1.0 and 0.1, returns 2: clipped to 0.2 and 0.1
    model = FixedOutputs([0.0, 0.0], [0.0, 0.0], [1.0, 0.1])
    batch = samples(2, old_values=[0.0, 0.0], returns=[2.0, 2.0])
    clipped = ppo_loss(model, batch, settings(clip_value=True)).value_loss.item()
    plain = ppo_loss(model, batch, settings(clip_value=False)).value_loss.item()
    assert clipped == pytest.approx(0.5 * (max(1.0, 1.8**2) + max(1.9**2, 1.9**2)) / 2)
    assert plain == pytest.approx(0.5 * (1.0**2 + 1.9**2) / 2)


class RecordingStep:
    """A minibatch step that records which samples (by observation id) and advantages each minibatch holds."""

    def __init__(self, **kw):
        self.settings, self.seen = settings(**kw), []

    def __call__(self, mb):
        self.seen.append((mb.observations[:, 0].long(), mb.advantages.clone()))
        zero = torch.zeros(())
        return PPOLoss(zero, torch.zeros(len(mb.advantages)), zero, zero, zero)


def rollout_samples(num_steps, num_envs, advantages):
    """``[T, N]`` samples whose observation is the sample's index ``t * N + n``."""
    zeros = torch.zeros(num_steps, num_envs)
    ids = torch.arange(num_steps * num_envs, dtype=torch.float32).view(num_steps, num_envs, 1)
    return LearnerSamples(ids, zeros.long(), zeros, zeros, advantages, zeros)


def test_advantages_are_normalised_over_each_minibatch_of_whole_slots():
    adv = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)) * 3 + 2
    step = RecordingStep(epochs=2, minibatch_size=8, norm_adv=True)
    ppo_update(step, rollout_samples(8, 4, adv), torch.Generator().manual_seed(1))
    assert len(step.seen) == 2 * 4
    for epoch in (step.seen[:4], step.seen[4:]):  # every sample once per epoch
        assert sorted(torch.cat([ids for ids, _ in epoch]).tolist()) == list(range(32))
    for ids, got in step.seen:
        raw = adv.flatten()[ids]
        assert torch.allclose(got, (raw - raw.mean()) / (raw.std() + 1e-8), atol=1e-6)
        assert sorted((ids % 4).tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]  # two steps of each env
    plain = RecordingStep(minibatch_size=8, norm_adv=False)
    ppo_update(plain, rollout_samples(8, 4, adv), torch.Generator().manual_seed(1))
    assert all(torch.equal(got, adv.flatten()[ids]) for ids, got in plain.seen)


def test_the_shuffle_of_a_share_of_the_envs_is_that_share_of_the_whole_shuffle():
    """What a rank of a data-parallel run takes (envs 4-7 of 8) is exactly its envs' part of each minibatch one
    process takes: the same samples, in the same minibatches."""
    whole, share = epoch_order(torch.Generator().manual_seed(3), 6, 8, slice(0, 8), torch.device("cpu"))
    mine, everyone = epoch_order(torch.Generator().manual_seed(3), 6, 8, slice(4, 8), torch.device("cpu"))
    assert torch.equal(whole, share) and torch.equal(everyone, share)
    minibatch = 16  # two slots of 8 envs; the rank's share: two slots of its 4
    for k in range(3):
        theirs = [int(i) for i in everyone[k * minibatch:(k + 1) * minibatch] if i % 8 >= 4]
        ours = [int(i) // 4 * 8 + int(i) % 4 + 4 for i in mine[k * 8:(k + 1) * 8]]  # [T, 4] index -> [T, 8]
        assert ours == theirs


def cartpole_learner(seed=0):
    env = gym.make("CartPole-v1")
    model = ActorCritic(env.observation_space, env.action_space, normalize_obs=False, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    obs = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = model.act(obs)
    return model, optimizer, obs, out


def learner_samples(obs, out, shift=None):
    """Samples whose stored log-probs are the model's own, minus ``shift`` (so log-ratio = shift)."""
    shift = torch.zeros(len(obs)) if shift is None else shift
    adv = torch.linspace(-1, 1, len(obs))
    return LearnerSamples(obs, out["action"], out["log_prob"] - shift, out["value"], adv, out["value"] + adv)


def test_kl_and_clip_fraction_of_one_minibatch_are_those_before_its_step():
    model, optimizer, obs, out = cartpole_learner()
    stats = ppo_update(MinibatchStep(model, optimizer, settings(minibatch_size=16)), learner_samples(obs, out),
                       torch.Generator().manual_seed(0))
    assert stats["approx_kl"] == 0.0 and stats["clip_fraction"] == 0.0  # ratio 1 exactly, before the step
    shift = torch.tensor([0.5, -0.5, 0.1, -0.1] * 4)  # log-ratios: two of four outside the 0.2 clip range
    model, optimizer, obs, out = cartpole_learner()
    stats = ppo_update(MinibatchStep(model, optimizer, settings(minibatch_size=16)), learner_samples(obs, out, shift),
                       torch.Generator().manual_seed(0))
    expected_kl = float(((shift.exp() - 1) - shift).mean())
    assert stats["approx_kl"] == pytest.approx(expected_kl, rel=1e-5) and stats["clip_fraction"] == 0.5


def test_target_kl_stops_the_epochs_after_the_first_that_exceeds_it():
    shift = torch.full((16,), 0.3)  # KL of the first epoch: e^0.3 - 1 - 0.3 = 0.0499
    for target, epochs_run in ((0.01, 1), (None, 4), (10.0, 4)):
        model, optimizer, obs, out = cartpole_learner()
        step = MinibatchStep(model, optimizer, settings(epochs=4, minibatch_size=8, target_kl=target))
        stats = ppo_update(step, learner_samples(obs, out, shift), torch.Generator().manual_seed(0))
        assert stats["epochs"] == epochs_run, target


def test_a_remainder_smaller_than_a_minibatch_is_left_for_the_next_epoch(monkeypatch):
    model, optimizer, obs, out = cartpole_learner()
    steps = []
    real = optimizer.step
    monkeypatch.setattr(optimizer, "step", lambda: (steps.append(1), real())[1])
    ppo_update(MinibatchStep(model, optimizer, settings(epochs=3, minibatch_size=4)),
               learner_samples(obs[:10], {k: v[:10] for k, v in out.items()}), torch.Generator().manual_seed(0))
    assert len(steps) == 3 * 2  # 10 samples: two minibatches of 4 per epoch


def test_fewer_samples_than_a_minibatch_are_refused_not_reported_as_a_non_finite_loss():
    model, optimizer, obs, out = cartpole_learner()
    before = [p.clone() for p in model.parameters()]
    with raises(ValueError, "ppo_update", "10", "16"):  # the samples, and the minibatch
        ppo_update(MinibatchStep(model, optimizer, settings(minibatch_size=16)),
                   learner_samples(obs[:10], {k: v[:10] for k, v in out.items()}), torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_ppo_update_refuses_a_non_finite_loss_and_names_it():
    from trainer.algorithm import NonFiniteLossError
    model, optimizer, obs, out = cartpole_learner()
    bad = learner_samples(obs, out)._replace(returns=torch.full((16,), float("nan")))
    with raises(NonFiniteLossError, "value_loss", "nan"):  # the term that is not finite
        ppo_update(MinibatchStep(model, optimizer, settings(minibatch_size=16)), bad, torch.Generator().manual_seed(0))


def moments_of(chunks, prior=(0.0, 1.0, 1e-4)):
    """Mean and variance of the union, by the textbook pooled formula (not the delta update under test)."""
    stats = [prior] + [(float(np.mean(c)), float(np.var(c)), len(c)) for c in chunks]
    total = sum(n for _, _, n in stats)
    mean = sum(m * n for m, _, n in stats) / total
    var = sum(n * (v + (m - mean) ** 2) for m, v, n in stats) / total
    return mean, var, total


def test_running_moments_equal_the_pooled_moments_of_all_chunks():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3, 2, size=n) for n in (5, 1, 40)]
    m, v, c = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64), torch.tensor(1e-4)
    for chunk in chunks:
        m, v, c = merged_moments(m, v, c.double(), torch.from_numpy(chunk))
    mean, var, total = moments_of(chunks)
    assert (m.item(), v.item(), c.item()) == pytest.approx((mean, var, total), rel=1e-12)


def test_running_norm_update_tracks_each_feature_and_normalises_with_it():
    norm = RunningNorm((2,))
    data = torch.tensor([[1.0, 10.0], [3.0, 30.0], [5.0, 50.0], [7.0, 70.0]])
    norm.update(data[:1])
    norm.update(data[1:].reshape(1, 3, 2))  # any leading shape: [T, N, obs] rollouts
    for j in range(2):
        mean, var, _ = moments_of([data[:1, j].numpy(), data[1:, j].numpy()])
        assert norm.mean[j].item() == pytest.approx(mean, rel=1e-9) and norm.var[j].item() == pytest.approx(var)
    expected = ((data - norm.mean.float()) / torch.sqrt(norm.var.float() + 1e-8)).clamp(-10, 10)
    assert torch.allclose(norm(data), expected, atol=1e-6)
    copy = RunningNorm((2,))
    copy.load_state_dict(norm.state_dict())  # the acting copy derives its shift and scale on load
    assert torch.equal(copy(data), norm(data))


def test_return_scaler_accumulates_discounted_returns_per_env_and_resets_at_episode_ends():
    scaler = ReturnScaler(num_envs=2, gamma=0.5, device=torch.device("cpu"))
    rewards = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    done = torch.tensor([[False, False], [True, False], [False, False]])
    factor = scaler.scale(rewards, done)
    # env 0: 1, 1.5 (ends), 1; env 1: 2, 3, 3.5 (runs on)
    _, var, _ = moments_of([np.array([1.0, 2.0, 1.5, 3.0, 1.0, 3.5])])
    assert factor.item() == pytest.approx(1 / math.sqrt(var + 1e-8), rel=1e-6)
    assert scaler.ret.tolist() == [1.0, 3.5]
    scaler.scale(torch.tensor([[4.0]]), torch.tensor([[False]]), rows=slice(1, 2))  # one env's slice
    assert scaler.ret.tolist() == [1.0, 3.5 * 0.5 + 4.0]
    restored = ReturnScaler(2, 0.5, torch.device("cpu"))
    restored.load_state_dict(scaler.state_dict())
    assert torch.equal(restored.ret, scaler.ret) and torch.equal(restored.moments, scaler.moments)


class FirstFeatureValue:
    """A critic whose value is the observation's first feature: bootstraps can be read off the batch."""

    def value(self, obs):
        return obs[:, 0]


def rollout_batch(t, n, **fields):
    batch = {"observations": torch.zeros(t, n, 1), "actions": torch.zeros(t, n, dtype=torch.int64),
             "rewards": torch.ones(t, n), "terminated": torch.zeros(t, n, dtype=torch.bool),
             "truncated": torch.zeros(t, n, dtype=torch.bool), "final_observations": torch.zeros(t, n, 1),
             "final_observation_mask": torch.zeros(t, n, dtype=torch.bool), "values": torch.zeros(t, n),
             "log_probs": torch.zeros(t, n)}
    batch.update(fields)
    return TensorDict(batch, batch_size=[t, n])


def test_truncation_bootstraps_from_the_final_observation_and_termination_from_nothing():
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    final = torch.zeros(3, 2, 1)
    final[1, 0, 0] = 7.0  # env 0 is cut off by a time limit at step 1, in a state worth 7
    batch = rollout_batch(3, 2, truncated=truncated, terminated=terminated, final_observations=final,
                          final_observation_mask=truncated | terminated)
    last_obs = torch.tensor([[5.0], [11.0]])  # values after the rollout: 5 and 11
    adv, ret = advantages_and_returns(FirstFeatureValue(), batch, last_obs, gamma=0.5, lam=1.0)
    # env 0: steps 0-1 are one episode ending in a truncation worth 7, step 2 a new one bootstrapping 5
    assert ret[:, 0].tolist() == [1 + 0.5 * (1 + 0.5 * 7), 1 + 0.5 * 7, 1 + 0.5 * 5]
    # env 1: terminated at step 1 (nothing follows), then a new episode bootstrapping 11
    assert ret[:, 1].tolist() == [1 + 0.5 * 1, 1.0, 1 + 0.5 * 11]
    assert torch.equal(adv, ret)  # stored values are 0


def test_vtrace_targets_rewrite_the_batch_with_the_current_policy_and_correct_for_the_behaviour():
    model, _, obs, out = cartpole_learner(seed=3)
    t, n = 4, 4
    behaviour = out["log_prob"].reshape(t, n) - 0.3  # an older policy: every ratio is e^0.3, clipped to 1
    batch = rollout_batch(t, n, observations=obs.reshape(t, n, 4), actions=out["action"].reshape(t, n),
                          log_probs=behaviour.clone(), values=torch.full((t, n), 9.0))
    batch = batch.consolidate()  # as the collector hands it over: locked, written in place
    last_obs = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
    adv, vs = vtrace_targets(model, batch, last_obs, gamma=0.9, rho_bar=1.0, c_bar=1.0)
    with torch.no_grad():
        logp, _, values = model.evaluate(obs, out["action"])
        bootstrap = model.value(last_obs)
    assert torch.allclose(batch["log_probs"], logp.reshape(t, n)) and torch.allclose(batch["values"],
                                                                                     values.reshape(t, n))
    nxt = torch.cat([values.reshape(t, n)[1:], bootstrap[None]])
    want_vs, want_adv = vtrace(behaviour, logp.reshape(t, n), torch.ones(t, n), values.reshape(t, n), nxt,
                               torch.zeros(t, n, dtype=torch.bool), 0.9)
    assert torch.allclose(vs, want_vs) and torch.allclose(adv, want_adv)
    # ratios clipped to 1 and no episode end: V-trace is the n-step return to the end of the rollout
    n_step = sum(0.9**k for k in range(t)) + 0.9**t * bootstrap
    assert torch.allclose(vs[0], n_step, atol=1e-5)
