"""A fenced member keeps what it held until the ring holds each of its ranges on r+1
others (node.core.retired, node.runtime.retiring), on real TLS processes with data
directories on loopback. The pure rules are in tests/unit/test_retired.py."""

import signal
from collections import Counter
from pathlib import Path

import pytest

from floering.floe.cluster import LocalCluster
from floering.node.core.retired import decode
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import wait_for
from tests.support.retired_ring_shared import events, feed, ring_of, scan, stats_of

WORDS = [f"w{i % 173}" for i in range(5000)]

pytestmark = pytest.mark.multiprocess


def retired_files(data: Path, node_id: str) -> list[Path]:
    return sorted((data / node_id / "retired").glob("*.retired"))


def pause_until_removed(cluster, victim: str, witness: str) -> None:
    """SIGSTOP `victim` until `witness`'s ring has removed it, then SIGCONT."""
    cluster.kill(victim, signal.SIGSTOP)
    try:
        wait_for(lambda: victim not in ring_of(cluster, witness).nodes, 30,
                 f"{victim} declared dead")
    finally:
        cluster.kill(victim, signal.SIGCONT)


def test_a_fenced_member_keeps_its_ranges_until_r_plus_1_others_hold_them(tmp_path):
    data = tmp_path / "data"
    want = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(data / "{node}")]) as cluster:
        feed(cluster, WORDS, want)
        held = {t for t in ring_of(cluster, "n0").tokens
                if "n2" in ring_of(cluster, "n0").destinations(t)}
        pause_until_removed(cluster, "n2", "n0")
        wait_for(lambda: stats_of(cluster, "n2").node_id == "n2#1", 30, "n2 rejoins as n2#1")
        (kept,) = wait_for(lambda: events(cluster, "n2", "retired"), 10, "n2 keeps its ranges")
        assert kept["member"] == "n2" and set(kept["tokens"]) == held, (kept, held)
        assert kept["keys"] > 0
        # every kept range goes once the ring holds it on r+1 others, and only then
        wait_for(lambda: {e["token"] for e in events(cluster, "n2", "retired_deleted")}
                 == held, 60, "every kept range confirmed and deleted")
        assert not retired_files(data, "n2")
        shown = stats_of(cluster, "n2")                 # NodeStats, floe status --json
        assert (shown.retired_ranges, shown.retired_keys, shown.retired_deleted) == (
            0, 0, len(held))
        # each deleted after it was kept, under a ring that had taken its ranges over
        removed_at = min(e["ring_version"] for e in events(cluster, "n2", "fenced"))
        for e in events(cluster, "n2", "retired_deleted"):
            assert e["t"] > kept["t"] and e["ring_version"] > removed_at, (e, kept)
        assert scan(cluster) == want
        feed(cluster, WORDS[::7], want)
        assert scan(cluster) == want


def test_two_members_forced_out_at_r1_give_back_every_lost_range(tmp_path):
    """A member's certificate pushes a view removing two members while they are
    paused (the receiver's own probes find them silent, so it adopts it); they are
    killed there and started again on their data directories, where the ring no
    longer has them: they join as new members. At r=1 the ranges only they held are
    lost to the ring (8 of 24, which the ring used to lose for ever); the copies their
    directories kept give them back, exactly, and go once r+1 others hold them."""
    from floering.chaos.durable_faults import start_again
    data = tmp_path / "data"
    want = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(data / "{node}")]) as cluster:
        feed(cluster, WORDS, want)
        view = ring_of(cluster, "n0")
        alone = {t for t in view.tokens if set(view.destinations(t)) == {"n1", "n2"}}
        assert alone
        for node in ("n1", "n2"):
            cluster.kill(node, signal.SIGSTOP)
        try:
            with cluster.channel(cluster.node("n0").address, "n2") as ch:   # n2's own key
                floe_pb2_grpc.ControlPlaneStub(ch).ExchangeRing(floe_pb2.RingView(
                    version=view.version + 1, ring=view.without(["n1", "n2"]).to_wire(),
                    sender="n2"), timeout=10)
            wait_for(lambda: {"n1", "n2"} <= ring_of(cluster, "n0").removed, 30,
                     "n0 adopts the removal of the silent n1 and n2")
        finally:
            for node in ("n1", "n2"):
                cluster.kill(node, signal.SIGKILL)
        assert alone <= ring_of(cluster, "n0").lost
        shown = stats_of(cluster, "n0")
        assert shown.lost_ranges == len(alone) and shown.views_held >= 1
        start_again(cluster, ["n1", "n2"])
        cluster.wait_ready(60)
        for node in ("n1", "n2"):
            wait_for(lambda: stats_of(cluster, node).node_id.startswith(f"{node}#"), 30,
                     f"{node} joins as a new member")
        kept = {n: wait_for(lambda: events(cluster, n, "retired"), 10, f"{n} keeps")[0]
                for n in ("n1", "n2")}
        assert {e["member"] for e in kept.values()} == {"n1", "n2"}
        wait_for(lambda: stats_of(cluster, "n0").lost_ranges == 0, 30,
                 "the lost ranges are handed the kept copies, and served")
        handed = [e for n in ("n1", "n2") for e in events(cluster, n, "retired_handed_over")]
        assert {e["into"] for e in handed} == alone
        assert sum(stats_of(cluster, n).retired_handed_over for n in ("n1", "n2")) == len(handed)
        assert scan(cluster) == want
        feed(cluster, WORDS[::5], want)
        assert scan(cluster) == want
        # once the ring holds each range on r+1 members, the kept copies go
        wait_for(lambda: not retired_files(data, "n1") and not retired_files(data, "n2"),
                 60, "the kept copies deleted once confirmed")
        assert scan(cluster) == want
