"""What one member's certificate can do to the ring with ring views the protocol could have
produced: not split it (a version far ahead is absorbed a step at a time, so every node
converges), not erase it (a removal of live members waits for the receiver's own probe,
which finds them answering as themselves; a removal of the receiver itself counts only as
the answers of members it called, more than half of them, and removes it alone), not crowd
out another's held view. Pure rules, the seeded simulation, and real TLS processes.

The tests here start real node processes; the in-process ones are in
tests/simulation/test_member_attacks.py.
"""

from collections import Counter

import pytest

from floering.wire.ring import Ring


WORDS = [f"w{i % 131}" for i in range(4000)]


def _ring_of(cluster, node_id):
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(cluster.node(node_id).address) as ch:
        return Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            floe_pb2.GetRingRequest(), timeout=5).ring)


@pytest.mark.multiprocess
def test_a_members_certificate_can_neither_split_nor_erase_a_tls_ring(tmp_path):
    import json
    from floering.chaos.durable_faults import kill_all, start_again
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.helpers import wait_for
    want = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(tmp_path / "data" / "{node}")]) as cluster:

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
        members = set(view.nodes)
        with cluster.channel(cluster.node("n0").address, "n2") as ch:   # n2's own key
            as_n2 = floe_pb2_grpc.ControlPlaneStub(ch)

            def push(ring):
                return as_n2.ExchangeRing(floe_pb2.RingView(
                    version=ring.version, ring=ring.to_wire(), sender="n2"), timeout=10)
            for _ in range(2):        # each once split the ring for good
                now = Ring.from_wire(push(view).ring)
                push(now.with_version(now.version + (1 << 20)))
            push(view.without(["n1", "n2"]))   # once fenced both and lost 8 ranges
        with cluster.channel(cluster.node("n1").address, "n2") as ch:
            floe_pb2_grpc.ControlPlaneStub(ch).ExchangeRing(floe_pb2.RingView(
                version=view.version + 1, ring=view.without(["n1"]).to_wire(),
                sender="n2"), timeout=10)

        def converged():
            rings = [_ring_of(cluster, n) for n in ("n0", "n1", "n2")]
            return len({r.stamp for r in rings}) == 1 and set(rings[0].nodes) == members
        wait_for(converged, 30, "every node holds one ring with every member in it")
        assert scan() == want
        feed(WORDS[::3])
        assert scan() == want
        events = [json.loads(line) for n in ("n0", "n1")
                  for line in open(cluster.node(n).events)]
        seen = Counter(e["kind"] for e in events)
        assert seen["view_absorbed"] >= 1 and seen["removal_refused"] >= 2, seen
        assert not seen["fenced"] and not seen["lost"], seen
        # a durable restart of the whole ring, without --wipe
        kill_all(cluster)
        start_again(cluster, [n.node_id for n in cluster.nodes])
        cluster.wait_ready(60)
        wait_for(converged, 30, "the restarted ring is one ring")
        assert scan() == want
        assert all(node.alive() for node in cluster.nodes)


def _rogue_servicer(name: str, incarnation: int):
    """A member's certificate serving at that member's address: heartbeats answered
    as the member the ring knows, every exchange answered with the caller's ring less
    every member but itself (one forged answer once fenced the caller and spread its
    other removals), every indirect probe answered "alive"."""
    from floering.v1 import floe_pb2, floe_pb2_grpc

    class Rogue(floe_pb2_grpc.ControlPlaneServicer):
        forged: Counter = Counter()

        def ExchangeRing(self, request, context):
            theirs = Ring.from_wire(request.ring)
            view = theirs.without([n for n in theirs.nodes if n != name])
            self.forged[request.sender] += 1
            return floe_pb2.RingView(version=view.version, ring=view.to_wire(),
                                     reducer=request.reducer, sender=name)

        def Heartbeat(self, request, context):      # another stamp: callers ask it
            return floe_pb2.HeartbeatReply(sender=name, ring_stamp=1,
                                           incarnation=incarnation)

        def Probe(self, request, context):
            return floe_pb2.ProbeReply(alive=True)

    return Rogue()


@pytest.mark.multiprocess
def test_a_members_forged_answers_fence_nobody_on_real_tls_processes(tmp_path):
    import json
    import time
    from concurrent import futures

    import grpc

    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    from floering.node.transport.tls import node_files
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.helpers import wait_for
    want = Counter()
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
        rogue = _rogue_servicer("n2", view.incarnation_of("n2"))
        server = grpc.server(futures.ThreadPoolExecutor(4),
                             options=[("grpc.so_reuseport", 0)])
        floe_pb2_grpc.add_ControlPlaneServicer_to_server(rogue, server)
        address = cluster.node("n2").address
        credentials = node_files(cluster.tls_dir, "n2").server_credentials()
        cluster.kill("n2")                  # its certificate now answers at its address
        deadline = time.monotonic() + 2
        while not server.add_secure_port(address, credentials):
            assert time.monotonic() < deadline, "n2's port stayed bound"
            time.sleep(0.005)
        server.start()
        try:
            for victim in ("n0", "n1"):     # pushed its removal: it asks every peer
                with cluster.channel(cluster.node(victim).address, "n2") as ch:
                    removed = view.without([victim])
                    floe_pb2_grpc.ControlPlaneStub(ch).ExchangeRing(floe_pb2.RingView(
                        version=removed.version, ring=removed.to_wire(), sender="n2"),
                        timeout=10)
            wait_for(lambda: rogue.forged["n0"] >= 3 and rogue.forged["n1"] >= 3, 30,
                     "both members asked the rogue, again and again")
            for node in ("n0", "n1"):
                ring = _ring_of(cluster, node)
                assert {"n0", "n1", "n2"} <= set(ring.nodes), (node, ring.describe())
        finally:
            server.stop(0)                  # gone: refused, declared dead, taken over

        def settled():
            rings = [_ring_of(cluster, n) for n in ("n0", "n1")]
            return (len({r.stamp for r in rings}) == 1
                    and set(rings[0].nodes) == {"n0", "n1"})
        wait_for(settled, 30, "n0 and n1 hold one ring without n2")
        assert scan() == want
        feed(WORDS[::5])
        assert scan() == want
        events = [json.loads(line) for n in ("n0", "n1")
                  for line in open(cluster.node(n).events)]
        seen = Counter(e["kind"] for e in events)
        refused = [e for e in events if e["kind"] == "removal_refused"
                   and e.get("accusers") == ["n2"]]
        assert refused and not seen["fenced"] and not seen["lost"], seen
