"""Heavy hitters in bounded memory: the Space-Saving sketch (Metwally, Agrawal and El
Abbadi, 2005), weighted and with decay.

It keeps at most `capacity` counters. A key already counted adds its weight; a new key
takes a free counter, or else evicts the key with the smallest count c and starts at
c + weight, remembering c as its possible overestimate. With total weight N seen:

- every count overestimates its key's true weight by at most `error(key)` <= N / capacity;
- every key whose true weight exceeds N / capacity holds a counter.

So a key reported above a threshold T with `count - error >= T` surely is, and no key
truly above T + N / capacity is missed. `decay(f)` multiplies every count (and N) by
f, so an old hot key fades and a new one rises when the workload shifts; the bounds
hold for the decayed weights. Pure: no clock, the caller decides when to decay.
"""

from __future__ import annotations

import heapq
from typing import Hashable, Iterable


class SpaceSaving:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a sketch needs at least one counter")
        self.capacity = capacity
        self.counts: dict[Hashable, float] = {}
        self.errors: dict[Hashable, float] = {}
        self.total = 0.0
        self._heap: list[tuple[float, int, Hashable]] = []   # lazy: stale entries skipped
        self._pushes = 0

    def clear(self) -> None:
        """Forget every count: a new window starts."""
        self.counts.clear()
        self.errors.clear()
        self.total = 0.0
        self._heap.clear()

    def __len__(self) -> int:
        return len(self.counts)

    def __contains__(self, key) -> bool:
        return key in self.counts

    def add(self, key: Hashable, weight: float = 1.0) -> None:
        if weight <= 0:
            raise ValueError(f"weight must be positive, got {weight}")
        self.total += weight
        counts = self.counts
        if key in counts:
            counts[key] += weight
        elif len(counts) < self.capacity:
            counts[key] = weight
            self.errors[key] = 0.0
        else:
            smallest, victim = self._min()
            del counts[victim], self.errors[victim]
            counts[key] = smallest + weight
            self.errors[key] = smallest
        self._push(key)

    def add_all(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.add(key)

    def count(self, key) -> float:
        """An upper bound on `key`'s weight (0 if it holds no counter: then its weight
        is at most the smallest count)."""
        return self.counts.get(key, 0.0)

    def error(self, key) -> float:
        return self.errors.get(key, 0.0)

    def guaranteed(self, key) -> float:
        """A lower bound on `key`'s weight."""
        return self.counts.get(key, 0.0) - self.errors.get(key, 0.0)

    def top(self, n: int) -> list[tuple[Hashable, float]]:
        return heapq.nlargest(n, self.counts.items(), key=lambda kv: kv[1])

    def above(self, share: float) -> list[tuple[Hashable, float]]:
        """Keys whose counted weight exceeds `share` of the total, heaviest first: a
        superset of the keys truly above it."""
        bar = share * self.total
        return sorted(((k, c) for k, c in self.counts.items() if c > bar),
                      key=lambda kv: -kv[1])

    def decay(self, factor: float) -> None:
        """Scale every count by `factor` (0 < factor <= 1); counts that fall below a
        negligible weight are dropped."""
        if not 0 < factor <= 1:
            raise ValueError(f"decay factor must be in (0, 1], got {factor}")
        self.total *= factor
        floor = 1e-9 * max(self.total, 1.0)
        self.counts = {k: c * factor for k, c in self.counts.items() if c * factor > floor}
        self.errors = {k: self.errors[k] * factor for k in self.counts}
        self._rebuild()

    # ------------------------------------------------------------- the minimum

    def _push(self, key) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (self.counts[key], self._pushes, key))
        if len(self._heap) > 4 * self.capacity + 16:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(c, i, k) for i, (k, c) in enumerate(self.counts.items())]
        heapq.heapify(self._heap)
        self._pushes = len(self._heap)

    def _min(self) -> tuple[float, Hashable]:
        heap, counts = self._heap, self.counts
        while True:
            count, _, key = heap[0]
            if counts.get(key) == count:
                return count, key
            heapq.heappop(heap)
