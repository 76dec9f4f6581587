"""The learner's device, from ``--device``."""

from __future__ import annotations

import torch


def learner_device(name: str, gpus: int) -> str:
    """``auto`` -> ``cuda`` where there is a GPU, else ``cpu``; an explicit CUDA device needs a GPU.

    >>> learner_device("auto", gpus=0), learner_device("auto", gpus=2), learner_device("cpu", gpus=2)
    ('cpu', 'cuda', 'cpu')
    """
    if name == "auto":
        return "cuda" if gpus else "cpu"
    if name.startswith("cuda") and not gpus:
        raise ValueError("--device cuda requested but CUDA is not available; use --device cpu or auto")
    return name


def resolve_device(name: str) -> torch.device:
    """The learner's device for ``--device`` on this machine (``auto``: CUDA where there is one)."""
    return torch.device(learner_device(name, torch.cuda.device_count()))
