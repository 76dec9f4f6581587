"""Simulation: the VR-edge workload (single and natively batched) and heuristic baselines.

Importing this package registers ``VREdge-v0`` with Gymnasium.
"""

import gymnasium as gym

from envs.baselines import BASELINES, make_baseline
from envs.vector import VREdgeVectorEnv
from envs.vr_edge import SyntheticVREdgeEnv, VREdgeConfig
from envs.vr_edge_torch import VREdgeTorchEnv

__all__ = ["BASELINES", "SyntheticVREdgeEnv", "VREdgeConfig", "VREdgeTorchEnv", "VREdgeVectorEnv", "make_baseline"]

if "VREdge-v0" not in gym.registry:
    gym.register(id="VREdge-v0", entry_point="envs.vr_edge:SyntheticVREdgeEnv",
                 vector_entry_point="envs.vector:VREdgeVectorEnv")
