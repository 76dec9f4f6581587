"""Experience collection: one :class:`RolloutCollector` interface, interchangeable backends."""

from collectors.backends.async_ import WorkerDiedError
from collectors.collector import RolloutCollector
from collectors.env_group import EnvError
from collectors.seeding import env_seeds

__all__ = ["EnvError", "RolloutCollector", "WorkerDiedError", "env_seeds"]
