"""Prioritized experience replay (Schaul et al., 2016) for the Ape-X tier: a sum tree over a fixed-capacity,
FIFO TensorDict storage.

Proportional prioritisation: transition ``i`` is sampled with probability ``p_i^alpha / sum_k p_k^alpha``
and weighted by ``(size * P(i))^-beta / max_k (size * P(k))^-beta`` (beta annealed to 1 by the caller).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase


class SumTree:
    """Priorities of ``capacity`` slots in a binary tree of partial sums: O(log n) update and sampling.

    Example:
        >>> tree = SumTree(4)
        >>> tree.update(np.array([0, 1, 2]), np.array([1.0, 2.0, 1.0]))
        >>> tree.total
        4.0
        >>> tree.find(np.array([0.5, 1.5, 3.5])).tolist()  # prefix sums 1, 3, 4: slots 0, 1, 2
        [0, 1, 2]

    Leaves live at ``tree[leaves + slot]`` (``leaves``: ``capacity`` rounded up to a power of two),
    so a whole batch of updates or lookups runs level by level as NumPy ops.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} is invalid: must be >= 1")
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves, dtype=np.float64)  # float64: sums of 1e6 priorities stay exact enough

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[self.leaves + slots]

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of ``slots`` (``[B]``, distinct or not: the last write wins) and their ancestors."""
        nodes = self.leaves + np.asarray(slots, dtype=np.int64)
        self.tree[nodes] = priorities
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The slot whose prefix-sum interval holds each value of ``mass`` (``[B]``, in ``[0, total)``)."""
        mass = np.array(mass, dtype=np.float64)
        nodes = np.ones(len(mass), dtype=np.int64)
        while nodes[0] < self.leaves:
            left = self.tree[2 * nodes]
            right = mass >= left
            mass = np.where(right, mass - left, mass)
            nodes = 2 * nodes + right
        # rounding can step past the last slot with a priority; those slots have priority 0: step back
        return np.minimum(nodes - self.leaves, self.capacity - 1)


def replay_bytes(capacity: int, example: TensorDictBase) -> int:
    """Bytes a :class:`PrioritizedReplay` of ``capacity`` transitions shaped like ``example`` allocates: the
    storage, the running ids and the sum tree (two float64 nodes per leaf), all at once."""
    leaves = sum(v.element_size() * v.numel() for v in example.values(include_nested=True, leaves_only=True))
    return capacity * (leaves + 8) + 2 * 8 * (1 << max(0, (capacity - 1).bit_length()))


