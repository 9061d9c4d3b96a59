"""What one member's certificate can do to the ranges of other live members with ring views:
nothing without their own word (node.core.move_evidence). A view giving away a range of a
member the receiver holds live is merged when that member sent it, or once that member's
answer to an exchange backs the move; else it is refused, loudly. Pure rules, the seeded
simulation, and real TLS processes.

The tests here start real node processes; the in-process ones are in
tests/simulation/test_move_attacks.py.
"""

import pytest


WORDS = [f"w{i % 131}" for i in range(4000)]


def _ring_of(cluster, node_id):
    from floering.wire.ring import Ring
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(cluster.node(node_id).address) as ch:
        return Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            floe_pb2.GetRingRequest(), timeout=5).ring)


def answered_as(cluster, ring, address: str, placed):
    """Exchange `ring` with `address` under n0's certificate, the channel following
    `placed`: the member the answer is the word of (None: no answer)."""
    import asyncio

    from floering.wire.errors import FloeError
    from floering.node.core.membership import answered_by
    from floering.node.transport.peers import PeerPool

    async def call():
        pool = PeerPool(5.0, 64 << 20, cluster.tls("n0").channel_credentials())
        pool.follow(lambda: placed)
        try:
            wire, certificate = await pool.exchange_ring(
                address, sender="n0", ring_wire=ring.to_wire(), version=ring.version,
                reducer="")
        except FloeError:
            return None
        finally:
            await pool.close()
        return answered_by(ring, address, certificate)
    return asyncio.run(call())


@pytest.mark.multiprocess
def test_a_members_certificate_cannot_move_another_live_members_range_on_tls(tmp_path):
    """n2's certificate pushes n0 and n1 views giving n1's ranges (and n0's) to n2
    under a higher generation: nothing moves, the counts stay exact, the refusals are
    counted and logged."""
    import json
    from collections import Counter

    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.helpers import wait_for
    want: Counter = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:

        def feed(words):
            with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
                c.emit_many(words)
                c.flush()
            want.update(words)

        def scan():
            with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
                return Counter(dict(c.scan()))

        feed(WORDS)
        view = _ring_of(cluster, "n0")
        owners = dict(zip(view.tokens, view.owners))
        stolen = {t: "n2" for t in view.tokens_of("n1")}
        for receiver, moves in (("n0", stolen), ("n1", stolen),
                                ("n0", {t: "n2" for t in view.tokens_of("n0")})):
            forged = view.with_owners(moves).with_version(view.version + 1)
            with cluster.channel(cluster.node(receiver).address, "n2") as ch:  # n2's own key
                floe_pb2_grpc.ControlPlaneStub(ch).ExchangeRing(floe_pb2.RingView(
                    version=forged.version, ring=forged.to_wire(), sender="n2"), timeout=10)
        feed(WORDS[::3])

        def owned(node):
            ring = _ring_of(cluster, node)
            return {t: o for t, o in zip(ring.tokens, ring.owners) if t in owners}
        for node in ("n0", "n1", "n2"):
            assert owned(node) == owners, node

        def refused():
            events = [json.loads(line) for n in ("n0", "n1")
                      for line in open(cluster.node(n).events)]
            return [e for e in events if e["kind"] == "move_refused"]
        wait_for(lambda: len(refused()) >= 2, 30, "both receivers refused the moves")
        for node in ("n0", "n1", "n2"):
            assert owned(node) == owners, node
        assert scan() == want
        feed(WORDS[::7])
        assert scan() == want
        # n0's exchange with n1 is n1's word because the TLS handshake checked n1's
        # certificate there; a channel expecting another member there gets no answer
        ring = _ring_of(cluster, "n0")
        at = ring.address("n1")
        assert answered_as(cluster, ring, at, ring) == "n1"

        class Elsewhere:                        # a ring placing n2 at n1's address
            addresses = (("n2", at),)
        assert answered_as(cluster, ring, at, Elsewhere()) is None
        for node in ("n0", "n1"):
            with cluster.channel(cluster.node(node).address) as ch:
                shown = floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(),
                                                              timeout=5)
            assert shown.views_refused >= 1, (node, shown)
            # n0 asked n1 before refusing; n1 refused the move of its own ranges at once
            assert shown.views_held >= (node == "n0"), (node, shown)
