"""Every member of a ring runs the same reducer with the same arguments: the ring records it
when it is founded, and a view or a joining node saying otherwise is refused.

The tests here start real node processes; the in-process ones are in
tests/unit/test_reducer_agreement.py.
"""

from __future__ import annotations

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.node.core.reducers import reducer_identity
from tests.support.reducer_agreement_shared import COUNT


@pytest.mark.multiprocess
def test_a_node_with_another_reducer_is_refused_when_it_joins(tmp_path):
    with LocalCluster.up(2, 1, workdir=tmp_path, reducer="count") as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            assert client.ring.reducer == COUNT
        cluster.reducer = "sum"
        with pytest.raises(RuntimeError, match="exited during start"):
            cluster.add_nodes(1, ready_timeout=30)
        joiner = cluster.nodes[-1]
        assert joiner.popen.wait(30) == 2
        log = open(joiner.log).read()
        assert (f"the ring runs reducer '{COUNT}', this node was started with "
                f"{reducer_identity('sum', {})}") in log, log
        assert "Traceback" not in log
        last = log.strip().splitlines()[-1]
        assert last.startswith("floe node: the ring runs reducer"), log   # one clear line
        with RingClient(cluster.seeds[:2], tls=cluster.tls("client")) as client:
            ring = client.refresh_ring()           # the ring did not change
            assert ring.nodes == ("n0", "n1") and not ring.removed
            assert all("error" not in row for row in client.stats())
