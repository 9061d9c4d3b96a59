"""AsyncRingClient against real node processes on loopback, and the streamed scan."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from types import SimpleNamespace

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.v1 import floe_pb2
from floering.mapper import AsyncRingClient, FloeError, RingClient, split_words
from floering.mapper.scanning import RingScan
from floering.wire.codec import pack_entries
from floering.wire.pieces import merge_pieces, piece_key, pieces_first
from tests.helpers import wait_for, wait_until

WORDS = [w for line in kjv_lines(4000) for w in split_words(line)]


async def equals(answer, value) -> bool:
    return await answer == value


@pytest.mark.multiprocess
async def test_async_counts_are_exact_through_a_kill_and_a_resend(tmp_path):
    expect = Counter(WORDS)
    half = len(WORDS) // 2
    with LocalCluster.up(4, 1, workdir=tmp_path) as cluster:
        async with AsyncRingClient(cluster.seeds, source="async", batch_size=300,
                                   tls=cluster.tls()) as client:
            await client.emit_many(WORDS[:half])
            await client.flush()
            victim = client.ring.owner("the")
            feed = asyncio.create_task(client.emit_many(WORDS[half:]))
            await asyncio.sleep(0)          # the tuples are sealed and on their way
            await asyncio.to_thread(cluster.kill, victim)   # batches in flight resend
            await feed
            await client.flush()
            assert victim not in dict(client.ring.addresses)
            assert dict([kv async for kv in client.scan()]) == expect
            assert dict([kv async for kv in client.scan(chunk=100)]) == expect
            assert await client.get("god") == expect["god"]
            assert await client.get("zzz-never-sent") is None
            top = await client.top(5)
            assert [c for _, c in top] == [c for _, c in expect.most_common(5)]
            assert len(await client.stats()) == 3
        assert client.closed
        # a second incarnation resending the same (source, seq)s counts nothing twice
        async with AsyncRingClient([n.address for n in cluster.nodes if n.alive()],
                                   source="async", tls=cluster.tls()) as again:
            await again.emit_many(WORDS[:10_000])
            for word in WORDS[10_000:10_100]:
                await again.emit(word)
            await again.flush()
            assert dict([kv async for kv in again.scan()]) == expect
    assert not any(node.alive() for node in cluster.nodes)


@pytest.mark.multiprocess
async def test_async_client_on_a_sharing_ring_reads_keys_whole(tmp_path):
    words = WORDS[:40_000]
    expect = Counter(words)
    with LocalCluster.up(4, 1, workdir=tmp_path, balancer="pkg") as cluster:
        async with AsyncRingClient(cluster.seeds, tls=cluster.tls()) as client:
            await client.emit_many(words)
            await client.flush()
            hot = expect.most_common(1)[0][0]
            assert client.ring.balancer == "pkg"
            assert dict([kv async for kv in client.scan(chunk=50)]) == expect
            assert await client.get(hot) == expect[hot]
            top = await client.top(5)
            assert [c for _, c in top] == [c for _, c in expect.most_common(5)]
            # a new sequence on the same connections: the lingering tuples get delivered
            await client.rebind("second", first_seq=1)
            await client.emit("rebound")
            # no flush: the linger task seals it
            await wait_until(lambda: equals(client.get("rebound"), 1), 10, "the lingering tuple")
        with RingClient(cluster.seeds, tls=cluster.tls()) as sync:
            sync.rebind("third")
            sync.emit("rebound")
            wait_for(lambda: sync.get("rebound") == 2, 10, "the lingering tuple")
            assert dict(sync.scan(chunk=50)) == expect + Counter(["rebound"] * 2)
    assert not any(node.alive() for node in cluster.nodes)


# The sync client's cluster tests (tests/test_cluster.py), on the asyncio client.

@pytest.mark.multiprocess
async def test_async_bad_input_linger_race_and_combining_over_tls(tmp_path):
    from floering.wire.errors import InvalidArgument, InvalidKey
    words = WORDS[:60_000]
    with LocalCluster.up(4, 1, workdir=tmp_path) as cluster:
        assert cluster.tls() is not None                # every call mutual TLS
        # a tiny linger seals buffers while emit() seals full ones: seqs stay in order
        async with AsyncRingClient(cluster.seeds, batch_size=40, linger=0.001,
                                   tls=cluster.tls(), combine=False) as client:
            for start in range(0, len(words), 500):
                for word in words[start:start + 500]:
                    await client.emit(word)
                await asyncio.sleep(0.001)              # the linger timer fires in between
            await client.flush()
            assert dict([kv async for kv in client.scan()]) == Counter(words)
        async with AsyncRingClient(cluster.seeds, tls=cluster.tls()) as client:
            for key in (1.5, None, True, ("a",), "\ud800"):
                with pytest.raises(InvalidKey):
                    await client.emit(key)
            with pytest.raises(InvalidArgument):
                await client.emit("k", object())
            with pytest.raises(InvalidArgument):
                await client.emit("k", "not a count")      # refused before it is folded
            assert client.source.startswith("combined:")
            await client.emit_many(words)
            await client.emit("zz-fine")
            await client.flush()
            assert await client.get("zz-fine") == 1
            assert await client.get("the") == 2 * Counter(words)["the"]


@pytest.mark.multiprocess
async def test_async_flush_to_a_dead_node_fails_cleanly_instead_of_hanging(tmp_path):
    from floering.wire.errors import Unavailable
    with LocalCluster.up(2, 0, workdir=tmp_path) as cluster:
        client = AsyncRingClient(cluster.seeds, timeout=3.0, rpc_timeout=0.5,
                                 tls=cluster.tls())
        await client.emit_many(WORDS[:1000])
        await client.flush()
        await asyncio.to_thread(cluster.kill, "n1")
        await client.emit_many(WORDS[:1000])
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await client.flush()
        assert time.monotonic() - started < 10
        with pytest.raises(Unavailable):   # close() will not pretend the tuples arrived
            await client.close()


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
