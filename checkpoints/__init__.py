"""Persistence: atomic checksummed checkpoints, safe loading, retention, `latest` and `best` pointers, run-dir locks,
and one way to read a run's small files (regular files only, capped: `checkpoints.files`), and a file's content hash
(`content_hash`: what results name a checkpoint by).

Knows nothing of what it stores: any nest of dicts, lists, tuples, tensors, NumPy
arrays and plain Python values.
"""

from checkpoints.files import UnreadableFileError, appending, content_hash, read_small_file, reading
from checkpoints.run_dir import (
    NO_BEST,
    RunDirLock,
    RunDirLockedError,
    best_checkpoint,
    best_info,
    best_or_why_not,
    checkpoint_files,
    checkpoint_iteration,
    checkpoint_name,
    checkpoint_order,
    lagging_latest,
    latest_loadable,
    remove_partial_saves,
    revision_of,
    run_dir_of,
    save_in_run_dir,
    set_aside_newer,
    set_best,
)
from checkpoints.store import FORMAT_VERSION, CheckpointError, load, save

__all__ = ["FORMAT_VERSION", "NO_BEST", "CheckpointError", "UnreadableFileError", "appending", "content_hash",
           "read_small_file", "reading", "RunDirLock", "RunDirLockedError", "best_checkpoint", "best_info",
           "best_or_why_not",
           "checkpoint_files", "checkpoint_iteration", "checkpoint_name", "checkpoint_order",
           "lagging_latest", "latest_loadable", "load", "remove_partial_saves", "revision_of", "run_dir_of",
           "save", "save_in_run_dir", "set_aside_newer", "set_best"]
