"""Persistence: atomic checkpoint files, safe loading, retention and a ``latest`` pointer.

Knows nothing of what it stores: any nest of dicts, lists, tuples, tensors, NumPy
arrays and plain Python values.
"""

from checkpoints.run_dir import latest_loadable, save_in_run_dir
from checkpoints.store import FORMAT_VERSION, CheckpointError, load, save

__all__ = ["FORMAT_VERSION", "CheckpointError", "latest_loadable", "load", "save", "save_in_run_dir"]
