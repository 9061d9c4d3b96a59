"""Bytes of inbound messages taken in at once, bounded: decoding a message costs a few
times its bytes in objects, so a dozen large ones at once would double a node's
memory (which the allocator then keeps). A message waits for room, up to `wait`
seconds, then is refused (Overloaded: RESOURCE_EXHAUSTED, which a sender retries);
one larger than the whole budget goes alone."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from floering.node.core.errors import Overloaded

INBOUND_BYTES = 32 << 20     # bytes of messages being decoded at once, node-wide
INBOUND_WAIT = 5.0           # seconds a message waits for room before it is refused


class ByteBudget:
    def __init__(self, limit: int = INBOUND_BYTES, wait: float = INBOUND_WAIT) -> None:
        self.limit, self.wait = limit, wait
        self.held = 0
        self._room: asyncio.Condition | None = None

    @asynccontextmanager
    async def hold(self, nbytes: int):
        n = min(max(nbytes, 0), self.limit)
        if self._room is None:
            self._room = asyncio.Condition()
        room = self._room
        async with room:
            try:
                await asyncio.wait_for(room.wait_for(lambda: self.held + n <= self.limit),
                                       self.wait)
            except asyncio.TimeoutError:
                raise Overloaded(f"{self.held} bytes of messages are being taken in, the "
                                 f"most at once is {self.limit}: retry later") from None
            self.held += n
        try:
            yield
        finally:
            async with room:
                self.held -= n
                room.notify_all()
