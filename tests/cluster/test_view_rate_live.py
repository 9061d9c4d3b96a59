"""Ring views one member may push (node.core.slots.ViewRate): a token bucket per caller
identity (a large view costs more), refused Busy past it, counted in
floe_calls_refused_busy_total. Pure rules, and a real TLS ring a member floods with views.

The tests here start real node processes; the in-process ones are in
tests/unit/test_view_rate.py.
"""

from collections import Counter

import grpc
import pytest

from tests.support.helpers import wait_for


def three_free_ports() -> int:
    """A port p with p, p+1 and p+2 free on the loopback (the nodes' metrics)."""
    import socket
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        try:
            for port in (base, base + 1, base + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no three free ports in a row")


@pytest.mark.multiprocess
def test_a_member_flooding_views_is_refused_and_the_ring_stays_exact(tmp_path):
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    from floering.wire.ring import Ring
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.observability_shared import scrape, value
    words = [f"v{i % 89}" for i in range(3000)]
    base = three_free_ports()
    with LocalCluster.up(3, 1, workdir=tmp_path, metrics_port=base) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
            c.emit_many(words)
            c.flush()
        refused = accepted = 0
        with cluster.channel(cluster.node("n0").address, "n2") as ch:   # n2's own key
            stub = floe_pb2_grpc.ControlPlaneStub(ch)
            view = Ring.from_wire(stub.GetRing(floe_pb2.GetRingRequest(), timeout=5).ring)
            pushed = floe_pb2.RingView(version=view.version, ring=view.to_wire(),
                                       sender="n2")
            for _ in range(3):                # waves of 150 views at once
                calls = [stub.ExchangeRing.future(pushed, timeout=20) for _ in range(150)]
                for call in calls:
                    try:
                        call.result()
                        accepted += 1
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                        refused += 1
        assert accepted >= 100 and refused >= 100, (accepted, refused)
        # the counter may be bumped just after the refusal is on its way
        wait_for(lambda: value(scrape(base), "floe_calls_refused_busy_total",
                               service="floering.v1.ControlPlane",
                               method="ExchangeRing") == refused,
                 timeout=5, what=f"{refused} refusals counted")
        with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
            c.emit_many(words)
            c.flush()
            assert Counter(dict(c.scan())) == Counter(words * 2)
