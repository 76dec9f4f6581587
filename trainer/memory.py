"""Whether a run fits the machine's memory: what one env of it holds, how many copies of its rollout the machine
keeps, the bytes that makes, and which setting to lower when it does not fit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from envs.profiles import EnvSizes, profile_of
from envs.settings import ConfigError
from trainer.arguments import counted
from trainer.common.devices import learner_device
from trainer.common.spaces import action_heads, model_spaces
from trainer.config import TrainConfig
from trainer.run_layout import Machine


def check_memory(cfg: TrainConfig, machine: Machine) -> None:
    """``ConfigError`` where the run would need more memory than ``machine`` has available
    (:func:`check_fits`); nothing is checked where that is not known (a machine a test simulates)."""
    device = learner_device(cfg.device, machine.gpus)
    if machine.memory is not None:
        check_fits(cfg, _env_sizes(cfg), _rollout_copies(cfg, device), machine.memory)
    if device != "cpu" and machine.gpu_memory is not None:  # the learner's copy; the device backend's envs too
        env = _env_sizes(cfg)
        on_gpu = env if cfg.backend == "device" else dataclasses.replace(env, own=0, scores=0)
        check_fits(cfg, on_gpu, 1, machine.gpu_memory, where="GPU memory")


def _env_sizes(cfg: TrainConfig) -> EnvSizes:
    """What one env of the run holds, in bytes: from its arguments where its profile says how (nothing is built: its
    observation may be what does not fit), else from the spaces of one built."""
    if (sizes := profile_of(cfg.env).sizes) is not None:
        return sizes(cfg.env_options)
    observations, actions, _ = model_spaces(cfg)
    observation = observations.dtype.itemsize * math.prod(observations.shape)
    heads = action_heads(actions)
    if heads is None:  # no policy here acts in it: the algorithm says so once the layout is made
        return EnvSizes(observation, action=0, scores=0)
    action = 4 * heads.sizes[0] if heads.kind == "box" else 8 * len(heads.sizes)  # float32 reals, int64 choices
    return EnvSizes(observation, action, scores=sum(heads.sizes))


def check_cells_fit(env: str, asked: str, env_kwargs: dict[str, Any], envs_at_once: int, available: int | None,
                    widest_layer: int = 0, fewer_with: str = "--episodes", policy_rows: int | None = None) -> None:
    """Raise :class:`ConfigError` (``--users``, given as ``asked``) where ``envs_at_once`` envs of ``env`` (one with
    cells of users: VR-edge) and ``env_kwargs`` (the cells' arguments, their ``num_users`` slots the most of them),
    and a policy acting on each user slot whose widest layer has ``widest_layer`` units (a float32 output each, for
    every slot of the ``policy_rows`` envs it acts on at once; ``None``: every env), would need more than
    ``available`` bytes of memory (``None``: not known, and not checked); the error names the most users that fit
    and ``fewer_with``, the flag that plays fewer envs at once. Only what the envs, their observations and the
    policy's scores hold is counted besides (not the episodes' records, nor the interpreter): an evaluation refused
    would not have fitted, and it is refused before anything is built (``trainer.evaluate --users 100000000`` was
    an allocation error once the policy had loaded).

    >>> check_cells_fit("VREdge-v0", "2,100000000", {"num_users": 100_000_000}, envs_at_once=16, available=64 << 30)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --users 2,100000000: cells of 100,000,000 user slots would need at least 256.3 GiB \
of memory, more than the 64.0 GiB available here (16 envs at once, 17,200,000,157 bytes each); at most 24,970,739 \
users fit (a lower --episodes plays fewer envs at once)
    """
    profile = profile_of(env)

    def needed(users: int) -> int:  # (every slot active, no traces: what any cell of these slots holds at least)
        untraced = {k: v for k, v in env_kwargs.items() if k not in profile.trace_arguments}
        env = profile.sizes({**untraced, "num_users": users, "users": users})
        acting = envs_at_once if policy_rows is None else min(policy_rows, envs_at_once)
        return envs_at_once * (env.observation + env.action + env.per_env) + acting * 4 * widest_layer * users

    slots = env_kwargs["num_users"]
    if available is None or needed(slots) <= available:
        return
    most = _most_that_fits(available, needed, slots)
    fewer = f" (a lower {fewer_with} plays fewer envs at once)" if envs_at_once > 1 else ""
    raise ConfigError("users", asked, message=(
        f"--users {asked}: cells of {slots:,} user slots would need at least {_bytes(needed(slots))} of memory, more "
        f"than the {_bytes(available)} available here ({counted(envs_at_once, 'env')} at once, "
        f"{needed(slots) // envs_at_once:,} bytes each); "
        + (f"at most {most:,} users fit{fewer}" if most else f"not even one user fits{fewer}")))


def _rollout_copies(cfg: TrainConfig, device: str) -> int:
    """Copies of a rollout in this machine's memory: the collector's, and on a CPU learner the one it learns on
    (``RolloutStorage.to_device`` copies); with ``--overlap``, the collecting process's two, the shared buffer it
    hands them over in and this process's own; ``--backend device`` writes its one on the learner's device, not
    here when that is a GPU."""
    on_cpu = device == "cpu"
    if cfg.backend == "device":
        return int(on_cpu)
    if cfg.overlap:
        return 4
    return 2 if on_cpu else 1


def check_fits(cfg: TrainConfig, env: EnvSizes, copies: int, available: int, where: str = "memory") -> None:
    """Raise :class:`ConfigError` where the run would need more than ``available`` bytes of memory
    (:func:`memory_needed`), naming the setting that makes it so: the env's arguments where it would not fit
    even at the default sizes, else ``num_steps`` or ``num_envs``, whichever back at its default would
    save more, with the most of it that fits. ``copies``: of the rollout, in this memory (``where``: which).

    >>> vr = EnvSizes(observation=244, action=64, scores=48, own=1033)
    >>> check_fits(TrainConfig(num_steps=10**9), vr, copies=2, available=128 << 30)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --num-steps=1000000000: the run would need at least 65.1 TiB of \
