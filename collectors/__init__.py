"""Experience collection: one interface (``collect() -> Rollout``), interchangeable backends.

:func:`make_collector` picks the class: :class:`RolloutCollector` for ``serial``, ``sync``
and ``async``, :class:`DeviceCollector` for ``device``, :class:`RayCollector` for ``ray``.
"""

from collectors.backends.async_ import WorkerDiedError, WorkerTimeoutError
from collectors.base import Collector
from collectors.collector import RolloutCollector
from collectors.device import DeviceCollector
from collectors.env_group import EnvError
from collectors.factory import BACKENDS, make_collector
from collectors.rollout import Rollout
from collectors.seeding import env_seeds

__all__ = ["BACKENDS", "Collector", "DeviceCollector", "EnvError", "Rollout", "RolloutCollector", "WorkerDiedError",
           "WorkerTimeoutError", "env_seeds", "make_collector", "RayCollector"]


def __getattr__(name: str):
    if name == "RayCollector":  # imported on first use: most runs never need Ray's plumbing
        from collectors.ray_collector import RayCollector
        return RayCollector
    raise AttributeError(f"module 'collectors' has no attribute {name!r}")
