"""Which class runs for ``--algo NAME``: the one place that maps a name to an algorithm.

A new algorithm is a package with a subclass of ``trainer.algorithm.Algorithm``, plus one line here.
"""

from __future__ import annotations

from trainer.algorithm import Algorithm
from trainer.apex.algorithm import ApeX
from trainer.config import ConfigError
from trainer.ppo.algorithm import PPO

ALGORITHMS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "apex": ApeX,
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name``; a ``ConfigError`` on ``--algo`` naming the choices otherwise.

    >>> algorithm_class("ppo").__name__
    'PPO'
    """
    if name not in ALGORITHMS:
        *others, last = ALGORITHMS
        raise ConfigError("algo", name, f"choose {', '.join(others)} or {last}" if others else f"choose {last}")
    return ALGORITHMS[name]


def option_owner(field: str) -> str | None:
    """The name of the algorithm that alone reads the config field ``field`` (``None``: every algorithm does)."""
    return next((name for name, cls in ALGORITHMS.items() if field in cls.options), None)
