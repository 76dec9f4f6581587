"""What a model needs to know of its env: the observation and action spaces, and how actions split into heads."""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym

import envs.vr_edge  # noqa: F401 - registers VREdge-v0
from envs.arguments import KINDS, shown
from envs.settings import ConfigError, did_you_mean
from trainer.arguments import command
from trainer.common.policy_layout import FLAT, PolicyLayout

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def check_env_id(env: str) -> None:
    """Raise ``ConfigError`` unless ``env`` is a registered Gymnasium id, or ``module:id`` (Gymnasium's syntax:
    the module, imported here, registers the id)."""
    module, _, name = env.rpartition(":")
    before = set(gym.registry) if module else set()
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError("env", env,
                              message=f"--env {env!r}: cannot import {module!r} ({e}); run from the "
                                      "directory that holds it, or add that directory to PYTHONPATH") from None
    if name in gym.registry:
        return
    if module:  # the module imported: the ids it registers are the ones to choose from
        # what its import registered (a first import), and the ids whose envs it holds (an import done before)
        registered = sorted(set(gym.registry) - before | {
            i for i, spec in gym.registry.items()
            if _entry_module(spec.entry_point) == module or _entry_module(spec.entry_point).startswith(module + ".")})
        which = f"; it registers {', '.join(registered)}" if registered else \
            "; it registers no env (a gymnasium.register call it should make when imported?)"
        raise ConfigError("env", env, message=f"--env {env!r}: {module} does not register {name!r}"
                                              f"{did_you_mean(name, registered)}{which}")
    raise ConfigError("env", env,
                      message=f"unknown env id {name!r}{did_you_mean(name, gym.registry)}: register it with "
                              "gymnasium first (e.g. CartPole-v1, VREdge-v0), or name the module that registers "
                              "it as module:id")


def _entry_module(entry_point: Any) -> str:
    """The module an env spec's entry point lives in (``"pkg.mod:Cls"`` or a callable); ``""`` if none."""
    if isinstance(entry_point, str):
        return entry_point.partition(":")[0]
    return getattr(entry_point, "__module__", "") or ""


class ActionHeads(NamedTuple):
    """How a policy acts in an action space: ``kind`` is ``"discrete"`` (one categorical head), ``"multi"``
    (a 1-D ``MultiDiscrete``: one categorical head per entry) or ``"box"`` (a 1-D ``Box`` of reals);
    ``sizes`` are the actions of each head (for ``"box"``: the action's dimension, one entry)."""

    kind: str
    sizes: list[int]


def action_heads(space: gym.Space) -> ActionHeads | None:
    """The heads of ``space``, or ``None`` for a space no model here acts in (each model says what it takes).

    >>> action_heads(gym.spaces.MultiDiscrete([3, 3])), action_heads(gym.spaces.Tuple([]))
    (ActionHeads(kind='multi', sizes=[3, 3]), None)
    """
    if isinstance(space, gym.spaces.Discrete):
        return ActionHeads("discrete", [int(space.n)])
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return ActionHeads("multi", [int(n) for n in space.nvec])
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return ActionHeads("box", [int(space.shape[0])])
    return None


def constructor_parameters(env: str) -> dict[str, inspect.Parameter] | None:
    """The parameters the constructor of ``env`` (an id or ``module:id``) names, which ``gym.make(env, **kwargs)``
    passes on, but ``render_mode`` (a training run renders nothing); ``None`` where it takes ``**kwargs`` (any name
    may be valid) or its signature cannot be read.

    >>> list(constructor_parameters("CartPole-v1"))
    ['sutton_barto_reward']
    """
    spec = gym.spec(env.rpartition(":")[2])
    try:
        creator = spec.entry_point if callable(spec.entry_point) else \
            gym.envs.registration.load_env_creator(spec.entry_point)
        parameters = inspect.signature(creator).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and
            p.name != "render_mode"}


def _mistyped_argument(env: str, given: dict[str, Any], parameters: dict[str, inspect.Parameter]) -> str:
    """What is wrong with the first value of ``given`` that is not of the kind of its parameter's default
    (``sutton_barto_reward=abc`` would be taken as a true string); ``""`` where each fits or has no default."""
    for name, value in given.items():
        default = parameters[name].default if name in parameters else None
        ok, said = KINDS.get(type(default).__name__, (None, ""))
        if ok is not None and not ok(value):
            return (f"{env}'s argument {name}={shown(value)} is invalid: must be {said} "
                    f"(its default is {shown(default)})")
    return ""


