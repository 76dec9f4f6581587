"""What kind of policy a model is, and how it reads its observation: :class:`PolicyLayout`, decided once from the
env's declarations and ``policy_arch`` (``trainer.common.spaces.model_spaces``), carried by every model
(``model.layout``) and read by every consumer (export, evaluation, cells, the algorithms); nothing else decides.

Plain Python, no torch: the command line and the config checks read it before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LayoutKind = Literal["flat", "per_head", "set"]
KINDS: tuple[LayoutKind, ...] = ("flat", "per_head", "set")


@dataclass(frozen=True)
class PolicyLayout:
    """A policy's kind and the slot facts of its observation.

    - ``flat``: the observation is one vector; nothing is known of slots (``features``, ``shared``: 0).
    - ``per_head``: ``features`` per action head, then ``shared`` features; one actor shared by all heads. The
      head count is the action space's, and the parameters fix it (the critic reads the whole observation).
    - ``set``: ``features`` per user slot, for ANY number of slots, then ``shared`` features (VR-edge: the
      cell's); ``active`` is the index, among a slot's features, of its 1.0 / 0.0 "active" flag, or ``None``
      where every slot is always active. No parameter depends on the slot count.

    ``active`` is a set policy's only: a per-head policy's slots are all played, whatever a flag says.

    Example:
        >>> layout = PolicyLayout("set", features=7, shared=5, active=6)
        >>> layout.fits(7 * 3 + 5), layout.fits(7 * 3 + 4), layout.slots(7 * 3 + 5)
        (True, False, 3)
        >>> PolicyLayout("flat") == FLAT, FLAT.fits(26)
        (True, False)
    """

    kind: LayoutKind = "flat"
    features: int = 0  # per head (per_head) or per user slot (set)
    shared: int = 0  # after the heads' or slots' features: read by every head or slot
    active: int | None = None  # set only: the index of a slot's active flag among its features

    def __post_init__(self) -> None:
        # a layout is built from an env's declarations: a wrong one is a programming error, said here once
        if self.kind not in KINDS:
            raise ValueError(f"a policy layout's kind is one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind == "flat" and (self.features or self.shared or self.active is not None):
            raise ValueError(f"a flat layout has no slot facts, got {self}")
        if self.kind != "flat" and (self.features < 1 or self.shared < 0):
            raise ValueError(f"a {self.kind} layout needs features >= 1 per slot and shared >= 0, got {self}")
        if self.active is not None and (self.kind != "set" or not 0 <= self.active < self.features):
            raise ValueError(f"an active flag is a set layout's, one of a slot's {self.features} features; got "
                             f"{self}")

    def fits(self, width: int) -> bool:
        """Whether an observation ``width`` wide is ``slots >= 1`` slots and the shared features (``False`` for a
        flat layout, which knows no slots)."""
        return self.kind != "flat" and width > self.shared and (width - self.shared) % self.features == 0

    def slots(self, width: int) -> int:
        """How many slots an observation ``width`` wide holds (one that :meth:`fits`)."""
        if not self.fits(width):
            raise ValueError(f"an observation {width} wide is not slots of {self.features} features and "
                             f"{self.shared} shared ones ({self.kind} layout)")
        return (width - self.shared) // self.features


FLAT = PolicyLayout("flat")  # the layout of a policy that knows no slots
