"""The experiments users run over many trainings: seeds (``trainer.train --seeds``), sweeps (``trainer.sweep``),
and the jobs that run several of them at once on one machine (:mod:`trainer.experiments.jobs`)."""
