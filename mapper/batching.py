"""The mapper's emit side, shared by the sync and the asyncio client: route each
tuple to its token's buffer, seal full (or lingering) buffers into batches in seal
order, and hand them to the delivery. No I/O: the client decides on which thread and
loop the sealed batches are drained into `Delivery.submit`."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket
import threading
import time
import uuid
from bisect import bisect_left
from collections import deque
from typing import Iterable, Protocol

import msgpack

from floering.mapper.kernel import Combiner, KernelBuffer, kernel, kernel_value, new_combiner
from floering.mapper.outbox import PendingBatch
from floering.mapper.routing import Router
from floering.mapper.sharing import check_key, chooser_for
from floering.wire.balancers import balancer
from floering.wire.channels import MESSAGE_LIMIT, check_message_bytes
from floering.node.core.batch import (DEFAULT_LIMITS, KEY_TYPES, encode_batch, encode_payload,
                                      encode_seqs, positions_of)
from floering.wire.errors import InvalidArgument, InvalidKey
from floering.wire.hashing import key_bytes
from floering.wire.pieces import check_user_key

PLAIN_VALUES = frozenset((int, float, str, bytes, bool, type(None)))
# A combining buffer is sealed at batch_size keys or this many tuples per key of it.
COMBINED_INPUTS_PER_KEY = 64
SEAL_TICK = 0.002     # seconds between two looks at which buffers may go
BULK_ROUTE_MIN = 64   # keys not yet cached, from which a list is hashed in one call
MAX_KEY_BYTES = DEFAULT_LIMITS.max_key_bytes      # what a node takes
# A token's buffer is sealed once its tuples' bytes reach this, whatever their count:
# with one more tuple (a key of 64 KiB, a value of 1 MiB at most) a batch stays under
# a node's --max-batch-bytes (4 MiB by default), and a Push message (batches packed
# up to 2 MiB, delivery.MESSAGE_BYTES) under the 8 MiB message limit.
SEAL_BYTES = 1 << 20
TUPLE_BYTES = 24      # what a tuple costs beside its key and value (format 2's columns)


class OpenBuffer(Protocol):
    """A token's open buffer, of any kind (a batcher holds one kind a token at a time):
    when its first tuple was due, and the ring's tokens its keys were routed with."""
    since: float
    tokens: tuple


def wrong_kind(token: int, buf: OpenBuffer, wanted: type) -> TypeError:
    """The error for an open buffer of another kind than the one being filled (each
    emit seals the other kinds first, so this is a bug)."""
    return TypeError(f"token {token}'s open buffer is a {type(buf).__name__}, "
                     f"not a {wanted.__name__}")


class Buffer:
    __slots__ = ("keys", "values", "seqs", "since", "tokens", "nbytes")

    def __init__(self, now: float, tokens: tuple) -> None:
        self.keys: list = []
        self.values: list = []
        self.seqs: list[int] = []
        self.nbytes = 0            # about what its tuples take in a batch (value_size)
        self.since = now
        # The ring's tokens read before any of its keys was routed: if the ring is
        # cut meanwhile (a split), delivery re-checks every key of the batch.
        self.tokens = tokens


class AppendBuffer(KernelBuffer):
    """A token's open buffer held in the append kernel (its part `index`)."""
    __slots__ = ()


