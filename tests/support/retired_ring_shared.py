"""Helpers of tests/cluster/test_retired_ring.py that other test files use too: events, feed,
ring_of, scan, stats_of.
"""

import json
from collections import Counter

from floering.mapper import RingClient
from floering.wire.ring import Ring
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import node_stats as stats_of  # noqa: F401 (used by others)


def feed(cluster, words, want: Counter) -> None:
    with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
        c.emit_many(words)
        c.flush()
    want.update(words)


def scan(cluster) -> Counter:
    with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
        return Counter(dict(c.scan()))


def ring_of(cluster, node_id: str) -> Ring:
    with cluster.channel(cluster.node(node_id).address) as ch:
        return Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            floe_pb2.GetRingRequest(), timeout=5).ring)


def events(cluster, node_id: str, kind: str) -> list[dict]:
    out = []
    for line in open(cluster.node(node_id).events):
        e = json.loads(line)
        if e["kind"] == kind:
            out.append(e)
    return out
