"""Pick the collector class for a backend: :func:`make_collector`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from collectors.backend_names import BACKENDS
from collectors.base import Collector, Policy
from collectors.collector import RolloutCollector
from collectors.device import DeviceCollector

RAY_OPTIONS = frozenset({"envs_per_worker", "ray_address", "cpus_per_worker", "worker_options", "keep_collecting",
                         "worker_cls", "worker_kwargs"})


def make_collector(env_fns: Sequence[Callable[[], Any]], policy: Policy, backend: str = "sync",
                   background: bool = False, **options: Any) -> Collector:
    """A :class:`~collectors.RolloutCollector` (``serial``, ``sync``, ``async``), a
    :class:`~collectors.DeviceCollector` (``device``: an env written in torch, on the policy's device)
    or a :class:`~collectors.RayCollector` (``ray``), built with ``options``; ``background=True``
    runs a local one in a process of its own (:class:`~collectors.background.BackgroundCollector`).

    Example:
        >>> import functools, gymnasium as gym, torch
        >>> from collectors import make_collector
        >>> env_fns = [functools.partial(gym.make, "CartPole-v1")] * 2
        >>> with make_collector(env_fns, lambda obs: torch.zeros(len(obs), dtype=torch.int64),
        ...                     backend="serial", num_steps=8) as c:
        ...     print(c.collect().batch["rewards"].shape)
        torch.Size([8, 2])

    An option the chosen class does not have (``keep_collecting`` or ``ray_address`` without
    Ray, ``main_share`` with it) is refused with the options that backend takes.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "ray":
        if background:
            raise ValueError("background=True is for the serial, sync and async backends: Ray actors already "
                             "collect apart from this process (keep_collecting=True keeps them collecting)")
        from collectors.ray_collector import RayCollector  # imports Ray's plumbing only where it is used
        cls, kwargs = RayCollector, options
    elif backend == "device":
        if background:
            raise ValueError("background=True (--overlap) is for the serial, sync and async backends: the device "
                             "backend steps its env on the learner's device, between updates")
        cls, kwargs = DeviceCollector, options
    else:
        cls, kwargs = RolloutCollector, {"backend": backend, **options}
    known = set(inspect.signature(cls.__init__).parameters) - {"self", "env_fns", "policy", "backend"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"backend={backend!r} does not support {', '.join(unknown)}"
                         + (" (Ray only: use backend='ray')" if backend != "ray" and set(unknown) <= RAY_OPTIONS
                            else "")
                         + f"; its options: {', '.join(sorted(known))}")
    if background:
        from collectors.background import BackgroundCollector
        return BackgroundCollector(env_fns, policy, **kwargs)
    return cls(env_fns, policy, **kwargs)