class PrioritizedReplay:
    """A fixed-capacity FIFO replay of transitions with proportional prioritized sampling.

    Example:
        >>> from tensordict import TensorDict
        >>> example = TensorDict({"observations": torch.zeros(4), "actions": torch.zeros((), dtype=torch.int64)}, [])
        >>> replay = PrioritizedReplay(8, example, alpha=0.6, seed=0)
        >>> replay.add(example.expand(5).clone(), torch.ones(5))
        >>> batch, slots, ids, weights = replay.sample(3, beta=0.4)
        >>> batch["observations"].shape, slots.shape, weights.shape
        (torch.Size([3, 4]), (3,), torch.Size([3]))

    Storage: one TensorDict ``[capacity]`` shaped like ``example`` (a single transition, ``batch_size=[]``),
    allocated at once, so memory is ``bytes_per_transition x capacity`` and never grows. New transitions
    overwrite the oldest (FIFO). Every write gets a running id; :meth:`update_priorities` takes the ids the
    sample returned and ignores slots rewritten since (their new transition keeps its own priority).
    Sampling is stratified (one draw in each of ``B`` equal slices of the total mass), from the replay's
    own seeded ``torch.Generator``.
    """

    def __init__(self, capacity: int, example: TensorDictBase, alpha: float = 0.6, eps: float = 1e-6,
                 seed: int = 0) -> None:
        if alpha < 0:
            raise ValueError(f"alpha={alpha} is invalid: must be >= 0")
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.tree = SumTree(capacity)
        self.storage = example.expand(capacity).clone()  # zeros or not: every slot is written before it is read
        self.ids = np.full(capacity, -1, dtype=np.int64)  # running id of the transition in each slot
        self.added = 0  # transitions ever added (the next id)
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def size(self) -> int:
        return min(self.added, self.capacity)

    @property
    def bytes_per_transition(self) -> int:
        """Bytes one slot takes: the storage's leaves, plus the tree (two float64 nodes) and the id."""
        return replay_bytes(self.capacity, self.storage[0]) // self.capacity

    def describe(self) -> str:
        total = self.bytes_per_transition * self.capacity
        return (f"replay: {self.capacity:,} transitions x {self.bytes_per_transition} bytes = {total / 2**20:,.1f} MiB "
                f"(alpha {self.alpha:g})")

    def _stored_priority(self, priorities: torch.Tensor) -> np.ndarray:
        p = priorities.detach().to("cpu", torch.float64).numpy()
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ValueError("priorities must be finite and >= 0")
        return (p + self.eps) ** self.alpha

    def add(self, transitions: TensorDictBase, priorities: torch.Tensor) -> None:
        """Append ``transitions`` (``[B]``) with their priorities (``[B]``, e.g. absolute TD errors)."""
        b = transitions.batch_size[0]
        if b == 0:
            return
        if b > self.capacity:  # only the newest capacity of them would survive
            transitions, priorities = transitions[b - self.capacity:], priorities[b - self.capacity:]
            self.added += b - self.capacity
            b = self.capacity
        slots = (self.added + np.arange(b)) % self.capacity
        index = torch.from_numpy(slots)
        self.storage[index] = transitions.to("cpu")
        self.ids[slots] = self.added + np.arange(b)
        self.tree.update(slots, self._stored_priority(priorities))
        self.added += b

    def sample(self, batch_size: int, beta: float) -> tuple[TensorDictBase, np.ndarray, np.ndarray, torch.Tensor]:
        """``(transitions [B], slots [B], ids [B], importance weights [B])``; the weights are normalised by the
        batch's largest, so they are <= 1.

        Why the batch's and not the replay's smallest priority (Schaul et al.): one transition with a TD error
        near 0 (priority ``eps^alpha``) would then shrink every weight, and so the learning rate, by orders of
        magnitude."""
        if self.size == 0:
            raise ValueError("sample() from an empty replay: add transitions first")
        total = self.tree.total
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64).numpy()
        mass = (np.arange(batch_size) + u) * (total / batch_size)
        slots = np.minimum(self.tree.find(mass), self.size - 1)  # rounding past the newest slot: take it
        weights = (self.size * self.tree.priorities(slots) / total) ** -beta
        weights = torch.from_numpy(weights / weights.max()).float()
        return self.storage[torch.from_numpy(slots)], slots, self.ids[slots].copy(), weights

    def update_priorities(self, slots: np.ndarray, ids: np.ndarray, priorities: torch.Tensor) -> int:
        """Set new priorities for sampled slots, skipping those overwritten since; returns how many were set."""
        keep = self.ids[slots] == ids
        if keep.any():
            self.tree.update(slots[keep], self._stored_priority(priorities)[keep])
        return int(keep.sum())

    def state_dict(self) -> dict[str, Any]:
        """Everything, storage included (``capacity x bytes_per_transition``: can be gigabytes)."""
        return {"storage": self.storage.to_dict(), "leaves": self.tree.tree[self.tree.leaves:].copy(),
                "ids": self.ids.copy(), "added": self.added, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["ids"]) != self.capacity:
            raise ValueError(f"saved replay holds {len(state['ids'])} slots; this one has {self.capacity}")
        self.storage.update_(TensorDict(state["storage"], batch_size=[self.capacity]))
        self.ids[:], self.added = state["ids"], int(state["added"])
        self.tree.update(np.arange(self.tree.leaves), state["leaves"])
        self.generator.set_state(state["generator"])

    def generator_state(self) -> torch.Tensor:
        """The sampling stream's state (kept in every checkpoint, also without the storage)."""
        return self.generator.get_state()
