"""The executor side: one Spark partition of one micro-batch is one mapper.

Runs in Spark's Python worker processes. The RingClient is created inside the worker
(gRPC channels must not cross the fork that made the worker) and kept for the worker's
next task (spark_driver.connections); each task rebinds it and flushes before it
returns, so Spark commits a batch only once the ring holds all of it on r+1
nodes. Tuples are numbered from (batch id, position) under the source
`<query id>#<partition id>` (wire.epochs): a retried task or a batch replayed
after a driver restart resends the very same (source, seq)s and the ring drops them.

Three ways in:
- `write_lines`: the default word split, done here by the mapper's kernel (in C, as
  mapper.words.split_words) on the partition's lines, Arrow arrays (mapInArrow);
- `write_words`: the same split done by Spark SQL in the JVM; the task gets the
  partition's words as Arrow arrays and sends them in bulk;
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
    # (address, node) of the ring the driver saw: a worker's first client expects each
    # seed's member on its first channel, one TLS handshake a node, not two.
    names: tuple[tuple[str, str], ...] = ()


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


def write_lines(config: PartitionConfig, batch_id: int, partition_id: int, arrays) -> int:
    """Push the words of a partition's lines, Arrow string arrays in the partition's
    order, to the ring, the word split done here by the mapper's kernel; return the
    number of tuples sent."""
    return feed_lines(config, batch_id, partition_id, arrays)[0]


def feed_lines(config: PartitionConfig, batch_id: int, partition_id: int,
               arrays) -> tuple[int, int]:
    """write_lines, returning (tuples sent, words split): feed_words over each array's
    words, split by the kernel (mapper.words.split_words in C: `words_of`)."""
    return feed_words(config, batch_id, partition_id, (words_of(a) for a in arrays))


def words_of(lines):
    """The words of an Arrow string array of lines, in order, as split_words gives them
    (a null line gives none): a large_string array split by the mapper's kernel from the
    lines' UTF-8 buffers, no Python object per line or word."""
    import pyarrow as pa
    from floering.mapper.kernel import kernel
    if pa.types.is_string(lines.type) or pa.types.is_large_string(lines.type):
        width = 4 if pa.types.is_string(lines.type) else 8
        validity, offsets, data = lines.buffers()
        start = lines.offset
        words, ends, n = kernel.split_words(data, offsets, width, start, start + len(lines),
                                            validity if lines.null_count else None, 0)
    else:
        from floering.mapper.words import split_words
        raw = [w.encode() for line in lines.to_pylist() if line is not None
               for w in split_words(str(line))]
        words, ends = _encoded_bytes(raw)
        n = len(raw)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(ends), pa.py_buffer(words))


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
                                 tls_dir=config.tls_dir, plan=config.plan,
                                 names=config.names)
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
    if marker is None:
        raise ValueError("a fault is injected with fail_once or hang_once set")
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
            _send_pairs(self.client, self.totals)
            self.totals = Counter()
            if self.after_flush is not None:
                self.after_flush(self.position)

    def drain(self) -> None:
        self.send()
        self.send_totals()


def _send_pairs(client, totals: dict) -> None:
    """Every (key, total) in order, one seq each: str keys with int64 totals as UTF-8
    buffers through the append kernel (RingClient.emit_utf8), anything else one by
    one."""
    keys = list(totals)
    values = list(totals.values())
    if not set(map(type, keys)) - {str} and not set(map(type, values)) - {int} and \
            _INT64[0] <= min(values) and max(values) <= _INT64[1]:
        from array import array
        try:
            data, offsets = _encoded(keys)
        except UnicodeEncodeError:
            pass                          # refused by emit, key by key, as before
        else:
            client.emit_utf8(data, offsets, 8, len(keys), values=array("q", values))
            return
    emit = client.emit
    for key, total in zip(keys, values):
        emit(key, total)


_INT64 = (-(1 << 63), (1 << 63) - 1)


