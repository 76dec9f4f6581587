"""The learner's device, from ``--device``."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

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
        why = no_gpu_reason(torch.__version__, torch.version.cuda)
        raise ConfigError("device", name, f"CUDA is not available here: {why}; use --device cpu or auto",
                          message=f"--device {name} requested but CUDA is not available here: {why}; use --device "
                                  "cpu or auto")
    return name


def no_gpu_reason(version: str, cuda: str | None) -> str:
    """Why torch ``version`` (built for CUDA ``cuda``, ``None`` for a CPU build) sees no GPU, in words: a CPU build
    sees none even where ``nvidia-smi`` shows one, and then the fix is another torch, not another machine.

    >>> no_gpu_reason("2.13.0+cpu", None)
    'torch 2.13.0+cpu is a CPU build, which sees no GPU even where nvidia-smi shows one (install a CUDA build of torch: docs/device.md#a-cuda-build-of-torch)'
    >>> no_gpu_reason("2.13.0+cu128", "12.8")
    'torch 2.13.0+cu128 (CUDA 12.8) finds no GPU (nvidia-smi says whether this machine has one, and its driver)'
    """  # noqa: E501
    if cuda is None:
        return (f"torch {version} is a CPU build, which sees no GPU even where nvidia-smi shows one (install a CUDA "
                "build of torch: docs/device.md#a-cuda-build-of-torch)")
    return f"torch {version} (CUDA {cuda}) finds no GPU (nvidia-smi says whether this machine has one, and its driver)"


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
    remove_broken_builds()
    try:
        torch.compile(_add_one, fullgraph=True, dynamic=False)(torch.zeros(2, device=device))
    except Exception as e:  # noqa: BLE001 (any failure means: act eagerly, or refuse --compile on)
        return one_line(e)
    return None


def _whole_elf(path: Path) -> bool:
    """Whether the shared object at ``path`` is whole: an ELF file as long as its header says (the linker writes the
    section headers last, so a build cut short is shorter than that)."""
    try:
        with path.open("rb") as f:
            header = f.read(64)
            size = f.seek(0, 2)
    except OSError:
        return True  # gone, or not ours to judge
    if len(header) < 64 or header[:4] != b"\x7fELF":
        return False  # empty, cut short, or not what a linker writes
    if header[4] != 2:
        return True  # not a 64-bit ELF file, which is all inductor builds: left as it is
    end = "<" if header[5] == 1 else ">"
    (section_headers,) = struct.unpack_from(end + "Q", header, 40)  # e_shoff: where the section headers start
    entry_size, entries = struct.unpack_from(end + "HH", header, 58)  # e_shentsize, e_shnum
    return size >= section_headers + entry_size * entries


def remove_broken_builds() -> list[Path]:
    """Delete the kernels in inductor's on-disk cache that a build stopped midway left empty or cut short (a run
    killed while it compiled): inductor takes any file there as built, and every later compile of that kernel
    would fail to load it ("file too short"). A kernel being built now (its lock held) is left alone; the paths
    removed are returned."""
    try:
        from filelock import FileLock, Timeout
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # another torch: nothing known to clean
        return []
    root, removed = Path(cache_dir()), []
    for built in root.glob("*/*.so"):
        if _whole_elf(built):
            continue
        key = built.name.split(".")[0]  # inductor builds <key>[.main].so under locks/<key>.lock
        try:
            with FileLock(root / "locks" / f"{key}.lock", timeout=0):
                if not _whole_elf(built):
                    built.unlink(missing_ok=True)
                    removed.append(built)
        except Timeout:
            continue  # being built by another process
    return removed
