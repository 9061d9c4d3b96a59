"""RingClient: the mapper library, usable from plain synchronous code.

Spark executors and scripts are not asyncio programs, so the client runs its own
event loop on a daemon thread. emit() only routes and buffers on the caller's
thread; full batches are handed to the loop, which streams them to each token's
primary and replicas. Create the client inside the process that uses it: gRPC
channels must not cross fork().
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import os
import socket
import threading
import time
import uuid
from collections import deque
from typing import Iterable, Iterator

import grpc
import msgpack

from floering.v1 import floe_pb2
from node.core.batch import KEY_TYPES, encode_payload, encode_seqs
from node.core.codec import pack, unpack, unpack_entries
from node.core.errors import InvalidArgument, InvalidKey, Unavailable
from node.core.ring import Ring
from mapper.delivery import Delivery
from mapper.outbox import PendingBatch
from mapper.routing import Router
from mapper.sharing import check_key, chooser_for
from node.core.balancers import balancer
from node.core.pieces import check_user_key, merge_pieces, piece_key
from node.core.reducers import load_reducer
from node.transport.status import error_from_rpc
from node.transport.tls import TlsFiles

_PLAIN_VALUES = frozenset((int, float, str, bytes, bool, type(None)))

_shared: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_shared_lock = threading.Lock()


def _client_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """One event loop thread per process, shared by every client and never closed:
    grpc.aio binds its completion queue to the loops that use it, and a closed loop
    left bound makes later clients' callbacks fail. Keyed by pid so a forked child
    (Spark's Python workers) starts its own instead of inheriting a dead thread."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid() or not _shared[2].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="floe-mapper", daemon=True)
            thread.start()
            _shared = (os.getpid(), loop, thread)
        return _shared[1], _shared[2]


class _Buffer:
    __slots__ = ("keys", "values", "seqs", "since", "tokens")

    def __init__(self, now: float, tokens: tuple) -> None:
        self.keys: list = []
        self.values: list = []
        self.seqs: list[int] = []
        self.since = now
        # The ring's tokens read before any of its keys was routed: if the ring is
        # cut meanwhile (a split), delivery re-checks every key of the batch.
        self.tokens = tokens


class RingClient:
    """Push (key, value) tuples into a floe ring and query its state.

    `flush()` returns when every tuple emitted so far is acknowledged by its primary
    and all its replicas. Not thread-safe: use one client per thread. `tls`: the
    client's certificate of the ring's CA when the nodes run TLS (`--tls-dir`).
    """

    def __init__(self, seeds: str | Iterable[str], *, source: str | None = None,
                 batch_size: int = 1000, linger: float = 0.05, window: int = 64,
                 max_pending_batches: int = 512, timeout: float = 60.0,
                 rpc_timeout: float = 5.0, expect_reducer: str | None = None,
                 first_seq: int = 1, tls: TlsFiles | None = None) -> None:
        seeds = [s.strip() for s in (seeds.split(",") if isinstance(seeds, str) else seeds)
                 if s.strip()]
        if not seeds:
            raise ValueError("RingClient needs at least one seed address host:port")
        if batch_size < 1 or max_pending_batches < 1:
            raise ValueError("batch_size and max_pending_batches must be >= 1")
        self.source = source or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
        self.batch_size = batch_size
        self.linger = linger
        self.max_pending_batches = max_pending_batches
        self.timeout = timeout
        self.rpc_timeout = rpc_timeout
        self._next_seq = first_seq
        self._batch_ids = itertools.count(1)
        self._buffers: dict[int, _Buffer] = {}
        # Sealed batches wait here in seal order. Per token, seqs must reach a node in
        # order (dedup keeps one watermark per range and source), so both the caller's
        # thread and the linger task only ever append here, under the lock, and the
        # loop drains it front to back.
        self._sealed: deque[PendingBatch] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._loop, self._thread = _client_loop()
        self._delivery = Delivery(seeds, window, rpc_timeout, expect_reducer,
                                  tls.channel_credentials() if tls else None)
        try:
            ring = self._call(self._delivery.fetch_ring())
        except BaseException:
            self._stop_loop()
            raise
        self._router = Router(ring)
        # where each tuple of a shared key goes (the ring's balancer is fixed); a source
        # the caller names may be replayed by another process (a retried Spark task),
        # which must send each seq to the piece it went to: its choice is the seq's
        self._chooser = chooser_for(balancer(ring.balancer), replayable=source is not None)
        self._merging = None                # the reducer, once a read merges pieces
        self._tokens = ring.tokens          # the ring tokens the open buffers were routed with
        self._delivery.on_ring_change = self._router.update
        self._linger_task = self._call(self._start_linger())

    # ------------------------------------------------------------- plumbing

    def _call(self, coro, timeout: float | None = None):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout if timeout is not None else self.timeout)
        except TimeoutError:
            future.cancel()
            raise Unavailable("the ring did not answer in time") from None

    async def _start_linger(self):
        return asyncio.create_task(self._linger_loop())

    async def _linger_loop(self) -> None:
        # Seal buffers older than `linger` so a slow stream still gets delivered.
        while True:
            await asyncio.sleep(self.linger / 2)
            now = time.monotonic()
            with self._lock:
                for token in [t for t, b in self._buffers.items() if now - b.since >= self.linger]:
                    self._seal_locked(token)
            self._drain()
            self._delivery.check_progress()

    @property
    def ring(self) -> Ring:
        return self._delivery.ring

    def refresh_ring(self) -> Ring:
        """Ask the nodes for the newest ring now (the client also does so by itself
        whenever a send is refused or stalls)."""
        return self._call(self._delivery.fetch_ring())

    @property
    def reducer(self) -> str:
        return self._delivery.reducer

    def rebind(self, source: str, first_seq: int = 1) -> None:
        """Reuse this client's connections for a new sequence of tuples: `source` and
        seqs from `first_seq` on. Only between sequences (everything flushed); the
        Push streams are reopened, so the new sequence gets stream numbers above
        anything this process sent before, as a new client would. Also fetches the
        ring (and checks the reducer) again, so a stale view is not carried over."""
        if self._closed:
            raise RuntimeError("the client is closed")
        with self._lock:
            pending = bool(self._buffers or self._sealed)
        if pending or self._delivery.undelivered:
            raise RuntimeError("rebind() needs every tuple flushed first")
        if self._delivery.fatal is not None:
            raise self._delivery.fatal
        self._call(self._delivery.reopen_streams())
        self._call(self._delivery.fetch_ring())
        self._chooser = chooser_for(balancer(self.ring.balancer), replayable=True)
        self.source = source
        self._next_seq = first_seq

    # --------------------------------------------------------------- emit

    def emit(self, key, value=1) -> None:
        """Queue one tuple. Blocks while too many batches are unacknowledged."""
        if type(key) not in KEY_TYPES:
            raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")
        if type(value) not in _PLAIN_VALUES:
            _check_value(value)
        if type(key) is bytes:
            check_user_key(key)
        with self._lock:
            tokens, route, sealed, place = self._routing_locked()
            if place is None:
                token = route(key)
            else:
                key, token = place(key, self._next_seq)
            buf = self._buffers.get(token)
            if buf is None:
                buf = self._buffers[token] = _Buffer(time.monotonic(), tokens)
            buf.keys.append(key)
            buf.values.append(value)
            buf.seqs.append(self._next_seq)
            self._next_seq += 1
            full = len(buf.keys) >= self.batch_size
            if full:
                self._seal_locked(token)
        if full or sealed:
            self._hand_over()

    def _routing_locked(self):
        """The ring's tokens and a router bound to them for one emit call. When a split
        added tokens since the open buffers were started, seal them all first: every
        tuple routed with the old ring then precedes, in seq order per token, every
        tuple routed with the new one (delivery cuts those batches by key)."""
        ring, route = self._router.fixed()
        place = self._chooser.placer(ring, route) if self._chooser else None
        sealed = False
        if ring.tokens is not self._tokens and ring.tokens != self._tokens:
            for token in list(self._buffers):
                self._seal_locked(token)
                sealed = True
        self._tokens = ring.tokens
        return ring.tokens, route, sealed, place

    def emit_many(self, keys: Iterable, value=1) -> None:
        """emit(key, value) for every key, several times faster than a loop of emit()."""
        if type(value) not in _PLAIN_VALUES:
            _check_value(value)
        size = self.batch_size
        with self._lock:
            tokens, route, full, place = self._routing_locked()
            buffers = self._buffers
            seq = self._next_seq
            try:
                for key in keys:
                    if type(key) is not str:
                        check_key(key)
                    if place is None:
                        token = route(key)
                    else:
                        key, token = place(key, seq)
                    buf = buffers.get(token)
                    if buf is None:
                        buf = buffers[token] = _Buffer(time.monotonic(), tokens)
                    buf.keys.append(key)
                    buf.values.append(value)
                    buf.seqs.append(seq)
                    seq += 1
                    if len(buf.keys) >= size:
                        self._seal_locked(token)
                        full = True
            finally:
                self._next_seq = seq
        if full:
            self._hand_over()

    def _seal_locked(self, token: int) -> None:
        buf = self._buffers.pop(token)
        seqs = buf.seqs
        self._sealed.append(PendingBatch(
            next(self._batch_ids), token, self.source, seqs[0], seqs[-1], len(seqs),
            encode_payload(buf.keys, buf.values), encode_seqs(seqs), buf.since,
            tokens=buf.tokens))

    def _drain(self) -> None:
        """On the loop: submit sealed batches in seal order."""
        sealed, submit = self._sealed, self._delivery.submit
        while sealed:
            submit(sealed.popleft())

    def _hand_over(self) -> None:
        d = self._delivery
        if d.fatal is not None:
            raise d.fatal
        with d.changed:
            deadline = time.monotonic() + self.timeout
            while len(d.undelivered) >= self.max_pending_batches and d.fatal is None:
                if not d.changed.wait(max(0.0, deadline - time.monotonic())):
                    raise Unavailable(f"{len(d.undelivered)} batches unacknowledged for "
                                      f"{self.timeout}s; the ring is not accepting tuples")
        self._loop.call_soon_threadsafe(self._drain)

    def flush(self, timeout: float | None = None) -> None:
        """Send every buffered tuple and wait until all are on their r+1 nodes."""
        with self._lock:
            for token in list(self._buffers):
                self._seal_locked(token)
        self._hand_over()
        # Barrier: the loop runs callbacks in order, so once this no-op has run every
        # batch handed over above is in `undelivered`.
        self._call(_noop())
        d = self._delivery
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with d.changed:
            while True:
                if d.fatal is not None:
                    raise d.fatal
                if not d.undelivered:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                d.changed.wait(min(remaining, 0.05))
        raise Unavailable(f"flush timed out with {len(d.undelivered)} batches "
                          f"unacknowledged, {self._call(_describe_waiting(d), 5.0)}")

    def close(self) -> None:
        """Flush, then release the connections."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._stop_loop()

    @property
    def closed(self) -> bool:
        """Closed, and holding no connection any more."""
        return self._closed and not self._delivery.channels

    def _stop_loop(self) -> None:
        async def shutdown():
            task = getattr(self, "_linger_task", None)
            if task:
                task.cancel()
            await self._delivery.close()
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        except Exception:
            pass  # closing is best effort; the loop thread is shared and stays

    def __enter__(self) -> "RingClient":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._stop_loop()

    # --------------------------------------------------------------- queries

    def _query(self, make_call):
        """Run make_call(ring) on the loop; on a stale ring refresh and retry."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._call(make_call(self._delivery.ring))
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
            if not err.refresh_ring or time.monotonic() > deadline:
                raise err
            time.sleep(0.05)
            self._call(self._delivery.fetch_ring())

    def get(self, key):
        """The reducer state of `key`, or None if the ring has never seen it."""
        if type(key) not in KEY_TYPES:
            raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")

        if type(key) is bytes:
            check_user_key(key)

        async def call(ring: Ring):
            keys = [piece_key(key, i) for i in range(balancer(ring.balancer).pieces)]
            return await asyncio.gather(*(
                self._delivery.query_stub(ring.address(ring.owner(k))).Get(
                    floe_pb2.GetRequest(key=pack(k)), timeout=self.rpc_timeout)
                for k in keys))

        states = [unpack(reply.state) for reply in self._query(call) if reply.found]
        if len(states) > 1:                 # the pieces of a shared key
            return functools.reduce(self._reducer().merge, states)
        return states[0] if states else None

    def top(self, k: int = 10) -> list[tuple[object, object]]:
        """The k keys with the highest rank (the count, for word count), best first."""
        if balancer(self.ring.balancer).pieces > 1:
            # a key's pieces rank apart on their nodes: rank the merged whole
            reducer = self._reducer()
            return heapq.nlargest(k, self.scan(), key=lambda e: reducer.sort_key(e[1]))

        async def call(ring: Ring):
            return await asyncio.gather(*(
                self._delivery.query_stub(address).Top(floe_pb2.TopRequest(k=k),
                                                       timeout=self.rpc_timeout)
                for _, address in ring.addresses))

        entries = [e for reply in self._query(call) for e in unpack(reply.entries)]
        return [(key, state) for key, state, _ in heapq.nlargest(k, entries, key=lambda e: e[2])]

    def scan(self) -> Iterator[tuple[object, object]]:
        """Every (key, state) in the ring. Every node is read at the same ring (stamp);
        if the ring changes meanwhile (a range moving), the whole scan starts over, so
        a moving range is never missed or read twice."""
        async def call(ring: Ring):
            async def one(address):
                stub = self._delivery.query_stub(address)
                return [chunk.entries async for chunk in stub.Scan(
                    floe_pb2.ScanRequest(ring_stamp=ring.stamp),
                    timeout=max(self.rpc_timeout, 30.0))]
            return await asyncio.gather(*(one(a) for _, a in ring.addresses))
        replies = self._query(call)
        items = (item for per_node in replies for entries in per_node
                 for item in unpack_entries(entries).items())
        if balancer(self.ring.balancer).pieces > 1:
            yield from merge_pieces(items, self._reducer().merge).items()
        else:
            yield from items

    def _reducer(self):
        """The ring's reducer, loaded here to merge the pieces of shared keys."""
        if self._merging is None:
            self._merging = load_reducer(self.reducer)
        return self._merging

    def delivery_latencies(self) -> list[tuple[float, int]]:
        """(seconds from a batch's first emit to its last ack, tuples in it) for the
        most recent batches delivered."""
        return list(self._delivery.latencies)

    def stats(self, also: dict[str, str] | None = None) -> list[dict]:
        """NodeStats of every member, then of `also` ({node: address}, e.g. processes
        no longer members); an unreachable node gives {'node_id', 'address', 'error'}."""
        async def call(ring: Ring):
            async def one(node, address):
                try:
                    s = await self._delivery.query_stub(address).Stats(
                        floe_pb2.StatsRequest(), timeout=self.rpc_timeout)
                except grpc.RpcError as exc:
                    return {"node_id": node, "address": address, "error": exc.code().name}
                return {f.name: _plain(getattr(s, f.name)) for f in s.DESCRIPTOR.fields}
            asked = list(ring.addresses) + sorted((also or {}).items())
            return await asyncio.gather(*(one(n, a) for n, a in asked))
        return self._query(call)


def _plain(value):
    """A repeated field as a list (JSON-friendly); scalars as they are."""
    return value if isinstance(value, (str, bytes, int, float, bool)) else list(value)


async def _describe_waiting(delivery) -> str:
    return delivery.waiting_for()


async def _noop():
    return None


def _check_value(value) -> None:
    try:
        msgpack.packb(value)
    except Exception as exc:
        raise InvalidArgument(f"value {value!r} is not msgpack-serialisable: {exc}") from None
