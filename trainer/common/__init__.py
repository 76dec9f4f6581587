"""What the algorithms share: a model's spaces, the learner's device, RNG capture and CPU copies for checkpoints,
flat parameters, running moments and keyed sampling noise."""