class Batcher:
    """Open buffers per token and the sealed batches waiting for the loop. Per token,
    seqs must reach a node in order (dedup keeps one watermark per range and source),
    so tuples are only ever appended to `sealed` under the lock, and the loop drains it
    front to back."""

    def __init__(self, router: Router, chooser, source: str, batch_size: int,
                 first_seq: int = 1, columnar: bool | None = False,
                 speaks_columns=None, clock=time.monotonic) -> None:
        self.router = router
        self.clock = clock                     # monotonic seconds: when tuples are born
        # Format 2 (columns) when asked (True), never (False), or when every node that
        # answered for the ring said it speaks format 2 (None: `speaks_columns()`).
        self.columnar = columnar
        self.speaks_columns = speaks_columns or (lambda: False)
        self.chooser = chooser
        self.source = source
        self.batch_size = batch_size
        self.next_seq = first_seq
        self.buffers: dict[int, OpenBuffer] = {}
        self.sealed: deque[PendingBatch] = deque()
        self.lock = threading.Lock()
        self.tokens = router.ring.tokens       # the ring tokens the open buffers were routed with
        self._batch_ids = itertools.count(1)
        # str keys with an int64 value, where no key is shared (no chooser), are routed
        # and buffered by the append kernel (mapper/kernel.py): each token's keys,
        # values and seqs in C, sealed straight into a payload (`kernels` False: Python
        # lists, as before)
        self.appender: Combiner | None = None
        self.kernels = True

    def rebind(self, source: str, first_seq: int, ring, plan=None) -> None:
        """A new sequence of tuples (nothing buffered): `source`, seqs from `first_seq`
        on, a replayable choice of pieces within routing `plan` (see `batcher_for`)."""
        with self.lock:
            self.source = source
            self.next_seq = first_seq
            self.chooser = chooser_for(balancer(ring.balancer), replayable=True,
                                       source=source, plan=plan)

    @property
    def pending(self) -> bool:
        with self.lock:
            return bool(self.buffers or self.sealed)

    def seal_if_idle(self, delivery) -> bool:
        """Seal every open buffer when nothing is on its way (no sealed batch waiting,
        none unacknowledged): a light stream then waits for no linger, and under load,
        while batches are in flight, buffers keep filling (as Nagle's rule does)."""
        if self.sealed or delivery.undelivered or not self.buffers:
            return False
        self.seal_all()
        return True

    def emit(self, key, value, due: float | None = None) -> bool:
        """Buffer one tuple; True when a batch was sealed (the caller hands it over).
        `due`: the monotonic time the tuple was due (default: now), from which its
        batch's delivery latency counts."""
        if type(key) is str and self.chooser is None and self.kernels and kernel_value(value):
            return self._append([key], value, due or self.clock())
        if type(key) not in KEY_TYPES:
            raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")
        value_bytes = value_size(value)
        if type(key) is bytes:
            check_user_key(key)
        if type(key) is not int and len(key) > MAX_KEY_BYTES // 4:
            check_key_bytes([key_bytes(key)])
        with self.lock:
            tokens, route, sealed, place = self._routing_locked()
            self._seal_kind_locked(AppendBuffer)
            if place is None:
                token = route(key)
            else:
                key, token = place(key, self.next_seq)
            buf = self.buffers.get(token)
            if buf is None:
                buf = self.buffers[token] = Buffer(due or self.clock(), tokens)
            elif not isinstance(buf, Buffer):
                raise wrong_kind(token, buf, Buffer)
            buf.keys.append(key)
            buf.values.append(value)
            buf.seqs.append(self.next_seq)
            buf.nbytes += key_size(key) + value_bytes
            self.next_seq += 1
            if len(buf.keys) >= self.batch_size or buf.nbytes >= SEAL_BYTES:
                self._seal_locked(token)
                sealed = True
        return sealed

    def emit_many(self, keys: Iterable, value, due: float | None = None) -> bool:
        """emit(key, value) for every key, several times faster than a loop of emit()."""
        value_bytes = value_size(value)
        size = self.batch_size
        born = due or self.clock()
        if type(keys) is list and self.chooser is None and self.kernels and \
                kernel_value(value):
            # str keys the kernel takes, checked in one pass in C; else as before
            if kernel.check_keys(keys, MAX_KEY_BYTES)[1] == kernel.DONE:
                return self._append(keys, value, born, checked=True)
            if not set(map(type, keys)) - {str}:
                return self._append(keys, value, born)
        with self.lock:
            tokens, route, full, place = self._routing_locked()
            self._seal_kind_locked(AppendBuffer)
            buffers = self.buffers
            seq = self.next_seq
            cached = route.cached          # a dict lookup, not a call, for a known key
            if place is None and type(keys) is list:
                route_in_bulk(keys, tokens, route)
            try:
                for key in keys:
                    if type(key) is not str:
                        check_key(key)
                    if place is None:
                        token = cached(key)
                        if token is None:
                            token = route(key)
                    else:
                        key, token = place(key, seq)
                    buf = buffers.get(token)
                    if buf is None:
                        buf = buffers[token] = Buffer(born, tokens)
                    elif not isinstance(buf, Buffer):
                        raise wrong_kind(token, buf, Buffer)
                    buf.keys.append(key)
                    buf.values.append(value)
                    buf.seqs.append(seq)
                    buf.nbytes += (len(key) if type(key) is str and key.isascii()
                                   else key_size(key)) + value_bytes
                    seq += 1
                    if len(buf.keys) >= size or buf.nbytes >= SEAL_BYTES:
                        self._seal_locked(token)
                        full = True
            finally:
                self.next_seq = seq
        return full

    def _append(self, keys: list, value: int, born: float, checked: bool = False) -> bool:
        """Route and buffer str keys with one int64 value in the append kernel; seqs as
        emit_many gives them (one each, in order). A bad key is refused before any
        tuple is buffered (`checked`: check_keys found none)."""
        if not checked:
            check_str_keys(keys)
        return self._append_with(
            lambda appender, i, seq0: appender.fold(keys, i, value, None, self.batch_size,
                                                    0, seq0, SEAL_BYTES),
            lambda i: refuse_key(keys[i]), born)

    def _append_with(self, fold, refuse, born: float) -> bool:
        """The append kernel's loop: `fold(appender, i, seq0)` buffers keys from the
        i-th until a buffer is full (sealed here) or the keys end; `refuse(i)` raises
        for a key the kernel would not take. Seqs one a key, in order."""
        with self.lock:
            tokens, _, full, _ = self._routing_locked()
            self._seal_kind_locked(Buffer)
            appender = self.appender
            if appender is None or appender.tokens != tokens:   # (a new ring sealed all)
                appender = self.appender = new_combiner("append", tokens, MAX_KEY_BYTES)
            buffers, seq0, i = self.buffers, self.next_seq, 0
            try:
                while True:
                    i, t, status = fold(appender, i, seq0)
                    for index in appender.opened:
                        buffers[tokens[index]] = AppendBuffer(born, tokens, index)
                    appender.opened.clear()
                    if status == kernel.DONE:
                        return full
                    if status != kernel.FULL:
                        refuse(i)
                    self._seal_locked(tokens[t])
                    full = True
            finally:
                self.next_seq = seq0 + i

    def emit_utf8(self, data, offsets, width: int, count: int, value: int = 1,
                  values=None, due: float | None = None) -> bool:
        """emit_many for `count` str keys given as UTF-8 bytes, key i
        data[offsets[i]:offsets[i + 1]] (`width`-byte little-endian offsets: an Arrow
        string array's buffers), each with `value` or values[i] (an int64 buffer);
        seqs one each, in order. Routed, buffered and encoded by the append kernel
        without a Python object per key. A key the nodes would refuse raises
        InvalidKey once the keys before it are buffered. Where keys are placed tuple
        by tuple (a sharing balancer) or combined, the keys are decoded and emitted."""
        born = due or self.clock()
        if self.chooser is not None or getattr(self, "combining", False) or not self.kernels:
            return self._emit_decoded(data, offsets, width, count, value, values, born)
        if values is None:
            if not kernel_value(value):
                raise InvalidArgument(f"value {value!r} is not an int64")

        def refuse(i: int) -> None:
            raise InvalidKey(f"key {i} of the buffer is not UTF-8 or over "
                             f"{MAX_KEY_BYTES} bytes")
        return self._append_with(
            lambda appender, i, seq0: appender.fold_utf8(data, offsets, width, i, count, value,
                                                         values, self.batch_size, 0, seq0,
                                                         SEAL_BYTES),
            refuse, born)

    def _emit_decoded(self, data, offsets, width: int, count: int, value, values,
                      born: float) -> bool:
        raw = bytes(memoryview(data).cast("B")) if data is not None else b""
        at = memoryview(offsets).cast("B").cast("i" if width == 4 else "q")
        try:
            keys = [raw[at[i]:at[i + 1]].decode() for i in range(count)]
        except UnicodeDecodeError as exc:
            raise InvalidKey(f"str key is not valid UTF-8: {exc.reason}") from None
        if values is None:
            return self.emit_many(keys, value, born)
        vals = memoryview(values).cast("B").cast("q")
        full = False
        for i, key in enumerate(keys):
            full |= self.emit(key, vals[i], born)
        return full

    def _seal_kind_locked(self, kind: type) -> None:
        if self.buffers:
            for token in [t for t, b in self.buffers.items() if type(b) is kind]:
                self._seal_locked(token)

    def _routing_locked(self):
        """The ring's tokens and a router bound to them for one emit call. When a split
        added tokens since the open buffers were started, seal them all first: every
        tuple routed with the old ring then precedes, in seq order per token, every
        tuple routed with the new one (delivery cuts those batches by key)."""
        ring, route = self.router.fixed()
        place = self.chooser.placer(ring, route) if self.chooser else None
        sealed = False
        if ring.tokens is not self.tokens and ring.tokens != self.tokens:
            for token in list(self.buffers):
                self._seal_locked(token)
                sealed = True
        self.tokens = ring.tokens
        return ring.tokens, route, sealed, place

    def seal_all(self) -> None:
        with self.lock:
            for token in list(self.buffers):
                self._seal_locked(token)

    def seal_older(self, linger: float, busy: set | frozenset = frozenset()) -> None:
        """Seal the buffers whose token has no batch on its way (not in `busy`), and
        those `linger` seconds old whatever: each token's next batch goes as soon as
        its last one is acknowledged (Nagle's rule per token), so a light stream waits
        for a round trip at most, and a heavy one fills its batches meanwhile."""
        now = self.clock()
        with self.lock:
            for token in [t for t, b in self.buffers.items()
                          if t not in busy or now - b.since >= linger]:
                self._seal_locked(token)

    def _seal_locked(self, token: int) -> None:
        buf = self.buffers.pop(token)
        if type(buf) is AppendBuffer:
            appender = self.appender
            if appender is None:
                raise RuntimeError(f"token {token}'s buffer is in the append kernel, "
                                   f"which this batcher has not opened")
            first, last, packed = appender.take_seqs(buf.index)
            payload, count, _ = appender.take(buf.index, 2 if self.columns() else 1)
            self.sealed.append(PendingBatch(next(self._batch_ids), token, self.source, first,
                                            last, count, payload, packed, buf.since,
                                            tokens=buf.tokens))
            return
        if not isinstance(buf, Buffer):
            raise wrong_kind(token, buf, Buffer)
        seqs = buf.seqs
        self.sealed.append(PendingBatch(
            next(self._batch_ids), token, self.source, seqs[0], seqs[-1], len(seqs),
            self.encode(buf.keys, buf.values), encode_seqs(seqs), buf.since,
            tokens=buf.tokens))

    def columns(self) -> bool:
        """Whether a batch sealed now goes in format 2."""
        return self.speaks_columns() if self.columnar is None else self.columnar

    def encode(self, keys: list, values: list) -> bytes:
        return (encode_batch if self.columns() else encode_payload)(keys, values)

    def drain(self, submit) -> None:
        """On the loop: submit sealed batches in seal order."""
        sealed = self.sealed
        while sealed:
            submit(sealed.popleft())


