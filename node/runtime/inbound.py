"""The inbound queue: batches received, waiting for the node's one applier.

Bounded twice: in requests (`--queue-batches`) and in bytes (`--max-inbound-bytes`).
A sender facing a full queue waits, and while it waits its stream is not read: that
is the backpressure a client feels, and what keeps a node's memory bounded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class StreamState:
    """One inbound Push stream. After a refused batch the stream is dead: batches
    queued behind it must not be applied, or a gap would open in the source's seqs."""

    failed: bool = False


@dataclass
class Inbound:
    batches: list
    stream: StreamState
    done: asyncio.Future = field(repr=False)
    applied: int = 0                       # batches of it already applied
    nbytes: int = 0


class InboundQueue:
    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self._queue: asyncio.Queue[Inbound] = asyncio.Queue(max_requests)
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._room = asyncio.Condition()

    async def put(self, item: Inbound) -> None:
        item.nbytes = sum(len(b.payload) + len(b.seqs) for b in item.batches)
        async with self._room:
            # One request always fits an empty queue (the message limit bounds it).
            await self._room.wait_for(
                lambda: not self.nbytes or self.nbytes + item.nbytes <= self.max_bytes)
            self.nbytes += item.nbytes
        try:
            await self._queue.put(item)
        except BaseException:             # the stream went away while the queue was full
            await self._release(item.nbytes)
            raise

    async def get(self) -> Inbound:
        return await self._queue.get()

    async def done(self, item: Inbound) -> None:
        """`item` left the queue: its bytes make room for waiting senders."""
        await self._release(item.nbytes)

    async def _release(self, nbytes: int) -> None:
        async with self._room:
            self.nbytes -= nbytes
            self._room.notify_all()

    def qsize(self) -> int:
        return self._queue.qsize()

    def empty(self) -> bool:
        return self._queue.empty()


def resolve_after(committed: asyncio.Future, done: asyncio.Future, acks) -> None:
    """Resolve `done` with `acks` once `committed` did, or with its error."""
    def resolve(c: asyncio.Future) -> None:
        if not done.done():
            exc = c.exception()
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(acks)
    committed.add_done_callback(resolve)


def mark_seen(future: asyncio.Future) -> None:
    """A future's error counts as retrieved (asyncio logs an unretrieved one)."""
    if not future.cancelled():
        future.exception()
