"""Restarting nodes, real processes: a restarted process is never taken for the member
it was, whatever signal stopped it and however fast it came back."""

import signal
import time
from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.floe.restart import (member_at, restart_node, rolling_restart, wait_replicated,
                                    wait_share)
from floering.mapper import RingClient
from floering.wire.errors import RangeLost
from tests.support.helpers import Feeder, diff, events_of

pytestmark = pytest.mark.multiprocess

# a member back empty pulls its share after --share-pull-grace, again after
# --share-pull-interval (3 s and 2 s by default): shorter where a test waits for its
# share, the same pulls
PULLS = ["--share-pull-grace", "0.5", "--share-pull-interval", "0.5"]

WORDS16 = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
           "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]


def restart_in_place(cluster, node_id, sig):
    """What a service manager does: stop the process with `sig`, start it again with
    the same flags (no leave, no ranges handed back)."""
    return cluster.restart(node_id, graceful=False, sig=sig, timeout=15)


def answers(client, words):
    """Per word: its count, None if the ring says absent, or the error it raised."""
    out = {}
    for w in words:
        try:
            out[w] = client.get(w)
        except RangeLost as exc:
            out[w] = exc
    return out


def test_restarting_each_node_in_place_loses_nothing(tmp_path):
    """The operator's sequence that lost data: 3 nodes, r=1, 16 words, each node
    restarted in turn with SIGTERM and the same flags. Each comes back as a new empty
    member; owners left without replicas (from the second restart on) refill such a
    member with ranges by themselves, so nothing is lost."""
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.emit_many(WORDS16 * 3)
            client.flush()
        names = []
        for node_id in ["n0", "n1", "n2"]:
            fresh = restart_in_place(cluster, node_id, signal.SIGTERM)
            name = member_at(fresh.address, cluster.seeds, 30, cluster.tls())
            assert name != node_id, "a restarted process came back as the member it was"
            names.append(name)
            wait_replicated(cluster.seeds, 30, cluster.tls())
            with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
                ring = client.refresh_ring()
                assert node_id in ring.removed and not ring.lost, ring.describe()
                assert answers(client, WORDS16) == {w: 3 for w in WORDS16}
        assert names == ["n0#1", "n1#1", "n2#1"]


def test_back_to_back_restarts_never_serve_a_lost_key_as_absent(tmp_path):
    """The same without waiting between restarts: a range may lose every copy, and
    then its keys are an error, never "absent"."""
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.emit_many(WORDS16 * 3)
            client.flush()
        for node_id in ["n0", "n1", "n2"]:
            fresh = restart_in_place(cluster, node_id, signal.SIGKILL)
            member_at(fresh.address, cluster.seeds, 30, cluster.tls())
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.refresh_ring()
            got = answers(client, WORDS16)
        for word, value in got.items():
            assert value == 3 or isinstance(value, RangeLost), (word, value)


def test_a_kill_and_restart_inside_the_detection_window_under_load_is_exact(tmp_path):
    """SIGKILL, then the same command at once: the new process finds the old one alive
    in every peer's ring, declares it dead itself, and joins empty. (The peers are told
    to suspect silence only after 4 s, so the restart surely beats their detector.)"""
    slow = ["--suspect-min", "4", "--suspect-max", "5"]
    with LocalCluster.up(4, 1, workdir=tmp_path, extra_args=slow) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        fresh = restart_in_place(cluster, "n1", signal.SIGKILL)
        name = member_at(fresh.address, [n.address for n in cluster.nodes], 30,
                         cluster.tls())
        feeder.wait_rounds(2)              # the stream goes on with the new member
        client = feeder.finish_exact()
        ring = client.refresh_ring()
        client.close()
        assert name == "n1#1" and "n1" in ring.removed
        log = open(fresh.log).read()
        assert "declaring n1 dead at" in log and "joins empty as n1#1" in log
        # it joined empty: any range it holds by now, it asked for (its share)
        assert not ring.tokens_of(name) or "owns too little of the ring" in log
        assert not ring.lost


def test_rolling_restart_under_load_is_exact_and_ends_fully_replicated(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=PULLS) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        lines = []
        rolling_restart(cluster, graceful=True, timeout=60, report=lines.append)
        client = feeder.finish_exact()
        ring = client.refresh_ring()
        rows = client.stats()
        client.close()
        assert sorted(ring.nodes) == ["n0#1", "n1#1", "n2#1"], lines
        assert {"n0", "n1", "n2"} <= ring.removed and not ring.lost
        assert all(len(ring.tokens_of(n)) >= 6 for n in ring.nodes), lines
        assert all(r["under_replicated"] == 0 for r in rows)


