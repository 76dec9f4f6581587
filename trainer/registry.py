"""Which algorithm runs for ``--algo NAME``: the one place that maps a name to an algorithm.

A new algorithm is a package with a subclass of ``trainer.algorithm.Algorithm`` (and, so that the command line
answers before torch loads, its ``AlgorithmSpec`` in a module that imports no torch), plus one line here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.algorithm import Algorithm, AlgorithmSpec
from trainer.apex.spec import ApeXSpec
from trainer.arguments import choose
from trainer.config import ConfigError, TrainConfig
from trainer.ppo.spec import PPOSpec

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
        raise ConfigError("algo", name, choose(name, list(ALGORITHMS)))
    return ALGORITHMS[name]


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name`` (imports it); a ``ConfigError`` on ``--algo`` otherwise.

    >>> algorithm_class("ppo").__name__
    'PPO'
    """
    return algorithm_spec(name).algorithm()


def option_owner(field: str) -> str | None:
    """The name of the algorithm that alone reads the config field ``field`` (``None``: every algorithm does)."""
    return next((name for name, cls in ALGORITHMS.items() if field in cls.options), None)


def new_run_config(given: dict[str, Any], gpu: bool = False) -> TrainConfig:
    """The config of a new run from the settings the user gave (flags, TOML keys): those win over the
    algorithm's defaults for the env, which win over ``TrainConfig``'s own; env file paths made absolute, so
    that the commands a run prints work from any directory (``TrainConfig.with_absolute_paths``).

    >>> cfg = new_run_config({"algo": "apex", "env": "CartPole-v1", "gamma": 0.95})
    >>> cfg.num_envs, cfg.n_step, cfg.gamma
    (8, 5, 0.95)
    """
    algo, env = given.get("algo", TrainConfig.algo), given.get("env", TrainConfig.env)
    return TrainConfig(**{**algorithm_spec(algo).defaults_for(env, gpu), **given}).with_absolute_paths()


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


def algorithm_defaults() -> dict[str, dict[tuple[str, str], Any]]:
    """For each config field (in ``TrainConfig``'s order) whose default depends on the algorithm or the env:
    its default per ``(algo, env)`` (env ``"*"``: every env the algorithm names no defaults for).

    >>> algorithm_defaults()["num_envs"][("apex", "*")], algorithm_defaults()["num_envs"][("ppo", "VREdge-v0")]
    (8, 64)
    """
    envs = [(env, False) for env in sorted({e for spec in ALGORITHMS.values() for e in spec.defaults} - {"*"})]
    envs += [("*", False)] + [(env, True) for env in sorted({e for s in ALGORITHMS.values() for e in s.gpu_defaults})]
    out = {}
    for f in dataclasses.fields(TrainConfig):
        per = {(algo, f"{env} with a GPU" if gpu else env): spec.defaults_for(env, gpu).get(f.name, f.default)
               for algo, spec in ALGORITHMS.items() for env, gpu in envs if not gpu or env in spec.gpu_defaults}
        if len(set(map(repr, per.values()))) > 1:
            out[f.name] = per
    return out
