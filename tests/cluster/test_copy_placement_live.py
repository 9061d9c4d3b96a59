"""A checkpoint cut under an earlier ring lands where it was meant to: a full copy in flight
(in chunks) or a delta survives ring changes that leave its range's primary, bounds and our
place among its replicas as they were, and is refused after a change that moves, splits or
drops the range (node.core.placement).

The tests here start real node processes; the in-process ones are in
tests/unit/test_copy_placement.py.
"""

import threading
import time
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper.admin import split
from floering.wire.errors import FloeError
from floering.wire.hashing import HASH_SPACE
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import wait_for


def _under_replicated(cluster, node) -> int | None:
    try:
        with cluster.channel(node.address) as channel:
            return floe_pb2_grpc.QueryPlaneStub(channel).Stats(
                floe_pb2.StatsRequest(), timeout=10).under_replicated
    except grpc.RpcError:
        return None


class SplitStorm(threading.Thread):
    """Splits the range of `token` over and over (each cut a little further into its
    tail, which keeps the token): one ring change after the other, until stopped."""

    def __init__(self, ring, token, tls) -> None:
        super().__init__(daemon=True)
        self.ring, self.token, self.tls = ring, token, tls
        self.stop = threading.Event()
        self.done = 0
        self.error: Exception | None = None

    def run(self) -> None:
        lo, hi = self.ring.range_of_token(self.token)
        size = (hi - lo) % HASH_SPACE
        try:
            # paced, and cuts enough for minutes of it: the storm must outlast the copies
            for k in range(1, 100_000):
                if self.stop.is_set():
                    return
                try:
                    split(self.ring, (lo + size * k // 100_000) % HASH_SPACE, tls=self.tls,
                          timeout=10)
                    self.done += 1
                    time.sleep(0.02)
                except FloeError:          # a handoff under way: splits wait
                    time.sleep(0.05)
        except Exception as exc:            # reported by the test
            self.error = exc


@pytest.mark.multiprocess
def test_full_copies_complete_while_another_range_splits_again_and_again(tmp_path):
    """After a kill, a survivor's full copies to its new replica (chunks of 16 entries:
    each copy takes many calls) go on while another member splits a range of its own
    again and again, each split a new ring version. Every range of the survivor is on
    r+1 nodes again while the splits go on (before, each split turned every copy in
    flight away and none ever completed), and every count is exact."""
    words = [f"k{i}" for i in range(40_000)] + [f"k{i}" for i in range(0, 40_000, 7)]
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=2, node_args=[
            "--checkpoint-chunk-entries=16", "--repair-delay=0",
            "--max-splits-per-minute=100000"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
            expect = Counter(words)
            ring = client.refresh_ring()
            victim = ring.nodes[2]
            # `copier`'s ranges are backed up on the victim: they need new full copies;
            # `splitter` owns a range backed up elsewhere, which it splits meanwhile.
            copier = next(n for n in ring.nodes if n != victim and
                          all(ring.replicas_of_token(t) == (victim,) for t in ring.tokens_of(n)))
            splitter = next(n for n in ring.nodes if n not in (victim, copier))
            token = next(t for t in ring.tokens_of(splitter)
                         if victim not in ring.replicas_of_token(t))
            wait_for(lambda: all(_under_replicated(cluster, n) == 0 for n in cluster.nodes),
                     60, "every range on r+1 nodes")
            storm = SplitStorm(ring, token, cluster.tls("operator"))
            storm.start()
            try:
                wait_for(lambda: storm.done >= 3, 60, "the first splits")
                cluster.kill(victim)
                node = cluster.node(copier)
                wait_for(lambda: victim not in client.refresh_ring().nodes, 60,
                         "the victim removed")
                splits = storm.done
                wait_for(lambda: _under_replicated(cluster, node) == 0, 60,
                         f"{copier}'s ranges on r+1 nodes again")
                assert storm.is_alive() and storm.error is None
                assert storm.done > splits + 3, "the ring did not change while copies ran"
            finally:
                storm.stop.set()
                storm.join(30)
            assert storm.error is None, storm.error
            alive = [n for n in cluster.nodes if n.node_id != victim]
            wait_for(lambda: all(_under_replicated(cluster, n) == 0 for n in alive), 60,
                     "every range on r+1 nodes")
            assert dict(client.scan()) == expect