class _WordEmitter(_Counting):
    """The Arrow path, on the mapper's combiner kernels (mapper/kernel.py) with no
    Python object per word: each Arrow array of words goes to the ring as its UTF-8
    buffers (RingClient.emit_utf8: hashed, routed and encoded in bulk by the append
    kernel, one seq each in order). Combining folds the words into one table of totals
    (a kernel's part) and sends them whenever it holds `max_keys` keys, right after the
    word that made it so, and at the end: where the flushes fall depends only on the
    words, never on the Arrow batch sizes or the ring, and so do the totals' seqs (their
    first-seen order)."""

    def __init__(self, client, combine: bool, max_keys: int = COMBINE_KEYS) -> None:
        from floering.mapper.batching import MAX_KEY_BYTES
        from floering.mapper.kernel import kernel
        self.client = client
        self.combine = combine
        self.max_keys = max(1, max_keys)
        self.kernel = kernel
        self.totals = kernel.Combiner("sum", (0,), MAX_KEY_BYTES) if combine else None

    def add(self, words) -> None:
        self.inputs += len(words)
        buffers = utf8_buffers(words)
        if buffers is None:               # nulls, or not a string array: as Python keys
            keys = words.to_pylist()
            if self.combine:
                keys = [_checked_word(k) for k in keys]
                buffers = (*_encoded(keys), 8, len(keys))
            else:
                self.position += len(keys)
                self._count(len(keys))
                self.client.emit_many(keys)
                return
        data, offsets, width, n = buffers
        if not self.combine:
            self.position += n
            self._count(n)
            self.client.emit_utf8(data, offsets, width, n)
            return
        kernel, totals, i = self.kernel, self.totals, 0
        assert totals is not None
        while i < n:
            j, _, status = totals.fold_utf8(data, offsets, width, i, n, 1, None,
                                            self.max_keys, _MOST)
            self.position += j - i
            i = j
            if status in (kernel.FULL, kernel.OVERFLOW):
                self.send_totals()
            elif status != kernel.DONE:
                from floering.mapper.batching import refuse_key
                refuse_key(_word_at(data, offsets, width, i))

    def send_totals(self) -> None:
        if self.totals is None:
            return
        data, offsets, values = self.totals.take_columns(0)
        n = len(offsets) // 8 - 1
        if n:
            self._count(n)
            self.client.emit_utf8(data, offsets, 8, n, values=values)
            if self.after_flush is not None:
                self.after_flush(self.position)

    def send(self) -> None:
        pass                              # nothing is buffered here but the totals

    def drain(self) -> None:
        self.send_totals()


_MOST = 1 << 62        # tuples a table of totals takes: no bound but its keys


def utf8_buffers(words):
    """(data, offsets, offset width, length) of an Arrow string or large_string array
    without nulls (the offsets from the array's own first, a slice's included); None
    for anything else."""
    import pyarrow as pa
    if words.null_count:
        return None
    if pa.types.is_string(words.type):
        width = 4
    elif pa.types.is_large_string(words.type):
        width = 8
    else:
        return None
    _, offsets, data = words.buffers()
    if offsets is None:
        return None
    return data, offsets.slice(words.offset * width), width, len(words)


def _checked_word(key):
    if type(key) is not str:
        from floering.mapper import InvalidKey
        raise InvalidKey(f"key must be str, not {type(key).__name__}")
    return key


def _encoded(keys: list) -> tuple[bytes, bytes]:
    return _encoded_bytes([k.encode() for k in keys])


def _encoded_bytes(raw: list) -> tuple[bytes, bytes]:
    from array import array
    offsets, total = array("q", [0]), 0
    for r in raw:
        total += len(r)
        offsets.append(total)
    return b"".join(raw), offsets.tobytes()


def _word_at(data, offsets, width: int, i: int) -> str:
    at = memoryview(offsets).cast("B").cast("i" if width == 4 else "q")
    raw = bytes(memoryview(data).cast("B")[at[i]:at[i + 1]]) if data is not None else b""
    return raw.decode(errors="surrogateescape")
