"""Two members of a live ring paused past detection and woken together, under a feed:
both are fenced, keep what they held as retired ranges, and the ring converges with
every count exact (node.core.evidence, node.core.retired), on real TLS processes."""

import signal
import time

import pytest

from floering.floe.cluster import LocalCluster
from tests.support.helpers import Feeder, diff
from tests.support.helpers import wait_for
from tests.support.retired_ring_shared import events, ring_of, stats_of

pytestmark = pytest.mark.multiprocess

# --lossy-suspicion: the second paused member holds ranges no other copy has, so its
# removal waits this long (30 s by default); shorter here, the same path
LOSSY = "5"


class PatientFeeder(Feeder):
    """A flush waits out the second pause: the ranges only the paused member holds
    are declared lost after the lossy suspicion (LOSSY), and only then sent elsewhere."""

    def __init__(self, seeds, tls):
        super().__init__(seeds, tls=tls)
        from floering.mapper import RingClient
        self.client.close()
        self.client = RingClient(seeds, linger=0.01, timeout=120, tls=tls)


def settled(cluster, members, processes=("n0", "n1", "n2", "n3")) -> bool:
    """Every live member holds the same ring content with the given members, serves
    every range it owns (a range the ring marks lost stays marked, served once a
    retired copy restored it), and keeps no retired range."""
    try:
        rings = [ring_of(cluster, node) for node in processes]
        stats = [stats_of(cluster, node) for node in processes]
    except Exception:
        return False
    return (len({r.content() for r in rings}) == 1 and set(rings[0].nodes) == set(members)
            and all(s.lost_ranges == 0 and s.retired_ranges == 0 for s in stats))


def test_two_members_paused_and_woken_together_converge_exactly(tmp_path):
    data = tmp_path / "data"
    with LocalCluster.up(4, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(data / "{node}"), "--lossy-suspicion", LOSSY]) as cluster:
        feeder = PatientFeeder(cluster.seeds, cluster.tls("client"))
        feeder.start()
        feeder.wait_rounds(3)
        # two of four paused at once leave no quorum to declare them: one is paused
        # until the ring removes it, then the other, and both wake together
        try:
            for node in ("n1", "n2"):
                cluster.kill(node, signal.SIGSTOP)
                wait_for(lambda: node in ring_of(cluster, "n0").removed, 60,
                         f"n0 removes the paused {node}")
        finally:
            for node in ("n1", "n2"):
                cluster.kill(node, signal.SIGCONT)
        for node in ("n1", "n2"):
            wait_for(lambda: stats_of(cluster, node).node_id == f"{node}#1", 30,
                     f"{node} rejoins as {node}#1")
        members = ["n0", "n3", "n1#1", "n2#1"]
        try:
            wait_for(lambda: settled(cluster, members), 60, "the ring converges")
        except AssertionError:
            for node in ("n0", "n1", "n2", "n3"):
                print(node, ring_of(cluster, node).content(), stats_of(cluster, node))
            raise
        feeder.stop.set()
        feeder.join(150)
        client = feeder.finish()
        got = client.scan_all()
        assert got == feeder.acked, diff(got, feeder.acked)
        client.close()
        for node in ("n1", "n2"):
            assert events(cluster, node, "fenced") and events(cluster, node, "retired")
        # the ranges only n2 held when it was removed (n1's, taken over) were lost,
        # and a retired copy gave them back
        assert sum(len(events(cluster, n, "retired_handed_over")) for n in ("n1", "n2"))


@pytest.mark.slow
def test_two_of_five_members_paused_at_once_and_woken_together_converge_exactly(tmp_path):
    """Paused together (the other three are a quorum), both are declared dead, the
    ranges only they held lost; woken together, both are fenced and their retired
    copies give those ranges back: every count exact."""
    data = tmp_path / "data"
    with LocalCluster.up(5, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(data / "{node}"), "--lossy-suspicion", LOSSY]) as cluster:
        feeder = PatientFeeder(cluster.seeds, cluster.tls("client"))
        feeder.start()
        feeder.wait_rounds(3)
        try:
            for node in ("n1", "n2"):
                cluster.kill(node, signal.SIGSTOP)
            wait_for(lambda: {"n1", "n2"} <= ring_of(cluster, "n0").removed, 60,
                     "n0 removes the paused n1 and n2")
        finally:
            for node in ("n1", "n2"):
                cluster.kill(node, signal.SIGCONT)
        processes = ("n0", "n1", "n2", "n3", "n4")
        members = ["n0", "n3", "n4", "n1#1", "n2#1"]
        wait_for(lambda: settled(cluster, members, processes), 90, "the ring converges")
        feeder.stop.set()
        feeder.join(150)
        client = feeder.finish()
        got = client.scan_all()
        assert got == feeder.acked, diff(got, feeder.acked)
        client.close()
        for node in ("n1", "n2"):
            assert events(cluster, node, "fenced") and events(cluster, node, "retired")
        assert sum(len(events(cluster, n, "retired_handed_over")) for n in ("n1", "n2"))
