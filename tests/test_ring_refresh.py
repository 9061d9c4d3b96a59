"""Reads that find their ring stale together refresh it together: one GetRing burst,
not one per read. Real gRPC servers on loopback play the ring's two nodes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from floering.mapper import AsyncRingClient, FloeError
from floering.node.core.codec import pack, unpack
from floering.node.core.ring import Ring
from floering.v1 import floe_pb2, floe_pb2_grpc

READS = 64


class Cluster:
    """The ring both fake nodes hold, and how often anyone asked for it."""

    def __init__(self) -> None:
        self.ring: Ring | None = None
        self.ring_calls = 0
        self.fail_ring = False

    def move_all_to(self, node: str) -> None:
        """A takeover: every range to `node`, the ring one version on."""
        self.ring = self.ring.with_owners({t: node for t in self.ring.tokens})


class FakeNode(floe_pb2_grpc.ControlPlaneServicer, floe_pb2_grpc.QueryPlaneServicer):
    """Answers a read of a key it owns in the ring (its state: the key's length),
    refuses one it does not own as a node does (StaleRing). GetRing answers slowly,
    as a node busy taking over does, so that reads pile up behind it."""

    def __init__(self, node_id: str, cluster: Cluster) -> None:
        self.node_id, self.cluster = node_id, cluster

    async def GetRing(self, request, context):
        self.cluster.ring_calls += 1
        await asyncio.sleep(0.05)
        if self.cluster.fail_ring:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Unavailable: busy")
        ring = self.cluster.ring
        return floe_pb2.RingView(version=ring.version, ring=ring.to_wire(),
                                 reducer="count", sender=self.node_id)

    async def Get(self, request, context):
        key, ring = unpack(request.key), self.cluster.ring
        if ring.owner(key) != self.node_id:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "StaleRing: not mine")
        return floe_pb2.GetReply(found=True, state=pack(len(key)), ring_version=ring.version)


@pytest.fixture
async def cluster():
    servers, addresses, shared = [], {}, Cluster()
    for node_id in ("n0", "n1"):
        server = grpc.aio.server()
        addresses[node_id] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        node = FakeNode(node_id, shared)
        floe_pb2_grpc.add_ControlPlaneServicer_to_server(node, server)
        floe_pb2_grpc.add_QueryPlaneServicer_to_server(node, server)
        await server.start()
        servers.append(server)
    shared.ring = Ring.initial(addresses, 0, 8)
    yield shared
    for server in servers:
        await server.stop(None)


async def reads_after_a_takeover(cluster, client):
    """READS keys read at once right after n0's ranges went to n1: about half of them
    go to n0 at the client's ring, are refused, and refresh the ring."""
    keys = [f"key-{i:03d}" for i in range(READS)]
    assert sum(cluster.ring.owner(k) == "n0" for k in keys) >= READS // 4
    cluster.move_all_to("n1")
    cluster.ring_calls = 0
    return keys, await asyncio.gather(*(client.get(k) for k in keys), return_exceptions=True)


def client_of(cluster, timeout: float) -> AsyncRingClient:
    return AsyncRingClient([a for _, a in cluster.ring.addresses], timeout=timeout,
                           rpc_timeout=1)


async def test_reads_that_find_the_ring_moved_fetch_it_once_between_them(cluster):
    async with client_of(cluster, timeout=5) as client:
        keys, got = await reads_after_a_takeover(cluster, client)
        assert got == [len(k) for k in keys]
        assert client.ring.version == cluster.ring.version
        # each refused read alone would ask both nodes: >= READS / 2 calls. One
        # shared fetch (perhaps one more begun before the new ring landed) serves all.
        assert 1 <= cluster.ring_calls <= 4, cluster.ring_calls


async def test_a_shared_fetch_that_fails_fails_each_read_and_the_next_one_asks_again(cluster):
    async with client_of(cluster, timeout=0.3) as client:
        cluster.fail_ring = True
        keys, got = await reads_after_a_takeover(cluster, client)
        refused = [g for g in got if isinstance(g, FloeError)]
        assert refused and all(isinstance(g, (FloeError, int)) for g in got), got
        # the refused reads retried until their timeout (about three fetches of both
        # nodes in 0.3 s), sharing each fetch: alone, each would ask twice per retry
        assert cluster.ring_calls <= 12, (cluster.ring_calls, len(refused))
        cluster.fail_ring = False
        first_n0_key = next(k for k, g in zip(keys, got) if isinstance(g, FloeError))
        assert await client.get(first_n0_key) == len(first_n0_key)
        assert client.ring.version == cluster.ring.version
