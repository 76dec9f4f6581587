"""Whether a run fits the machine's memory: what one env of it holds, and how many copies of its rollout the machine
keeps (the arithmetic and the message are ``TrainConfig.check_memory``'s)."""

from __future__ import annotations

import math

from envs.vr_edge import MEMORY_ARGUMENTS, VREdgeConfig
from trainer.common.devices import learner_device
from trainer.common.spaces import action_heads, model_spaces
from trainer.config import EnvSizes, TrainConfig
from trainer.run_layout import Machine


def check_memory(cfg: TrainConfig, machine: Machine) -> None:
    """``ConfigError`` where the run would need more memory than ``machine`` has available
    (``TrainConfig.check_memory``); nothing is checked where that is not known (a machine a test simulates)."""
    if machine.memory is not None:
        copies = _rollout_copies(cfg, learner_device(cfg.device, machine.gpus))
        cfg.check_memory(_env_sizes(cfg), copies, machine.memory)


def _env_sizes(cfg: TrainConfig) -> EnvSizes:
    """What one env of the run holds, in bytes: VR-edge's from its arguments (nothing is built: its observation may
    be what does not fit), any other env's from the spaces of one built."""
    if cfg.env == "VREdge-v0":
        vr = VREdgeConfig(**cfg.env_options)
        observation = 4 * vr.obs_dim  # float32
        return EnvSizes(observation, action=8 * vr.num_users, scores=vr.num_users * vr.num_levels,
                        own=vr.state_bytes + 2 * observation, scaled_by=MEMORY_ARGUMENTS)  # (+ its space's bounds)
    observations, actions, _ = model_spaces(cfg)
    observation = observations.dtype.itemsize * math.prod(observations.shape)
    heads = action_heads(actions)
    if heads is None:  # no policy here acts in it: the algorithm says so once the layout is made
        return EnvSizes(observation, action=0, scores=0)
    action = 4 * heads.sizes[0] if heads.kind == "box" else 8 * len(heads.sizes)  # float32 reals, int64 choices
    return EnvSizes(observation, action, scores=sum(heads.sizes))


def _rollout_copies(cfg: TrainConfig, device: str) -> int:
    """Copies of a rollout in this machine's memory: the collector's, and on a CPU learner the one it learns on
    (``RolloutStorage.to_device`` copies); with ``--overlap``, the collecting process's two, the shared buffer it
    hands them over in and this process's own; ``--backend device`` writes its one on the learner's device, not
    here when that is a GPU."""
    on_cpu = device == "cpu"
    if cfg.backend == "device":
        return int(on_cpu)
    if cfg.overlap:
        return 4
    return 2 if on_cpu else 1
