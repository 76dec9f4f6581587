import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.messages import raises
from trainer.common import noise
from trainer.ppo.model import ActorCritic

# 0.999 quantiles of the chi-square distribution (no scipy in the test environment)
CHI2_999 = {3: 16.27, 5: 20.52}


def splitmix_reference(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer, less its last xorshift, on NumPy uint64 (which wraps by definition)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        return (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)


def test_torch_int64_hash_equals_the_unsigned_reference():
    keys = torch.tensor([0, 1, 2**62 + 12345, 2**63 - 1, 987654321])
    steps = torch.tensor([0, 7, 3, 2**40, 1])
    bits = noise.hash_bits(keys, steps, (5, 3)).numpy().view(np.uint64)
    with np.errstate(over="ignore"):
        k, s = keys.numpy().astype(np.uint64)[:, None], steps.numpy().astype(np.uint64)[:, None]
        x = k + s * np.uint64(noise._G1 % 2**64) + np.arange(3, dtype=np.uint64) * np.uint64(noise._G2 % 2**64)
    np.testing.assert_array_equal(bits, splitmix_reference(x))


def test_the_rows_offsets_equal_the_unsigned_product_up_to_the_widest_row_and_wider_is_refused():
    # G2 is multiplied in 16-bit parts (Triton runs inductor's index arithmetic in int32): every carry must land
    width = noise._MOST_ELEMENTS - 1
    with np.errstate(over="ignore"):
        want = np.arange(width, dtype=np.uint64) * np.uint64(noise._G2 % 2**64)
    np.testing.assert_array_equal(noise._weyl_offsets(width, torch.device("cpu")).numpy().view(np.uint64), want)
    with raises(ValueError, str(noise._MOST_ELEMENTS - 1)):
        noise._weyl_offsets(noise._MOST_ELEMENTS, torch.device("cpu"))


@pytest.mark.parametrize("draw", [noise.uniform, noise.gumbel, noise.normal])
def test_a_row_depends_only_on_its_key_and_step(draw):
    keys, steps = torch.arange(10) * 1000 + 3, torch.arange(10) + 100
    full = draw(keys, steps, (10, 4, 6))
    for rows in (slice(0, 1), slice(3, 7), slice(9, 10)):
        assert torch.equal(draw(keys[rows], steps[rows], (rows.stop - rows.start, 4, 6)), full[rows])
    assert not torch.equal(draw(keys, steps + 1, (10, 4, 6)), full)  # the step counter matters
    assert not torch.equal(draw(keys + 1, steps, (10, 4, 6)), full)  # ... and so does the key


def test_uniforms_are_in_the_open_interval_and_look_uniform():
    u = noise.uniform(torch.arange(2000), torch.zeros(2000, dtype=torch.int64), (2000, 50))
    assert 0 < u.min() and u.max() < 1
    counts = torch.histc(u, bins=10, min=0, max=1)
    expected = u.numel() / 10
    assert float(((counts - expected) ** 2 / expected).sum()) < 27.88  # chi-square 0.999 quantile, 9 dof


def test_normal_noise_has_unit_moments_and_gaussian_tails():
    z = noise.normal(torch.arange(4000) * 7 + 1, torch.full((4000,), 3), (4000, 25)).double()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float((z.abs() > 1.96).double().mean()) - 0.05) < 0.003


def _chi_square(actions: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(actions, minlength=len(probs)).double()
    expected = probs.double() * len(actions)
    return float(((counts - expected) ** 2 / expected).sum())


def test_keyed_gumbel_max_samples_the_categorical_probabilities():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    logp = probs.log()
    n = 60_000
    # across envs at one step, and along one env's steps: both must follow the probabilities
    across = (logp + noise.gumbel(torch.arange(n) * 977 + 5, torch.zeros(n, dtype=torch.int64), (n, 6))).argmax(-1)
    along = (logp + noise.gumbel(torch.full((n,), 42), torch.arange(n), (n, 6))).argmax(-1)
    for actions in (across, along):
        assert _chi_square(actions, probs) < CHI2_999[5]
    # the test can fail: a distribution off by 2 percentage points is rejected
    assert _chi_square(across, torch.tensor([0.42, 0.23, 0.15, 0.1, 0.07, 0.03])) > CHI2_999[5]


def test_actor_critic_keyed_actions_depend_only_on_own_row():
    env = gym.make("CartPole-v1")
    ac = ActorCritic(env.observation_space, env.action_space, seed=0)
    obs = torch.randn(64, 4)
    keys, steps = torch.arange(64) + 10, torch.full((64,), 9)
    first = ac.act(obs, keys, steps)
    other = obs.clone()
    other[32:] = torch.randn(32, 4)  # change the other half's observations
    second = ac.act(other, keys, steps)
    assert torch.equal(first["action"][:32], second["action"][:32])
    assert torch.equal(ac.act(obs, keys, steps)["action"], first["action"])  # no hidden state
    unkeyed = [ac.act(obs)["action"] for _ in range(2)]
    assert not torch.equal(*unkeyed)  # the generator path draws fresh noise
    with raises(ValueError, "noise_keys", "steps"):  # the two that go together
        ac.act(obs, noise_keys=keys)


def test_actor_critic_keyed_box_actions():
    env = gym.make("Pendulum-v1")
    ac = ActorCritic(env.observation_space, env.action_space, seed=0)
    obs = torch.randn(4000, 3)
    keys, steps = torch.arange(4000), torch.zeros(4000, dtype=torch.int64)
    out = ac.act(obs, keys, steps)
    z = (out["action"] - ac.act_deterministic(obs)) / ac.log_std.exp()
    torch.testing.assert_close(z, noise.normal(keys, steps, (4000, 1)), atol=1e-5, rtol=0)
    assert torch.equal(ac.act(obs, keys, steps)["action"], out["action"])


def test_uniforms_stay_inside_the_open_interval_at_the_extreme_bits():
    bits = torch.tensor([-(2**63), -1, 0, 2**63 - 1])  # top bits 100..0, 111..1, 000..0, 011..1
    u = noise._open_unit(bits)
    assert u.tolist() == [2.0 ** -24, 0.5 - 2.0 ** -24, 0.5 + 2.0 ** -24, 1 - 2.0 ** -24]
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_noise_made_in_inference_mode_is_usable_outside_it():
    keys, steps = torch.arange(3), torch.zeros(3, dtype=torch.int64)
    with torch.inference_mode():
        inside = noise.gumbel(keys, steps, (3, 17))
    assert torch.equal(noise.gumbel(keys, steps, (3, 17)), inside)
