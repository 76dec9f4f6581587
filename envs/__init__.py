"""Simulation: the VR-edge workload (single and natively batched) and heuristic baselines.

Every name here is imported on first use, so that ``envs.settings`` (the settings mechanism, which the trainer's
command line reads before anything heavy loads) comes without NumPy or Gymnasium. Importing ``envs.vr_edge``
(which any of these names imports) registers ``VREdge-v0`` with Gymnasium.
"""

import importlib

_HOMES = {
    "BASELINES": "envs.baselines",
    "SyntheticVREdgeEnv": "envs.vr_edge",
    "VREdgeConfig": "envs.vr_edge",
    "VREdgeTorchEnv": "envs.vr_edge_torch",  # loads torch, which checking a command line must not
    "VREdgeVectorEnv": "envs.vector",
    "make_baseline": "envs.baselines",
}

__all__ = sorted(_HOMES)


def register() -> None:
    """Register ``VREdge-v0`` with Gymnasium (once; its classes load when an env is made)."""
    import gymnasium as gym
    if "VREdge-v0" not in gym.registry:
        gym.register(id="VREdge-v0", entry_point="envs.vr_edge:SyntheticVREdgeEnv",
                     vector_entry_point="envs.vector:VREdgeVectorEnv")


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
