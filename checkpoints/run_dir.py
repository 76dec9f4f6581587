"""A run directory's checkpoints (``checkpoints/ckpt_<iteration>.pt``, retention, a ``latest`` pointer) and its lock.

A checkpoint file is never rewritten. New weights for an iteration already saved (a distillation round of the
finished run's policy) are the next file of that iteration, ``ckpt_<iteration>_<revision>.pt``: the files are
ordered by ``(iteration, revision)`` (:func:`checkpoint_order`), so that file is the run's newest, and the one before
it stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from checkpoints.files import POINTER_BYTES, read_small_file, write_whole
from checkpoints.store import CheckpointError, load, save

_NAME = re.compile(r"ckpt_(\d+)(?:_(\d+))?\.pt$")
LATEST = "latest"
BEST = "best"
LOCK = "lock"
GUARD = ".lock.guard"  # never deleted: the flock on it lets one contender at a time judge and take the lock
GUARD_WAIT_S = 10.0  # a contender holds the guard for milliseconds; longer means a process hangs while holding it


def _write_pointer(directory: Path, text: str, pointer: str = LATEST) -> None:
    try:
        write_whole(directory / pointer, text + "\n", durable=True)
    except OSError as e:
        raise CheckpointError(f"cannot write {directory / pointer}: {e.strerror or e}") from None


def set_best(run_dir: str | os.PathLike, checkpoint: Path, info: dict[str, Any], keep: int) -> None:
    """Point ``best`` (next to ``latest``) at ``checkpoint``, with ``info`` (JSON-serialisable: what made it best).

    Retention never deletes the file ``best`` names; the former best, kept only as best (older than the newest
    ``keep`` files), is deleted once the pointer has moved.
    """
    directory = Path(run_dir) / "checkpoints"
    former = best_checkpoint(run_dir)
    _write_pointer(directory, json.dumps({"file": Path(checkpoint).name, **info}), BEST)
    if former is not None and former != Path(checkpoint) and former in checkpoint_files(run_dir)[keep:]:
        former.unlink(missing_ok=True)


def best_info(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """What the ``best`` pointer holds (``file`` and the info given to :func:`set_best`), or ``None`` when
    the run has no best checkpoint (no pointer, an unreadable one, one that leads out of the run's checkpoints
    folder, or its file is gone: :func:`best_or_why_not`)."""
    return _best_pointer(_checkpoint_dir(Path(run_dir)))[0]


def best_or_why_not(run_dir: str | os.PathLike) -> tuple[Path | None, str]:
    """The file the ``best`` pointer of a run directory names and ``""``, or ``None`` and why there is none, in a
    few words."""
    directory = _checkpoint_dir(Path(run_dir))
    info, why = _best_pointer(directory)
    return (directory / info["file"] if info else None), why


def _checkpoint_dir(path: Path) -> Path:
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def _own(directory: Path, path: Path) -> bool:
    """Whether ``path``, with ``..`` and links resolved, is a file of the checkpoints ``directory`` itself. A pointer
    or a link that leads elsewhere (another run's checkpoint) is never followed: its state is not this run's, and
    what a command writes next to the checkpoint it loads would land in the other run."""
    return Path(os.path.realpath(path)).parent == Path(os.path.realpath(directory))  # (realpath: loops too)


def _outside(directory: Path, where: str | Path) -> str:
    return f"{where}, outside the run's checkpoints folder {directory}: refused"


NO_BEST = "the run has no best checkpoint"


def _best_pointer(directory: Path) -> tuple[dict[str, Any] | None, str]:
    if not (directory / BEST).exists() and not (directory / BEST).is_symlink():
        return None, NO_BEST
    text, why = _read_pointer(directory / BEST)
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("file"), str) or not info["file"]:
        return None, f"the run's best pointer {directory / BEST} is unreadable{why}"
    if not _own(directory, directory / info["file"]):
        return None, f"the run's best pointer {directory / BEST} names {_outside(directory, info['file'])}"
    if not (directory / info["file"]).is_file():
        return None, f"the best checkpoint, {info['file']}, is gone"
    return info, ""


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The file the ``best`` pointer of a run directory names, or ``None`` (see :func:`best_info`)."""
    return best_or_why_not(run_dir)[0]


def save_in_run_dir(run_dir: str | os.PathLike, state: dict[str, Any], iteration: int, keep: int,
                    revision: int = 0, spared: tuple[str, ...] = ()) -> Path:
    """Save ``state`` as iteration ``iteration`` (its ``revision``-th file: :func:`checkpoint_name`), point ``latest``
    at it, keep the newest ``keep`` files.

    The pointer moves only after the new file is complete, so it never names a partial file, and older files are
    deleted only after that; retention never deletes the file just written, the one ``best`` names, nor those named
    in ``spared`` (file names in the run's checkpoints folder: the trained weights rounds of distillation came from).
    """
    if keep < 1:
        raise ValueError(f"keep={keep} is invalid: must be >= 1")
    directory = Path(run_dir) / "checkpoints"
    path = save(directory / checkpoint_name(iteration, revision), state)
    _write_pointer(directory, path.name)
    kept = {path, best_checkpoint(run_dir), *(directory / name for name in spared)}
    for old in checkpoint_files(run_dir)[keep:]:
        if old not in kept:
            old.unlink(missing_ok=True)
    return path


def checkpoint_name(iteration: int, revision: int = 0) -> str:
    """The file name of iteration ``iteration``'s checkpoint, or of its ``revision``-th new weights (>= 1).

    >>> checkpoint_name(16), checkpoint_name(16, 2)
    ('ckpt_00000016.pt', 'ckpt_00000016_2.pt')
    """
    return f"ckpt_{iteration:08d}" + (f"_{revision}" if revision else "") + ".pt"


def remove_partial_saves(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of checkpoint saves that never finished (a process killed while writing one:
    up to a checkpoint's size each, gigabytes with a saved replay); returns them. Only for the holder of the run
    directory's lock (:class:`RunDirLock`): nobody else may be writing one."""
    directory = Path(run_dir) / "checkpoints"
    partial = sorted(directory.glob(".ckpt_*.pt.*.tmp")) if directory.is_dir() else []
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def checkpoint_files(run_dir: str | os.PathLike) -> list[Path]:
    """A run directory's checkpoint files, newest iteration first (also accepts the ``checkpoints`` folder)."""
    path = Path(run_dir)
    directory = _checkpoint_dir(path)
    files = [p for p in directory.glob("ckpt_*.pt") if _NAME.search(p.name)]
    return sorted(files, key=checkpoint_order, reverse=True)


def checkpoint_iteration(path: Path) -> int:
    """The iteration a checkpoint file holds, from its name."""
    return checkpoint_order(path)[0]


def checkpoint_order(path: Path) -> tuple[int, int]:
    """Where a checkpoint file stands in its run, from its name: ``(iteration, revision)``, newer is larger.

    >>> checkpoint_order(Path("ckpt_00000016.pt")), checkpoint_order(Path("ckpt_00000016_1.pt"))
    ((16, 0), (16, 1))
    """
    iteration, revision = _NAME.search(path.name).groups()
    return int(iteration), int(revision or 0)


def revision_of(path: Path) -> int:
    """The revision a checkpoint file's name says (:func:`checkpoint_order`); 0 for a name of another form (a
    checkpoint file passed by a name of the user's)."""
    return checkpoint_order(path)[1] if _NAME.search(path.name) else 0


def run_dir_of(checkpoint: str | os.PathLike) -> Path:
    """The run directory a checkpoint file belongs to (``RUN/checkpoints/ckpt_*.pt`` -> ``RUN``)."""
    path = Path(checkpoint)
    if path.is_dir():
        return path.parent if path.name == "checkpoints" else path
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def set_aside_newer(run_dir: str | os.PathLike, iteration: int, revision: int = 0) -> list[Path]:
    """Rename checkpoints newer than ``(iteration, revision)`` (:func:`checkpoint_order`) to ``*.orphaned`` names no
    file has (``ckpt_N.pt.orphaned``, else ``ckpt_N.pt.2.orphaned``, ...: what an earlier rollback set aside is never
    replaced); returns the new names. The pointers stay true to the files: a ``latest`` that named a set-aside file
    (or none of the run's) names the newest checkpoint left (or is removed when none is left), and a ``best`` that
    named one is dropped.
    Only for the holder of the run directory's lock (:class:`RunDirLock`): nobody else renames its files.

    Resuming from an older checkpoint (or past a corrupted newer one) starts a new future:
    the newer files would otherwise win retention and the newest-first order over it.
    """
    order = (iteration, revision)
    moved = []
    best = best_checkpoint(run_dir)
    for f in checkpoint_files(run_dir):
        if checkpoint_order(f) > order:
            target = _set_aside_name(f)
            os.replace(f, target)
            moved.append(target)
    if not moved:
        return moved
    directory = moved[0].parent
    if (directory / LATEST).is_file() and _latest_pointer(directory)[0] is None:
        left = checkpoint_files(run_dir)
        if left:
            _write_pointer(directory, left[0].name)
        else:
            (directory / LATEST).unlink()
    if best is not None and checkpoint_order(best) > order:  # a best from the abandoned future
        (directory / BEST).unlink(missing_ok=True)
    return moved


def _set_aside_name(checkpoint: Path) -> Path:
    """``ckpt_N.pt.orphaned``, or, where a file of that name exists, the same with the first free counter."""
    target, n = checkpoint.with_name(checkpoint.name + ".orphaned"), 1
    while target.exists() or target.is_symlink():
        n += 1
        target = checkpoint.with_name(f"{checkpoint.name}.{n}.orphaned")
    return target


def candidates(path: str | os.PathLike) -> tuple[list[Path], list[str]]:
    """What to load, in order, and what was refused on the way (one line each).

    A checkpoint file is itself. A run directory gives its checkpoint files newest first: the newest that loads
    holds the run's state, whatever ``latest`` says (a kill between a save and the pointer's update leaves the
    pointer behind a complete file: :func:`lagging_latest`). Its ``latest`` pointer, passed where a file was meant,
    stands for the run directory; its ``best`` pointer for the file it names (a rollback to the best, asked for),
    or, where it names none of the run's, for the run directory. A pointer or a link that leads out of the run's
    checkpoints folder is refused, never followed.
    """
    path, refused = Path(path), []
    if path.is_file() and not _is_pointer(path):
        return [path], refused
    if path.is_file():
        if path.name == BEST:
            info, why = _best_pointer(path.parent)
            if info:
                return [path.parent / info["file"]], refused
            refused.append(f"{why}; taking the run's newest checkpoint that loads")
        path = run_dir_of(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint file or run directory")
    directory = _checkpoint_dir(path)
    listed = checkpoint_files(path)
    files = [f for f in listed if _own(directory, f)]
    refused += [f"{f} is a link to {_outside(directory, os.path.realpath(f))}" for f in listed if f not in files]
    why = _latest_pointer(directory)[1]
    refused += [why] if why else []
    if files:
        return files, refused
    if listed:
        raise CheckpointError("no loadable checkpoint:\n  " + "\n  ".join(refused))
    raise _none_found(path, directory)


def _none_found(path: Path, directory: Path) -> CheckpointError:
    """The error for a directory without checkpoints, with what to pass instead."""
    where = directory if directory.name == "checkpoints" else directory / "checkpoints"
    runs = [d for d in path.iterdir() if (d / "checkpoints").is_dir()]  # runs/, say: a run's parent
    if (path / "config.json").is_file():  # what a run writes before its first iteration
        hint = ("the run has written none yet (it stopped before its first iteration completed, or is still in "
                "it): nothing to load; its own command starts it again, taking the directory over")
    elif runs:
        hint = (f"it holds {len(runs)} run director{'y' if len(runs) == 1 else 'ies'}: pass one, e.g. the "
                f"newest, {max(runs, key=lambda d: d.stat().st_mtime)}")
    else:
        hint = "pass a run directory (trainer.train's --run-dir) or a checkpoint file"
    return CheckpointError(f"{path}: no checkpoints found (expected {where}/ckpt_*.pt); {hint}")


def _is_pointer(path: Path) -> bool:
    """A run's ``latest`` or ``best`` pointer (passed where its file was meant)."""
    return path.name in (LATEST, BEST) and not _is_zip(path)


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"PK"  # what torch.save writes; a pointer is text


def _latest_pointer(directory: Path) -> tuple[Path | None, str]:
    """The checkpoint file that the ``latest`` pointer in ``directory`` names and ``""``, or ``None`` and why it
    names none of the run's (``""`` where there is no pointer)."""
    pointer = directory / LATEST
    if not pointer.exists() and not pointer.is_symlink():
        return None, ""
    name, why = _read_pointer(pointer)
    if not name:
        return None, f"the run's latest pointer {pointer} is unreadable{why}"
    if not _own(directory, directory / name):
        return None, f"the run's latest pointer {pointer} names {_outside(directory, name)}"
    if not (directory / name).is_file():
        return None, f"the run's latest pointer {pointer} names {name}, which does not exist"
    return directory / name, ""


def _read_pointer(pointer: Path) -> tuple[str, str]:
    """A pointer's text, stripped, and ``""``; or ``""`` and why it cannot be read (``" (it is a FIFO ...)"``): a
    pointer is a regular file of a few bytes (:func:`checkpoints.files.read_small_file`), never waited for."""
    try:
        return read_small_file(pointer, POINTER_BYTES).strip(), ""
    except OSError as e:
        return "", f" ({e.strerror or e})"
    except ValueError:  # not UTF-8
        return "", ""


def lagging_latest(path: str | os.PathLike, loaded: Path) -> str:
    """One line where the run at ``path`` (a run directory, or its ``latest`` pointer) has a ``latest`` pointer that
    names a checkpoint older than ``loaded``, the newest that loads: a save whose pointer update did not happen (a
    kill between the two), not a rollback; else ``""``. A rollback is asked for by naming the older file."""
    path = Path(path)
    if path.is_file() and not (path.name == LATEST and _is_pointer(path)):  # a file named: a rollback, if older
        return ""
    named = _latest_pointer(loaded.parent)[0]
    if named is None or not _NAME.search(named.name) or checkpoint_order(named) >= checkpoint_order(loaded):
        return ""
    return (f"the run's latest pointer names {named.name}, but the newer {loaded.name} is complete and loads: the "
            f"pointer was not moved after that save (stopped between the two), so {loaded.name} holds the run's "
            f"newest state (to roll back, name the older file: {named})")


def latest_loadable(path: str | os.PathLike, map_location: str = "cpu") -> tuple[Path, dict[str, Any], list[str]]:
    """Load the newest checkpoint that loads (:func:`candidates`); returns ``(file, state, problems)``: what was
    refused or did not load on the way, one line each.

    Raises :class:`CheckpointError` listing every problem when none loads.
    """
    tried, problems = candidates(path)
    for candidate in tried:
        try:
            return candidate, load(candidate, map_location), problems
        except CheckpointError as e:
            problems.append(str(e))
    if Path(path).is_file():  # one file asked for: its run's other checkpoints are named, not loaded (GBs each)
        run_dir = run_dir_of(tried[0])
        others = [f for f in checkpoint_files(run_dir) if f not in tried]
        if others:
            problems.append(f"its run directory {run_dir} holds {len(others)} other checkpoint"
                            f"{'' if len(others) == 1 else 's'} (newest {others[0].name}): pass the directory "
                            "instead of the file to take the newest that loads")
    raise CheckpointError("no loadable checkpoint:\n  " + "\n  ".join(problems))


class RunDirLockedError(ValueError):
    """Another live process holds the run directory's lock, or the directory cannot be written."""


def _slurm_job() -> dict[str, str]:
    """The SLURM job and its requeue count, where this runs in a SLURM job."""
    job = os.environ.get("SLURM_JOB_ID")
    return {"slurm_job": job, "slurm_restart": os.environ.get("SLURM_RESTART_COUNT", "0")} if job else {}


@contextlib.contextmanager
def _exclusive(guard: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``guard`` (waiting at most :data:`GUARD_WAIT_S`).

    Where the file system has no ``flock`` (some network file systems, or Windows), nothing is held: taking
    over a stale lock is then not guarded against a second contender doing the same at the same moment.
    """
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirLockedError(f"cannot write to run directory {guard.parent}: {e.strerror or e}") from None
    try:
        deadline = time.monotonic() + GUARD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunDirLockedError(f"could not take {guard.with_name(LOCK)}: {guard} stayed locked for "
                                            f"{GUARD_WAIT_S:g} s (a process hangs while taking the lock?)") from None
                time.sleep(0.005)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                break  # no flock on this file system: unguarded, as documented above
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class RunDirLock:
    """One process at a time per run directory: ``<run_dir>/lock`` holds its pid, host and start time.

    Example:
        >>> import tempfile
        >>> from checkpoints import RunDirLock
        >>> with RunDirLock(tempfile.mkdtemp()) as lock:
        ...     lock.path.is_file()
        True

    A lock whose process is gone (same host, pid dead or reused by a younger process, or an
    earlier run of the same requeued SLURM job on any host), or one copied along with its run
    directory, is stale and taken over; ``stale`` then describes it. Contenders judge and take the lock one at a
    time (an ``flock`` on ``<run_dir>/.lock.guard``, a file never deleted), and a stale lock is replaced by one
    rename, so two contenders never both hold it. A lock held by a live process, or by
    a process on another host (whose liveness cannot be checked), raises
    :class:`RunDirLockedError`.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK
        self.stale: str | None = None
        self._held = False

    def acquire(self) -> RunDirLock:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "process_start": _start_time(os.getpid()), "run_dir": str(self.path.parent.resolve()), **_slurm_job()}
        tmp = self.path.with_name(f".{LOCK}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(me))
        except OSError as e:
            raise RunDirLockedError(f"cannot write to run directory {self.path.parent}: {e.strerror or e}") from None
        try:
            with _exclusive(self.path.with_name(GUARD)):
                self._take(tmp)
            self._held = True
            return self
        finally:
            tmp.unlink(missing_ok=True)

    def _take(self, tmp: Path) -> None:
        """Make ``tmp`` the lock, or raise; run by one contender at a time (:func:`_exclusive`)."""
        for _ in range(2):
            try:
                os.link(tmp, self.path)  # atomic, fails if a lock exists: no window for a second trainer
                return
            except FileExistsError:
                pass
            holder = self._holder()
            if holder is None and not self.path.exists():
                continue  # its live holder released it just now: the directory is free
            if holder is not None and self._alive(holder) and not self._copied(holder):
                raise RunDirLockedError(
                    f"run directory {self.path.parent} is in use by {self._describe(holder)}; stop that "
                    f"trainer first (or, if it is gone, delete {self.path})")
            # a stale lock changes only under the guard (its holder is gone), so it is still the one judged here;
            # replaced in one rename, never unlinked first, so no contender ever finds the directory free
            os.replace(tmp, self.path)
            self.stale = f"removed a stale lock {self.path} ({self._describe(holder)})"
            return
        raise RunDirLockedError(f"could not take {self.path}: other trainers take and release it at the same time")

    def _holder(self) -> dict[str, Any] | None:
        try:
            holder = json.loads(read_small_file(self.path, POINTER_BYTES))  # (a FIFO planted there: unreadable)
            return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _copied(self, holder: dict[str, Any]) -> bool:
        """A lock copied along with its run directory (``cp -r`` of a live run) belongs to the original."""
        return holder.get("run_dir", str(self.path.parent.resolve())) != str(self.path.parent.resolve())

    @staticmethod
    def _alive(holder: dict[str, Any]) -> bool:
        job = _slurm_job()
        if job and holder.get("slurm_job") == job["slurm_job"] and holder.get("slurm_restart") != job["slurm_restart"]:
            return False  # an earlier run of this requeued job (perhaps on another node): one job runs once at a time
        if holder.get("host") != socket.gethostname():
            return True  # cannot be checked from here: assume it runs
        started = _start_time(holder["pid"])
        if started is None:
            return False
        expected = holder.get("process_start")
        return expected is None or abs(started - expected) < 1.0  # else the pid was reused

    @staticmethod
    def _describe(holder: dict[str, Any] | None) -> str:
        if holder is None:
            return "unreadable lock file"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
        return f"pid {holder['pid']} on {holder.get('host', '?')} since {since}"

    def release(self) -> None:
        if self._held:
            self._held = False
            holder = self._holder()
            if holder is not None and holder["pid"] == os.getpid():
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
