"""One checkpoint file: atomic write, ``weights_only`` load, format version check."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# 2: the optimiser state is that of one flat parameter tensor (trainer/flat_params.py); the
# model's layout of separate actor/critic trunks changed to one StackedMLP
FORMAT_VERSION = 2
_NDARRAY = "__ndarray__"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, corrupted or of another format version."""


def _encode(x: Any) -> Any:
    """NumPy values become tensors of raw bytes (exact for every dtype), so ``weights_only`` loads them."""
    if isinstance(x, np.ndarray):
        raw = torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.uint8).copy())
        return {_NDARRAY: raw, "dtype": x.dtype.str, "shape": list(x.shape)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_encode(v) for v in x)
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, dict):
        if _NDARRAY in x:
            return x[_NDARRAY].numpy().view(np.dtype(x["dtype"])).reshape(x["shape"]).copy()
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_decode(v) for v in x)
    return x


def save(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: temp file in the same directory, fsync, ``os.replace``.

    A crash at any point leaves either the old file or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, "state": _encode(state)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not possible on every platform (Windows); the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``; raise :class:`CheckpointError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read as a checkpoint (truncated or corrupted?): "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(payload, dict) or "format_version" not in payload or "state" not in payload:
        raise CheckpointError(f"{path}: not a parallel-rollouts checkpoint (no format version)")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload['format_version']} is not supported "
                              f"by this version (expects {FORMAT_VERSION}); use the version that wrote it, "
                              "or start a new run")
    return _decode(payload["state"])
