"""PPO: an actor-critic learns on-policy from ``[T, N]`` rollouts on the learner's device.

- :mod:`.spec`: what the command line knows of PPO before torch loads (its settings, its defaults per env);
- :mod:`.algorithm`: :class:`~trainer.ppo.algorithm.PPO`, the run's state and one iteration, as the loop drives it;
- :mod:`.model`: the actor-critic (``ActorCritic``, observation normalisation, stacked MLPs);
- :mod:`.set_model`: the set actor-critic (``policy_arch = "set"``: any number of users, masked pooling);
- :mod:`.targets`: how each step bootstraps, GAE, V-trace;
- :mod:`.update`: the clipped-surrogate loss and the epochs of minibatches (``ppo_update``);
- :mod:`.optimizer`: fused Adam over one flat parameter, the learning rate a device tensor annealed in place;
- :mod:`.cuda_graph`: a minibatch step captured as one CUDA graph (``--cuda-graphs``);
- :mod:`.batching`: the minibatch planner (``python -m trainer.batching``);
- :mod:`.pipeline`: where each rollout comes from (collected after the update, or during it: ``--overlap``);
- :mod:`.reward_scaling`: ``scale_rewards``;
- :mod:`.export`: a trained policy as a TorchScript / ONNX file (``python -m trainer.export``).

The package imports nothing at import time: ``import trainer.ppo.model`` loads only what the model needs.
"""
