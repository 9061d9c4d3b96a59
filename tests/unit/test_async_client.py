"""AsyncRingClient against real node processes on loopback, and the streamed scan."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import grpc
import pytest

from floering.v1 import floe_pb2
from floering.mapper import FloeError
from floering.mapper.scanning import RingScan
from floering.wire.codec import pack_entries
from floering.wire.pieces import merge_pieces, piece_key, pieces_first


# The sync client's cluster tests (tests/cluster/test_cluster.py), on the asyncio client.


# ------------------------------------------------------------ the streamed scan


class FakeScanCall:
    """A node's Scan stream: its entries in chunks, counting the chunks read."""

    def __init__(self, items: list, chunk: int, refuse: bool = False) -> None:
        self.chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        self.read_count = 0
        self.refuse = refuse
        self.fail_at: int | None = None     # the stream breaks before this chunk

    async def read(self):
        if self.refuse or self.read_count == self.fail_at:
            raise grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                       grpc.aio.Metadata(), grpc.aio.Metadata(), "stale")
        if self.read_count == len(self.chunks):
            return grpc.aio.EOF
        self.read_count += 1
        return floe_pb2.ScanChunk(entries=pack_entries(self.chunks[self.read_count - 1]))

    def cancel(self) -> None:
        pass


def fake_ring(nodes: dict[str, list], chunk: int):
    calls = {f"10.0.0.{i}:1": FakeScanCall(items, chunk) for i, items in enumerate(nodes.values())}
    ring = SimpleNamespace(stamp=7, addresses=[(n, a) for n, a in zip(nodes, calls)])
    stub_for = lambda address: SimpleNamespace(Scan=lambda request: calls[address],  # noqa: E731
                                               Stats=no_fold_ran)
    return ring, stub_for, list(calls.values())


async def no_fold_ran(request, timeout=None):
    return floe_pb2.NodeStats(fold_epoch=0)


async def test_a_scan_hands_on_items_before_the_last_chunk_is_read():
    nodes = {f"n{i}": [(f"k{i}-{j}", j) for j in range(1000)] for i in range(3)}
    ring, stub_for, calls = fake_ring(nodes, chunk=10)
    scan = RingScan(stub_for, ring)
    await scan.start()
    first = await scan.next_chunk()
    assert first and len(first) == 10
    # one chunk of each node read (the heads), of 100 each: nothing is loaded whole
    assert [c.read_count for c in calls] == [1, 1, 1]
    got = list(first)
    held = []
    while (items := await scan.next_chunk()) is not None:
        got += items
        held.append(sum(c.read_count for c in calls))
    assert dict(got) == Counter({k: v for items in nodes.values() for k, v in items})
    assert len(got) == 3000
    assert held[0] < 10 and held[-1] == 300      # read as consumed, not before


async def test_a_streamed_scan_merges_pieces_spread_over_nodes():
    add = lambda a, b: a + b  # noqa: E731
    nodes = {
        "n0": [("a", 1), (piece_key("hot", 1), 10), ("b", 2)] + [(f"x{j}", 1) for j in range(50)],
        "n1": [("hot", 5), ("c", 3), (piece_key("hot", 2), 7)] + [(f"y{j}", 1) for j in range(50)],
        "n2": [("d", 4)] + [(f"z{j}", 1) for j in range(50)] + [(piece_key("warm", 1), 2)],
        "n3": [("warm", 1)],
    }
    expect = merge_pieces([kv for items in nodes.values() for kv in items], add)
    ordered = {n: pieces_first(items) for n, items in nodes.items()}
    ring, stub_for, calls = fake_ring(ordered, chunk=4)
    scan = RingScan(stub_for, ring, merge=add)
    await scan.start()
    got = []
    while (items := await scan.next_chunk()) is not None:
        got += items
    assert len(got) == len(expect) and dict(got) == expect
    assert dict(got)["hot"] == 22 and dict(got)["warm"] == 3
    # shared keys come last; every other key was handed on as it came
    assert {k for k, _ in got[-2:]} == {"hot", "warm"}


async def test_a_node_refusing_the_ring_fails_the_start_before_anything_is_handed_on():
    ring, stub_for, calls = fake_ring({"n0": [("a", 1)], "n1": [("b", 2)]}, chunk=1)
    calls[1].refuse = True
    scan = RingScan(stub_for, ring)
    with pytest.raises(grpc.RpcError):
        await scan.start()


async def test_a_stream_lost_after_items_were_handed_on_raises_a_floe_error():
    ring, stub_for, calls = fake_ring({"n0": [(f"a{i}", 1) for i in range(9)],
                                       "n1": [(f"b{i}", 1) for i in range(9)]}, chunk=3)
    calls[0].fail_at = 2
    scan = RingScan(stub_for, ring)
    await scan.start()
    assert len(await scan.next_chunk()) == 3
    assert len(await scan.next_chunk()) == 3
    with pytest.raises(FloeError):
        await scan.next_chunk()
