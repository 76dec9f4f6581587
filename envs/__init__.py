"""Simulation: the VR-edge workload (single and natively batched) and heuristic baselines.

Every name here is imported on first use, so that ``envs.settings`` (the settings mechanism, which the trainer's
command line reads before anything heavy loads) comes without NumPy or Gymnasium. ``VREdge-v0`` is registered with
Gymnasium by Gymnasium's conventions, ``import envs`` then ``gymnasium.make("VREdge-v0")``, or
``gymnasium.make("envs:VREdge-v0")``, without importing Gymnasium here: where it is not loaded yet, it registers the
env once it is (:func:`register_when_gymnasium_loads`).

Example:
    >>> import gymnasium, envs
    >>> gymnasium.make("VREdge-v0", num_users=2).observation_space.shape
    (19,)
"""

import importlib
import sys

_HOMES = {
    "BASELINES": "envs.baselines",
    "SyntheticVREdgeEnv": "envs.vr_edge",
    "VREdgeConfig": "envs.vr_edge",
    "VREdgeTorchEnv": "envs.vr_edge_torch",  # loads torch, which checking a command line must not
    "VREdgeVectorEnv": "envs.vector",
    "VolatilityGuard": "envs.guard",
    "make_baseline": "envs.baselines",
}

__all__ = sorted(_HOMES)


def register() -> None:
    """Register ``VREdge-v0`` with Gymnasium (once; its classes load when an env is made)."""
    import gymnasium as gym
    if "VREdge-v0" not in gym.registry:
        gym.register(id="VREdge-v0", entry_point="envs.vr_edge:SyntheticVREdgeEnv",
                     vector_entry_point="envs.vector:VREdgeVectorEnv")


class _RegisterOnImport:
    """A finder on ``sys.meta_path`` that finds nothing itself: when Gymnasium is imported it lets the other finders
    find it and, once Gymnasium's ``__init__`` has run, registers ``VREdge-v0`` and leaves ``sys.meta_path``.
    Importing Gymnasium here instead would load it (and NumPy, about 0.5 s) for ``python -m trainer.train --help``,
    which reads ``envs.settings`` only."""

    def find_spec(self, name: str, path=None, target=None):
        if name != "gymnasium":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *_: None)(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = self._then_register(spec.loader.exec_module)
                return spec
        return None

    def _then_register(self, exec_module):
        def run(module) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register()
        return run


def register_when_gymnasium_loads() -> None:
    """Register ``VREdge-v0`` now if Gymnasium is loaded, else as soon as it is (importing ``envs`` calls it)."""
    if "gymnasium" in sys.modules:
        register()
    elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


register_when_gymnasium_loads()
