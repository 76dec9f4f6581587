"""The Ape-X tier's Ray actors (imported only for ``--algo apex --backend ray``: nothing else loads Ray's plumbing).

An actor imports what it acts with and nothing of the learner's side: no replay, no checkpoints, no run directory.
"""

from __future__ import annotations

import numpy as np
import torch

from collectors.backends.ray_ import RolloutWorker
from collectors.seeding import noise_keys
from trainer.apex.dqn import initial_priorities
from trainer.apex.exploration import EpsilonGreedy
from trainer.apex.nstep import NStepBuilder


class ApexWorker(RolloutWorker):
    """A Ray actor of the Ape-X tier: acts epsilon-greedily on its envs with its own copy of the network,
    builds the n-step transitions and computes their initial priorities itself, and returns those
    (``batch``: the transitions plus ``priorities``, ``[B]``) instead of the rollout.

    Used through ``RayCollector(..., worker_cls=ApexWorker, worker_kwargs={"n_step": n, "gamma": g})``;
    dead actors are replaced and their envs reseeded by the ``ray`` backend, as for any worker.
    """

    def __init__(self, env_fns: list, policy: EpsilonGreedy, num_steps: int, seeds: list[int], first_index: int,
                 policy_seed: int, n_step: int, gamma: float) -> None:
        super().__init__(env_fns, policy, num_steps, seeds, first_index, policy_seed)
        # the envs of a replaced actor are reseeded, so their noise keys are new: they keep their slots' epsilons
        keys = policy.keys.clone()
        keys[first_index:first_index + len(seeds)] = torch.tensor(noise_keys(seeds), dtype=torch.int64)
        self.collector.policy.keys = keys
        self.builder = NStepBuilder(n_step, gamma)

    def batch(self, rollout) -> dict[str, np.ndarray]:
        transitions = self.builder.add(rollout)
        transitions["priorities"] = initial_priorities(self.collector.policy.q, transitions)
        return {k: v.numpy() for k, v in transitions.items()}
