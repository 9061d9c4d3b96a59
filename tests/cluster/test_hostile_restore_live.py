"""RangeHeld and RestoreRange, the members' calls about retired ranges (node.core.retired), fed
hostile input: every field is refused with a clear status, in bounded memory, and nothing
changes. Pure rules first, then a real TLS ring.

The tests here start real node processes; the in-process ones are in
tests/unit/test_hostile_restore.py.
"""

from collections import Counter

import grpc
import pytest

from floering.wire.codec import pack
from tests.support.retired_shared import WORDS, cluster


@pytest.mark.multiprocess
def test_hostile_range_held_and_restore_calls_are_refused_on_a_real_ring(tmp_path):
    import psutil
    from floering.floe.cluster import LocalCluster
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.retired_ring_shared import feed, ring_of, scan, stats_of
    want = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        feed(cluster, WORDS, want)
        ring = ring_of(cluster, "n0")
        mine = ring.tokens_of("n0")[0]
        node = cluster.node("n0")
        rss = psutil.Process(node.pid).memory_info().rss

        def call(name, method, **fields):
            with cluster.channel(node.address, name) as ch:
                stub = floe_pb2_grpc.SnapshotsStub(ch)
                request = (floe_pb2.HeldRequest if method == "RangeHeld"
                           else floe_pb2.RestoreChunk)(**fields)
                try:
                    return getattr(stub, method)(request, timeout=20), None
                except grpc.RpcError as exc:
                    return None, exc

        good = dict(ring_stamp=ring.stamp, token=mine)
        restore = dict(good, member="n1", retired=mine, chunk=1, chunks=1,
                       entries=pack([["w1"], [1]]), watermarks=pack({"s1": 1}))
        # not a member: refused whatever it sends
        for method, fields in (("RangeHeld", good), ("RestoreRange", restore)):
            _, exc = call("client", method, **fields)
            assert exc is not None and exc.code() == grpc.StatusCode.PERMISSION_DENIED
        refused = [
            ("RangeHeld", dict(good, watermarks=pack({"s1": "x"}))),
            ("RangeHeld", dict(good, watermarks=pack({f"s{i}": 1 for i in range(70_000)}))),
            ("RangeHeld", dict(good, watermarks=b"\xc1\xc1")),
            ("RangeHeld", dict(good, watermarks=b"\x00" * (5 << 20))),
            ("RestoreRange", dict(restore, member="n" * 100_000)),
            ("RestoreRange", dict(restore, entries=pack([["w1", "w2"], [1]]))),
            ("RestoreRange", dict(restore, entries=b"\xc1" * 1000)),
            ("RestoreRange", dict(restore, chunk=0)),
            ("RestoreRange", dict(restore, chunks=1 << 30)),
            ("RestoreRange", dict(restore, watermarks=pack({"s1": -5}))),
        ]
        for method, fields in refused:
            _, exc = call("n2", method, **fields)
            assert exc is not None and exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                method, exc and exc.code())
            assert exc.details(), method
        # well formed, but nothing to restore: a range that is not lost, a made-up token
        for fields in (restore, dict(restore, token=12345)):
            _, exc = call("n2", "RestoreRange", **fields)
            assert exc is not None and exc.code() == grpc.StatusCode.FAILED_PRECONDITION, (
                exc and exc.code())
        reply, exc = call("n2", "RangeHeld", **dict(good, token=12345))
        assert exc is None and (reply.role, reply.holds, reply.lost) == ("", False, False)
        reply, _ = call("n2", "RangeHeld", **dict(good, watermarks=pack({"s9": 1 << 40})))
        assert (reply.role, reply.holds, reply.lost) == ("primary", False, False)
        # nothing changed, and nothing stays held
        assert ring_of(cluster, "n0").content() == ring.content()
        assert stats_of(cluster, "n0").lost_ranges == 0
        assert scan(cluster) == want
        assert psutil.Process(node.pid).memory_info().rss - rss < 64 << 20
