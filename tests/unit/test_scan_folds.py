"""A scan across a fold of a shared key (mapper.scanning): the fold is read on two
nodes at two moments, and the sum must count it once, or the scan must say so."""

from __future__ import annotations

import grpc
import msgpack
import pytest

from floering.mapper.scanning import FoldDuringScan, RingScan
from floering.wire.codec import pack_entries
from floering.wire.pieces import fold_key, fold_source, piece_key
from floering.wire.ring import Ring
from floering.v1 import floe_pb2

RING = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2, "dkg")
OUT = fold_key("the", 2, 0)


class FakeCall:
    def __init__(self, chunks):
        self.chunks = list(chunks)

    async def read(self):
        return self.chunks.pop(0) if self.chunks else grpc.aio.EOF

    def cancel(self):
        pass


class FakeNode:
    """A node's Scan stream (one chunk, with its fold epoch and marks) and its Stats."""

    def __init__(self, entries, epoch=0, marks=None, epoch_after=None):
        self.chunk = floe_pb2.ScanChunk(entries=pack_entries(entries), fold_epoch=epoch,
                                        fold_marks=msgpack.packb(marks) if marks else b"")
        self.epoch_after = epoch if epoch_after is None else epoch_after

    def Scan(self, request):
        return FakeCall([self.chunk])

    async def Stats(self, request, timeout=None):
        return floe_pb2.NodeStats(fold_epoch=self.epoch_after)


async def scan(nodes: dict) -> dict:
    stubs = dict(zip((address for _, address in RING.addresses), nodes.values()))
    ring_scan = RingScan(stubs.__getitem__, RING, merge=lambda a, b: a + b)
    await ring_scan.start()
    out = {}
    while (items := await ring_scan.next_chunk()) is not None:
        out.update(items)
    return out


async def test_a_fold_on_its_way_counts_once_whether_or_not_its_key_took_it():
    piece = (piece_key("the", 1), 4)
    # a's outgoing key still holds fold 1 (5); b has not merged it: b's "the" is 10
    assert await scan({"a": FakeNode([piece, (OUT, [1, 5])]),
                       "b": FakeNode([("the", 10)])}) == {"the": 19}
    # b merged it already (its marks say seq 1 of that source): b's "the" is 15
    assert await scan({"a": FakeNode([piece, (OUT, [1, 5])]),
                       "b": FakeNode([("the", 15)], marks={fold_source(OUT): 1})}) == \
        {"the": 19}
    # an older fold merged, not this one
    assert await scan({"a": FakeNode([piece, (OUT, [2, 5])]),
                       "b": FakeNode([("the", 10)], marks={fold_source(OUT): 1})}) == \
        {"the": 19}


async def test_a_fold_step_during_the_scan_raises_instead_of_a_wrong_sum():
    # a emptied the piece into its outgoing key after its snapshot, b merged the fold
    # before its own: the piece and the merged key both hold the 5
    nodes = {"a": FakeNode([(piece_key("the", 1), 5)], epoch=3, epoch_after=4),
             "b": FakeNode([("the", 15)], epoch=7, epoch_after=8)}
    with pytest.raises(FoldDuringScan, match="scan again"):
        await scan(nodes)


async def test_fold_marks_that_are_not_a_map_are_refused():
    bad = FakeNode([("the", 1)])
    bad.chunk.fold_marks = msgpack.packb([1, 2])
    with pytest.raises(Exception, match="fold marks"):
        await scan({"a": bad, "b": FakeNode([])})
