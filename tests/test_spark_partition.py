"""The executor-side mapper without Spark: retries and replays of a partition against a
real ring count once; a zombie of a committed batch is dropped by the group's floor."""

from collections import Counter

import pytest

from chaos.cluster import LocalCluster
from chaos.corpus import kjv_lines
from mapper import RingClient, split_words
from spark_driver.partition import InjectedFailure, PartitionConfig, write_partition

pytestmark = pytest.mark.multiprocess

LINES = kjv_lines(1200)


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    with LocalCluster.up(3, 1, workdir=tmp_path_factory.mktemp("ring")) as cluster:
        yield cluster


def rows(lines):
    return [(line,) for line in lines]


def state(cluster):
    with RingClient(cluster.seeds) as client:
        return dict(client.scan()), sum(s["duplicates"] for s in client.stats())


def words(lines):
    return Counter(w for line in lines for w in split_words(line))


def config(cluster, query, **kw):
    return PartitionConfig(tuple(cluster.seeds), query, "mapper.words:split_words", "count", **kw)


def test_retry_after_a_failure_half_way_and_a_zombie_count_once(ring, tmp_path):
    before, dups0 = state(ring)
    faulty = config(ring, "q1", fail_once=str(tmp_path / "marker"))
    parts = [LINES[:600], LINES[600:]]
    with pytest.raises(InjectedFailure):
        write_partition(faulty, 0, 0, rows(parts[0]))        # half of it reaches the ring
    assert write_partition(faulty, 0, 0, rows(parts[0])) > 0  # the retry
    write_partition(faulty, 0, 1, rows(parts[1]))
    got, dups1 = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)
    assert dups1 > dups0                                      # the retry's prefix was dropped
    # batch 1 starts (so batch 0 is committed); a late attempt of batch 0 changes nothing
    write_partition(config(ring, "q1"), 1, 0, rows(LINES[:100]))
    write_partition(config(ring, "q1"), 0, 1, rows(parts[1]))
    got2, _ = state(ring)
    assert Counter(got2) - Counter(before) == words(LINES) + words(LINES[:100])


def test_combined_partition_and_empty_partition(ring):
    before, _ = state(ring)
    cfg = config(ring, "q2", combine=True)
    assert write_partition(cfg, 0, 0, rows(LINES)) == len(words(LINES))   # one tuple per word
    assert write_partition(cfg, 0, 0, rows(LINES)) == len(words(LINES))   # a replay
    assert write_partition(cfg, 0, 1, []) == 0
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)
