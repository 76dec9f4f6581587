"""Where a run's metrics go besides ``metrics.jsonl``: TensorBoard (``--tensorboard``, into ``<run-dir>/tb``) and
Weights & Biases (``--wandb PROJECT``, its files in ``<run-dir>/wandb``). Each takes every completed iteration's
metrics row, its numbers at the row's ``env_steps``. Their packages are extras, imported only by a run that uses
them (:func:`check_trackers` names a missing one before the run starts); under torchrun, rank 0 alone tracks.

A resumed run continues its W&B run: the run's id is kept in ``<run-dir>/wandb_id``.
"""

from __future__ import annotations

import importlib.util
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from envs.settings import ConfigError
from trainer.config import TrainConfig

# the settings that turn a tracker on, each needing the extra (and the package) of its own name
TRACKER_SETTINGS = ("tensorboard", "wandb")
WANDB_ID = "wandb_id"
DEFAULT_PARENT = "runs"  # where runs go when no --run-dir names a place: a folder of unrelated runs


def check_trackers(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` naming the first tracker ``cfg`` turns on whose extra is not installed."""
    for key in TRACKER_SETTINGS:
        if getattr(cfg, key) and importlib.util.find_spec(key) is None:
            raise ConfigError(key, getattr(cfg, key), f"needs the {key} extra: pip install -e '.[{key}]'")


def wandb_names(run_dir: Path) -> tuple[str, str | None]:
    """A run's W&B name and group. A run directory inside an experiment folder (seeds side by side, a sweep's
    trials) is named ``FOLDER/NAME`` and grouped by its folder; one in ``runs/``, the folder of unrelated runs,
    is named for itself alone.

    >>> wandb_names(Path("runs/default/s3"))
    ('default/s3', 'default')
    >>> wandb_names(Path("runs/VREdge-v0-s1-20250101-120000"))
    ('VREdge-v0-s1-20250101-120000', None)
    """
    path = run_dir.resolve()  # the same names whichever way a resume spells the directory
    folder = path.parent.name
    if folder in ("", DEFAULT_PARENT):
        return path.name, None
    return f"{folder}/{path.name}", folder


class _Tracker(Protocol):
    def log(self, numbers: dict[str, float], step: int) -> None: ...

    def close(self, exit_code: int) -> None: ...


class Trackers:
    """The run's trackers, open until :meth:`close` (or the end of a ``with`` block: an error or a stop closes
    them too, W&B's run marked with the exit status). :meth:`log` takes a metrics row; its numbers (``None``
    and text left out) go to every tracker at ``row["env_steps"]``.

    Example (neither ``--tensorboard`` nor ``--wandb``: nothing is tracked, nothing written):
        >>> import tempfile
        >>> with Trackers.for_run(TrainConfig(), Path(tempfile.mkdtemp()), lead=True) as trackers:
        ...     trackers.log({"iteration": 1, "env_steps": 128, "sps": 512.0, "episode_return": None})
        >>> trackers.describe()
        []
    """

    def __init__(self, trackers: Sequence[_Tracker] = (), notes: Sequence[str] = ()) -> None:
        self._trackers, self._notes = list(trackers), list(notes)

    @classmethod
    def for_run(cls, cfg: TrainConfig, run_dir: Path, lead: bool) -> Trackers:
        """The trackers ``cfg`` turns on, writing into ``run_dir``; none unless ``lead`` (this process writes the
        run's files: rank 0 under torchrun, and a run with iterations to do)."""
        if not lead:
            return cls()
        trackers, notes = [], []
        if cfg.tensorboard:
            trackers.append(_TensorBoard(run_dir))
        if cfg.wandb:
            try:
                trackers.append(_WandB(cfg, run_dir))
            except BaseException:
                cls(trackers).close(1)
                raise
            notes.append(trackers[-1].describe())
        return cls(trackers, notes)

    def log(self, row: dict[str, Any]) -> None:
        """Every number of the metrics ``row`` to every tracker, at its ``env_steps``."""
        if self._trackers:
            numbers = {k: v for k, v in row.items() if isinstance(v, (int, float))}
            for tracker in self._trackers:
                tracker.log(numbers, row["env_steps"])

    def describe(self) -> list[str]:
        """Lines for the user: where each tracker that says more than its flag logs."""
        return list(self._notes)

    def close(self, exit_code: int = 0) -> None:
        """Close every tracker (W&B: its run finished with ``exit_code``, its service process ended); once."""
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(exit_code)

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        # a stop's status (130, 143) or an error's (1): W&B says the run did not finish
        self.close(0 if error is None else getattr(error, "exit_status", 1))


class _TensorBoard:
    """TensorBoard's event files in ``<run-dir>/tb``."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # (the extra is there: check_trackers)

        self.writer = SummaryWriter(str(run_dir / "tb"))

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)

    def close(self, exit_code: int) -> None:
        self.writer.close()


class _WandB:
    """A W&B run, its files in ``<run-dir>/wandb``: the run's settings as its config, a resumed run's the same
    W&B run (its id in ``<run-dir>/wandb_id``). W&B prints nothing: the trainer's lines stay readable."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        import wandb  # (the extra is there: check_trackers)

        self.wandb = wandb
        name, group = wandb_names(run_dir)
        try:
            self.run = wandb.init(project=cfg.wandb, name=name, group=group, config=cfg.to_dict(), dir=str(run_dir),
                                  id=_wandb_id(run_dir), resume="allow",
                                  settings=wandb.Settings(silent=True, console="off"))
        except BaseException as e:
            wandb.teardown()  # the service process it may have started
            if isinstance(e, wandb.Error):  # not logged in, no network: one line, as a setting this machine cannot run
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError("wandb", cfg.wandb, f"could not start a W&B run: {first} (without a network: "
                                  "WANDB_MODE=offline, then wandb sync)") from None
            raise

    def describe(self) -> str:
        """Where the run logs: its page, or the offline files and the command that uploads them."""
        mode = self.run.settings.mode
        if mode == "offline":
            files = Path(self.run.settings.sync_dir).resolve()
            return f"wandb: offline run {self.run.id} (upload: {sys.executable} -m wandb sync {files})"
        return f"wandb: {self.run.url}" if mode != "disabled" else "wandb: off (WANDB_MODE=disabled)"

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def close(self, exit_code: int) -> None:
        try:
            self.run.finish(exit_code=exit_code)
        finally:
            self.wandb.teardown()  # no service process outlives the run


def _wandb_id(run_dir: Path) -> str:
    """The W&B run id of the run in ``run_dir``: the one kept there, or a new one, kept (replaced whole)."""
    from checkpoints.files import POINTER_BYTES, read_small_file, write_whole

    path = run_dir / WANDB_ID
    try:
        kept = read_small_file(path, POINTER_BYTES).strip()
    except FileNotFoundError:
        kept = ""
    except (OSError, ValueError) as e:  # (ValueError: not UTF-8)
        raise ValueError(f"cannot read the run's W&B id {path}: {getattr(e, 'strerror', None) or e}; move it "
                         "aside (a new W&B run is then started) or put the run's back") from None
    if kept:
        return kept
    new = secrets.token_hex(4)  # 8 characters, as W&B's own ids
    write_whole(path, new + "\n")
    return new
