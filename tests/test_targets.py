"""PPO's backward recursions (``trainer.ppo.targets``): the scan a CUDA learner runs gives the loop's sums, and the
CPU keeps the loop's numbers bit for bit."""

import pytest
import torch

from trainer.ppo.targets import compute_gae, discounted_sums_by_loop, discounted_sums_by_scan, vtrace

GAMMA, LAM = 0.99, 0.95


def rollout(steps: int, envs: int, seed: int, end_rate: float = 0.05) -> dict[str, torch.Tensor]:
    """Random ``[T, N]`` float32 targets' inputs, with episode ends at ``end_rate``."""
    g = torch.Generator().manual_seed(seed)
    return {"rewards": torch.randn(steps, envs, generator=g), "values": torch.randn(steps, envs, generator=g),
            "next_vals": torch.randn(steps, envs, generator=g),
            "done": torch.rand(steps, envs, generator=g) < end_rate,
            "log_probs": -torch.rand(steps, envs, generator=g),
            "target_log_probs": -torch.rand(steps, envs, generator=g)}


def deltas_and_carry(r: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE's recursion's terms, as :func:`compute_gae` forms them."""
    return r["rewards"] + GAMMA * r["next_vals"] - r["values"], (GAMMA * LAM) * (~r["done"]).to(torch.float32)


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 64, 128, 129, 256])
def test_the_scan_gives_the_loops_sums_on_random_rollouts_with_episode_ends(steps):
    for seed in range(3):
        deltas, carry = deltas_and_carry(rollout(steps, 64, seed))
        by_loop, by_scan = discounted_sums_by_loop(deltas, carry), discounted_sums_by_scan(deltas, carry)
        assert by_scan.dtype == by_loop.dtype == torch.float32 and by_scan.shape == by_loop.shape
        torch.testing.assert_close(by_scan, by_loop, rtol=1e-5, atol=1e-5)


def test_the_scan_follows_long_episodes_too():
    """No episode ends: every step's sum reaches the end of the rollout (the longest compositions of the scan)."""
    deltas, carry = deltas_and_carry(rollout(512, 16, 7, end_rate=0.0))
    assert bool(carry.all())
    torch.testing.assert_close(discounted_sums_by_scan(deltas, carry), discounted_sums_by_loop(deltas, carry),
                               rtol=1e-5, atol=1e-5)


def test_nothing_after_an_episodes_end_reaches_the_steps_before_it_in_the_scan():
    r = rollout(100, 32, 3, end_rate=0.1)
    deltas, carry = deltas_and_carry(r)
    sums = discounted_sums_by_scan(deltas, carry)
    assert torch.equal(sums[r["done"]], deltas[r["done"]])  # an episode's last step: its own term, exactly
    # each env's steps up to (and with) its first end do not change, bit for bit, whatever comes after it
    first_end = torch.where(r["done"].any(0), r["done"].int().argmax(0), torch.full((32,), 99))
    after = torch.arange(100)[:, None] > first_end[None]
    assert bool(after.any())
    changed = discounted_sums_by_scan(torch.where(after, deltas * 1e3 + 7.0, deltas), carry)
    assert torch.equal(changed[~after], sums[~after])
    assert not torch.equal(changed[after], sums[after])


def test_gae_and_vtrace_on_the_cpu_keep_the_loops_numbers_bit_for_bit():
    """The loop as it was written before the scan: CPU runs and the results stored from them do not change."""
    r = rollout(128, 16, 11)
    deltas, carry = deltas_and_carry(r)
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(127, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    got, returns = compute_gae(r["rewards"], r["values"], r["next_vals"], r["done"], GAMMA, LAM)
    assert torch.equal(got, advantages) and torch.equal(returns, advantages + r["values"])
    assert not torch.equal(discounted_sums_by_scan(deltas, carry), advantages)  # (the scan rounds otherwise)

    rho = torch.exp(r["target_log_probs"] - r["log_probs"])
    cs, clipped = LAM * rho.clamp(max=1.0) * (~r["done"]).float(), rho.clamp(max=1.0)
    vtrace_deltas = clipped * (r["rewards"] + GAMMA * r["next_vals"] - r["values"])
    correction, running = torch.zeros_like(deltas), torch.zeros_like(deltas[0])
    for t in range(127, -1, -1):
        running = vtrace_deltas[t] + GAMMA * cs[t] * running
        correction[t] = running
    vs, _ = vtrace(r["log_probs"], r["target_log_probs"], r["rewards"], r["values"], r["next_vals"], r["done"],
                   GAMMA, lam=LAM)
    assert torch.equal(vs, r["values"] + correction)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gae_on_cuda_runs_the_scan_and_gives_the_cpus_numbers():
    r = rollout(128, 4096, 5)
    on_cpu = compute_gae(r["rewards"], r["values"], r["next_vals"], r["done"], GAMMA, LAM)
    cuda = {k: v.cuda() for k, v in r.items()}
    on_cuda = compute_gae(cuda["rewards"], cuda["values"], cuda["next_vals"], cuda["done"], GAMMA, LAM)
    for got, want in zip(on_cuda, on_cpu):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    deltas, carry = deltas_and_carry(cuda)
    assert torch.equal(on_cuda[0], discounted_sums_by_scan(deltas, carry))  # the scan, not the loop
