"""The bounded sample queue between rollout instances and the trainer.

Holds finished prompt groups until the trainer takes them as a mini-batch. Backpressure
by reservation: a group is counted against ``capacity`` from its admission on
(``reserve``), so ``put`` never overflows and instances stop receiving new prompts while
``queued + in flight >= capacity``. The trainer's current iteration is exempt
(``can_admit(force=True)``), which rules out a deadlock when the capacity is smaller than
the lag window; with the default capacity ``global batch x (k + 1)`` it never binds
the current iteration anyway. Every put/get is a ``queue`` timeline event.
"""
from __future__ import annotations

from typing import Any, Callable


class SampleQueue:
    def __init__(self, capacity: int, on_event: Callable[..., None] | None = None):
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.items: dict[Any, dict] = {}
        self.reserved = 0
        self._on_event = on_event or (lambda **ev: None)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key) -> bool:
        return key in self.items

    def can_admit(self, force: bool = False) -> bool:
        return force or len(self.items) + self.reserved < self.capacity

    def reserve(self) -> None:
        self.reserved += 1

    def cancel(self, n: int = 1) -> None:
        """Release reservations whose groups will never arrive (a failed instance)."""
        self.reserved = max(0, self.reserved - n)

    def put(self, key, group: dict, t: float) -> None:
        if key in self.items:
            raise ValueError(f"group {key} queued twice")
        self.reserved = max(0, self.reserved - 1)
        self.items[key] = group
        self._on_event(t=t, op="put", size=len(self.items))

    def take(self, keys, t: float) -> list[dict]:
        out = [self.items.pop(k) for k in keys]
        self._on_event(t=t, op="get", size=len(self.items))
        return out
