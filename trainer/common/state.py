"""A run's state as a checkpoint holds it: the process's random generators, and copies on the CPU."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators and of every CUDA device's.

    Example:
        >>> state = capture_rng()
        >>> a = torch.rand(2)
        >>> restore_rng(state)
        >>> torch.equal(a, torch.rand(2))
        True
    """
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(rng: dict[str, Any]) -> None:
    """Set the generators to a state from :func:`capture_rng` (CUDA's only where the device count matches:
    a run resumed on another machine draws new CUDA streams)."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def cpu_copy(x: Any) -> Any:
    """A deep copy with nothing tied to a device or shared with the original: tensors to fresh CPU tensors,
    arrays copied, dicts, lists and tuples rebuilt (a ``state_dict`` comes back as a plain dict).

    >>> weights = {"w": torch.ones(2)}
    >>> copy = cpu_copy(weights)
    >>> _ = weights["w"].add_(1)
    >>> copy["w"].tolist()
    [1.0, 1.0]
    """
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: cpu_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(cpu_copy(v) for v in x)
    return x
