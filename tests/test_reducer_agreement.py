"""Every member of a ring runs the same reducer with the same arguments: the ring
records it when it is founded, and a view or a joining node saying otherwise is
refused."""

from __future__ import annotations

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.node.config import load_config
from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import reducer_identity
from floering.wire.ring import Ring
from floering.wire.ring_merge import check_compatible

MEMBERS = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(3)}
COUNT = reducer_identity("count", {})


def test_an_alias_and_its_class_are_one_reducer_and_arguments_count():
    assert COUNT == reducer_identity("floering.node.core.reducers:Count", {})
    assert reducer_identity("topk", {"k": 5}) != reducer_identity("topk", {"k": 10})
    assert reducer_identity("x.y:Z", {"b": 1, "a": "s"}) == "x.y:Z(a='s', b=1)"
    config = load_config(["--node-id", "n0", "--listen", "127.0.0.1:1", "--peers",
                          "n0=127.0.0.1:1", "--reducer", "topk", "--reducer-arg", "k=5"])
    assert config.reducer_identity == reducer_identity("topk", {"k": 5})


def test_the_ring_carries_its_reducer_and_refuses_a_view_with_another():
    ring = Ring.initial(MEMBERS, 1, 2, reducer=COUNT)
    assert Ring.from_wire(ring.to_wire()).reducer == COUNT
    other = Ring.initial(MEMBERS, 1, 2, reducer=reducer_identity("sum", {}))
    assert other.stamp != ring.stamp
    with pytest.raises(InvalidArgument, match="reducer"):
        check_compatible(ring, other)
    # a view from before rings recorded their reducer is taken, and the merge keeps it
    unrecorded = Ring.initial(MEMBERS, 1, 2)
    check_compatible(ring, unrecorded)
    assert ring.merge(unrecorded.with_version(5)).reducer == COUNT
    with pytest.raises(InvalidArgument):
        Ring.from_wire(Ring.initial(MEMBERS, 1, 2, reducer="x" * 2000).to_wire())


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
