"""A client's ring only moves forward: two refreshes on their way at once (reads and
the feed each refresh when refused) must not let the older one's views roll the
client back. Real gRPC servers on loopback play the ring's two nodes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from floering.mapper import AsyncRingClient
from floering.node.core.ring import Ring
from floering.v1 import floe_pb2, floe_pb2_grpc


class FakeNode(floe_pb2_grpc.ControlPlaneServicer):
    """Answers GetRing with the ring the cluster held when the call came, after the
    next of `delays` (then at once): a node busy taking over answers late."""

    def __init__(self, node_id: str, cluster: dict) -> None:
        self.node_id, self.cluster = node_id, cluster

    async def GetRing(self, request, context):
        ring = self.cluster["ring"]
        delays = self.cluster["delays"]
        await asyncio.sleep(delays.pop(0) if delays else 0.0)
        return floe_pb2.RingView(version=ring.version, ring=ring.to_wire(),
                                 reducer="count", sender=self.node_id)


@pytest.fixture
async def cluster():
    servers, addresses, shared = [], {}, {"delays": []}
    for node_id in ("n0", "n1"):
        server = grpc.aio.server()
        addresses[node_id] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        floe_pb2_grpc.add_ControlPlaneServicer_to_server(FakeNode(node_id, shared), server)
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
        slow = asyncio.ensure_future(delivery.fetch_ring())
        await asyncio.sleep(0.05)                  # both its calls have taken the old ring
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
