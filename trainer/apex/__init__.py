"""Ape-X (Horgan et al., 2018): epsilon-greedy actors feed a prioritized replay; one learner trains a double DQN.

- :mod:`.spec`: what the command line knows of Ape-X before torch loads (its settings, its defaults per env);
- :mod:`.algorithm`: :class:`~trainer.apex.algorithm.ApeX`, the run's state and one iteration, as the loop drives it;
- :mod:`.q_network`: the dueling, branching Q-network;
- :mod:`.exploration`: Ape-X's epsilons and the actors' keyed epsilon-greedy policy;
- :mod:`.dqn`: double-DQN targets, the loss, priorities;
- :mod:`.nstep`: n-step transitions from rollouts;
- :mod:`.replay`: the prioritized replay (a sum tree over a FIFO storage);
- :mod:`.ray_worker`: the Ray actor that builds its own transitions and priorities (it imports only what an
  actor needs: no replay, no checkpoints, no run directory).

The package imports nothing at import time, so that a Ray actor loads only :mod:`.ray_worker`'s imports.
"""
