"""Token splits on real processes: a range cut under a streaming mapper and its tail
handed to the clockwise neighbour, and the owner SIGKILLed right after a split; the
ring's counts equal an independent count of what flush() confirmed."""

import threading
import time

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper.admin import request_handoff
from floering.wire.ring import Ring
from tests.support.helpers import Feeder, finish_exact, floe, live_ring, middle, status, wait_for

pytestmark = pytest.mark.multiprocess


def ring_at(cluster, address):
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(address) as channel:
        view = floe_pb2_grpc.ControlPlaneStub(channel).GetRing(floe_pb2.GetRingRequest(),
                                                               timeout=5)
    return Ring.from_wire(view.ring)


def test_floe_split_hands_the_tail_to_the_neighbour_under_a_streaming_mapper(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=2) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        ring = feeder.client.refresh_ring()
        token = ring.tokens_of("n0")[0]
        heir = ring.heir(token)
        at = middle(ring, token)
        moved = status(tmp_path)["n0"]["moved_bytes"]
        out = floe(tmp_path, "split", hex(at), "--to", heir)
        assert "handed the tail" in out
        feeder.wait_rounds(2)                   # the stream goes on between the cuts
        # a second cut of the head, kept by n0 (split only)
        second = middle(ring.split_token(token, at), at)
        assert "split the range" in floe(tmp_path, "split", str(second))
        feeder.wait_rounds(2)
        ring = finish_exact(feeder)
        assert ring.owner_of_token(token) == heir
        assert ring.owner_of_token(at) == "n0" and ring.owner_of_token(second) == "n0"
        assert len(ring.tokens) == 8
        nodes = status(tmp_path)
        assert nodes["n0"]["tokens"] == 3 and nodes["n0"]["handed_off"] >= 1
        # the parts' full copies to their new holders count as state moved
        assert nodes["n0"]["moved_bytes"] > moved
        assert sum(n["ring_share"] for n in nodes.values()) == pytest.approx(1.0)
        assert all(n["lost_ranges"] == 0 for n in nodes.values())


@pytest.mark.parametrize("when", ["after the split", "during the tail's handoff"])
def test_the_owner_killed_right_after_a_split_loses_nothing(tmp_path, when):
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=2) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        ring = feeder.client.refresh_ring()
        token = ring.tokens_of("n0")[1]
        at = middle(ring, token)
        if when == "after the split":
            reply = request_handoff(ring.address("n0"), [], "", timeout=10, split_at=at,
                                    tls=cluster.tls("operator"))
            assert reply.accepted
            # the replica holds the split (its copy cut in two) before the owner dies
            deadline = time.monotonic() + 10
            while not ring_at(cluster, ring.address(ring.heir(token))).has_token(at):
                assert time.monotonic() < deadline, "the split never reached the replica"
                time.sleep(0.01)
            cluster.kill("n0")
        else:
            result = {}

            def split_and_move():
                try:
                    result["reply"] = request_handoff(ring.address("n0"), [], ring.heir(token),
                                                      timeout=10, split_at=at,
                                                      tls=cluster.tls("operator"))
                except Exception as exc:      # the owner dies under it
                    result["error"] = exc
            mover = threading.Thread(target=split_and_move)
            mover.start()
            time.sleep(0.05)                  # the kill lands while the split and move run
            cluster.kill("n0")
            mover.join(30)
        wait_for(lambda: "n0" in live_ring(cluster).removed, 30, "n0 declared dead")
        feeder.wait_rounds(2)                 # the stream goes on without it
        ring = finish_exact(feeder)
        assert "n0" in ring.removed
        if when == "after the split":
            assert ring.has_token(at)
        assert "n0" not in ring.owners
        nodes = status(tmp_path)
        assert all(n["lost_ranges"] == 0 for n in nodes.values() if "error" not in n)


def test_load_shedding_splits_a_range_holding_two_hot_keys(tmp_path):
    """Both hot keys in one range of n0: no whole-range move evens n0 and n1, so the
    overloaded node cuts the range between them and hands the tail over by itself."""
    from floering.chaos.balance import run
    # 50 us of wall time per tuple (at most 20,000 tuples/s a node), not CPU work: the
    # hot words' 21,600 tuples/s overload their node however busy the other cores are,
    # and a node starved of CPU is never mistaken for a dead one
    result = run(tmp_path, seconds=8, rate=24000, work=0, wait_us=50, hot=2, one_range=True)
    assert result["exact"], "counts differ from the independent count"
    assert "t_over" in result, "no node became overloaded: the workload is too light here"
    assert result["splits"] >= 1, "the overloaded node never split its hot range"
    assert result["false_declarations"] == 0, "a busy node was declared dead"
    assert result["ratio_after"] < result["ratio_before"], (result["before"], result["after"])
