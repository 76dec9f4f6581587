"""Evaluation: playing a policy over whole held-out episodes, and the statistics of what it scored.

The words: *evaluation* plays a trained policy on test episodes (``python -m trainer.evaluate``, and every run's in
``python -m trainer.compare``);
*validation* plays it on validation episodes during training (``--eval-every``, :mod:`.validation`) to pick
the best checkpoint. Each has its own seeds, and training never uses either.

- :mod:`.episodes`: the held-out seeds and env arguments, one record per episode: :func:`run_episodes` (a policy),
  :func:`reference_episodes` (a player that reads the envs), :func:`filter_episodes` (a stateful controller);
- :mod:`.statistics`: means with 95% CIs, paired differences, the gap closed, Jain's index;
- :mod:`.servable`: the one rule by which an evaluation says that nobody serves a cell (``UNSERVABLE``);
- :mod:`.aggregate`: over runs, as rliable: the interquartile mean, the probability of improvement, stratified
  bootstrap CIs;
- :mod:`.policies`: a checkpoint's policy (the run's best or latest), built by its algorithm;
- :mod:`.baselines`: the heuristic baselines a policy is compared with, and the best of them;
- :mod:`.report`: the results table and plot;
- :mod:`.comparison` and :mod:`.curves`: groups of runs compared (``python -m trainer.compare``), their learning
  curves;
- :mod:`.validation`: validation during training and the ``best`` checkpoint pointer.
"""

from trainer.evaluation.episodes import (
    batched_reference_episodes,
    evaluation_seeds,
    filter_episodes,
    held_out_env_kwargs,
    policy_actions,
    reference_episodes,
    run_episodes,
    validation_seeds,
)
from trainer.evaluation.statistics import gap_closed, jain_index, paired_difference, summarize, t_quantile_975

__all__ = ["batched_reference_episodes", "evaluation_seeds", "filter_episodes", "gap_closed", "held_out_env_kwargs",
           "jain_index", "paired_difference", "policy_actions", "reference_episodes", "run_episodes", "summarize",
           "t_quantile_975", "validation_seeds"]