def test_a_leave_from_a_pair_hands_its_ranges_over_once_under_load(tmp_path):
    """Two members at r=1: the leaver empties itself into the other member, whose ranges
    then lack a replica. That member used to refill the leaver with them, which handed
    them straight back, several times a second until the leave ended."""
    with LocalCluster.up(2, 1, workdir=tmp_path) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        cluster.remove("n0")
        # the survivor feeds on alone, for long enough that a range handed back to the
        # leaver (its refill, several times a second) would show
        time.sleep(1.0)
        feeder.wait_rounds(2)
        client = feeder.finish_exact()
        client.close()
        events = events_of(cluster, "n1")
        prepared = [e for e in events if e["kind"] == "handoff_prepared"]
        taken = [e for e in events if e["kind"] == "taken_over"]
        assert not prepared, prepared      # it never handed a range back to the leaver
        assert len(taken) == 1 and taken[0]["previous"] == ["n0"], taken


def test_restart_by_sigterm_with_leave_on_sigterm_hands_everything_over(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path,
                         extra_args=["--leave-on-sigterm", *PULLS]) as cluster:
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.emit_many(WORDS16 * 2)
            client.flush()
        for node_id in ("n0", "n1"):
            fresh = restart_in_place(cluster, node_id, signal.SIGTERM)
            seeds = [n.address for n in cluster.nodes]
            name = member_at(fresh.address, seeds, 30, cluster.tls())
            ring = wait_share(seeds, name, 30, cluster.tls())    # it pulls its share itself
            assert len(ring.tokens_of(name)) == 8, ring.describe()
            wait_replicated(seeds, 30, cluster.tls())
        with RingClient([n.address for n in cluster.nodes], timeout=30, tls=cluster.tls()) as client:
            assert dict(client.scan()) == Counter(WORDS16 * 2)
            assert not client.refresh_ring().lost
        log = open(cluster.node("n0").log).read()
        assert "left the ring" in log


def test_restart_node_by_kill_gives_the_new_member_its_share(tmp_path):
    with LocalCluster.up(4, 1, workdir=tmp_path, extra_args=PULLS) as cluster:
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.emit_many(WORDS16 * 5)
            client.flush()
        lines = restart_node(cluster, "n2", graceful=False, timeout=60)
        with RingClient([n.address for n in cluster.nodes], timeout=30, tls=cluster.tls()) as client:
            got = dict(client.scan())
            ring = client.refresh_ring()
        assert got == Counter(WORDS16 * 5), diff(got, Counter(WORDS16 * 5))
        assert ring.tokens_of("n2#1"), lines


def test_a_restart_that_hears_no_running_peer_waits_instead_of_founding(tmp_path):
    """With every peer unreachable a new process cannot tell a restart from a fresh
    start: it serves nothing until a peer answers, then joins as a new member."""
    from floering.floe.cluster import serving, spawn_node
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            client.emit_many(WORDS16)
            client.flush()
        old = cluster.node("n0")
        for peer in ("n1", "n2"):
            cluster.kill(peer, signal.SIGSTOP)
        cluster.kill("n0")
        cluster.nodes.remove(old)
        fresh = spawn_node("n0", old.address, old.cmd, old.log)
        cluster.nodes.append(fresh)
        cluster.save()
        try:
            # It says so after 5 s of its own (later on a loaded machine); it must
            # serve nothing all that time.
            started, deadline = time.monotonic(), time.monotonic() + 30
            while time.monotonic() < started + 6 or \
                    "waiting for a running peer" not in open(fresh.log).read():
                assert time.monotonic() < deadline, "never said it was waiting"
                assert fresh.alive() and not serving(fresh.address, cluster.tls()), \
                    "served before any peer confirmed its place"
                time.sleep(0.1)
        finally:
            for peer in ("n1", "n2"):
                cluster.kill(peer, signal.SIGCONT)
        LocalCluster([fresh], 1, cluster.state_file,
                     extra_args=cluster.extra_args).wait_ready(30)
        assert member_at(fresh.address, cluster.seeds, 30, cluster.tls()) == "n0#1"
        wait_replicated(cluster.seeds, 30, cluster.tls())
        with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
            assert dict(client.scan()) == Counter(WORDS16)
