"""How long a worker may stay silent before the collector gives up on it: :class:`Deadline`."""

from __future__ import annotations

DEFAULT_WORKER_TIMEOUT_S = 60.0  # generous: a worker on a busy shared machine may be slow, but not a minute
START_TIMEOUT_S = 120.0  # starting a process (imports, building envs) may take longer than any step
MAX_WORKER_TIMEOUT_S = 1e6  # 11.6 days: "never" in practice, and within what every wait primitive accepts
FIRST_PHASES = frozenset({"start", "reset"})  # start-up and the first reset (loading traces, say) get the floor
SLACK = 20.0  # a worker is given this many times the slowest answer it has ever needed


class Deadline:
    """The silence a collector tolerates from a worker: ``max(floor_s, 20 x the slowest answer measured)``.

    Every wait on a worker process, a collecting process or a Ray actor is bounded by :meth:`limit`;
    the measured answers (:meth:`measured`) stretch it for envs whose steps are slow by nature.

    Example:
        >>> from collectors.deadlines import Deadline
        >>> d = Deadline(10.0)
        >>> d.limit("step"), d.limit("start")
        (10.0, 120.0)
        >>> d.measured(2.0)
        >>> d.limit("step")
        40.0
    """

    def __init__(self, floor_s: float = DEFAULT_WORKER_TIMEOUT_S) -> None:
        number = isinstance(floor_s, (int, float)) and not isinstance(floor_s, bool)
        if not number or not 0 < floor_s <= MAX_WORKER_TIMEOUT_S:
            raise ValueError(f"worker_timeout={floor_s!r} is invalid: seconds > 0 and at most {MAX_WORKER_TIMEOUT_S:g} "
                             f"(default {DEFAULT_WORKER_TIMEOUT_S:g}), how long a worker may stay silent")
        self.floor_s = float(floor_s)
        self.slowest_s = 0.0

    def limit(self, phase: str = "step") -> float:
        """Seconds a worker may take to answer in ``phase`` (``"start"`` and ``"reset"``: at least
        ``START_TIMEOUT_S``); never more than ``MAX_WORKER_TIMEOUT_S``, which every wait accepts."""
        limit = max(self.floor_s, SLACK * self.slowest_s)
        return min(max(limit, START_TIMEOUT_S) if phase in FIRST_PHASES else limit, MAX_WORKER_TIMEOUT_S)

    def measured(self, seconds: float) -> None:
        """Record how long an answer took (start-up excluded: it says nothing about a step)."""
        self.slowest_s = max(self.slowest_s, seconds)
