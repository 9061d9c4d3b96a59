"""How a client refreshes its ring. It only moves forward: two refreshes on their way
at once (reads and the feed each refresh when refused) must not let the older one's
views roll it back. Reads refused together share one refresh begun after they were
refused. Real gRPC servers on loopback play the ring's two nodes."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from floering.mapper import AsyncRingClient, FloeError
from floering.wire.codec import pack, unpack
from floering.wire.ring import Ring
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import wait_until


READS = 64


class FakeNode(floe_pb2_grpc.ControlPlaneServicer, floe_pb2_grpc.QueryPlaneServicer):
    """Answers GetRing with the ring the cluster held when the call came, after the
    next of `delays` (then after `delay`): a node busy taking over answers late. Answers
    a read of a key it owns (its state: the key's length), refuses one it does not own
    as a node does (StaleRing)."""

    def __init__(self, node_id: str, cluster: dict) -> None:
        self.node_id, self.cluster = node_id, cluster

    async def GetRing(self, request, context):
        cluster = self.cluster
        cluster["ring_calls"] += 1
        ring, delays = cluster["ring"], cluster["delays"]
        await asyncio.sleep(delays.pop(0) if delays else cluster["delay"])
        if cluster["fail_ring"]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Unavailable: busy")
        return floe_pb2.RingView(version=ring.version, ring=ring.to_wire(),
                                 reducer="count", sender=self.node_id)

    async def Get(self, request, context):
        self.cluster["gets"] += 1
        await asyncio.sleep(self.cluster["get_delay"])
        key, ring = unpack(request.key), self.cluster["ring"]
        if ring.owner(key) != self.node_id:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "StaleRing: not mine")
        return floe_pb2.GetReply(found=True, state=pack(len(key)), ring_version=ring.version)


@pytest.fixture
async def cluster():
    servers, addresses = [], {}
    shared = {"delays": [], "delay": 0.0, "ring_calls": 0, "fail_ring": False,
              "get_delay": 0.0, "gets": 0}
    for node_id in ("n0", "n1"):
        server = grpc.aio.server()
        addresses[node_id] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        node = FakeNode(node_id, shared)
        floe_pb2_grpc.add_ControlPlaneServicer_to_server(node, server)
        floe_pb2_grpc.add_QueryPlaneServicer_to_server(node, server)
        await server.start()
        servers.append(server)
    shared["ring"] = Ring.initial(addresses, 0, 8)
    yield shared
    for server in servers:
        await server.stop(None)


async def test_a_slow_refresh_begun_before_a_newer_ring_landed_does_not_roll_it_back(cluster):
    old = cluster["ring"]
    async with AsyncRingClient([a for _, a in old.addresses], timeout=5,
                               rpc_timeout=2) as client:
        delivery = client._delivery
        assert client.ring.version == old.version
        cluster["delays"] = [0.3, 0.3]            # the first refresh's two calls are slow
        asked = cluster["ring_calls"] + 2
        slow = asyncio.ensure_future(delivery.fetch_ring())
        await wait_until(lambda: cluster["ring_calls"] >= asked, 5,
                         "both its calls have taken the old ring")
        new = old.with_owners({t: "n1" for t in old.tokens})   # a takeover, one version on
        cluster["ring"] = new
        assert (await delivery.fetch_ring()).version == new.version
        await slow
        assert client.ring.version == new.version, "a stale refresh rolled the ring back"
        assert client.ring.stamp == new.stamp


async def test_a_ring_no_node_holds_any_more_is_left_for_the_survivors_one(cluster):
    """Our ring's only holder died before telling anyone: the survivors' ring has the
    same version but is another ring, and the client takes it."""
    old = cluster["ring"]
    async with AsyncRingClient([a for _, a in old.addresses], timeout=5,
                               rpc_timeout=2) as client:
        delivery = client._delivery
        held = old.with_owners({t: "n0" for t in old.tokens})
        delivery.adopt(held)                      # as if n0 had sent it, then died
        survivors = old.with_owners({t: "n1" for t in old.tokens})
        assert survivors.version == held.version and survivors.stamp != held.stamp
        cluster["ring"] = survivors
        await delivery.fetch_ring()
        assert client.ring.stamp == survivors.stamp


def take_over(cluster) -> Ring:
    """Every range to n1, the ring one version on."""
    old = cluster["ring"]
    cluster["ring"] = old.with_owners({t: "n1" for t in old.tokens})
    return cluster["ring"]


async def reads_after_a_takeover(cluster, client):
    """READS keys read at once right after n0's ranges went to n1: the ones n0 held at
    the client's ring are refused, and refresh the ring."""
    keys = [f"key-{i:03d}" for i in range(READS)]
    assert sum(cluster["ring"].owner(k) == "n0" for k in keys) >= READS // 4
    take_over(cluster)
    cluster["ring_calls"] = 0
    return keys, await asyncio.gather(*(client.get(k) for k in keys), return_exceptions=True)


def client_of(cluster, timeout: float) -> AsyncRingClient:
    return AsyncRingClient([a for _, a in cluster["ring"].addresses], timeout=timeout,
                           rpc_timeout=1)


async def test_reads_refused_together_fetch_the_ring_once_between_them(cluster):
    cluster["delay"] = 0.05             # a busy node: the reads pile up behind the fetch
    async with client_of(cluster, timeout=5) as client:
        keys, got = await reads_after_a_takeover(cluster, client)
        assert got == [len(k) for k in keys]
        assert client.ring.version == cluster["ring"].version
        # each refused read alone would ask both nodes: >= READS / 2 calls. Shared
        # fetches serve them all: one, and one more for the reads refused while it
        # ran (on a busy machine the refusals can straggle over two or three fetches).
        assert 1 <= cluster["ring_calls"] <= 8, cluster["ring_calls"]


async def test_a_read_refused_after_a_fetch_began_waits_for_one_of_its_own(cluster):
    async with client_of(cluster, timeout=5) as client:
        delivery = client._delivery
        cluster["delays"] = [0.3, 0.3]            # a fetch holding the old ring, slow
        asked = cluster["ring_calls"] + 2
        early = asyncio.ensure_future(delivery.fetch_ring_after(time.monotonic()))
        await wait_until(lambda: cluster["ring_calls"] >= asked, 5,
                         "both its calls have taken the old ring")
        new = take_over(cluster)
        # the read is refused now, after the slow fetch took its view: that view is
        # the ring it was refused at, so it fetches again rather than wait for it
        assert (await delivery.fetch_ring_after(time.monotonic())).stamp == new.stamp
        await early
        assert client.ring.stamp == new.stamp


async def test_a_shared_fetch_that_fails_fails_each_read_and_the_next_one_asks_again(cluster):
    cluster["delay"] = 0.05
    async with client_of(cluster, timeout=0.3) as client:
        cluster["fail_ring"] = True
        keys, got = await reads_after_a_takeover(cluster, client)
        refused = [g for g in got if isinstance(g, FloeError)]
        assert refused and all(isinstance(g, (FloeError, int)) for g in got), got
        # the refused reads retried until their timeout (a few fetches of both nodes in
        # 0.3 s), sharing each fetch: alone, each would ask twice per retry
        assert cluster["ring_calls"] <= 16, (cluster["ring_calls"], len(refused))
        cluster["fail_ring"] = False
        first_n0_key = next(k for k, g in zip(keys, got) if isinstance(g, FloeError))
        assert await client.get(first_n0_key) == len(first_n0_key)
        assert client.ring.version == cluster["ring"].version


async def test_a_read_refused_after_the_client_moved_on_tries_the_new_ring_at_once(cluster):
    async with client_of(cluster, timeout=5) as client:
        key = next(f"key-{i}" for i in range(1000)
                   if cluster["ring"].owner(f"key-{i}") == "n0")
        cluster["get_delay"] = 0.2             # n0 answers late: the read is out...
        gets = cluster["gets"] + 1
        read = asyncio.ensure_future(client.get(key))
        await wait_until(lambda: cluster["gets"] >= gets, 5, "the read reached n0")
        take_over(cluster)
        cluster["ring_calls"] = 0
        await client._delivery.fetch_ring()    # ...when the client learns the new ring
        cluster["get_delay"] = 0.0
        assert await read == len(key)
        # refused at the old ring, the read went to n1 at the new one without
        # fetching it again
        assert cluster["ring_calls"] == 2, cluster["ring_calls"]
