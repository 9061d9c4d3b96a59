"""A streamed scan of the whole ring: (key, state)s are handed on chunk by chunk as
the nodes' Scan streams deliver them, never the whole state at once.

Consistency: every node is asked at the client's ring stamp and refuses another ring.
A refusal comes before a node's first chunk, so `start()` reads the head of every
stream before anything is handed on: once it returned, each node serves a snapshot
taken at that one ring, and no range is missed or read twice. A stream that fails
after items were handed on cannot be restarted transparently (the caller has them):
it raises, and the caller scans again.

Shared keys (a balancer with pieces): one key's pieces live in different ranges, on
different nodes, and must be merged with the reducer's `merge`. Nodes send the pieces
(and outgoing keys of folds) of their snapshot first. `start()` reads every stream up
to its first plain entry, merging the pieces into `shared` by their key; from then on
every shared key of the ring is known. A plain entry whose key is shared is merged
into `shared`, any other is handed on at once, and `shared` comes last. What is held
is bounded by the number of shared keys, plus one chunk per node.
"""

from __future__ import annotations

import asyncio

import grpc

from floering.v1 import floe_pb2
from floering.node.core.codec import unpack_entries
from floering.node.core.errors import Unavailable
from floering.node.core.pieces import absorb_piece, is_fold_key, is_piece
from floering.node.core.ring import Ring
from floering.node.transport.status import error_from_rpc

READ_TIMEOUT = 30.0     # seconds one chunk may take to come


class RingScan:
    """One scan of `ring` through `stub_for(address)` (a QueryPlane stub); `merge`:
    the reducer's merge when keys are shared, else None."""

    def __init__(self, stub_for, ring: Ring, merge=None, chunk: int = 0,
                 read_timeout: float = READ_TIMEOUT) -> None:
        request = floe_pb2.ScanRequest(chunk=chunk, ring_stamp=ring.stamp)
        self.calls = [stub_for(address).Scan(request) for _, address in ring.addresses]
        self.merge = merge
        self.read_timeout = read_timeout
        self.shared: dict | None = {}       # shared key -> its pieces merged so far
        self.ahead: list[list | None] = []  # per node: plain entries read by start()
        self.node = 0                       # the node whose stream is being read
        self.started = False                # every head read: items may be handed on

    async def start(self) -> None:
        """Read the head of every stream; a node's refusal (stale ring) raises here."""
        try:
            self.ahead = list(await asyncio.gather(*(self._head(c) for c in self.calls)))
            self.started = True
        except BaseException:
            self.cancel()
            raise

    async def next_chunk(self) -> list | None:
        """The next (key, state)s to hand on, or None once the scan is complete."""
        try:
            while self.node < len(self.calls):
                items = self.ahead[self.node]
                self.ahead[self.node] = None
                if items is None:
                    items = await self._read(self.calls[self.node])
                    if items is None:
                        self.node += 1
                        continue
                items = self._plain(items)
                if items:
                    return items
        except BaseException:
            self.cancel()
            raise
        last, self.shared = self.shared, None
        return list(last.items()) if last else None

    def cancel(self) -> None:
        for call in self.calls:
            call.cancel()

    async def _read(self, call) -> list | None:
        try:
            chunk = await asyncio.wait_for(call.read(), self.read_timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"a scan chunk took over {self.read_timeout}s") from None
        except grpc.RpcError as exc:
            if self.started:        # items were handed on: the caller must scan again
                raise error_from_rpc(exc) from None
            raise                   # the query retries it (on a stale ring)
        if chunk is grpc.aio.EOF:
            return None
        return list(unpack_entries(chunk.entries).items())

    async def _head(self, call) -> list:
        """A stream's first entries; with shared keys, up to its first plain entry
        (its pieces are merged into `shared`)."""
        while True:
            items = await self._read(call)
            if items is None:
                return []
            if self.merge is None:
                return items
            shared, merge = self.shared, self.merge
            plain = [(k, s) for k, s in items if not absorb_piece(shared, k, s, merge)]
            if plain:
                return plain

    def _plain(self, items: list) -> list:
        """Of plain entries, those to hand on now; a shared key's are merged."""
        if self.merge is None:
            return items
        shared, merge, out = self.shared, self.merge, []
        for key, state in items:
            if is_piece(key) or is_fold_key(key):
                raise Unavailable("a node sent a piece of a shared key after its plain "
                                  "keys (it predates streamed scans): scan again later")
            if key in shared:
                shared[key] = merge(shared[key], state)
            else:
                out.append((key, state))
        return out


async def open_scan(delivery, query, merge, chunk: int = 0) -> RingScan:
    """A started RingScan at the client's ring; `query` retries it on a stale ring."""
    async def call(ring: Ring) -> RingScan:
        scan = RingScan(delivery.query_stub, ring, merge, chunk)
        await scan.start()
        return scan
    return await query(call)