async def linger_loop(batcher: Batcher, delivery, linger: float) -> None:
    """On the delivery's loop, for the client's life: every few ms, seal the buffers
    of tokens with nothing on its way and those older than `linger`, submit them, and
    let the delivery look for a newer ring when acks stall."""
    tick = min(linger / 2, SEAL_TICK)
    delivery.on_delivered = functools.partial(seal_and_drain, batcher, delivery, linger)
    try:
        while True:
            await asyncio.sleep(tick)
            seal_and_drain(batcher, delivery, linger)
            delivery.check_progress()
    finally:
        delivery.on_delivered = None


def seal_and_drain(batcher: Batcher, delivery, linger: float) -> None:
    """On the delivery's loop: submit what is sealed, then seal the buffers of tokens
    with nothing on its way and those older than `linger`, and submit them. Run at
    every tick and as soon as a reply completes a batch's delivery, so a token's next
    batch goes without waiting for the tick."""
    batcher.drain(delivery.submit)
    if batcher.buffers:
        batcher.seal_older(linger, {b.token for b in delivery.undelivered.values()})
        batcher.drain(delivery.submit)


def route_in_bulk(keys: list, tokens: tuple, route) -> None:
    """Check the str keys of `keys` the route does not know yet against the nodes' key
    size limit, before any tuple is buffered, and cache their tokens, hashed in one
    call (in C) rather than one by one. A key that is not UTF-8 is left to the route,
    which refuses it as before."""
    cached = route.cached
    misses = [k for k in dict.fromkeys(keys) if type(k) is str and cached(k) is None]
    try:
        data = list(map(str.encode, misses))
    except UnicodeEncodeError:
        return
    check_key_bytes(data)
    if len(misses) < BULK_ROUTE_MIN:
        return
    positions = positions_of(data)
    last = len(tokens)
    route.fill(misses, [tokens[i] if i < last else tokens[0]
                        for i in map(functools.partial(bisect_left, tokens), positions)])


