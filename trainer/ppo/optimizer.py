"""PPO's optimiser: fused Adam over one flat parameter, its learning rate a tensor that annealing writes in place."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# devices where torch's Adam has one fused kernel per step (and where it was measured: the CPU by default since the
# flat parameter, CUDA in every GPU run); elsewhere torch's own default implementation
FUSED_DEVICES = ("cpu", "cuda")


def adam_options(device: torch.device | str, capturable: bool = False) -> dict[str, Any]:
    """The keyword arguments of PPO's ``torch.optim.Adam`` for parameters on ``device`` (the learning rate apart):
    fused (one kernel per step) on the CPU and on CUDA; ``capturable`` for a step captured as a CUDA graph.

    Example:
        >>> adam_options("cuda", capturable=True)
        {'eps': 1e-05, 'fused': True, 'capturable': True}
        >>> adam_options("meta")
        {'eps': 1e-05, 'capturable': False}
    """
    fused = {"fused": True} if torch.device(device).type in FUSED_DEVICES else {}
    return {"eps": 1e-5, **fused, "capturable": capturable}


def fused_adam(param: nn.Parameter, lr: float, capturable: bool = False) -> torch.optim.Adam:
    """Fused Adam (:func:`adam_options`) over ``param`` (one flat tensor: ``trainer.common.flat_params``), a single
    kernel per step, with the learning rate held as a tensor on ``param``'s device.

    Why a tensor: annealing then writes it in place (:func:`set_learning_rate`), so a step captured
    as a CUDA graph (``capturable=True``) reads each new value, and nothing that was compiled sees
    a new constant. Its dtype is what the fused kernel reads: a double on the CPU (the same bits as
    a Python float, so eager CPU runs are unchanged), a float on CUDA.

    Example:
        >>> p = nn.Parameter(torch.zeros(3))
        >>> opt = fused_adam(p, 1e-3)
        >>> set_learning_rate(opt, 5e-4)
        >>> opt.param_groups[0]["lr"]
        tensor(0.0005, dtype=torch.float64)
    """
    dtype = torch.float64 if param.device.type == "cpu" else torch.float32
    lr_tensor = torch.tensor(lr, dtype=dtype, device=param.device)
    return torch.optim.Adam([param], lr=lr_tensor, **adam_options(param.device, capturable))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into the optimiser's learning-rate tensor, in place (no host-to-device copy, no recompile)."""
    optimizer.param_groups[0]["lr"].fill_(lr)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping this optimiser's own learning-rate tensor and ``capturable``.

    A checkpoint's groups are those of the device it was saved on (its learning rate a CPU tensor
    or, from older versions, a float; ``capturable`` as that run had it), and ``load_state_dict``
    would put them in place of this run's: the value is taken, the tensor and the flag stay.
    """
    group = optimizer.param_groups[0]
    lr, capturable = group["lr"], group["capturable"]
    optimizer.load_state_dict(state)
    saved = optimizer.param_groups[0]
    lr.fill_(float(saved["lr"]))
    saved.update(lr=lr, capturable=capturable)
