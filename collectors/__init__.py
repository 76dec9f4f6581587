"""Experience collection: one interface (``collect() -> Rollout``), interchangeable backends.

:func:`make_collector` picks the class: :class:`RolloutCollector` for ``serial``, ``sync``
and ``async``, :class:`DeviceCollector` for ``device``, :class:`RayCollector` for ``ray``.

Every name here is imported on first use: ``BACKENDS`` comes without torch (a command line
is checked before torch loads), ``RayCollector`` without the rest (most runs never need Ray).
"""

import importlib

_HOMES = {
    "BACKENDS": "collectors.backend_names",
    "Collector": "collectors.base",
    "DeviceCollector": "collectors.device",
    "EnvError": "collectors.env_group",
    "Rollout": "collectors.rollout",
    "RolloutCollector": "collectors.collector",
    "RayCollector": "collectors.ray_collector",
    "RayConnectError": "collectors.connection",
    "WorkerDiedError": "collectors.processes",
    "WorkerTimeoutError": "collectors.processes",
    "env_seeds": "collectors.seeding",
    "make_collector": "collectors.factory",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'collectors' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