memory, more than the 128.0 GiB available here (a rollout of 1,000,000,000 x 64 env steps at 559 bytes each, in 2 \
copies, and 1,225 bytes per env besides); at most 1,920,824 steps fit with --num-envs 64
    """
    needed = memory_needed(cfg.num_steps, cfg.num_envs, env, copies)
    if needed <= available:
        return
    steps, envs = min(cfg.num_steps, TrainConfig.num_steps), min(cfg.num_envs, TrainConfig.num_envs)
    why = (f"the run would need at least {_bytes(needed)} of {where}, more than the {_bytes(available)} available "
           f"here (a rollout of {cfg.num_steps:,} x {cfg.num_envs:,} env steps at {rollout_step_bytes(env):,} "
           f"bytes each, in {counted(copies, 'copy', 'copies')}, and {env.per_env:,} bytes per env besides)")
    if memory_needed(steps, envs, env, copies) > available:  # the env's own sizes
        scaling = [name for name in env.scaled_by if name in cfg.env_options]
        key = "env_kwargs" if cfg.env_kwargs else "env"
        raise ConfigError(key, getattr(cfg, key), f"{why}; not even {steps:,} x {envs:,} env steps fit"
                          + (f": lower {' or '.join(scaling)}" if scaling else ""))
    if memory_needed(steps, cfg.num_envs, env, copies) <= memory_needed(cfg.num_steps, envs, env, copies):
        most = _most_that_fits(available, lambda t: memory_needed(t, cfg.num_envs, env, copies), cfg.num_steps)
        raise ConfigError("num_steps", cfg.num_steps, f"{why}; " + (
            f"at most {most:,} steps fit with --num-envs {cfg.num_envs}" if most else
            f"not one step fits with --num-envs {cfg.num_envs}: lower both"))
    most = _most_that_fits(available, lambda n: memory_needed(cfg.num_steps, n, env, copies), cfg.num_envs)
    raise ConfigError("num_envs", cfg.num_envs, f"{why}; " + (
        f"at most {most:,} envs fit with --num-steps {cfg.num_steps}" if most else
        f"not one env fits with --num-steps {cfg.num_steps}: lower both"))


def rollout_step_bytes(env: EnvSizes) -> int:
    """Bytes of one env's step in a rollout (``collectors.storage``): its observation, its final observation, its
    action, the reward (float32) and three flags (terminated, truncated, the final observation's mask)."""
    return 2 * env.observation + env.action + 4 + 3


def memory_needed(num_steps: int, num_envs: int, env: EnvSizes, copies: int) -> int:
    """Bytes a run needs at least: ``copies`` of its ``[num_steps, num_envs]`` rollout with the observations that
    follow it, and per env what :attr:`EnvSizes.per_env` says (what more the run holds, its network and
    interpreters, is not counted: a run refused for memory would not have fitted).

    >>> memory_needed(128, 64, EnvSizes(observation=244, action=64, scores=48, own=1033), copies=2)
    9268288
    """
    return num_envs * (copies * (num_steps * rollout_step_bytes(env) + env.observation) + env.per_env)


def _most_that_fits(available: int, needed: Callable[[int], int], over: int) -> int:
    """The largest count below ``over`` whose ``needed`` bytes are at most ``available`` (0: not even one); the
    need grows with the count."""
    low, high = 0, over
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if needed(middle) <= available else (low, middle)
    return low


def _bytes(n: int) -> str:
    """``n`` bytes in the largest unit from MiB to EiB that it holds once: ``65.1 TiB``, ``100.0 MiB``."""
    units = ("MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(max((n.bit_length() - 1) // 10 - 2, 0), len(units) - 1)
    return f"{n / 2 ** (20 + 10 * power):,.1f} {units[power]}"
