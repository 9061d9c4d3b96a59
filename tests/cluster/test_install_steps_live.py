"""A full copy of a range that arrives as frames and is kept as a dict (user-defined reducers,
FLOE_PURE=1) is made that dict a few thousand entries per turn of the event loop, not in one
step: exact against the frames' entries and a Counter, the loop's steps counted and the
longest timed in the loop's own CPU time; and a real ring hands ranges of dict states over
while batches keep coming, exact afterwards.

The tests here start real node processes; the in-process ones are in
tests/unit/test_install_steps.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from floering.wire.codec import unpack_entries
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import wait_for


def inspect(cluster, address: str, token: int) -> tuple[str, dict]:
    with cluster.channel(address) as channel:
        chunks = list(floe_pb2_grpc.QueryPlaneStub(channel).InspectRange(
            floe_pb2.RangeRequest(token=token), timeout=30))
    return chunks[0].role, {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}


@pytest.mark.multiprocess
@pytest.mark.parametrize("reducer,pure", [("topk", False), ("count", True)])
def test_ranges_of_dict_states_handed_over_while_batches_come_stay_exact(
        tmp_path, monkeypatch, reducer, pure):
    """n2 leaves a ring of 3 holding 60,000 keys of dict states (top-k tuples; counts
    with FLOE_PURE=1): its ranges and the copies of the others' go over as frames
    while a second source keeps emitting. Afterwards every key is exact against a
    Counter, and every replica's copy equals its primary's."""
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    if pure:
        monkeypatch.setenv("FLOE_PURE", "1")
    first = [f"k{i}" for i in range(60_000)]
    more = [f"k{i}" for i in range(0, 60_000, 7)] + [f"n{i}" for i in range(5_000)]
    cluster = LocalCluster.up(3, 1, workdir=tmp_path, reducer=reducer, tls=False,
                              tokens_per_node=2)
    try:
        with RingClient(cluster.seeds, source="a") as client:
            client.emit_many(first)
            client.flush(timeout=120)

        def feed():
            with RingClient(cluster.seeds, source="b", batch_size=500) as other:
                for i in range(0, len(more), 2_000):
                    other.emit_many(more[i:i + 2_000])
                    time.sleep(0.02)
                other.flush(timeout=120)
        feeder = threading.Thread(target=feed)
        feeder.start()
        cluster.remove("n2", timeout=120)
        feeder.join(180)
        assert not feeder.is_alive()
        expect = Counter(first) + Counter(more)
        with RingClient(cluster.seeds, source="c") as client:
            wait_for(lambda: all(s["under_replicated"] == 0 for s in client.stats()),
                     timeout=60, what="every range's copies complete")
            got = dict(client.scan())
            ring = client.ring
        if reducer == "topk":
            assert all(s == (1,) * len(s) for s in got.values())
            got = {k: len(s) for k, s in got.items()}
        assert got == dict(expect)
        for token in ring.tokens:
            primary = inspect(cluster, ring.address(ring.owner_of_token(token)), token)
            for replica in ring.replicas_of_token(token):
                assert inspect(cluster, ring.address(replica), token)[1] == primary[1]
    finally:
        cluster.down(kill=True)
