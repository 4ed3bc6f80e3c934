"""One model version's pending work: a bounded queue ordered by deadline (data only)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count
from typing import Any

__all__ = ["ModelQueue", "Task", "Waiter"]

Waiter = Callable[[object, BaseException | None], None]
CacheKey = tuple[str, str, bytes]


class Task:
    """One input to evaluate. Its result goes to the prediction cache (``key``), which fans it
    out to every query waiting on that input, or straight to ``waiter`` when caching is off.
    ``span``: the sampled query's span (clipper.tracing) that queued it, or None."""

    __slots__ = ("deadline", "enqueued_at", "key", "payload", "span", "waiter")

    def __init__(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        payload: bytes,
        deadline: float,
        enqueued_at: float,
        key: CacheKey | None,
        waiter: Waiter | None,
        span: Any = None,
    ) -> None:
        self.payload = payload
        self.span = span
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.key = key
        self.waiter = waiter


class ModelQueue:
    """A min-heap on deadline. Bounded: ``push`` refuses rather than grow."""

    __slots__ = ("_heap", "_seq", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, task: Task) -> bool:
        if len(self._heap) >= self.capacity:
            return False
        heapq.heappush(self._heap, (task.deadline, next(self._seq), task))
        return True

    def requeue(self, tasks: list[Task]) -> None:
        """Put back the tasks of a batch whose replica vanished; they keep their deadlines
        (capacity is not checked: they were admitted once already)."""
        for task in tasks:
            heapq.heappush(self._heap, (task.deadline, next(self._seq), task))

    def earliest_deadline(self) -> float:
        return self._heap[0][0]

    def oldest_enqueued_at(self) -> float:
        # The head has the earliest deadline; with one SLO per model (the common case) it is
        # also the oldest query, which is what the batch-wait window is measured from.
        return self._heap[0][2].enqueued_at

    def drop_expired(self, now: float) -> list[Task]:
        heap = self._heap
        dropped: list[Task] = []
        while heap and heap[0][0] <= now:
            dropped.append(heapq.heappop(heap)[2])
        return dropped

    def pop(self, k: int) -> list[Task]:
        heap = self._heap
        if k >= len(heap):
            tasks = [entry[2] for entry in sorted(heap)]
            heap.clear()
            return tasks
        pop = heapq.heappop
        return [pop(heap)[2] for _ in range(k)]