def _refused_arguments(env: str, given: dict, error: TypeError, parameters: dict[str, inspect.Parameter] | None,
                       ) -> str:
    """Why ``gym.make(env, **given)`` raised ``error``: the arguments the constructor does not name (of its
    ``parameters``), with the ones it does; gymnasium's own text where the signature cannot tell."""
    known = list(parameters) if parameters is not None else None
    unknown = sorted(set(given) - set(known)) if known is not None else []
    if not unknown:  # a named argument with a value the constructor refused, or a constructor taking **kwargs
        raised = error.__context__ if isinstance(error.__context__, TypeError) else error  # (gym.make rewraps it)
        return f"{env} refused them ({raised}); pass only its constructor's arguments, with values it takes"
    takes = f"its arguments are {', '.join(known)}" if known else "it takes none"
    return (f"{env} has no argument {', '.join(unknown)}{did_you_mean(unknown, known)}; {takes} (drop "
            f"{'it' if len(unknown) == 1 else 'them'})")


def model_spaces(cfg: TrainConfig) -> tuple[gym.Space, gym.Space, PolicyLayout]:
    """``(observation space, action space, layout)`` of ``cfg.env`` as ``policy_arch`` asks (the one place a
    :class:`~trainer.common.policy_layout.PolicyLayout` is decided): ``per_head`` on the env's
    ``head_observation_layout`` ``(features per head, shared features)`` for ``per_head``, and ``auto`` where the
    env declares one; ``set`` for ``set``, and ``auto`` where the env also declares an ``active_user_feature`` (its
    user count varies); ``flat`` otherwise."""
    check_env_id(cfg.env)  # a module:id's module imported (gymnasium's own error would be a traceback)
    parameters = constructor_parameters(cfg.env) if cfg.env_options else None
    mistyped = _mistyped_argument(cfg.env, cfg.env_options, parameters) if parameters else ""
    if mistyped:  # before gym.make: the constructor would take the value as it is
        raise ConfigError("env_kwargs", cfg.env_kwargs, message=f"--env-kwargs: {mistyped}")
    try:
        env = gym.make(cfg.env, **cfg.env_options)
    except gym.error.DependencyNotInstalled as e:  # (Box2D, MuJoCo, Atari's ROMs: gymnasium says what to install)
        from collectors.base import one_line  # (here: it brings torch, which this module's importers may not want)

        raise ConfigError("env", cfg.env, message=f"--env {cfg.env} needs a package that is not installed: "
                          f"{one_line(e)} (with this interpreter's pip: {command('-m', 'pip', 'install')} ...)"
                          ) from None
    except TypeError as e:
        if not cfg.env_options:
            raise
        # the first env this run builds: --env-kwargs the env's constructor does not take
        raise ConfigError("env_kwargs", cfg.env_kwargs,
                          _refused_arguments(cfg.env, cfg.env_options, e, parameters)) from None
    try:
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:  # what every model here takes
            raise ConfigError("env", cfg.env, message=f"{cfg.env}'s observations are {space}; the policies here "
                              "take a flat Box: register the env wrapped in gymnasium.wrappers.FlattenObservation")
        return env.observation_space, env.action_space, _layout(cfg, env.unwrapped)
    finally:
        env.close()


def _layout(cfg: TrainConfig, env: gym.Env) -> PolicyLayout:
    """The layout ``cfg.policy_arch`` asks of ``env`` (unwrapped); ``ConfigError`` where the env declares none."""
    split = getattr(env, "head_observation_layout", None)
    active = getattr(env, "active_user_feature", None)
    if cfg.policy_arch in ("per_head", "set") and split is None:
        raise ConfigError("policy_arch", cfg.policy_arch, f"{cfg.env} declares no head_observation_layout; use "
                          "policy_arch = \"flat\" or \"auto\"", flag=False)
    if cfg.policy_arch == "set" or (cfg.policy_arch == "auto" and split is not None and active is not None):
        return PolicyLayout("set", int(split[0]), int(split[1]), None if active is None else int(active))
    if cfg.policy_arch in ("auto", "per_head") and split is not None:
        return PolicyLayout("per_head", int(split[0]), int(split[1]))
    return FLAT
