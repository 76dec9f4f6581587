"""A run's small files (its pointers and lock, ``config.json``, ``metrics.jsonl``, a study's side files), read and
appended one way: a regular file, opened without blocking, no larger than a cap. Anything else (a FIFO that would
block the reader forever, a device that never ends, a directory, a file grown past its cap) is an
:class:`UnreadableFileError`, an ``OSError`` whose ``strerror`` says why: what the callers already take for
"unreadable". And a file of any size by its content: :func:`content_hash`, what results name a checkpoint by."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO, TextIO

POINTER_BYTES = 1 << 16  # a pointer (latest, best) or a lock: a file name and a few numbers
SMALL_BYTES = 1 << 24  # config.json, seeds.json, a study's side files: kilobytes
LOG_BYTES = 1 << 30  # metrics.jsonl: ~1 KB a row, a million iterations; read as a stream, a line at a time
HASH_CHUNK = 1 << 20  # a checkpoint (a replay buffer inside) may be GiBs: hashed a MiB at a time
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # (Windows has none, and no FIFOs in a folder)


class UnreadableFileError(OSError):
    """A run's file that is not a regular file, or is larger than such a file may be; ``strerror`` says which."""


def _refused(path: str | os.PathLike, why: str) -> UnreadableFileError:
    return UnreadableFileError(errno.EINVAL, why, os.fspath(path))


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a file")


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, limit: int | None = SMALL_BYTES) -> int:
    """A descriptor of ``path`` opened with ``flags`` (``os.O_*``) without blocking (a FIFO would wait for a writer,
    or a reader, forever), once it is known to be a regular file of at most ``limit`` bytes (``None``: any size),
    then set to block as files do; :class:`UnreadableFileError` otherwise, ``OSError`` where it cannot be opened."""
    try:
        fd = os.open(path, flags | _NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO opened for writing, no reader at the other end
            raise _refused(path, "it is a FIFO (named pipe), not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused(path, f"it is {_kind(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise _refused(path, f"it is {info.st_size:,} bytes, more than the {limit:,} such a file may be")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_small_file(path: str | os.PathLike, limit: int = SMALL_BYTES) -> str:
    """The text of the regular file ``path``, at most ``limit`` bytes (:func:`open_regular`);
    :class:`UnreadableFileError` or ``OSError`` where it cannot be read, ``UnicodeDecodeError`` (a ``ValueError``)
    where it is not UTF-8."""
    with os.fdopen(open_regular(path, os.O_RDONLY, limit), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise _refused(path, f"it is more than the {limit:,} bytes such a file may be")
    return data.decode()


@contextlib.contextmanager
def reading(path: str | os.PathLike, limit: int = LOG_BYTES) -> Iterator[BinaryIO]:
    """``path`` open for reading as a stream (``metrics.jsonl``), once :func:`open_regular` has checked it."""
    with os.fdopen(open_regular(path, os.O_RDONLY, limit), "rb") as f:
        yield f


def content_hash(path: str | os.PathLike) -> str:
    """The hex SHA-256 of the regular file ``path``'s bytes, read a chunk at a time (:func:`open_regular`, any size).

    What a result names a checkpoint by next to its path: a path may come to hold other weights (a file replaced,
    a run directory copied over another), its content hash never does.

    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = (Path(folder) / "ckpt.pt").write_bytes(b"abc")
    ...     content_hash(Path(folder) / "ckpt.pt")
    'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    digest = hashlib.sha256()
    chunk = bytearray(HASH_CHUNK)
    with os.fdopen(open_regular(path, os.O_RDONLY, None), "rb") as f:
        while read := f.readinto(chunk):
            digest.update(memoryview(chunk)[:read])
    return digest.hexdigest()


def appending(path: str | os.PathLike) -> TextIO:
    """``path`` open for appending text (made where missing): a log of the run's (``threads.log``, ``train.log``)
    or a lock file, never a FIFO planted in its place (:func:`open_regular`)."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, None), "a")


def lines_of(f: BinaryIO, longest: int = SMALL_BYTES) -> Iterator[bytes]:
    """The lines of the stream ``f`` without their line ends; a line longer than ``longest`` bytes is given as its
    first ``longest`` bytes (what reads it finds it torn), so that no line costs more memory than that."""
    while line := f.readline(longest):
        if len(line) == longest and not line.endswith(b"\n"):
            while (rest := f.readline(longest)) and not rest.endswith(b"\n"):
                pass  # the rest of an overlong line: skipped, a chunk at a time
        yield line.rstrip(b"\r\n")


def write_whole(path: str | os.PathLike, text: str, durable: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file of its own moved into place: whole or not at all, and
    whatever stood at ``path`` (a link, a FIFO) is replaced, never followed or waited for; ``durable``: on the disk
    (``fsync``) before it is moved, as a pointer must be."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")  # its own: several processes may write it at once
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # what a killed write left (or was planted) there
    try:
        with os.fdopen(open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, None), "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
