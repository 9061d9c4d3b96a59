"""AsyncRingClient against real node processes on loopback, and the streamed scan.

The tests here start real node processes; the in-process ones are in
tests/unit/test_async_client.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.mapper import AsyncRingClient, RingClient, split_words
from tests.support.helpers import wait_for, wait_until


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
