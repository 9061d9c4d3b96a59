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
import os
import threading
import time
from typing import Iterable, Iterator

from floering.mapper.batching import batcher_for, linger_loop
from floering.mapper.common import ClientBase
from floering.mapper.queries import get_state, node_stats, query, top_entries, top_of
from floering.mapper.scanning import FOLD_RETRIES, FoldDuringScan, open_scan
from floering.wire.errors import Unavailable
from floering.wire.ring import Ring
from floering.wire.channels import MESSAGE_LIMIT
from floering.mapper.credentials import FIND, TlsChoice, find_tls, mismatch

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


class RingClient(ClientBase):
    """Push (key, value) tuples into a floe ring and query its state.

    `flush()` returns when every tuple emitted so far is acknowledged by its primary
    and all its replicas. Not thread-safe: use one client per thread. `tls`: the
    client's certificate of the ring's CA when the nodes run TLS: a TlsFiles, a
    directory, None for a ring in the clear; by default found as
    `mapper/credentials.py` says (FLOE_TLS_DIR, then ./floe-cluster/tls).
    `columnar`: batches of str keys and int values go in format 2 (columns,
    docs/design.md) rather than format 1: None (the default) when the nodes say they
    decode it, True always, False never. `batch_size`: the tuples a batch holds, or,
    combining, the distinct keys a token's buffer holds before it is sealed; None (the
    default): 1000 tuples, 4096 keys combining (common.COMBINED_BATCH_KEYS).
    `max_message_bytes`: the largest reply taken and request sent, what a node of the
    default settings sends and takes (8 MiB); nodes run with --max-batch-bytes over
    4 MiB send up to twice it. A larger reply fails its call with TooLarge.
    """

    def __init__(self, seeds: str | Iterable[str], *, source: str | None = None,
                 batch_size: int | None = None, linger: float = 0.05, window: int = 64,
                 max_pending_batches: int = 512, timeout: float = 60.0,
                 rpc_timeout: float = 5.0, expect_reducer: str | None = None,
                 first_seq: int = 1, tls: TlsChoice = FIND,
                 combine: bool = True, columnar: bool | None = None,
                 max_message_bytes: int = MESSAGE_LIMIT) -> None:
        self.tls = find_tls("client", tls)
        super().__init__(seeds, source, batch_size, linger, window, max_pending_batches,
                         timeout, rpc_timeout, expect_reducer, self.tls, combine,
                         max_message_bytes)
        self._loop, self._thread = _client_loop()
        try:
            self._call(self._delivery.fetch_ring())
        except BaseException as exc:
            self._stop_loop()
            told = mismatch(exc, self._delivery.seeds, self.tls)
            if told is exc:
                raise
            raise told from None
        # Emitted tuples are routed and buffered on the caller's thread, under the
        # batcher's lock; sealed batches are drained into the delivery on the loop.
        self._batcher = batcher_for(self._delivery, self.source, source is not None,
                                    self.batch_size, first_seq, combine, columnar)
        self.source = self._batcher.source
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
        return asyncio.create_task(linger_loop(self._batcher, self._delivery, self.linger))

    def refresh_ring(self) -> Ring:
        """Ask the nodes for the newest ring now (the client also does so by itself
        whenever a send is refused or stalls)."""
        return self._call(self._delivery.fetch_ring())

    def rebind(self, source: str, first_seq: int = 1, plan=None, *,
               refetch: bool = True) -> None:
        """Reuse this client's connections for a new sequence of tuples: `source` and
        seqs from `first_seq` on, shared keys routed by `plan` (mapper/plans.py; None:
        pieces 0 and 1 evenly). Only between sequences (everything flushed); the
        Push streams are reopened, so the new sequence gets stream numbers above
        anything this process sent before, as a new client would. Also fetches the
        ring (and checks the reducer) again, so a stale view is not carried over;
        `refetch=False` skips that for a client whose ring was fetched just now (a new
        one, given its plan: a ring fetch is 40-90 ms of a fresh client's start)."""
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._batcher.pending or self._delivery.undelivered:
            raise RuntimeError("rebind() needs every tuple flushed first")
        if self._delivery.fatal is not None:
            raise self._delivery.fatal
        self._call(self._delivery.reopen_streams())
        if refetch:
            self._call(self._delivery.fetch_ring())
        self._batcher.rebind(source, first_seq, self.ring, plan)
        self.source = source

    # --------------------------------------------------------------- emit

    def emit(self, key, value=1, *, due: float | None = None) -> None:
        """Queue one tuple. Blocks while too many batches are unacknowledged. `due`:
        the time.monotonic() at which the tuple was due (an open-loop source behind
        schedule), from which delivery_latencies() count; default now."""
        batcher = self._batcher
        if batcher.emit(key, value, due) or batcher.seal_if_idle(self._delivery):
            self._hand_over()

    def emit_many(self, keys: Iterable, value=1, *, due: float | None = None) -> None:
        """emit(key, value) for every key, several times faster than a loop of emit()."""
        batcher = self._batcher
        if batcher.emit_many(keys, value, due) or batcher.seal_if_idle(self._delivery):
            self._hand_over()

    def emit_utf8(self, data, offsets, width: int, count: int, value=1, values=None, *,
                  due: float | None = None) -> None:
        """emit_many for `count` str keys given as UTF-8 buffers (an Arrow string
        array's data and offsets, `width` 4 or 8 bytes each; Batcher.emit_utf8), each
        with `value` or values[i] (int64s), without a Python object per key."""
        batcher = self._batcher
        if batcher.emit_utf8(data, offsets, width, count, value, values, due) or \
                batcher.seal_if_idle(self._delivery):
            self._hand_over()

    def _drain(self) -> None:
        """On the loop: submit sealed batches in seal order."""
        self._batcher.drain(self._delivery.submit)

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
        self._batcher.seal_all()
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

    def _query(self, coro):
        """Run a read (`floering.mapper.queries`) on the loop; it retries on a stale ring."""
        return self._call(coro, self.timeout + self.rpc_timeout)

    def get(self, key):
        """The reducer state of `key`, or None if the ring has never seen it."""
        return self._query(get_state(self._delivery, self.timeout, self.rpc_timeout, key,
                                     self._reducer))

    def top(self, k: int = 10) -> list[tuple[object, object]]:
        """The k keys with the highest rank (the count, for word count), best first."""
        if self.shares_keys:
            # a key's pieces rank apart on their nodes: rank the merged whole, read
            # again if a fold ran meanwhile (a scan raises rather than count it wrong)
            for attempt in range(FOLD_RETRIES):
                try:
                    return top_of(self.scan(), k, self._reducer())
                except FoldDuringScan:
                    if attempt == FOLD_RETRIES - 1:
                        raise
        return self._query(top_entries(self._delivery, self.timeout, self.rpc_timeout, k))

    def scan(self, chunk: int = 0) -> Iterator[tuple[object, object]]:
        """Every (key, state) in the ring, streamed: chunk by chunk as the nodes send
        them (`chunk` keys each; 0: the nodes' default), the pieces of shared keys
        merged (see `floering.mapper.scanning`). Every node is read at the same ring
        (stamp); if the ring changes before the first item (a range moving), the scan
        starts over, so a moving range is never missed or read twice; a node lost later
        raises, and so does a fold of a shared key that ran while the scan read it
        (`FoldDuringScan`, an `Unavailable`), before the shared keys are handed on."""
        merge = self._reducer().merge if self.shares_keys else None
        scan = self._query(open_scan(self._delivery, functools.partial(
            query, self._delivery, self.timeout), merge, chunk))
        try:
            while (items := self._call(scan.next_chunk())) is not None:
                yield from items
        finally:
            self._loop.call_soon_threadsafe(scan.cancel)

    def scan_all(self) -> dict:
        """The whole ring as one dict (held in memory, unlike scan()), read again if a
        fold of a shared key ran while it read (FoldDuringScan)."""
        for attempt in range(FOLD_RETRIES):
            try:
                return dict(self.scan())
            except FoldDuringScan:
                if attempt == FOLD_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def stats(self, also: dict[str, str] | None = None) -> list[dict]:
        """NodeStats of every member, then of `also` ({node: address}, e.g. processes
        no longer members); an unreachable node gives {'node_id', 'address', 'error'}."""
        return self._query(node_stats(self._delivery, self.timeout, self.rpc_timeout, also))


async def _describe_waiting(delivery) -> str:
    return delivery.waiting_for()


async def _noop():
    return None
