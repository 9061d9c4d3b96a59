"""AsyncRingClient: the mapper library for asyncio programs.

The same machinery as RingClient (`mapper/client.py`): tuples routed and batched by
the batcher, delivered exactly once per (source, seq) by the delivery (one Push
stream per node, resends on a ring change), reads retried on a stale ring. Where
RingClient runs it on a loop thread of its own, this client runs it on the caller's
running loop: no thread, and every method that may wait is a coroutine.

    async with AsyncRingClient("127.0.0.1:7000") as client:
        await client.emit_many(words)
        await client.flush()
        async for key, state in client.scan():
            ...
"""

from __future__ import annotations

import asyncio
import functools
from typing import AsyncIterator, Iterable

from floering.mapper.batching import Batcher, batcher_for, linger_loop
from floering.mapper.common import ClientBase
from floering.mapper.queries import get_state, node_stats, query, top_entries, top_of
from floering.mapper.scanning import FOLD_RETRIES, FoldDuringScan, open_scan
from floering.wire.errors import Unavailable
from floering.wire.ring import Ring
from floering.wire.channels import MESSAGE_LIMIT
from floering.mapper.credentials import FIND, TlsChoice, find_tls, mismatch

POLL = 0.005        # seconds between two looks at the delivery while waiting on it


class AsyncRingClient(ClientBase):
    """Push (key, value) tuples into a floe ring and query its state, from asyncio.

    Use it as `async with AsyncRingClient(...) as client` (or `await connect()`, then
    `await close()`), on one event loop: its gRPC channels belong to that loop. The
    arguments are RingClient's."""

    def __init__(self, seeds, *, source: str | None = None, batch_size: int | None = None,
                 linger: float = 0.05, window: int = 64, max_pending_batches: int = 512,
                 timeout: float = 60.0, rpc_timeout: float = 5.0,
                 expect_reducer: str | None = None, first_seq: int = 1,
                 tls: TlsChoice = FIND, combine: bool = True,
                 columnar: bool | None = None,
                 max_message_bytes: int = MESSAGE_LIMIT) -> None:
        self.tls = find_tls("client", tls)
        super().__init__(seeds, source, batch_size, linger, window, max_pending_batches,
                         timeout, rpc_timeout, expect_reducer, self.tls, combine,
                         max_message_bytes)
        self._named = source is not None
        self._first_seq = first_seq
        self._batcher: Batcher | None = None
        self._columnar = columnar
        self._linger_task: asyncio.Task | None = None

    async def connect(self) -> "AsyncRingClient":
        """Fetch the ring and start the linger task (the first emit does it too)."""
        await self._connected()
        return self

    async def _connected(self) -> Batcher:
        """connect(), then the batcher it made."""
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._batcher is not None:
            return self._batcher
        try:
            await self._delivery.fetch_ring()
        except Unavailable as exc:
            told = await asyncio.to_thread(mismatch, exc, self._delivery.seeds, self.tls)
            if told is exc:
                raise
            raise told from None
        batcher = self._batcher = batcher_for(self._delivery, self.source, self._named,
                                              self.batch_size, self._first_seq,
                                              self.combine, self._columnar)
        self.source = batcher.source
        self._linger_task = asyncio.create_task(
            linger_loop(batcher, self._delivery, self.linger))
        return batcher

    async def __aenter__(self) -> "AsyncRingClient":
        return await self.connect()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self._shutdown()

    async def refresh_ring(self) -> Ring:
        """Ask the nodes for the newest ring now."""
        return await self._delivery.fetch_ring()

    async def rebind(self, source: str, first_seq: int = 1, plan=None) -> None:
        """RingClient.rebind: a new sequence of tuples on the same connections."""
        batcher = await self._connected()
        if batcher.pending or self._delivery.undelivered:
            raise RuntimeError("rebind() needs every tuple flushed first")
        if self._delivery.fatal is not None:
            raise self._delivery.fatal
        await self._delivery.reopen_streams()
        await self._delivery.fetch_ring()
        batcher.rebind(source, first_seq, self.ring, plan)
        self.source = source

    # --------------------------------------------------------------- emit

    async def emit(self, key, value=1, *, due: float | None = None) -> None:
        """Queue one tuple; waits while too many batches are unacknowledged."""
        batcher = self._batcher if self._batcher is not None else await self._connected()
        if batcher.emit(key, value, due) or batcher.seal_if_idle(self._delivery):
            await self._hand_over(batcher)

    async def emit_many(self, keys: Iterable, value=1, *, due: float | None = None) -> None:
        """emit(key, value) for every key, several times faster than a loop of emit()."""
        batcher = self._batcher if self._batcher is not None else await self._connected()
        if batcher.emit_many(keys, value, due) or batcher.seal_if_idle(self._delivery):
            await self._hand_over(batcher)

    async def _hand_over(self, batcher: Batcher) -> None:
        d = self._delivery
        await self._wait(lambda: len(d.undelivered) < self.max_pending_batches, self.timeout,
                         lambda: f"{len(d.undelivered)} batches unacknowledged for "
                                 f"{self.timeout}s; the ring is not accepting tuples")
        batcher.drain(d.submit)

    async def flush(self, timeout: float | None = None) -> None:
        """Send every buffered tuple and wait until all are on their r+1 nodes."""
        batcher = await self._connected()
        batcher.seal_all()
        await self._hand_over(batcher)
        d = self._delivery
        await self._wait(lambda: not d.undelivered,
                         self.timeout if timeout is None else timeout,
                         lambda: f"flush timed out with {len(d.undelivered)} batches "
                                 f"unacknowledged, {d.waiting_for()}")

    async def _wait(self, done, timeout: float, why) -> None:
        """Until done() (polling the delivery), the delivery failed, or `timeout`."""
        d = self._delivery
        deadline = d.clock() + timeout
        while d.fatal is None and not done():
            if d.clock() > deadline:
                raise Unavailable(why())
            await asyncio.sleep(POLL)
        if d.fatal is not None:
            raise d.fatal

    async def close(self) -> None:
        """Flush, then release the connections."""
        if self._closed:
            return
        try:
            if self._batcher is not None:
                await self.flush()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        if self._linger_task is not None:
            self._linger_task.cancel()
        await self._delivery.close()

    # --------------------------------------------------------------- queries

    async def get(self, key):
        """The reducer state of `key`, or None if the ring has never seen it."""
        await self.connect()
        return await get_state(self._delivery, self.timeout, self.rpc_timeout, key,
                               self._reducer)

    async def top(self, k: int = 10) -> list[tuple[object, object]]:
        """The k keys with the highest rank (the count, for word count), best first."""
        await self.connect()
        if self.shares_keys:
            for attempt in range(FOLD_RETRIES):
                best: list[tuple[object, object]] = []
                reducer = self._reducer()
                try:
                    async for items in self._chunks(0):
                        best = top_of(best + items, k, reducer)
                    return best
                except FoldDuringScan:
                    if attempt == FOLD_RETRIES - 1:
                        raise
        return await top_entries(self._delivery, self.timeout, self.rpc_timeout, k)

    async def scan(self, chunk: int = 0) -> AsyncIterator[tuple[object, object]]:
        """Every (key, state) in the ring, streamed chunk by chunk: RingClient.scan."""
        async for items in self._chunks(chunk):
            for item in items:
                yield item

    async def scan_all(self) -> dict:
        """The whole ring as one dict: RingClient.scan_all."""
        for attempt in range(FOLD_RETRIES):
            try:
                return {key: state async for key, state in self.scan()}
            except FoldDuringScan:
                if attempt == FOLD_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    async def _chunks(self, chunk: int) -> AsyncIterator[list]:
        await self.connect()
        merge = self._reducer().merge if self.shares_keys else None
        scan = await open_scan(self._delivery, functools.partial(
            query, self._delivery, self.timeout), merge, chunk)
        try:
            while (items := await scan.next_chunk()) is not None:
                yield items
        finally:
            scan.cancel()

    async def stats(self, also: dict[str, str] | None = None) -> list[dict]:
        """NodeStats of every member, then of `also` ({node: address})."""
        await self.connect()
        return await node_stats(self._delivery, self.timeout, self.rpc_timeout, also)
