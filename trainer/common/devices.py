"""The learner's device, from ``--device``."""

from __future__ import annotations

import functools

import torch

from collectors.base import one_line
from envs.settings import ConfigError


def learner_device(name: str, gpus: int) -> str:
    """``auto`` -> ``cuda`` where there is a GPU, else ``cpu``; an explicit CUDA device needs a GPU.

    >>> learner_device("auto", gpus=0), learner_device("auto", gpus=2), learner_device("cpu", gpus=2)
    ('cpu', 'cuda', 'cpu')
    """
    if name == "auto":
        return "cuda" if gpus else "cpu"
    if name.startswith("cuda") and not gpus:
        raise ConfigError("device", name, "CUDA is not available here; use --device cpu or auto",
                          message=f"--device {name} requested but CUDA is not available here; use --device cpu or auto")
    return name


def resolve_device(name: str) -> torch.device:
    """The learner's device for ``--device`` on this machine (``auto``: CUDA where there is one)."""
    return torch.device(learner_device(name, torch.cuda.device_count()))


def _add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@functools.cache
def compile_unavailable(device: str) -> str | None:
    """Why ``torch.compile`` cannot build code for ``device`` on this machine, in one line; ``None`` when it can.

    A probe compiles one addition: inductor needs a C++ compiler and Python's headers for the
    CPU and Triton for CUDA, and only a real build says whether they are there and work.
    """
    try:
        torch.compile(_add_one, fullgraph=True, dynamic=False)(torch.zeros(2, device=device))
    except Exception as e:  # noqa: BLE001 (any failure means: act eagerly, or refuse --compile on)
        return one_line(e)
    return None
