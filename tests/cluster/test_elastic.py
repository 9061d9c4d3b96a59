"""Elasticity on real processes: ranges move, nodes join and leave while a mapper
streams, and the ring's counts equal an independent count of what flush() confirmed."""

import threading
import time

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper.admin import request_handoff
from floering.chaos.timeline import node_events
from tests.support.helpers import Feeder, diff, finish_exact, floe, live_ring, status, wait_for

pytestmark = pytest.mark.multiprocess



def test_floe_move_under_a_streaming_mapper(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=4) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        ring = feeder.client.refresh_ring()
        to_heir = ring.tokens_of("n0")[0]                 # n0's first replica takes it
        heir = ring.heir(to_heir)
        other = next(n for n in ring.nodes if n not in ("n0", heir))
        to_other = ring.tokens_of("n0")[1]                # delayed transition via extras
        out1 = floe(tmp_path, "move", heir, "--to", hex(to_heir))
        feeder.wait_rounds(2)                             # the stream goes on between moves
        out2 = floe(tmp_path, "move", other, "--to", str(to_other - 5))
        feeder.wait_rounds(2)
        ring = finish_exact(feeder)
        assert "handed the range" in out1 and "handed the range" in out2
        assert ring.owner_of_token(to_heir) == heir and ring.owner_of_token(to_other) == other
        nodes = status(tmp_path)
        assert sum(n["ring_share"] for n in nodes.values()) == pytest.approx(1.0)
        assert nodes["n0"]["tokens"] == 2 and nodes["n0"]["handed_off"] >= 2
        assert all(n["lost_ranges"] == 0 for n in nodes.values())


def test_scale_out_3_to_5_and_back_to_3_under_load(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=4) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        out = floe(tmp_path, "scale", "--add", "2")
        cluster.nodes[:] = LocalCluster.load(cluster.state_file).nodes   # stopped on exit
        assert "added n3, n4" in out
        grown = status(tmp_path)
        assert set(grown) == {"n0", "n1", "n2", "n3", "n4"}
        assert grown["n3"]["tokens"] >= 2 and grown["n4"]["tokens"] >= 2
        feeder.wait_rounds(2)                             # the grown ring takes the stream
        for node in ("n3", "n4"):
            floe(tmp_path, "scale", "--remove", node)
        cluster.nodes[:] = LocalCluster.load(cluster.state_file).nodes
        feeder.wait_rounds(2)
        ring = finish_exact(feeder)
        assert set(ring.nodes) == {"n0", "n1", "n2"} and {"n3", "n4"} <= ring.removed
        shrunk = status(tmp_path)
        assert set(shrunk) == {"n0", "n1", "n2"}
        assert all(n["lost_ranges"] == 0 for n in shrunk.values())
        for n in ("n3", "n4"):
            kinds = [e["kind"] for e in node_events(
                str(tmp_path / "floe-cluster" / "logs" / f"{n}.events.jsonl"))]
            assert "left" in kinds and kinds[-1] == "stopped", (n, kinds)


@pytest.mark.parametrize("victim", ["owner", "target"])
def test_a_kill_in_the_middle_of_a_move_loses_nothing(tmp_path, victim):
    with LocalCluster.up(4, 1, workdir=tmp_path, tokens_per_node=4) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        ring = feeder.client.refresh_ring()
        tokens = ring.tokens_of("n0")[:2]
        target = "n2"                                     # not n0's neighbour: extras first
        result = {}

        def move():
            try:
                result["reply"] = request_handoff(ring.address("n0"), tokens, target, timeout=10,
                                                  tls=cluster.tls("operator"))
            except Exception as exc:      # the owner may die under it
                result["error"] = exc
        mover = threading.Thread(target=move)
        mover.start()
        time.sleep(0.05)                                  # the kill lands while the move runs
        dead = "n0" if victim == "owner" else target
        cluster.kill(dead)
        mover.join(30)
        wait_for(lambda: dead in live_ring(cluster).removed, 30, f"{dead} declared dead")
        feeder.wait_rounds(2)                             # the stream goes on without it
        ring = finish_exact(feeder)
        assert dead in ring.removed
        nodes = status(tmp_path)
        assert all(n["lost_ranges"] == 0 for n in nodes.values() if "error" not in n)


@pytest.mark.parametrize("policy", ["floe", "halving", "doubling"])
def test_a_skewed_stream_rebalances_by_itself_and_stays_exact(tmp_path, policy):
    from floering.chaos.balance import run
    # hot words 21,600 tuples/s on n0, which applies at most 20,000 (50 us of wall time
    # per tuple, not CPU work: the overload holds however busy the other cores are)
    result = run(tmp_path, seconds=8, rate=24000, work=0, wait_us=50, policy=policy)
    assert result["exact"], "counts differ from the independent count"
    assert "t_over" in result, "no node became overloaded: the workload is too light here"
    assert result["t_moved"] is not None, "the overloaded node moved nothing"
    assert result["false_declarations"] == 0, "a busy node was declared dead"
    assert result["ratio_after"] < result["ratio_before"], (result["before"], result["after"])


def test_autoscale_adds_a_node_under_load_and_removes_it_when_idle(tmp_path):
    from floering.chaos.balance import OpenLoopFeeder
    from floering.floe.elastic import autoscale_loop
    # The per-tuple cost is wall time (80 us: at most 12,500 tuples/s a node), not CPU
    # work, so 60,000 tuples/s overload the ring however fast the cores run today.
    extra = ["--reducer-arg", "work=0", "--reducer-arg", "wait_us=80",
             "--high-queue", "16", "--low-queue", "4",
             "--high-cpu", "0.85", "--low-cpu", "0.7"]
    with LocalCluster.up(3, 1, workdir=tmp_path, reducer="floering.chaos.costly:CostlyCount",
                         tokens_per_node=4, extra_args=extra) as cluster:
        words = [f"w{i}" for i in range(5000)]          # uniform: every node gets its share
        feeder = OpenLoopFeeder(cluster.seeds, 60_000, words, tls=cluster.tls())
        feeder.start()
        changes = []
        scaler = threading.Thread(target=lambda: autoscale_loop(
            cluster, seconds=60, min_nodes=3, max_nodes=4, cooldown=2.0, log=lambda m: None,
            changes=changes, until=lambda c: any("removed" in what for _, what in c)))
        scaler.start()
        wait_for(lambda: any("added" in c for _, c in changes), 30, "a node added under load")
        # The grown ring runs loaded a while, but less than the scaler's 2 s cool-down: a
        # condition could take longer, and the scaler may remove the new node, still
        # light, before the stream stops.
        time.sleep(1.0)
        feeder.stop.set()                               # now idle: the extra node goes
        feeder.join(120)
        assert feeder.error is None, feeder.error
        scaler.join(90)
        assert not scaler.is_alive()
        cluster.nodes[:] = LocalCluster.load(cluster.state_file).nodes
        kinds = [c.split()[0] for _, c in changes]
        assert kinds[:2] == ["added", "removed"], changes
        client = feeder.client
        got = dict(client.scan())
        ring = client.refresh_ring()
        client.close()
        assert got == dict(feeder.acked), diff(got, feeder.acked)
        assert len(ring.nodes) == 3
