"""PPO's optimiser (``trainer.ppo.optimizer``): fused Adam where torch has the kernel, the CPU's steps as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.ppo.optimizer import adam_options, fused_adam, set_learning_rate


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0), "cpu"])
def test_parameters_on_cuda_or_the_cpu_get_the_fused_kernel(device):
    assert adam_options(device)["fused"] is True
    assert adam_options(device, capturable=True)["capturable"] is True


def test_a_device_without_a_fused_kernel_gets_torchs_default_implementation():
    assert "fused" not in adam_options("meta")


def test_the_cpu_steps_are_those_of_fused_adam_with_a_double_learning_rate_bit_for_bit():
    """What every CPU run did before adam_options: the same floats, step after step, annealed."""
    torch.manual_seed(0)
    start = torch.randn(257, dtype=torch.float32)
    ours, theirs = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    optimizer = fused_adam(ours, 3e-4)
    reference = torch.optim.Adam([theirs], lr=torch.tensor(3e-4, dtype=torch.float64), eps=1e-5, fused=True)
    for step in range(5):
        grad = torch.randn(257)
        lr = 3e-4 * (1 - step / 5)
        set_learning_rate(optimizer, lr)
        reference.param_groups[0]["lr"].fill_(lr)
        for p, opt in ((ours, optimizer), (theirs, reference)):
            p.grad = grad.clone()
            opt.step()
        assert torch.equal(ours, theirs)
    assert optimizer.param_groups[0]["fused"] is True and not optimizer.param_groups[0]["capturable"]
