"""Recorded bandwidth traces for the VR-edge cell's capacity and its users' links: sets, splits, parsing, replay.

A trace set is named by ``capacity_trace`` or ``user_traces``: a shipped set by its name (:data:`TRACE_SETS`:
``pensieve``, the train and test traces of Mao et al., SIGCOMM 2017, in ``envs/trace_sets/``), a folder with
``train/`` and ``test/`` subfolders (``trace_split`` takes the set's own folders), a flat folder of trace files
(``trace_split`` is then a hash of the file names), or one file.

Four text formats are read (the format is recognised per file from its first data line, or said by
``trace_column``):

- **Pensieve** (Mao et al., SIGCOMM 2017; its FCC, HSDPA and Norway 3G sets): one sample per
  line, ``<time in s> <throughput in Mbit/s>``; each throughput holds from its timestamp to
  the next line's, and the last line ends the trace.
- **Mahimahi** (Netravali et al., ATC 2015): one line per 1500-byte delivery opportunity,
  its time in integer milliseconds (non-decreasing; repeated times are several
  opportunities in that millisecond). The trace repeats after its last timestamp.
- **HSDPA / 4G logs** (Riiser et al., MMSys 2013; van der Hooft et al., IEEE Comm. Letters 2016):
  ``<unix s> <ms> <lat> <lon> <bytes since last> <ms since last>``; each line's throughput holds over
  the milliseconds before its time.
- **CSV with a header** (``trace_column=NAME``): one row per second, the throughput in Mbit/s in column
  ``NAME``; ``trace_key=COL,COL`` makes one trace of each value of those columns (each run of a campaign).

Each trace becomes the mean throughput of consecutive ``segment_s`` windows from its start
(a last partial window is dropped), scaled (each file to a mean of the nominal capacity, or
by a given factor) and floored at :data:`MIN_CAPACITY_FRACTION` of the nominal capacity so
that download times stay finite through outages. An episode replays one file from a start
window, both drawn from the env's seed, wrapping around at the file's end.

A file is opened without blocking and refused unless it is a regular file of at most :data:`MAX_FILE_BYTES`, before
anything is read; it is then read line by line. Every number is checked before an array is sized from it: a file
spans at most :data:`MAX_WINDOWS` windows, and a throughput is at most :data:`MAX_MBPS`. Errors name the file and
line but never quote its content (a stored config may name any file).

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
import itertools
import math
import os
import stat
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

TRACE_SPLITS = ("auto", "all", "train", "test")
# the env arguments that concern traces: none of them changes the observation's or the action's shape
TRACE_ARGUMENTS = frozenset({"capacity_trace", "user_traces", "trace_split", "trace_scale", "trace_quantile",
                             "trace_column", "trace_key"})
SPLIT_FOLDERS = ("train", "test")  # a set's own split: a folder of each
TRACE_SETS_DIR = Path(__file__).resolve().parent / "trace_sets"
TRACE_SETS = ("pensieve",)  # shipped with the package, in TRACE_SETS_DIR: a name, not a path
TEST_FRACTION = 0.2  # of the files of a flat folder, at least one: the held-out ones
MIN_CAPACITY_FRACTION = 0.01  # of the nominal capacity: a window without deliveries still ends
MAHIMAHI_PACKET_BITS = 1500 * 8
MAX_WINDOWS = 1 << 22  # per file (48.5 days of 1 s windows): a longer span is a unit mistake, not a trace
MAX_MBPS = 1e6  # 1 Tbit/s: above any recorded link, and far from where sums of throughputs overflow
# the largest file read: MAX_WINDOWS windows of a 16-byte line each (the public sets' files are a few MB at most)
MAX_FILE_BYTES = 64 << 20
MAX_LINE_BYTES = 64 << 10  # a CSV row of many columns fits; a file of one endless line is no trace
CSV_ROW_S = 1.0  # a CSV trace's rows are one second apart (Lumos5G's, the Irish 5G set's)
_LAYOUT = {"Pensieve": "'<time s> <Mbit/s>'", "Mahimahi": "'<ms timestamp>'",
           "log": "'<unix s> <ms> <lat> <lon> <bytes since last> <ms since last>'"}
_FORMATS = ("expected Pensieve lines '<time s> <Mbit/s>', Mahimahi lines '<ms timestamp>', 6-column HSDPA/4G log "
            "lines, or a CSV with trace_column set")


class TraceError(ValueError):
    """A trace file or directory that cannot be used; the message names the file (and line)."""


class TraceNotFoundError(TraceError):
    """The trace file or directory is not there (moved, perhaps, since a run stored its path)."""


@dataclass(frozen=True)
class TraceSet:
    """The windows of several traces, concatenated: ``rates[offsets[k] + j]`` is window ``j`` of file ``k``.

    Shapes: ``rates`` ``[total windows]`` in Mbit/s (scaled); ``offsets`` and ``lengths``
    ``[files]``; ``files`` names them in the same order. Every method works on arrays of any shape (``[B]`` for the
    cell, ``[B, U]`` for the users).
    """

    files: tuple[str, ...]
    rates: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    def start(self, u_file: np.ndarray, u_offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File index and start window from two arrays of uniforms in (0, 1)."""
        n = len(self.files)
        trace = np.minimum((u_file * n).astype(np.int64), n - 1)
        length = self.lengths[trace]
        return trace, np.minimum((u_offset * length).astype(np.int64), length - 1)

    def next_position(self, trace: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The window after ``pos`` in each file (wrapping at its end)."""
        return (pos + 1) % self.lengths[trace]

    def capacity(self, trace: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The rate (Mbit/s, or the link quality of a users' set) of window ``pos`` of file ``trace``."""
        return self.rates[self.offsets[trace] + pos]


def trace_root(path: str) -> Path:
    """The file or folder a ``capacity_trace`` / ``user_traces`` value names: a shipped set's folder for its name
    (:data:`TRACE_SETS`; a folder of that name here is ``./pensieve``), else the path."""
    return TRACE_SETS_DIR / path if path in TRACE_SETS else Path(path)


def absolute_trace_path(path: str) -> str:
    """``path`` made absolute (a run's printed commands work from any directory); a shipped set's name as it is."""
    return path if path in TRACE_SETS else str(Path(path).resolve())


def has_split_folders(path: str) -> bool:
    """Whether ``path`` names a set that comes split: a folder with ``train/`` and ``test/`` subfolders."""
    root = trace_root(path)
    return all((root / name).is_dir() for name in SPLIT_FOLDERS)


def trace_files(path: str, split: str, setting: str = "capacity_trace") -> list[Path]:
    """The files of ``split`` in the set ``path`` names (``setting``: the argument that named it, for errors).

    A set with ``train/`` and ``test/`` folders: ``train`` (and ``auto``) its train folder, ``test`` its test
    folder, ``all`` both. A flat folder: every file (``auto``, ``all``) or :func:`split_files`'s hash split. A
    file: itself (``auto``, ``all``)."""
    root = trace_root(path)
    if has_split_folders(path):
        chosen = SPLIT_FOLDERS if split == "all" else ("test",) if split == "test" else ("train",)
        return [f for name in chosen for f in _listed(root / name, path, setting)]
    if root.is_dir():
        files = _listed(root, path, setting)
    elif os.path.lexists(root):  # a file (what else it may be: said when it is opened)
        files = [root]
    else:
        raise TraceNotFoundError(f"{setting}={path!r}: no such file or directory (a shipped set is named "
                                 f"{' or '.join(TRACE_SETS)})")
    return split_files(files, "all" if split == "auto" else split, path, setting)


def _listed(folder: Path, path: str, setting: str) -> list[Path]:
    """The trace files of ``folder``, by name: its entries less subfolders and names starting with ``.``."""
    try:
        with os.scandir(folder) as entries:
            files = sorted(Path(e.path) for e in entries if not e.name.startswith(".") and not e.is_dir())
    except OSError as e:
        raise TraceError(f"{setting}={path!r}: {folder} cannot be listed ({e.strerror})") from None
    if not files:
        raise TraceError(f"{setting}={path!r}: {folder} holds no trace files")
    return files


def split_files(files: list[Path], split: str, path: str, setting: str = "capacity_trace") -> list[Path]:
    """The files of ``split``: ordered by a SHA-256 of their names, the first ``max(1, round(0.2 n))`` are test."""
    if split == "all":
        return files
    if len(files) < 2:
        raise TraceError(f"{setting}={path!r}: trace_split={split!r} needs a directory of at least 2 files "
                         "(the split is by file) or one with train/ and test/ folders; use trace_split='all'")
    ordered = sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    n_test = max(1, round(TEST_FRACTION * len(files)))
    chosen = set(ordered[:n_test] if split == "test" else ordered[n_test:])
    return [f for f in files if f in chosen]


def load_traces(path: str, segment_s: float, split: str, scale: float | None, nominal_mbps: float,
                column: str = "", key: str = "", setting: str = "capacity_trace", quantile: float = 0.0) -> TraceSet:
    """Read the traces of ``split`` in the set ``path`` names (:func:`trace_files`) as a :class:`TraceSet`.

    ``scale`` multiplies the Mbit/s; ``None`` scales each trace so that its mean (``quantile`` 0), or that quantile
    of its windows (0.5: its median), is ``nominal_mbps`` (:func:`scale_factor`). ``column`` and
    ``key``: a CSV's throughput column and the columns whose values make one trace each. The set is cached by its
    files' versions (:func:`file_versions`) and these arguments: configs that name the same files share one set,
    read-only, and a file that changed (or a folder that gained one) is read again."""
    return _scaled_set(file_versions(path, split, setting), segment_s, scale, nominal_mbps, column, key, quantile)


def load_link_traces(path: str, segment_s: float, split: str, mean_quality: float, column: str = "",
                     key: str = "") -> TraceSet:
    """The users' traces (``user_traces``): each window's rate times ``mean_quality / the set's mean rate`` (the
    set's mean maps to ``mean_quality``), floored at :data:`MIN_CAPACITY_FRACTION` of ``mean_quality``; cached as
    :func:`load_traces`'s."""
    return _link_set(file_versions(path, split, "user_traces"), segment_s, mean_quality, column, key)


# a trace set's files as read: (the name it is listed by, the resolved path, st_mtime_ns, st_size) each
FileVersions = tuple[tuple[str, str, int, int], ...]
SET_CACHE_SIZE = 16  # trace sets kept (each also holds its files' windows in trace_windows's cache)


def file_versions(path: str, split: str, setting: str = "capacity_trace") -> FileVersions:
    """The files of ``split`` in the set ``path`` names (:func:`trace_files`) with their versions: what a cached set
    is keyed by. Listing and stat-ing them is all it reads."""
    versions = []
    for f in trace_files(path, split, setting):
        try:
            info = f.stat()
        except OSError as e:
            raise TraceError(f"{f}: cannot be read ({e.strerror})") from None
        versions.append((str(f), str(f.resolve()), info.st_mtime_ns, info.st_size))
    return tuple(versions)


def scale_factor(name: str, rates: np.ndarray, nominal_mbps: float, quantile: float = 0.0) -> float:
    """What one trace's windows ``rates`` (Mbit/s) are multiplied by to put its mean (``quantile`` 0) or that
    quantile of its windows at ``nominal_mbps``; a :class:`TraceError` naming the file where that quantile is 0 Mbit/s
    (an outage: no factor scales it up).

    A heavy-tailed trace (outages, bursts) has a mean well above its median: scaled by its mean, the cell gets less
    than the nominal capacity most of the time; scaled by its median, half of the time.

    >>> rates = np.array([0.5, 1.0, 1.0, 9.5])  # mean 3, median 1
    >>> scale_factor("t", rates, 12.0), scale_factor("t", rates, 12.0, quantile=0.5)
    (4.0, 12.0)
    """
    if not quantile:
        return float(nominal_mbps / rates.mean())
    at = float(np.quantile(rates, quantile))
    if at <= 0:
        raise TraceError(f"{name}: the {quantile:g} quantile of its {len(rates)} windows is 0 Mbit/s (an outage), "
                         "which no factor scales to the nominal capacity; give a higher trace_quantile")
    return float(nominal_mbps / at)


@functools.lru_cache(maxsize=SET_CACHE_SIZE)
def _scaled_set(versions: FileVersions, segment_s: float, scale: float | None, nominal_mbps: float, column: str,
                key: str, quantile: float = 0.0) -> TraceSet:
    names, windows = _set_windows(versions, segment_s, column, key)
    scaled = []
    for name, rates in zip(names, windows):
        factor = scale_factor(name, rates, nominal_mbps, quantile) if scale is None else scale
        scaled.append(np.maximum(rates * factor, MIN_CAPACITY_FRACTION * nominal_mbps))
        if not np.all(np.isfinite(scaled[-1])):
            raise TraceError(f"{name}: scaling by {factor:g} makes capacities that are not finite numbers; give a "
                             "smaller trace_scale (0: scale each file to a mean of the nominal capacity)")
    return _concatenated(names, scaled)


@functools.lru_cache(maxsize=SET_CACHE_SIZE)
def _link_set(versions: FileVersions, segment_s: float, mean_quality: float, column: str, key: str) -> TraceSet:
    names, windows = _set_windows(versions, segment_s, column, key)
    factor = mean_quality / np.concatenate(windows).mean()
    return _concatenated(names, [np.maximum(w * factor, MIN_CAPACITY_FRACTION * mean_quality) for w in windows])


def _concatenated(names: list[str], windows: list[np.ndarray]) -> TraceSet:
    """The set of ``windows``, its arrays read-only (a cached set is shared by every config that names it)."""
    lengths = np.array([len(w) for w in windows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    arrays = np.concatenate(windows), offsets, lengths
    for a in arrays:
        a.flags.writeable = False
    return TraceSet(tuple(names), *arrays)


def _set_windows(versions: FileVersions, segment_s: float, column: str, key: str
                 ) -> tuple[list[str], list[np.ndarray]]:
    """The names and unscaled windows of every trace of the files ``versions`` lists."""
    names, windows = [], []
    for name, resolved, mtime_ns, size in versions:
        traces = trace_windows(resolved, mtime_ns, size, segment_s, column, key)
        names += [f"{name}{suffix}" for suffix in traces[0]]
        windows += traces[1]
    return names, windows


@functools.lru_cache(maxsize=512)
def trace_windows(path: str, mtime_ns: int, size: int, segment_s: float, column: str = "", key: str = ""
                  ) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
    """The traces of one file (cached per file version): their names' suffixes (``""`` for a file of one trace,
    ``[COL=VALUE,...]`` for a CSV's keys) and the mean throughput (Mbit/s) of each whole ``segment_s`` window."""
    with open_trace(path) as f:
        rows = _rows(path, f, "," if column else None)
        first = next(rows, None)
        if first is None:
            raise TraceError(f"{path}: empty trace file (no data lines); {_FORMATS}")
        rows = itertools.chain([first], rows)
        if column:
            named = _csv_windows(path, rows, column, key, segment_s)
        else:
            named = {"": _format_windows(path, rows, len(first[1]), first[0], segment_s)}
    for suffix, rates in named.items():
        if not rates.any():
            raise TraceError(f"{path}{suffix}: the trace delivers nothing (every throughput is 0)")
    return tuple(named), tuple(named.values())


def _format_windows(path: str, rows: Iterator[tuple[int, list[str]]], fields: int, line: int, segment_s: float
                    ) -> np.ndarray:
    """The windows of a whitespace-separated trace, its format told by the ``fields`` of its first data line."""
    if fields == 2:
        return _pensieve_windows(path, _table(path, rows, 2, "Pensieve"), segment_s)
    if fields == 1:
        return _mahimahi_windows(path, _table(path, rows, 1, "Mahimahi")[:, 0], segment_s)
    if fields == 6:
        return _log_windows(path, _table(path, rows, 6, "log"), segment_s)
    raise TraceError(f"{path}:{line}: {fields} fields; {_FORMATS}")


def open_trace(path: str) -> BinaryIO:
    """``path`` opened for reading without blocking (a FIFO never hangs), refused unless it is a regular file of at
    most :data:`MAX_FILE_BYTES`: checked on the opened file, before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TraceError(f"{path}: cannot be opened ({e.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
        os.close(fd)
        why = (f"{info.st_size / (1 << 20):.0f} MiB, more than the {MAX_FILE_BYTES >> 20} MiB a trace file may be "
               "(split it, or resample it to one line per second)" if stat.S_ISREG(info.st_mode) else
               "not a regular file (a FIFO, socket or device); a trace is a file: copy the data into one")
        raise TraceError(f"{path}: {why}")
    return os.fdopen(fd, "rb")


def _rows(path: str, f: BinaryIO, sep: str | None) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line of ``f``, read one line (of at most
    :data:`MAX_LINE_BYTES`) at a time."""
    for line, raw in enumerate(iter(functools.partial(f.readline, MAX_LINE_BYTES + 1), b""), 1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"{path}:{line}: a line longer than {MAX_LINE_BYTES >> 10} KiB; {_FORMATS}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{path}:{line}: not a text file (byte {e.start} of the line is not UTF-8); "
                             f"{_FORMATS}") from None
        if text.strip():
            yield line, [part.strip() for part in text.split(sep)] if sep else text.split()


def _table(path: str, rows: Iterator[tuple[int, list[str]]], fields: int, what: str) -> np.ndarray:
    """The numbers ``[rows, fields]`` of every row, each checked to be a finite number."""
    values = array("d")
    for line, parts in rows:
        if len(parts) != fields:
            raise TraceError(f"{path}:{line}: {len(parts)} fields; every line of a {what} trace has {fields}")
        try:
            values.extend(map(float, parts))
        except ValueError:  # the field that is not a number, named
            for col, part in enumerate(parts):
                _number(path, line, col, part, f"{what} lines are {_LAYOUT[what]}")
    table = np.frombuffer(values, dtype=np.float64).reshape(-1, fields)
    infinite = ~np.isfinite(table)
    _refuse_first(path, [(infinite[:, col], lambda r, col=col: f"field {col + 1} is not a finite number")
                         for col in range(fields)])
    return table


def _number(path: str, line: int, col: int, part: str, layout: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise TraceError(f"{path}:{line}: field {col + 1} is not a number ({layout})") from None
    if not math.isfinite(value):
        raise TraceError(f"{path}:{line}: field {col + 1} is not a finite number")
    return value


def _line_of(path: str, row: int) -> int:
    """The line number of data row ``row`` (0-based, blank lines skipped) of ``path``: read again, for an error."""
    with open_trace(path) as f:
        return next(itertools.islice(_rows(path, f, None), row, None), (0, []))[0]


def _refuse_first(path: str, checks: list[tuple[np.ndarray, Callable[[int], str]]]) -> None:
    """Raise for the earliest row that a check flags (``(bad rows, what is wrong with row r)``, in the order they
    apply within a row), naming its line."""
    found = [(int(np.argmax(bad)), order, say) for order, (bad, say) in enumerate(checks) if bad.any()]
    if found:
        row, _, say = min(found)
        raise TraceError(f"{path}:{_line_of(path, row)}: {say(row)}")


def _too_long(span: str, segment_s: float, hint: str) -> str:
    return (f"the trace spans {span} by this line, more than the {MAX_WINDOWS} windows of segment_s={segment_s:g} s "
            f"({MAX_WINDOWS * segment_s:g} s) a file may hold; {hint}")


def _pensieve_windows(path: str, values: np.ndarray, segment_s: float) -> np.ndarray:
    times, mbps = values[:, 0], values[:, 1]
    earlier = np.concatenate([[-np.inf], times[:-1]])
    with np.errstate(over="ignore", invalid="ignore"):
        span = times - times[0]  # a span beyond a float is inf
    _refuse_first(path, [
        (mbps < 0, lambda r: f"negative throughput {mbps[r]:g} Mbit/s"),
        (mbps > MAX_MBPS, lambda r: f"throughput {mbps[r]:g} Mbit/s is above {MAX_MBPS:g} Mbit/s; "
                                        "Pensieve lines give Mbit/s (not bit/s)"),
        (times <= earlier, lambda r: f"timestamp {times[r]:g} s is not after the previous line's ({earlier[r]:g} "
                                     "s); timestamps must increase"),
        (span / segment_s > MAX_WINDOWS, lambda r: _too_long(f"{span[r]:g} s", segment_s, "Pensieve times are in "
                                                             "seconds (not milliseconds)")),
    ])
    return _windows(path, times, mbps, segment_s)


def _windows(path: str, times: np.ndarray, mbps: np.ndarray, segment_s: float) -> np.ndarray:
    """The mean throughput of each whole ``segment_s`` window of samples ``mbps`` holding from ``times`` to the
    next one's (the last sample only ends the trace)."""
    n = math.floor((times[-1] - times[0]) / segment_s + 1e-9)
    if n < 1:
        raise TraceError(f"{path}: the trace spans {times[-1] - times[0]:g} s, less than one segment "
                         f"({segment_s:g} s)")
    delivered = np.concatenate([[0.0], np.cumsum(mbps[:-1] * np.diff(times))])  # Mbit by each timestamp
    edges = times[0] + segment_s * np.arange(n + 1)
    return np.diff(np.interp(edges, times, delivered)) / segment_s


def _mahimahi_windows(path: str, stamps: np.ndarray, segment_s: float) -> np.ndarray:
    earlier = np.concatenate([[-np.inf], stamps[:-1]])
    _refuse_first(path, [
        ((stamps < 0) | (stamps != np.floor(stamps)), lambda r: "the timestamp is not a non-negative integer "
                                                                "number of milliseconds"),
        (stamps < earlier, lambda r: f"timestamp {stamps[r]:g} ms is before the previous line's ({earlier[r]:g} "
                                     "ms); timestamps must not decrease"),
        (stamps / (1000.0 * segment_s) > MAX_WINDOWS,  # windows count from 0 ms, the trace's start
         lambda r: _too_long(f"{stamps[r]:g} ms", segment_s, "Mahimahi timestamps count milliseconds from the "
                             "trace's start (0), not since an epoch: subtract the first line's timestamp from "
                             "every line")),
    ])
    window_ms = 1000.0 * segment_s
    n = math.floor(stamps[-1] / window_ms + 1e-9)
    if n < 1:
        raise TraceError(f"{path}: the trace lasts {stamps[-1]:g} ms, less than one segment ({window_ms:g} ms)")
    # delivery opportunities in the window (k * w, (k + 1) * w]
    counts = np.diff(np.searchsorted(stamps, window_ms * np.arange(n + 1), side="right"))
    return counts * MAHIMAHI_PACKET_BITS / 1e6 / segment_s


def _log_windows(path: str, values: np.ndarray, segment_s: float) -> np.ndarray:
    """The windows of an HSDPA / 4G log: each line's bytes delivered over the milliseconds before its time."""
    ms, sent, elapsed = values[:, 1], values[:, 4], values[:, 5]
    times = values[:, 0] + ms / 1000.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mbps = sent * 8.0 / elapsed / 1000.0
        begin = times[0] - elapsed[0] / 1000.0
        span = times - begin
    earlier = np.concatenate([[-np.inf], times[:-1]])
    _refuse_first(path, [
        ((ms < 0) | (ms >= 1000), lambda r: "field 2 (milliseconds) is not within 0..999"),
        (sent < 0, lambda r: "field 5 (bytes since the last line) is negative"),
        (elapsed <= 0, lambda r: "field 6 (milliseconds since the last line) is not above 0"),
        (mbps > MAX_MBPS, lambda r: f"throughput {mbps[r]:g} Mbit/s is above {MAX_MBPS:g} Mbit/s; field 5 counts "
                                    "bytes and field 6 milliseconds"),
        (times <= earlier, lambda r: f"time {times[r]:.3f} s is not after the previous line's ({earlier[r]:.3f} "
                                     "s); times must increase"),
        (span / segment_s > MAX_WINDOWS, lambda r: _too_long(f"{span[r]:g} s", segment_s, "field 1 counts "
                                                             "seconds and field 2 milliseconds")),
    ])
    return _windows(path, np.concatenate([[begin], times]), np.concatenate([mbps, [0.0]]), segment_s)


def _csv_windows(path: str, rows: Iterator[tuple[int, list[str]]], column: str, key: str, segment_s: float
                 ) -> dict[str, np.ndarray]:
    """The windows of each trace of a CSV with a header: rows one second apart, ``column`` in Mbit/s, one trace
    per value of the ``key`` columns (comma-separated; ``""``: the file is one trace), named ``[COL=VALUE,...]``."""
    line, header = next(rows)
    header = [name.strip('"') for name in header]
    keys = key.split(",") if key else []
    if missing := [c for c in [column, *keys] if c not in header]:
        raise TraceError(f"{path}:{line}: the header has no column {missing[0]!r} (trace_column and trace_key name "
                         "columns of a CSV's first line)")
    at, keys_at, most = header.index(column), [header.index(k) for k in keys], MAX_WINDOWS * segment_s / CSV_ROW_S
    groups: dict[tuple[str, ...], array] = {}
    for line, parts in rows:
        if len(parts) != len(header):
            raise TraceError(f"{path}:{line}: {len(parts)} fields; the header has {len(header)}")
        value = _number(path, line, at, parts[at].strip('"'), f"column {column!r} gives Mbit/s")
        if value < 0 or value > MAX_MBPS:
            raise TraceError(f"{path}:{line}: throughput {value:g} Mbit/s is not within 0..{MAX_MBPS:g} Mbit/s")
        group = groups.setdefault(tuple(parts[i].strip('"') for i in keys_at), array("d"))
        group.append(value)
        if len(group) > most:
            raise TraceError(f"{path}:{line}: " + _too_long(f"{len(group) * CSV_ROW_S:g} s", segment_s, "a CSV's "
                                                            "rows are one second apart (each key's rows in order)"))
    if not groups:
        raise TraceError(f"{path}: the CSV has a header but no rows")
    return {(f"[{','.join(f'{c}={v}' for c, v in zip(keys, values))}]" if keys else ""):
            _windows(path, CSV_ROW_S * np.arange(len(mbps) + 1), np.concatenate([mbps, [0.0]]), segment_s)
            for values, mbps in groups.items()}
