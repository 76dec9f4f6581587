"""Which algorithm runs for ``--algo NAME``: the one place that maps a name to an algorithm.

A new algorithm is a package with a subclass of ``trainer.algorithm.Algorithm`` (and, so that the command line
answers before torch loads, its ``AlgorithmSpec`` in a module that imports no torch), plus one line here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envs.settings import ConfigError, Limits, did_you_mean
from trainer.algorithm import Algorithm, AlgorithmSpec
from trainer.apex.spec import ApeXSpec
from trainer.ppo.spec import PPOSpec

if TYPE_CHECKING:
    from trainer.config import TrainConfig

ALGORITHMS: dict[str, type[AlgorithmSpec]] = {
    "ppo": PPOSpec,
    "apex": ApeXSpec,
}


def algorithm_spec(name: str) -> type[AlgorithmSpec]:
    """What the command line knows of the algorithm registered as ``name`` (no torch import); a
    ``ConfigError`` on ``--algo`` naming the choices otherwise.

    >>> algorithm_spec("ppo").__name__
    'PPOSpec'
    """
    if name not in ALGORITHMS:
        raise ConfigError("algo", name, f"must be {Limits(choices=tuple(ALGORITHMS)).rule()}",
                          hint=did_you_mean(name, ALGORITHMS))
    return ALGORITHMS[name]


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name`` (imports it); a ``ConfigError`` on ``--algo`` otherwise.

    >>> algorithm_class("ppo").__name__
    'PPO'
    """
    return algorithm_spec(name).algorithm()


def settings_class(name: str) -> type:
    """The dataclass of the settings the algorithm registered as ``name`` declares (``TrainConfig.algo_settings``);
    a ``ConfigError`` on ``--algo`` otherwise."""
    return algorithm_spec(name).Settings


def default_settings(name: str) -> Any:
    """The settings of the algorithm registered as ``name`` at their defaults; ``None`` for a name that is not
    registered (``TrainConfig.validate`` names the choices)."""
    return ALGORITHMS[name].Settings() if name in ALGORITHMS else None


def owners(key: str) -> tuple[str, ...]:
    """The algorithms that declare the setting ``key`` as their own (``()``: it is the run's, every algorithm's).

    >>> owners("epochs"), owners("minibatch_size"), owners("n_step"), owners("num_envs")
    (('ppo',), ('ppo', 'apex'), ('apex',), ())
    """
    return tuple(name for name, spec in ALGORITHMS.items() if key in spec.Settings.__dataclass_fields__)


def reads(algo: str, key: str) -> bool:
    """Whether the algorithm ``algo`` reads the setting ``key``: the run's settings, and its own.

    >>> reads("apex", "num_envs"), reads("apex", "epochs"), reads("ppo", "epochs")
    (True, False, True)
    """
    return not owners(key) or algo in owners(key)


def takes_gpu_defaults(cfg: TrainConfig, given: dict[str, Any]) -> bool:
    """Whether a new run of ``cfg`` takes its algorithm's GPU defaults for its env: it learns on CUDA and the user
    chose no other backend than theirs. Torch is imported (to count GPUs) only where the answer depends on it."""
    mine = algorithm_spec(cfg.algo).gpu_defaults.get(cfg.env)
    if cfg.device == "cpu" or not mine or given.get("backend", mine.get("backend")) != mine.get("backend"):
        return False
    if cfg.device != "auto":
        return True
    import torch
    return torch.cuda.device_count() > 0
