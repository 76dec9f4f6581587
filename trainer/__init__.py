"""Learning: algorithms that learn from the rollouts of ``collectors``, the durable loop that runs them, and the
command lines.

- ``python -m trainer.train``, ``trainer.evaluate``, ``trainer.export``, ``trainer.batching``: the command lines
  (thin: they parse flags and call the library; no library module imports them);
- :mod:`trainer.train`: the loop, the same for every algorithm; :mod:`trainer.algorithm`: what it asks of an
  algorithm (and what the command line knows of one before torch loads: its spec, its defaults per env);
  :mod:`trainer.registry`: ``--algo`` name -> algorithm;
- :mod:`trainer.ppo`, :mod:`trainer.apex`: one package per algorithm;
- :mod:`trainer.evaluation`: episodes on held-out seeds, their statistics, a checkpoint's policy, validation
  during training;
- :mod:`trainer.common`: what the algorithms share (model spaces, devices, RNG capture, CPU copies, flat
  parameters, moments, keyed noise);
- :mod:`trainer.config` (the settings), :mod:`trainer.flags` (as flags and TOML), :mod:`trainer.run_layout`
  (the run's shape on the machine), :mod:`trainer.thread_plan` (its thread counts, chosen by timing),
  :mod:`trainer.run_files` (claiming and resuming a run directory),
  :mod:`trainer.metrics`, :mod:`trainer.interrupts` (stop signals at safe points), :mod:`trainer.arguments`
  (one-line command-line errors with "did you mean").

A trained policy in three lines (:func:`trainer.load_policy`, a run directory or a checkpoint file)::

    import trainer
    policy = trainer.load_policy("runs/my-run")
    action = policy(observation)  # NumPy in, NumPy out: one observation or a batch
"""

from typing import Any

__all__ = ["TrainedPolicy", "load_policy"]
_POLICIES = {"TrainedPolicy", "load_policy"}  # trainer.evaluation.policies's: torch loads on first use


def __getattr__(name: str) -> Any:
    """``load_policy`` and ``TrainedPolicy``, imported on first use: the package's import must not load torch
    (``python -m trainer.train --help`` answers before it does). ``__version__``, read on first use:
    importlib.metadata takes half of this package's import time, and ``python -m trainer.train`` handles Ctrl-C
    only once its imports are done (the shorter, the better)."""
    if name in _POLICIES:
        from trainer.evaluation import policies

        return getattr(policies, name)
    if name != "__version__":
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("parallel-rollouts")
    except PackageNotFoundError:  # running from a source tree that was not installed
        value = "0+unknown"
    globals()["__version__"] = value  # later lookups skip this function
    return value
