"""A count reducer that spends CPU on every tuple, standing in for an expensive reduce
(parsing, scoring): with it one mapper can load a node past one core, which the plain
count reducer (millions of tuples/s per node) never lets a single feeder do.

    --reducer floering.chaos.costly:CostlyCount --reducer-arg work=400

With `wait_us`, each tuple also costs that many microseconds of wall time in which the
node does nothing else (as a synchronous call to a slow store would), without using a
core: a node's capacity is then 1e6 / wait_us tuples/s whatever else the machine's
cores are running, which CPU work on a shared, throttled machine is not.

    --reducer-arg work=0 --reducer-arg wait_us=200      (5,000 tuples/s per node)
"""

from __future__ import annotations

import time

from floering.node.core.reducers import Count


class CostlyCount(Count):
    def __init__(self, work: int | str = 400, wait_us: int | str = 0) -> None:
        super().__init__()
        self.work = int(work)
        self.wait_us = int(wait_us)
        if self.work < 0 or self.wait_us < 0:
            raise ValueError("work and wait_us must be at least 0")

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        spin = range(self.work * len(keys))
        for _ in spin:        # the per-tuple cost
            pass
        if self.wait_us:      # blocks the node as a synchronous call would
            time.sleep(self.wait_us * len(keys) / 1e6)
        super().apply_batch(keys, values, active, lookup)


def tuples_per_core_second(work: int, seconds: float = 2.0) -> float:
    """What one core of this machine applies per second with this reducer at `work`
    (the best of a few rounds, timed here): an overload is set against it, since the
    same `work` costs more or less time from one machine, or one hour, to another."""
    reducer, state = CostlyCount(work), {}
    keys, values = ["k"] * 500, [1] * 500
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        reducer.apply_batch(keys, values, state, lambda key: 0)
        best = max(best, len(keys) / (time.perf_counter() - t))
    return best
