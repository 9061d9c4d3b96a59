"""The executor side: one Spark partition of one micro-batch is one mapper.

Runs in Spark's Python worker processes. The RingClient is created inside the worker
(gRPC channels must not cross the fork that made the worker) and kept for the worker's
next task (spark_driver.connections); each task rebinds it and flushes before it
returns, so Spark commits a batch only once the ring holds all of it on r+1
nodes. Tuples are numbered from (batch id, position) under the source
`<query id>#<partition id>` (node.core.epochs): a retried task or a batch replayed
after a driver restart resends the very same (source, seq)s and the ring drops them.

Two ways in:
- `write_words`: the default word split, done by Spark SQL in the JVM; the task gets
  the partition's words as Arrow arrays (DataFrame.mapInArrow) and sends them in bulk.
- `write_partition`: any other map step, run here in Python over the partition's rows.

With `combine` (the default for the count and sum reducers) a task sums the values of
each key first and sends one tuple per distinct key, every `combine_keys` distinct keys
at the latest (bounded memory). Where those flushes fall depends only on the
partition's input, never on timing or on how Spark cut it into Arrow batches, so a
retry sends the same tuples under the same seqs.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from dataclasses import dataclass

from floering.mapper import MAX_POSITION, epoch_seq, epoch_source

COMBINE_KEYS = 100_000      # distinct keys a combining task holds before it sends them
COMBINE_CHUNK = 65_536      # the Arrow path folds words in chunks of this many, at most


@dataclass(frozen=True)
class PartitionConfig:
    """Everything a task needs; pickled into the closure Spark ships to executors."""

    seeds: tuple[str, ...]
    query_id: str
    map_spec: str
    reducer: str | None = None      # the reducer the ring must run (checked again here)
    combine: bool = False           # sum values per key within a partition first
    combine_keys: int = COMBINE_KEYS   # ... sending the totals every this many distinct keys
    batch_size: int = 2000
    tls_dir: str | None = None      # the ring's client certificate (ca.pem, client.pem/.key)
    # Fault injection for tests: the first task to create this file fails (or hangs)
    # after half its partition is on the ring.
    fail_once: str | None = None
    hang_once: str | None = None
    # The batch's routing plan (mapper/plans.py, encoded), recorded by the driver before
    # the batch's first attempt: every attempt sends each seq to the same piece.
    plan: bytes | None = None


class InjectedFailure(RuntimeError):
    pass


def write_partition(config: PartitionConfig, batch_id: int, partition_id: int, rows) -> int:
    """Map the rows in Python and push the tuples to the ring; return the number of
    tuples sent."""
    return feed_rows(config, batch_id, partition_id, rows)[0]


def feed_rows(config: PartitionConfig, batch_id: int, partition_id: int,
              rows) -> tuple[int, int]:
    """write_partition, returning (tuples sent, tuples the map step made): the two
    differ when combining."""
    from floering.spark_driver.maps import load_map

    map_step = load_map(config.map_spec)
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return 0, 0                       # an empty partition needs no connection
    rows = itertools.chain((first,), rows)
    half = 0
    if config.fail_once or config.hang_once:
        rows = list(rows)
        half = len(rows) // 2

    def feed(client) -> _Counting:
        emitter = _Emitter(client, config.combine, config.combine_keys)
        fault = _Fault(config, client, emitter, half)
        for row in rows:
            if not config.combine:
                fault.at(emitter.position)
            emitter.position += 1
            value = row[0]
            if value is not None:
                emitter.add(map_step(value))
        emitter.drain()
        return emitter

    return _task(config, batch_id, partition_id, feed)


def write_words(config: PartitionConfig, batch_id: int, partition_id: int, arrays) -> int:
    """Push a partition's words, Arrow string arrays in the partition's order (the word
    split done by Spark SQL), to the ring; return the number of tuples sent."""
    return feed_words(config, batch_id, partition_id, arrays)[0]


def feed_words(config: PartitionConfig, batch_id: int, partition_id: int,
               arrays) -> tuple[int, int]:
    """write_words, returning (tuples sent, words read): the two differ when
    combining."""
    arrays = (a for a in arrays if len(a))
    first = next(arrays, None)
    if first is None:
        return 0, 0
    arrays = itertools.chain((first,), arrays)
    half = 0
    if config.fail_once or config.hang_once:
        arrays = list(arrays)
        half = sum(len(a) for a in arrays) // 2

    def feed(client) -> _Counting:
        emitter = _WordEmitter(client, config.combine, config.combine_keys)
        fault = _Fault(config, client, emitter, half)
        for words in arrays:
            if not config.combine:            # combining, the fault waits for a flush
                if emitter.position < half < emitter.position + len(words):
                    cut = half - emitter.position
                    emitter.add(words.slice(0, cut))
                    words = words.slice(cut)
                fault.at(emitter.position)
            emitter.add(words)
        emitter.drain()
        return emitter

    return _task(config, batch_id, partition_id, feed)


def _task(config: PartitionConfig, batch_id: int, partition_id: int,
          feed) -> tuple[int, int]:
    """Take the worker's client for this partition's source, feed it, flush."""
    from floering.spark_driver import connections   # imported in the worker, not the driver's pickle
    # The group (the query's id) is bound by every node to the identity that pushes it:
    # with TLS, the client certificate every task of the query uses (tls_dir), so
    # another identity that learns the id opens a group of its own, never ends ours.
    client = connections.acquire(config.seeds, source=epoch_source(config.query_id, partition_id),
                                 first_seq=epoch_seq(batch_id, 0),
                                 expect_reducer=config.reducer, batch_size=config.batch_size,
                                 tls_dir=config.tls_dir, plan=config.plan)
    try:
        emitter = feed(client)
        client.flush()
    except BaseException:
        connections.discard(client)
        raise
    connections.release(client, config.seeds, config.reducer, config.batch_size,
                        config.tls_dir)
    return emitter.emitted, emitter.inputs


class _Fault:
    """Testing: fail or hang once half the partition's tuples are on the ring.

    The fault must not change which tuples the task sends, since the retry (or a rerun
    without the fault) must send the same ones. Sending every tuple, any point will
    do: at half the input. Combining, only where the task sends its totals anyway: at
    the first such flush once half the input is read, which may be the last one, at the
    end of the partition (smaller --combine-keys flush earlier)."""

    def __init__(self, config: PartitionConfig, client, emitter, half: int) -> None:
        self.config = config
        self.client = client
        self.emitter = emitter
        self.half = half
        self.armed = half > 0
        if self.armed and config.combine:
            emitter.after_flush = self.at

    def at(self, position: int) -> None:
        if self.armed and position >= self.half:
            self.armed = False
            _inject(self.config, self.client, self.emitter)


def _inject(config: PartitionConfig, client, emitter) -> None:
    emitter.send()                        # buffered keys, in order: their seqs are fixed
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


class _Counting:
    emitted = 0                           # tuples sent
    inputs = 0                            # tuples the map step made (before combining)
    position = 0                          # input taken so far (rows or words)
    after_flush = None                    # called with the position after totals go out

    def _count(self, n: int) -> None:
        self.emitted += n
        if self.emitted > MAX_POSITION:
            raise ValueError(f"a partition may emit at most {MAX_POSITION} tuples per batch; "
                             f"use more partitions")


class _Emitter(_Counting):
    """The row path. Keys go out in bulk (emit_many); (key, value) pairs one by one, in
    order, so a tuple's position in the partition (its seq) is the same on every
    attempt. Combining sends the totals whenever `max_keys` keys are held, checked
    after each row."""

    def __init__(self, client, combine: bool, max_keys: int = COMBINE_KEYS) -> None:
        self.client = client
        self.combine = combine
        self.max_keys = max(1, max_keys)
        self.keys: list = []
        self.totals: Counter = Counter()

    def add(self, items) -> None:
        for item in items:
            self.inputs += 1
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
        if len(self.totals) >= self.max_keys:
            self.send_totals()

    def send(self) -> None:
        if self.keys:
            self._count(len(self.keys))
            self.client.emit_many(self.keys)
            self.keys = []

    def send_totals(self) -> None:
        if self.totals:
            self._count(len(self.totals))
            emit = self.client.emit
            for key, total in self.totals.items():
                emit(key, total)
            self.totals = Counter()
            if self.after_flush is not None:
                self.after_flush(self.position)

    def drain(self) -> None:
        self.send()
        self.send_totals()


class _WordEmitter(_Counting):
    """The Arrow path: each array of words goes out with one emit_many. Combining folds
    the words in chunks of a fixed number of words (pyarrow's value_counts, in C++),
    chunk boundaries counted from the partition's first word, so they fall in the same
    places whatever the Arrow batch sizes; the totals go out at the first chunk boundary
    where they hold `max_keys` keys or more (so at most max_keys + chunk keys are held)."""

    def __init__(self, client, combine: bool, max_keys: int = COMBINE_KEYS) -> None:
        self.client = client
        self.combine = combine
        self.max_keys = max(1, max_keys)
        self.chunk = min(COMBINE_CHUNK, self.max_keys)
        self.pending: list = []           # slices of the chunk being filled
        self.pending_len = 0
        self.totals: dict = {}

    def add(self, words) -> None:
        self.inputs += len(words)
        if not self.combine:
            self.position += len(words)
            keys = words.to_pylist()
            self._count(len(keys))
            self.client.emit_many(keys)
            return
        while len(words):
            take = min(len(words), self.chunk - self.pending_len)
            self.pending.append(words.slice(0, take))
            self.pending_len += take
            self.position += take
            words = words.slice(take)
            if self.pending_len == self.chunk:
                self._fold()
                if len(self.totals) >= self.max_keys:
                    self.send_totals()

    def _fold(self) -> None:
        if not self.pending:
            return
        import pyarrow as pa
        import pyarrow.compute as pc
        words = self.pending[0] if len(self.pending) == 1 else pa.concat_arrays(self.pending)
        self.pending, self.pending_len = [], 0
        counts = pc.value_counts(words)
        totals = self.totals
        get = totals.get
        for key, n in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist()):
            totals[key] = get(key, 0) + n

    def send_totals(self) -> None:
        if self.totals:
            self._count(len(self.totals))
            emit = self.client.emit
            for key, total in self.totals.items():
                emit(key, total)
            self.totals = {}
            if self.after_flush is not None:
                self.after_flush(self.position)

    def send(self) -> None:
        pass                              # nothing is buffered here but the totals

    def drain(self) -> None:
        self._fold()
        self.send_totals()
