"""A count reducer that spends CPU on every tuple, standing in for an expensive reduce
(parsing, scoring): with it one mapper can load a node past one core, which the plain
count reducer (millions of tuples/s per node) never lets a single feeder do.

    --reducer floering.chaos.costly:CostlyCount --reducer-arg work=400
"""

from __future__ import annotations

from floering.node.core.reducers import Count


class CostlyCount(Count):
    def __init__(self, work: int | str = 400) -> None:
        super().__init__()
        self.work = int(work)

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        spin = range(self.work * len(keys))
        for _ in spin:        # the per-tuple cost
            pass
        super().apply_batch(keys, values, active, lookup)
