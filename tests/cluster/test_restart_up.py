"""`floe up` against a running cluster with members SIGKILLed, real processes under a
streaming mapper: it starts only the missing members, each on its own data
directory, leaves the live ones alone (same PIDs), and the ring gives each its share
back: back inside the detection window it is the same member with what it held;
declared dead first, it is a new member that pulls its share. Every member within
25% of the mean share within 30 s, the counts equal what flush() confirmed, and
`floe status --check` says HEALTHY."""

import json
import time

import pytest

from floering.floe.cluster import LocalCluster
from tests.support.helpers import Feeder, finish_exact, floe, floe_run
from tests.support.share_return_shared import WITHIN, ring_of, seconds_to_even, uneven

pytestmark = pytest.mark.multiprocess

# Peers suspect a silent member only after 4 s, so a restart right after the kill
# surely comes back before the ring declares it dead.
SLOW = ["--suspect-min", "4", "--suspect-max", "5"]


def pids(tmp_path) -> dict[str, int]:
    return {n["node_id"]: n["pid"]
            for n in json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]}


def up_again(tmp_path, gone: str) -> tuple[str, float]:
    """`floe up` with `gone` killed: only it starts, on its data directory; returns the
    command's output and how long the ring took to be even again from its start."""
    before = pids(tmp_path)
    started = time.monotonic()
    out = floe(tmp_path, "up")
    cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
    even = seconds_to_even(cluster, 4) + (time.monotonic() - started)
    after = pids(tmp_path)
    assert {n: p for n, p in after.items() if n != gone} == \
        {n: p for n, p in before.items() if n != gone}, "a live member was restarted"
    assert after[gone] != before[gone] and cluster.node(gone).alive()
    return out, even


def test_up_starts_only_the_killed_members_and_their_shares_come_back(tmp_path):
    floe(tmp_path, "up", "--nodes", "4", "--replicas", "1", "--", *SLOW)
    cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
    try:
        everyone = floe_run(tmp_path, "up")           # nothing is missing: refused
        assert everyone.returncode == 1 and "still running" in everyone.stderr
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)

        cluster.kill("n2")                            # back before it is declared dead
        refused = floe_run(tmp_path, "up", "--nodes", "5")
        assert refused.returncode == 1 and "without --nodes" in refused.stderr
        out, same = up_again(tmp_path, "n2")
        assert "serves as n2, as the same member" in out, out
        ring = ring_of(cluster)
        assert "n2" in ring.nodes and "n2" not in ring.removed, ring.describe()

        cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
        cluster.kill("n1")                            # declared dead before it is back
        deadline = time.monotonic() + WITHIN
        while "n1" not in ring_of(cluster).removed:
            assert time.monotonic() < deadline, "n1's death was never declared"
            time.sleep(0.1)
        out, fresh = up_again(tmp_path, "n1")
        assert "serves as n1#1, as a new member" in out, out
        assert "started n1 again; n0, n2, n3 were running and left alone" in out, out

        feeder.wait_rounds(2)                         # the stream goes on after it
        ring = finish_exact(feeder)                   # exact counts throughout
        assert not ring.lost and not uneven(ring), ring.describe()
        assert sorted(ring.nodes) == ["n0", "n1#1", "n2", "n3"], ring.describe()
        assert fresh <= WITHIN and same <= WITHIN
        check = floe_run(tmp_path, "status", "--check")
        assert check.returncode == 0, check.stdout + check.stderr
        print(f"even again {same:.1f} s after `floe up` (same member), {fresh:.1f} s "
              f"(new member)")
    finally:
        LocalCluster.load(tmp_path / "floe-cluster.json").down()