def check_str_keys(keys: list) -> None:
    """Raise InvalidKey when a str key of `keys` is not UTF-8 or over the nodes' key
    size limit (one pass in C for the usual ASCII keys)."""
    if not keys:
        return
    if max(map(len, keys)) > MAX_KEY_BYTES // 4:      # (a char is at most 4 bytes)
        check_key_bytes([k.encode(errors="surrogatepass") for k in keys
                         if len(k) > MAX_KEY_BYTES // 4])
    text = "".join(keys)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise InvalidKey(f"str key is not valid UTF-8: {exc.reason}") from None


def refuse_key(key: str) -> None:
    """Raise InvalidKey for a str key a kernel would not take: not UTF-8, too long."""
    try:
        data = key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidKey(f"str key is not valid UTF-8: {exc.reason}") from None
    check_key_bytes([data])
    raise InvalidKey(f"key of {len(data)} bytes refused")


def check_key_bytes(data: list[bytes]) -> None:
    if data and max(map(len, data)) > MAX_KEY_BYTES:
        size = max(map(len, data))
        raise InvalidKey(f"a key of {size} bytes is over the limit of {MAX_KEY_BYTES} bytes")


def check_value(value) -> int:
    """The msgpack bytes of `value`; InvalidArgument when it has none."""
    try:
        return len(msgpack.packb(value))
    except Exception as exc:
        raise InvalidArgument(f"value {value!r} is not msgpack-serialisable: {exc}") from None


def value_size(value) -> int:
    """About the bytes `value` takes in a batch, with a tuple's own (TUPLE_BYTES);
    a value that is not plain is encoded once to check it (InvalidArgument) and
    measure it."""
    kind = type(value)
    if kind is str or kind is bytes:
        return TUPLE_BYTES + 5 + (len(value) if kind is bytes or value.isascii()
                                  else 4 * len(value))
    if kind in PLAIN_VALUES:
        return TUPLE_BYTES + 9
    return TUPLE_BYTES + check_value(value)


def key_size(key) -> int:
    """A key's bytes in a batch, or (a str key not ASCII) at most that."""
    kind = type(key)
    if kind is int:
        return 9
    return len(key) if kind is bytes or key.isascii() else 4 * len(key)


def check_settings(seeds, batch_size: int, max_pending_batches: int,
                   max_message_bytes: int = MESSAGE_LIMIT) -> list[str]:
    """The seed addresses of a client's `seeds` (a comma-separated str or a list);
    ValueError for a setting out of its range."""
    check_message_bytes(max_message_bytes)
    seeds = [s.strip() for s in (seeds.split(",") if isinstance(seeds, str) else seeds)
             if s.strip()]
    if not seeds:
        raise ValueError("a ring client needs at least one seed address host:port")
    if batch_size < 1 or max_pending_batches < 1:
        raise ValueError("batch_size and max_pending_batches must be >= 1")
    return seeds


def default_source() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"


def batcher_for(delivery, source: str, named: bool, batch_size: int,
                first_seq: int, combine: bool = True,
                columnar: bool | None = None) -> Batcher:
    """A batcher routing with the delivery's ring (kept current by the delivery). Where
    each tuple of a shared key goes follows the ring's balancer (fixed); a source the
    caller names (`named`) may be replayed by another process (a retried Spark task),
    which must send each seq to the piece it went to: its choice is drawn from
    (source, seq), within a routing plan given to `rebind` (mapper/plans.py). With
    `combine`, an unnamed source pre-aggregates when the ring's reducer has a merge
    (`mapper/combining.py`)."""
    from floering.mapper.combining import CombiningBatcher, combiner_for   # it builds on Batcher

    ring = delivery.ring
    router = Router(ring)
    delivery.on_ring_change = router.update
    chooser = chooser_for(balancer(ring.balancer), replayable=named, source=source)
    reducer = combiner_for(ring.reducer) if combine and not named else None
    speaks = getattr(delivery, "speaks_columns", None)
    clock = getattr(delivery, "clock", time.monotonic)
    if reducer is not None:
        return CombiningBatcher(router, chooser, source, batch_size, reducer,
                                max_inputs=COMBINED_INPUTS_PER_KEY * batch_size,
                                columnar=columnar, speaks_columns=speaks, clock=clock)
    return Batcher(router, chooser, source, batch_size, first_seq, columnar, speaks, clock)
