"""One model version's pending work: a bounded queue ordered by class, then deadline (data only)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count
from typing import Any, Final

__all__ = ["RANKS", "STANDARD", "ModelQueue", "Task", "Waiter"]

Waiter = Callable[[object, BaseException | None], None]
CacheKey = tuple[str, str, bytes]


# A task's class (clipper.tenants.PriorityClass's value): 0 critical, 1 standard, 2 sheddable.
# Everything is standard on a frontend without tenants.
RANKS: Final = 3
STANDARD: Final = 1


class Task:
    """One input to evaluate. Its result goes to the prediction cache (``key``), which fans it
    out to every query waiting on that input, or straight to ``waiter`` when caching is off.
    ``rank``: its priority class (lower is served first). ``span``: the sampled query's span
    (clipper.tracing) that queued it, or None."""

    __slots__ = ("deadline", "enqueued_at", "key", "payload", "rank", "span", "waiter")

    def __init__(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        payload: bytes,
        deadline: float,
        enqueued_at: float,
        key: CacheKey | None,
        waiter: Waiter | None,
        rank: int = STANDARD,
        span: Any = None,
    ) -> None:
        self.payload = payload
        self.span = span
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.key = key
        self.waiter = waiter
        self.rank = rank


class ModelQueue:
    """Ordered by class, then by deadline: a min-heap on deadline per class, and a batch takes
    from the highest class first. Bounded: ``push`` refuses rather than grow (a full queue
    makes room for a higher class with :meth:`evict_below`). With one class (no tenants) it
    is the one min-heap on deadline it always was."""

    __slots__ = ("_heaps", "_n", "_seq", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._heaps: tuple[list[tuple[float, int, Task]], ...] = tuple([] for _ in range(RANKS))
        self._n = 0
        self._seq = count()

    def __len__(self) -> int:
        return self._n

    def ahead(self, rank: int) -> int:
        """Tasks a new task of class ``rank`` would wait behind: those of its class or above."""
        if rank >= RANKS - 1:
            return self._n
        heaps = self._heaps
        return sum(len(heaps[r]) for r in range(rank + 1))

    def push(self, task: Task) -> bool:
        if self._n >= self.capacity:
            return False
        heapq.heappush(self._heaps[task.rank], (task.deadline, next(self._seq), task))
        self._n += 1
        return True

    def evict_below(self, rank: int) -> Task | None:
        """Take out the task of the lowest class below ``rank`` that is due first (the likeliest
        to miss its deadline anyway); None when every task is of ``rank`` or above."""
        for r in range(RANKS - 1, rank, -1):
            heap = self._heaps[r]
            if heap:
                self._n -= 1
                return heapq.heappop(heap)[2]
        return None

    def requeue(self, tasks: list[Task]) -> None:
        """Put back the tasks of a batch whose replica vanished; they keep their deadlines
        (capacity is not checked: they were admitted once already)."""
        for task in tasks:
            heapq.heappush(self._heaps[task.rank], (task.deadline, next(self._seq), task))
        self._n += len(tasks)

    def _head_heap(self) -> list[tuple[float, int, Task]]:
        """The heap whose head is due first."""
        critical, standard, sheddable = self._heaps
        if not critical and not sheddable:
            return standard  # one class: the common case
        best: list[tuple[float, int, Task]] | None = None
        for heap in self._heaps:
            if heap and (best is None or heap[0][0] < best[0][0]):
                best = heap
        assert best is not None, "an empty queue has no head"
        return best

    def earliest_deadline(self) -> float:
        return self._head_heap()[0][0]

    def oldest_enqueued_at(self) -> float:
        # The head has the earliest deadline; with one SLO per model (the common case) it is
        # also the oldest query, which is what the batch-wait window is measured from.
        return self._head_heap()[0][2].enqueued_at

    def drop_expired(self, now: float) -> list[Task]:
        dropped: list[Task] = []
        for heap in self._heaps:
            while heap and heap[0][0] <= now:
                dropped.append(heapq.heappop(heap)[2])
        self._n -= len(dropped)
        return dropped

    def pop(self, k: int) -> list[Task]:
        """Up to ``k`` tasks, the highest class first and by deadline within a class."""
        out: list[Task] = []
        pop = heapq.heappop
        for heap in self._heaps:
            want = k - len(out)
            if want <= 0:
                break
            if want >= len(heap):
                out.extend(entry[2] for entry in sorted(heap))
                heap.clear()
            else:
                out.extend(pop(heap)[2] for _ in range(want))
        self._n -= len(out)
        return out
