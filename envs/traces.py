"""Recorded bandwidth traces as the VR-edge cell's capacity: parsing, train/test split, replay.

Two text formats are read (the format is recognised per file from its first data line):

- **Pensieve** (Mao et al., SIGCOMM 2017; its FCC, HSDPA and Norway 3G sets): one sample per
  line, ``<time in s> <throughput in Mbit/s>``; each throughput holds from its timestamp to
  the next line's, and the last line ends the trace.
- **Mahimahi** (Netravali et al., ATC 2015): one line per 1500-byte delivery opportunity,
  its time in integer milliseconds (non-decreasing; repeated times are several
  opportunities in that millisecond). The trace repeats after its last timestamp.

Each trace becomes the mean throughput of consecutive ``segment_s`` windows from its start
(a last partial window is dropped), scaled (each file to a mean of the nominal capacity, or
by a given factor) and floored at :data:`MIN_CAPACITY_FRACTION` of the nominal capacity so
that download times stay finite through outages. An episode replays one file from a start
window, both drawn from the env's seed, wrapping around at the file's end.

Every number is checked before an array is sized from it: a file spans at most :data:`MAX_WINDOWS`
windows, and a throughput is at most :data:`MAX_MBPS`. Errors name the file and line but never quote
its content (a stored config may name any file).

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "trace.txt"
    >>> _ = path.write_text("0 4.0\\n1 2.0\\n2 6.0\\n3 1.0\\n")
    >>> traces = load_traces(str(path), segment_s=1.0, split="all", scale=1.0, nominal_mbps=4.0)
    >>> traces.rates.tolist()  # Mbit/s per 1 s window: [0, 1), [1, 2), [2, 3)
    [4.0, 2.0, 6.0]
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRACE_SPLITS = ("all", "train", "test")
TEST_FRACTION = 0.2  # of the files, at least one: the held-out ones
MIN_CAPACITY_FRACTION = 0.01  # of the nominal capacity: a window without deliveries still ends
MAHIMAHI_PACKET_BITS = 1500 * 8
MAX_WINDOWS = 1 << 22  # per file (48.5 days of 1 s windows): a longer span is a unit mistake, not a trace
MAX_MBPS = 1e6  # 1 Tbit/s: above any recorded link, and far from where sums of throughputs overflow


class TraceError(ValueError):
    """A trace file or directory that cannot be used; the message names the file (and line)."""


class TraceNotFoundError(TraceError):
    """The trace file or directory is not there (moved, perhaps, since a run stored its path)."""


@dataclass(frozen=True)
class TraceSet:
    """The windows of several traces, concatenated: ``rates[offsets[k] + j]`` is window ``j`` of file ``k``.

    Shapes: ``rates`` ``[total windows]`` in Mbit/s (scaled); ``offsets`` and ``lengths``
    ``[files]``; ``files`` names them in the same order.
    """

    files: tuple[str, ...]
    rates: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    def start(self, u_file: np.ndarray, u_offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File index and start window ``[B]`` from two ``[B]`` uniforms in (0, 1)."""
        n = len(self.files)
        trace = np.minimum((u_file * n).astype(np.int64), n - 1)
        length = self.lengths[trace]
        return trace, np.minimum((u_offset * length).astype(np.int64), length - 1)

    def next_position(self, trace: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The window after ``pos`` in each file (wrapping at its end)."""
        return (pos + 1) % self.lengths[trace]

    def capacity(self, trace: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Capacity ``[B]`` in Mbit/s of window ``pos`` of file ``trace``."""
        return self.rates[self.offsets[trace] + pos]


def load_traces(path: str, segment_s: float, split: str, scale: float | None, nominal_mbps: float) -> TraceSet:
    """Read a trace file, or every file of a directory (names starting with ``.`` skipped), as a :class:`TraceSet`.

    ``split`` is ``all``, ``train`` or ``test``: the files are ordered by a hash of their name
    and the first ``max(1, round(TEST_FRACTION * n))`` are the test files. ``scale`` multiplies
    the Mbit/s; ``None`` scales each file to a mean of ``nominal_mbps``.
    """
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise TraceError(f"capacity_trace={path!r}: the directory holds no trace files")
    elif root.is_file():
        files = [root]
    else:
        raise TraceNotFoundError(f"capacity_trace={path!r}: no such file or directory")
    files = split_files(files, split, path)
    windows = []
    for f in files:
        stat = f.stat()
        rates = trace_windows(str(f.resolve()), stat.st_mtime_ns, stat.st_size, segment_s)
        factor = nominal_mbps / rates.mean() if scale is None else scale
        scaled = np.maximum(rates * factor, MIN_CAPACITY_FRACTION * nominal_mbps)
        if not np.all(np.isfinite(scaled)):
            raise TraceError(f"{f}: scaling by {factor:g} makes capacities that are not finite numbers; give a "
                             "smaller trace_scale (0: scale each file to a mean of the nominal capacity)")
        windows.append(scaled)
    lengths = np.array([len(w) for w in windows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return TraceSet(tuple(str(f) for f in files), np.concatenate(windows), offsets, lengths)


def split_files(files: list[Path], split: str, path: str) -> list[Path]:
    """The files of ``split``: ordered by a SHA-256 of their names, the first ``max(1, round(0.2 n))`` are test."""
    if split == "all":
        return files
    if len(files) < 2:
        raise TraceError(f"capacity_trace={path!r}: trace_split={split!r} needs a directory of at least 2 files "
                         "(the split is by file); use trace_split='all'")
    ordered = sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    n_test = max(1, round(TEST_FRACTION * len(files)))
    chosen = set(ordered[:n_test] if split == "test" else ordered[n_test:])
    return [f for f in files if f in chosen]


@functools.lru_cache(maxsize=256)
def trace_windows(path: str, mtime_ns: int, size: int, segment_s: float) -> np.ndarray:
    """Mean throughput (Mbit/s) of each whole ``segment_s`` window of one file (cached per file version)."""
    raw = Path(path).read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise TraceError(f"{path}:{line}: not a text file (byte {e.start} is not UTF-8); expected Pensieve lines "
                         "'<time s> <Mbit/s>' or Mahimahi lines '<ms timestamp>'") from None
    data = [(i + 1, line.split()) for i, line in enumerate(lines) if line.strip()]
    if not data:
        raise TraceError(f"{path}: empty trace file (no data lines); expected Pensieve lines '<time s> <Mbit/s>' "
                         "or Mahimahi lines '<ms timestamp>'")
    fields = len(data[0][1])
    if fields == 2:
        rates = _pensieve_windows(path, data, segment_s)
    elif fields == 1:
        rates = _mahimahi_windows(path, data, segment_s)
    else:
        raise TraceError(f"{path}:{data[0][0]}: {fields} fields; expected Pensieve '<time s> <Mbit/s>' or "
                         "Mahimahi '<ms timestamp>'")
    if not rates.any():
        raise TraceError(f"{path}: the trace delivers nothing (every throughput is 0)")
    return rates


_LAYOUT = {"Pensieve": "'<time s> <Mbit/s>'", "Mahimahi": "'<ms timestamp>'"}


def _numbers(path: str, data: list[tuple[int, list[str]]], fields: int, what: str) -> np.ndarray:
    out = np.empty((len(data), fields))
    for row, (line, parts) in enumerate(data):
        if len(parts) != fields:
            raise TraceError(f"{path}:{line}: {len(parts)} fields; every line of a {what} trace has {fields}")
        for col, part in enumerate(parts):
            try:
                out[row, col] = float(part)
            except ValueError:
                raise TraceError(f"{path}:{line}: field {col + 1} is not a number ({what} lines are "
                                 f"{_LAYOUT[what]})") from None
            if not math.isfinite(out[row, col]):
                raise TraceError(f"{path}:{line}: field {col + 1} is not a finite number")
    return out


def _too_long(path: str, line: int, span: str, segment_s: float, hint: str) -> TraceError:
    return TraceError(f"{path}:{line}: the trace spans {span} by this line, more than the {MAX_WINDOWS} windows "
                      f"of segment_s={segment_s:g} s ({MAX_WINDOWS * segment_s:g} s) a file may hold; {hint}")


def _pensieve_windows(path: str, data: list[tuple[int, list[str]]], segment_s: float) -> np.ndarray:
    values = _numbers(path, data, 2, "Pensieve")
    times, mbps = values[:, 0], values[:, 1]
    for row in range(len(data)):
        if mbps[row] < 0:
            raise TraceError(f"{path}:{data[row][0]}: negative throughput {mbps[row]:g} Mbit/s")
        if mbps[row] > MAX_MBPS:
            raise TraceError(f"{path}:{data[row][0]}: throughput {mbps[row]:g} Mbit/s is above {MAX_MBPS:g} "
                             "Mbit/s; Pensieve lines give Mbit/s (not bit/s)")
        if row and times[row] <= times[row - 1]:
            raise TraceError(f"{path}:{data[row][0]}: timestamp {times[row]:g} s is not after the previous line's "
                             f"({times[row - 1]:g} s); timestamps must increase")
        span = float(times[row]) - float(times[0])  # a span beyond a float is inf (Python floats: no warning)
        if span / segment_s > MAX_WINDOWS:
            raise _too_long(path, data[row][0], f"{span:g} s", segment_s,
                            "Pensieve times are in seconds (not milliseconds)")
    n = math.floor((times[-1] - times[0]) / segment_s + 1e-9)
    if n < 1:
        raise TraceError(f"{path}: the trace spans {times[-1] - times[0]:g} s, less than one segment "
                         f"({segment_s:g} s)")
    delivered = np.concatenate([[0.0], np.cumsum(mbps[:-1] * np.diff(times))])  # Mbit by each timestamp
    edges = times[0] + segment_s * np.arange(n + 1)
    return np.diff(np.interp(edges, times, delivered)) / segment_s


def _mahimahi_windows(path: str, data: list[tuple[int, list[str]]], segment_s: float) -> np.ndarray:
    stamps = _numbers(path, data, 1, "Mahimahi")[:, 0]
    for row in range(len(data)):
        if stamps[row] < 0 or stamps[row] != int(stamps[row]):
            raise TraceError(f"{path}:{data[row][0]}: the timestamp is not a non-negative integer number of "
                             "milliseconds")
        if row and stamps[row] < stamps[row - 1]:
            raise TraceError(f"{path}:{data[row][0]}: timestamp {stamps[row]:g} ms is before the previous line's "
                             f"({stamps[row - 1]:g} ms); timestamps must not decrease")
        if stamps[row] / (1000.0 * segment_s) > MAX_WINDOWS:  # windows count from 0 ms, the trace's start
            raise _too_long(path, data[row][0], f"{stamps[row]:g} ms", segment_s,
                            "Mahimahi timestamps count milliseconds from the trace's start (0), not since an "
                            "epoch: subtract the first line's timestamp from every line")
    window_ms = 1000.0 * segment_s
    n = math.floor(stamps[-1] / window_ms + 1e-9)
    if n < 1:
        raise TraceError(f"{path}: the trace lasts {stamps[-1]:g} ms, less than one segment ({window_ms:g} ms)")
    # delivery opportunities in the window (k * w, (k + 1) * w]
    counts = np.diff(np.searchsorted(stamps, window_ms * np.arange(n + 1), side="right"))
    return counts * MAHIMAHI_PACKET_BITS / 1e6 / segment_s
