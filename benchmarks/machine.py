"""What a benchmark ran on, and robust summaries of repeated timings."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import gymnasium
import numpy as np
import torch

from collectors.resources import cpu_model


def machine_info() -> dict[str, str]:
    """Python, NumPy, Gymnasium, torch, CPU and CUDA versions of this machine."""
    cpu = cpu_model()
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gymnasium": gymnasium.__version__,
        "torch": torch.__version__,
        "cpu": f"{cpu} ({os.cpu_count()} logical cores)",
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


def print_machine() -> None:
    for k, v in machine_info().items():
        print(f"{k:>10}: {v}")


def timed(fn: Callable[[], int]) -> float:
    """Run ``fn`` (which returns a transition count) once; return transitions per second."""
    start = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - start)


def summary(rates: list[float]) -> str:
    """Median and spread (min-max) of repeated rates."""
    return f"{statistics.median(rates):>12,.0f}  [{min(rates):,.0f} - {max(rates):,.0f}]"


def side_by_side(rates: dict[str, list[float]], labels: dict[str, str], ratio: tuple[str, str]) -> list[str]:
    """Lines for rounds of two ways of running measured alternately: each way's median [min - max] of ``rates``
    (by key, named by ``labels``), then the ratio ``ratio[0] / ratio[1]`` of the medians and per round."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    top, bottom = ratio
    width = max(len(label) for label in labels.values())
    return [*(f"{labels[k]:<{width}}: median {med[k]:,.0f} [{min(v):,.0f} - {max(v):,.0f}]" for k, v in rates.items()),
            f"{top} / {bottom}: {med[top] / med[bottom]:.3f} (per round: "
            f"{', '.join(f'{a / b:.3f}' for a, b in zip(rates[top], rates[bottom]))})"]
