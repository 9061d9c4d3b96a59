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

Folds (a piece merged back into its key, node.core.folding) move a state from one
node to another while the scan reads them at two moments. Each node's first chunk
carries, taken with its snapshot, its fold epoch and the last fold seq merged per fold
source. A fold seen on its way ([n, state] under an outgoing key) counts unless some
node shows seq n merged already; and before the shared keys are handed on, every
node's epoch is asked again: if one moved, a fold step ran there after its snapshot
(a piece emptied, a fold merged or done) and the scan may have read that fold twice
or not at all, so it raises Unavailable (scan again) rather than hand on a wrong sum.
"""

from __future__ import annotations

import asyncio

import grpc
import msgpack

from floering.v1 import floe_pb2
from floering.wire.codec import unpack_entries
from floering.wire.errors import Unavailable
from floering.wire.pieces import absorb_piece, fold_source, is_fold_key, is_piece, on_its_way
from floering.wire.ring import Ring
from floering.wire.status import error_from_rpc

READ_TIMEOUT = 30.0     # seconds one chunk may take to come
FOLD_RETRIES = 5        # whole reads (top over shared keys) tried while folds run


class FoldDuringScan(Unavailable):
    """A fold of a shared key ran on a node while a scan read it: scan again."""


class RingScan:
    """One scan of `ring` through `stub_for(address)` (a QueryPlane stub); `merge`:
    the reducer's merge when keys are shared, else None."""

    def __init__(self, stub_for, ring: Ring, merge=None, chunk: int = 0,
                 read_timeout: float = READ_TIMEOUT) -> None:
        request = floe_pb2.ScanRequest(chunk=chunk, ring_stamp=ring.stamp)
        self.stub_for = stub_for
        self.addresses = [address for _, address in ring.addresses]
        self.calls = [stub_for(address).Scan(request) for address in self.addresses]
        self.epochs = [0] * len(self.calls)  # per node: its fold epoch at its snapshot
        self.marks: dict[str, int] = {}      # fold source -> last seq a node merged
        self.on_way: list = []               # (outgoing key, seq, state): folds seen
        self.merge = merge
        self.read_timeout = read_timeout
        self.shared: dict | None = {}       # shared key -> its pieces merged so far
        self.ahead: list[list | None] = []  # per node: plain entries read by start()
        self.node = 0                       # the node whose stream is being read
        self.started = False                # every head read: items may be handed on

    async def start(self) -> None:
        """Read the head of every stream; a node's refusal (stale ring) raises here."""
        try:
            self.ahead = list(await asyncio.gather(
                *(self._head(i, c) for i, c in enumerate(self.calls))))
            self._settle_folds()
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
        if self.merge is not None:
            await self._check_no_fold_ran()
        return list(last.items()) if last else None

    def cancel(self) -> None:
        for call in self.calls:
            call.cancel()

    def _shared(self) -> dict:
        """The shared keys' pieces merged so far (handed on, and gone, at the end)."""
        if self.shared is None:
            raise RuntimeError("the scan is complete: its shared keys were handed on")
        return self.shared

    async def _read(self, call, first_of: int | None = None) -> list | None:
        """A chunk's entries (None at the end); `first_of`: the index of the node
        whose first chunk this is (its fold epoch and marks are kept)."""
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
        if first_of is not None:
            self.epochs[first_of] = chunk.fold_epoch
            self._take_marks(chunk.fold_marks)
        return list(unpack_entries(chunk.entries).items())

    def _take_marks(self, packed: bytes) -> None:
        if not packed:
            return
        try:
            marks = msgpack.unpackb(packed)
        except (ValueError, msgpack.UnpackException) as exc:
            raise Unavailable(f"a node sent unreadable fold marks: {exc}") from None
        if not isinstance(marks, dict):
            raise Unavailable("a node sent fold marks that are not a map")
        for source, seq in marks.items():
            if type(source) is str and type(seq) is int:
                self.marks[source] = max(seq, self.marks.get(source, 0))

    async def _head(self, index: int, call) -> list:
        """A stream's first entries; with shared keys, up to its first plain entry
        (its pieces are merged into `shared`, its folds on their way kept aside)."""
        first = True
        while True:
            items = await self._read(call, index if first else None)
            first = False
            if items is None:
                return []
            if self.merge is None:
                return items
            shared, merge, plain = self._shared(), self.merge, []
            for k, s in items:
                if is_fold_key(k) and on_its_way(s):
                    self.on_way.append((k, s[0], s[1]))
                elif not absorb_piece(shared, k, s, merge):
                    plain.append((k, s))
            if plain:
                return plain

    def _settle_folds(self) -> None:
        """Count each fold seen on its way, unless a node shows it merged already."""
        for out, seq, state in self.on_way:
            if self.marks.get(fold_source(out), 0) < seq:
                absorb_piece(self._shared(), out, [seq, state], self.merge)
        self.on_way = []

    async def _check_no_fold_ran(self) -> None:
        """Every node's fold epoch again: one that moved took a fold step after its
        snapshot, which this scan may have read on one side only (or both)."""
        try:
            replies = await asyncio.gather(*(
                self.stub_for(address).Stats(floe_pb2.StatsRequest(),
                                             timeout=self.read_timeout)
                for address in self.addresses))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        moved = [address for address, reply, epoch in zip(self.addresses, replies, self.epochs)
                 if reply.fold_epoch != epoch]
        if moved:
            raise FoldDuringScan(f"a fold of a shared key ran on {', '.join(moved)} while the "
                              f"scan read (its sum could count it twice or miss it): scan "
                              f"again")

    def _plain(self, items: list) -> list:
        """Of plain entries, those to hand on now; a shared key's are merged."""
        if self.merge is None:
            return items
        shared, merge, out = self._shared(), self.merge, []
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
