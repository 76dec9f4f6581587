"""Ape-X's own settings, declared once with their help and limits (``envs.settings``); the run's are
``trainer.config.TrainConfig``'s. Imports no torch: the command line reads them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass

from envs.settings import setting


@dataclass
class ApeXSettings:
    """What ``--algo apex`` reads besides the run's settings: the replay, the learner, the actors' exploration.

    Example:
        >>> ApeXSettings().n_step, ApeXSettings().minibatch_size
        (3, 128)
    """

    replay_capacity: int = setting(100_000, "transitions the replay holds (FIFO); its memory is printed at start",
                                   at_least=1)
    learning_starts: int = setting(2_000, "transitions in the replay before the learner starts", at_least=0)
    replay_ratio: float = setting(8.0, "transitions the learner samples per transition entering the replay",
                                  above=0)
    minibatch_size: int = setting(128, "learner minibatch size", at_least=1)
    n_step: int = setting(3, "steps of the n-step return", at_least=1)
    save_replay: bool = setting(False, "also save the replay's contents in every checkpoint, for an exact resume; it "
                                "can be gigabytes (replay_capacity x the bytes per transition printed at start), "
                                "and a run then needs up to 4 times that in memory; without it a resumed run "
                                "refills the replay", flag=False, resumable=True)
    replay_alpha: float = setting(0.6, "priority exponent (0: uniform sampling)", at_least=0, flag=False)
    replay_beta: float = setting(0.4, "importance-sampling exponent at the start, annealed linearly to 1 over "
                                 "total_steps", at_least=0, at_most=1, flag=False)
    target_update: int = setting(500, "copy the online network into the target network every this many learner "
                                 "steps", at_least=1, flag=False)
    weights_every: int = setting(400, "the actors pull the learner's weights every this many steps per env "
                                 "(rounded up to whole rollouts of num_steps)", at_least=1, flag=False)
    eps_base: float = setting(0.4, "exploration rate of env i is eps_base^(1 + eps_alpha * i / (num_envs - 1))",
                              above=0, at_most=1, flag=False)
    eps_alpha: float = setting(7.0, "see eps_base", at_least=0, flag=False)
