"""Shares come back without an operator, real processes under a streaming mapper: a
crashed node started again on its data directory rejoins as a new, empty member and
pulls ranges from the member holding the most; a scale-in spreads the leaver's ranges
over the members instead of doubling one neighbour. Each time every member is within
25% of the mean share within 30 s, and the counts equal what flush() confirmed."""

import time

import pytest

from floering.floe.cluster import LocalCluster
from floering.floe.restart import member_at, wait_replicated
from tests.support.helpers import Feeder, finish_exact
from tests.support.share_return_shared import WITHIN, ring_of, seconds_to_even, uneven

pytestmark = pytest.mark.multiprocess

# a short member pulls after --share-pull-grace, pulls again after --share-pull-interval
# (3 s and 2 s by default): shorter here, the same pulls
PULLS = ["--share-pull-grace", "0.5", "--share-pull-interval", "0.5"]


def test_a_rejoined_member_and_a_scale_in_get_even_shares_back_under_load(tmp_path):
    with LocalCluster.up(4, 1, workdir=tmp_path, data_dir=tmp_path / "data",
                          extra_args=PULLS) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        cluster.kill("n2")
        deadline = time.monotonic() + WITHIN
        while "n2" not in ring_of(cluster).removed:      # its ranges went to its heir
            assert time.monotonic() < deadline, "n2's death was never declared"
            time.sleep(0.1)
        doubled = ring_of(cluster)
        assert max(doubled.share_of(n) for n in doubled.nodes) >= 0.4, doubled.describe()

        fresh = cluster.restart("n2", graceful=False)    # a crash: started again
        name = member_at(fresh.address, cluster.seeds, WITHIN, cluster.tls())
        assert name == "n2#1"
        rejoin = seconds_to_even(cluster, 4)
        assert ring_of(cluster).share_of(name) > 0

        cluster.remove("n0")                              # scale-in, under load
        leave = seconds_to_even(cluster, 3)
        feeder.wait_rounds(2)                             # the even ring takes the stream
        ring = finish_exact(feeder)                       # exact counts throughout
        assert not ring.lost and not uneven(ring), ring.describe()
        wait_replicated([n.address for n in cluster.nodes], WITHIN, cluster.tls())
        log = open(fresh.log).read()
        assert "owns too little of the ring" in log, log[-2000:]
        print(f"even again {rejoin:.1f} s after the rejoin, {leave:.1f} s after the leave")


def test_a_crash_with_no_restart_evens_shares_out_under_load(tmp_path):
    """A member SIGKILLed and not started again is a scale-in from the ring's point of
    view: its heir took its ranges over (a double share); the members below the mean
    pull from it until every member is within 25% of the mean, and nothing is lost."""
    with LocalCluster.up(4, 1, workdir=tmp_path, data_dir=tmp_path / "data",
                          extra_args=PULLS) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        cluster.kill("n2")
        deadline = time.monotonic() + WITHIN
        while "n2" not in ring_of(cluster).removed:
            assert time.monotonic() < deadline, "n2's death was never declared"
            time.sleep(0.1)
        taken = ring_of(cluster)
        assert max(taken.share_of(n) for n in taken.nodes) >= 0.4, taken.describe()
        even = seconds_to_even(cluster, 3)
        feeder.wait_rounds(2)                             # the even ring takes the stream
        ring = finish_exact(feeder)                       # exact counts throughout
        assert not ring.lost and not uneven(ring), ring.describe()
        assert sorted(ring.nodes) == ["n0", "n1", "n3"], ring.describe()
        wait_replicated([n.address for n in cluster.nodes if n.alive()], WITHIN,
                        cluster.tls())
        print(f"even again {even:.1f} s after n2's death was declared")
