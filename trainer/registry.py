"""Which algorithm runs for ``--algo NAME``: the one place that maps a name to an algorithm.

A new algorithm is a package with a subclass of ``trainer.algorithm.Algorithm`` (and, so that the command line
answers before torch loads, its ``AlgorithmSpec`` in a module that imports no torch), plus one line here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainer.algorithm import Algorithm, AlgorithmSpec
from trainer.apex.spec import ApeXSpec
from trainer.arguments import did_you_mean
from trainer.config import ConfigError, TrainConfig
from trainer.ppo.spec import PPOSpec
from trainer.settings import Limits

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


def owners(key: str) -> tuple[str, ...]:
    """The algorithms that declare the setting ``key`` as their own (``()``: it is the run's, every algorithm's).

    >>> owners("epochs"), owners("minibatch_size"), owners("num_envs")
    (('ppo',), ('ppo', 'apex'), ())
    """
    return tuple(name for name, spec in ALGORITHMS.items() if key in spec.Settings.__dataclass_fields__)


def renamed(values: Mapping[str, Any], algo: str | None = None) -> dict[str, Any]:
    """``values`` with the old spellings of settings (each algorithm's ``Settings.renamed``) read as the new: of
    ``algo`` (a stored config, whose algorithm is known), or of every algorithm (``None``: a command line).

    >>> renamed({"batch_size": 256, "num_envs": 8}, "ppo")
    {'minibatch_size': 256, 'num_envs': 8}
    """
    names = renamed_names(algo)
    return {names.get(k, k): v for k, v in values.items()}


def renamed_names(algo: str | None = None) -> dict[str, str]:
    """Old setting names, and the new each stands for: ``algo``'s, or every algorithm's (``None``)."""
    return {old: new for name, spec in ALGORITHMS.items() if algo in (None, name)
            for old, new in getattr(spec.Settings, "renamed", {}).items()}


def setting_fields() -> list[tuple[str, dataclasses.Field]]:
    """Every setting as ``(owner, field)``: the run's (owner ``""``) then each algorithm's, in declaration order;
    a setting two algorithms declare comes once, with the first's field."""
    out = [("", f) for f in dataclasses.fields(TrainConfig) if f.name != "algo_settings"]
    seen = {f.name for _, f in out}
    for name, spec in ALGORITHMS.items():
        out += [(name, f) for f in dataclasses.fields(spec.Settings) if f.name not in seen]
        seen |= {f.name for f in dataclasses.fields(spec.Settings)}
    return out


def new_run_config(given: dict[str, Any], gpu: bool = False) -> TrainConfig:
    """The config of a new run from the settings the user gave (flags, TOML keys): those win over the
    algorithm's defaults for the env, which win over ``TrainConfig``'s own; env file paths made absolute, so
    that the commands a run prints work from any directory (``TrainConfig.with_absolute_paths``).

    >>> cfg = new_run_config({"algo": "apex", "env": "CartPole-v1", "gamma": 0.95})
    >>> cfg.num_envs, cfg.algo_settings.n_step, cfg.gamma
    (8, 5, 0.95)
    """
    algo, env = given.get("algo", TrainConfig.algo), given.get("env", TrainConfig.env)
    return TrainConfig.from_dict({**algorithm_spec(algo).defaults_for(env, gpu), **given}).with_absolute_paths()


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
    """For each setting (in :func:`setting_fields`' order) whose default depends on the algorithm or the env:
    its default per ``(algo, env)`` (env ``"*"``: every env the algorithm names no defaults for).

    >>> algorithm_defaults()["num_envs"][("apex", "*")], algorithm_defaults()["num_envs"][("ppo", "VREdge-v0")]
    (8, 64)
    """
    envs = [(env, False) for env in sorted({e for spec in ALGORITHMS.values() for e in spec.defaults} - {"*"})]
    envs += [("*", False)] + [(env, True) for env in sorted({e for s in ALGORITHMS.values() for e in s.gpu_defaults})]
    out = {}
    for _, f in setting_fields():
        readers = owners(f.name) or tuple(ALGORITHMS)
        per = {(algo, f"{env} with a GPU" if gpu else env): spec.defaults_for(env, gpu).get(f.name, _default(spec, f))
               for algo, spec in ALGORITHMS.items() if algo in readers
               for env, gpu in envs if not gpu or env in spec.gpu_defaults}
        if len(set(map(repr, per.values()))) > 1:
            out[f.name] = per
    return out


def _default(spec: type[AlgorithmSpec], f: dataclasses.Field) -> Any:
    """The declared default of the setting ``f`` for the algorithm ``spec`` (its own field's, where it declares
    one of that name)."""
    own = spec.Settings.__dataclass_fields__.get(f.name)
    return (own or f).default
