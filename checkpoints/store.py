"""One checkpoint file: atomic write, checksum, ``weights_only`` load, format version check."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

# 3: the state is stored as a checksummed payload; collector state is kept per env and the
# minibatch generator is derived from (seed, iteration) instead of being stored per device
FORMAT_VERSION = 3
ZIP_HEADER = b"PK\x03\x04"  # how torch.save's files begin (since torch 1.6)
ZIP_END = b"PK\x05\x06"  # the record that ends a zip archive, within its last 65,557 bytes (zip64 keeps it too)
HEAD_BYTES = 4096  # how much of a file is read to tell what it is
TAIL_BYTES = 65_557
_NDARRAY = "__ndarray__"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, corrupted, of another format version, or cannot be written."""


def _file_mode() -> int:
    """What ``open()`` gives a new file here: 0666 less the umask (read once, at import: setting it to read it
    is not thread-safe, and nothing else has started yet)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


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


def _serialize(state: dict[str, Any]) -> memoryview:
    """The file's bytes: the encoded state as an inner torch file, wrapped with its SHA-256.

    The inner file is stored as a uint8 tensor of the outer one, so the whole file is still
    read by ``torch.load(weights_only=True)``, and a flipped bit anywhere in the state is
    caught by the checksum (torch's zip reader does not verify its CRCs).
    Views, not copies, of the two buffers: the peak is the state's size twice over, which
    counts when the state holds a replay of many GiB.
    """
    inner = io.BytesIO()
    torch.save(_encode(state), inner)
    payload = inner.getbuffer()
    outer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, "sha256": hashlib.sha256(payload).hexdigest(),
                "payload": torch.frombuffer(payload, dtype=torch.uint8)}, outer)
    return outer.getbuffer()


def save(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: temp file in the same directory, fsync, ``os.replace``.

    A crash at any point leaves either the old file or the complete new one. A write that
    fails (disk full, read-only directory) raises :class:`CheckpointError` naming the path
    and leaves no temporary file.
    """
    path = Path(path)
    data = _serialize(state)  # before touching the disk: a failure here writes nothing
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.chmod(tmp, _FILE_MODE)  # mkstemp's 0600 would make checkpoints the one unreadable file of a shared run
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as e:
        why = (f"{path.parent} is not a directory" if path.parent.exists() and not path.parent.is_dir()
               else e.strerror or str(e))
        raise CheckpointError(f"cannot write checkpoint {path}: {why}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
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
    """Load a checkpoint with ``torch.load(weights_only=True)``; verify its format version and checksum.

    Raises :class:`CheckpointError` naming the file and what is wrong with it.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    with path.open("rb") as f:
        _check_framing(path, f)
        outer = _torch_load(path, f, "cpu")
    if not isinstance(outer, dict) or "format_version" not in outer:
        raise CheckpointError(f"{path}: not a parallel-rollouts checkpoint (no format version)")
    if outer["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {outer['format_version']} is not supported "
                              f"by this version (expects {FORMAT_VERSION}); use the version that wrote it, "
                              "or start a new run")
    payload = outer.get("payload")
    if not isinstance(payload, torch.Tensor) or not isinstance(outer.get("sha256"), str):
        raise CheckpointError(f"{path}: not a parallel-rollouts checkpoint (no checksummed payload)")
    if hashlib.sha256(payload.numpy()).hexdigest() != outer["sha256"]:
        raise CheckpointError(f"{path}: checksum mismatch, the file is corrupted")
    inner = io.BytesIO(payload.numpy())
    del outer, payload  # one copy of the payload at a time: a checkpoint may hold a replay of many GiB
    return _decode(_torch_load(path, inner, map_location))


def _check_framing(path: Path, f: BinaryIO) -> None:
    """Raise ``CheckpointError`` unless the file begins and ends as a ``torch.save`` file does (a zip archive);
    torch's own text for other bytes is about its legacy format, or an ``OSError``, which say nothing of what
    happened to the file. Leaves ``f`` at its start."""
    head = f.read(HEAD_BYTES)
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - TAIL_BYTES))
    tail = f.read()
    f.seek(0)
    what = ("the file is empty" if not head else
            f"its first {len(head):,} bytes are zeros" if not head.strip(b"\0") else
            "it is not a torch.save file (a zip archive); is it another kind of file?"
            if not head.startswith(ZIP_HEADER) else
            f"it ends before its zip directory, at {size:,} bytes" if ZIP_END not in tail else "")
    if what:
        raise CheckpointError(f"{path}: cannot be read as a checkpoint (truncated or corrupted?): {what}")


def _torch_load(path: Path, f: BinaryIO, map_location) -> Any:
    try:
        with warnings.catch_warnings():  # a TorchScript file is reported as an error below, not as a warning
            warnings.filterwarnings("ignore", message=".*looks like a TorchScript archive")
            return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:
        if "TorchScript" in str(e):
            raise CheckpointError(f"{path}: an exported TorchScript policy, not a training checkpoint") from None
        if isinstance(e, pickle.UnpicklingError):  # torch's text goes on to suggest an unsafe load: not here
            raise CheckpointError(f"{path}: cannot be read as a checkpoint (truncated or corrupted?): it does not "
                                  "load as a weights-only torch file; is it another kind of file?") from None
        # torch's first sentence: its cause, if it gives one (miniz's goes on to ask for a bug report)
        detail = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else ""
        if len(detail) > 160:
            detail = detail[:157] + "..."
        raise CheckpointError(f"{path}: cannot be read as a checkpoint (truncated or corrupted?): "
                              f"{type(e).__name__}{': ' + detail if detail else ''}") from None
