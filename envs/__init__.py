"""Simulation: the VR-edge workload (single and natively batched) and heuristic baselines.

Importing this package registers ``VREdge-v0`` with Gymnasium.
"""

import gymnasium as gym

from envs.baselines import BASELINES, make_baseline
from envs.vector import VREdgeVectorEnv
from envs.vr_edge import SyntheticVREdgeEnv, VREdgeConfig

__all__ = ["BASELINES", "SyntheticVREdgeEnv", "VREdgeConfig", "VREdgeTorchEnv", "VREdgeVectorEnv", "make_baseline"]

if "VREdge-v0" not in gym.registry:
    gym.register(id="VREdge-v0", entry_point="envs.vr_edge:SyntheticVREdgeEnv",
                 vector_entry_point="envs.vector:VREdgeVectorEnv")


def __getattr__(name: str):
    if name == "VREdgeTorchEnv":  # imported on first use: it loads torch, which checking a command line must not
        from envs.vr_edge_torch import VREdgeTorchEnv
        return VREdgeTorchEnv
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
