"""The executor side: one Spark partition of one micro-batch is one mapper.

Runs in Spark's Python worker processes. The RingClient is created inside the worker
(gRPC channels must not cross the fork that made the worker) and kept for the worker's
next task (spark_driver.connections); each task rebinds it and flushes before it
returns, so Spark commits a batch only once the ring holds all of it on r+1
nodes. Tuples are numbered from (batch id, position) under the source
`<query id>#<partition id>` (node.core.epochs): a retried task or a batch replayed
after a driver restart resends the very same (source, seq)s and the ring drops them.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from dataclasses import dataclass

from mapper import MAX_POSITION, epoch_seq, epoch_source


@dataclass(frozen=True)
class PartitionConfig:
    """Everything a task needs; pickled into the closure Spark ships to executors."""

    seeds: tuple[str, ...]
    query_id: str
    map_spec: str
    reducer: str | None = None      # the reducer the ring must run (checked again here)
    combine: bool = False           # sum values per key within a partition first
    batch_size: int = 2000
    tls_dir: str | None = None      # the ring's client certificate (ca.pem, client.pem/.key)
    # Fault injection for tests: the first task to create this file fails (or hangs)
    # after half its partition is on the ring.
    fail_once: str | None = None
    hang_once: str | None = None


class InjectedFailure(RuntimeError):
    pass


def write_partition(config: PartitionConfig, batch_id: int, partition_id: int, rows) -> int:
    """Map the rows and push the tuples to the ring; return the number of tuples."""
    from spark_driver import connections   # imported in the worker, not the driver's pickle
    from spark_driver.maps import load_map

    map_step = load_map(config.map_spec)
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return 0                          # an empty partition needs no connection
    rows = itertools.chain((first,), rows)
    inject = config.fail_once or config.hang_once
    if inject:
        rows = list(rows)
        half = len(rows) // 2
    client = connections.acquire(config.seeds, source=epoch_source(config.query_id, partition_id),
                                 first_seq=epoch_seq(batch_id, 0),
                                 expect_reducer=config.reducer, batch_size=config.batch_size,
                                 tls_dir=config.tls_dir)
    try:
        emitter = _Emitter(client, config.combine)
        for n, row in enumerate(rows):
            if inject and n == half and half > 0:
                _inject(config, client, emitter)
            value = row[0]
            if value is not None:
                emitter.add(map_step(value))
        emitter.finish()
        client.flush()
    except BaseException:
        connections.discard(client)
        raise
    connections.release(client, config.seeds, config.reducer, config.batch_size,
                        config.tls_dir)
    return emitter.emitted


def _inject(config: PartitionConfig, client, emitter) -> None:
    emitter.send()
    client.flush()                        # half the partition is on the ring now
    marker = config.fail_once or config.hang_once
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return                            # only the first task gets the fault
    if config.fail_once:
        raise InjectedFailure(f"injected task failure after {emitter.emitted} tuples")
    while True:                           # hang until the test kills the driver
        time.sleep(1)


class _Emitter:
    """Keys go out in bulk (emit_many); (key, value) pairs one by one, in order, so a
    tuple's position in the partition (its seq) is the same on every attempt."""

    def __init__(self, client, combine: bool) -> None:
        self.client = client
        self.combine = combine
        self.keys: list = []
        self.totals: Counter = Counter()
        self.emitted = 0

    def add(self, items) -> None:
        for item in items:
            if type(item) is tuple:
                key, value = item
                if self.combine:
                    self.totals[key] += value
                else:
                    self.send()
                    self._count(1)
                    self.client.emit(key, value)
            elif self.combine:
                self.totals[item] += 1
            else:
                self.keys.append(item)
        if len(self.keys) >= 10_000:
            self.send()

    def send(self) -> None:
        if self.keys:
            self._count(len(self.keys))
            self.client.emit_many(self.keys)
            self.keys = []

    def finish(self) -> None:
        self.send()
        if self.totals:
            self._count(len(self.totals))
            for key, total in self.totals.items():
                self.client.emit(key, total)
            self.totals = Counter()

    def _count(self, n: int) -> None:
        self.emitted += n
        if self.emitted > MAX_POSITION:
            raise ValueError(f"a partition may emit at most {MAX_POSITION} tuples per batch; "
                             f"use more partitions")
