"""The executor-side mapper without Spark: retries and replays of a partition against a
real ring count once; a zombie of a committed batch is dropped by the group's floor."""

from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.mapper import RingClient, split_words
from floering.spark_driver.partition import InjectedFailure, PartitionConfig, write_partition

pytestmark = pytest.mark.multiprocess

LINES = kjv_lines(1200)


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    with LocalCluster.up(3, 1, workdir=tmp_path_factory.mktemp("ring")) as cluster:
        yield cluster


def rows(lines):
    return [(line,) for line in lines]


def state(cluster):
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        return dict(client.scan()), sum(s["duplicates"] for s in client.stats())


def words(lines):
    return Counter(w for line in lines for w in split_words(line))


def config(cluster, query, **kw):
    return PartitionConfig(tuple(cluster.seeds), query, "floering.mapper.words:split_words", "count",
                           tls_dir=str(cluster.tls_dir), **kw)


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


def test_a_worker_reuses_its_connection_across_tasks_and_stays_exact(ring, tmp_path):
    from floering.spark_driver import connections
    connections.close_all()
    before, _ = state(ring)
    cfg = config(ring, "q3")
    write_partition(cfg, 0, 0, rows(LINES[:300]))
    (client,) = connections._idle.values()
    write_partition(cfg, 0, 1, rows(LINES[300:600]))            # another partition
    write_partition(cfg, 1, 0, rows(LINES[600:900]))            # the next batch
    write_partition(cfg, 1, 0, rows(LINES[600:900]))            # a replay of it
    assert list(connections._idle.values()) == [client]         # one client, kept
    # A task that fails closes the worker's client; its retry opens a new one.
    faulty = config(ring, "q3", fail_once=str(tmp_path / "marker"))
    with pytest.raises(InjectedFailure):
        write_partition(faulty, 2, 0, rows(LINES[900:]))
    assert connections.idle_count() == 0
    write_partition(faulty, 2, 0, rows(LINES[900:]))
    assert connections._idle and next(iter(connections._idle.values())) is not client
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)
    connections.close_all()


def test_a_fresh_workers_first_task_opens_one_channel_a_node_with_the_drivers_names(
        ring, monkeypatch):
    from floering.mapper import delivery
    from floering.spark_driver import connections
    connections.close_all()
    before, _ = state(ring)
    names = tuple((n.address, n.node_id) for n in ring.nodes)    # the driver's ring
    for given, per_node in (((), 2), (names, 1)):
        monkeypatch.setattr(delivery, "PLACED", {})             # a worker that saw no ring
        write_partition(config(ring, "q6", names=given), len(given), 0, rows(LINES[:100]))
        (client,) = connections._idle.values()
        opened = Counter(a for a, _ in client._delivery.channels._open)
        assert opened == Counter({n.address: per_node for n in ring.nodes})
        connections.close_all()
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES[:100]) + words(LINES[:100])


def test_a_new_client_given_a_plan_fetches_the_ring_once(ring, monkeypatch):
    from floering.mapper import delivery
    from floering.mapper.plans import EVEN
    from floering.spark_driver import connections
    connections.close_all()
    before, _ = state(ring)
    fetches = []
    real = delivery.Delivery.fetch_ring

    async def counted(self):
        fetches.append(self)
        return await real(self)
    monkeypatch.setattr(delivery.Delivery, "fetch_ring", counted)
    write_partition(config(ring, "q7", plan=EVEN.encode()), 0, 0, rows(LINES[:100]))
    assert len(fetches) == 1                  # the rebind to the plan fetched no more
    write_partition(config(ring, "q7", plan=EVEN.encode()), 1, 0, rows(LINES[:100]))
    assert len(fetches) == 2                  # a kept client's rebind fetches anew
    connections.close_all()
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES[:100]) + words(LINES[:100])


def test_a_forked_worker_does_not_use_its_parents_connection(ring, monkeypatch):
    from floering.spark_driver import connections
    connections.close_all()
    cfg = config(ring, "q4")
    write_partition(cfg, 0, 0, rows(LINES[:50]))
    parent_client = next(iter(connections._idle.values()))
    monkeypatch.setattr(connections, "_pid", -1)               # as seen from a child
    assert connections.idle_count() == 0
    parent_client.close()


def test_a_dead_ring_is_not_reused_and_is_reported(tmp_path):
    from floering.wire.errors import Unavailable
    from floering.spark_driver import connections
    connections.close_all()
    with LocalCluster.up(2, 1, workdir=tmp_path) as cluster:
        cfg = config(cluster, "q5")
        write_partition(cfg, 0, 0, rows(LINES[:50]))
        assert connections.idle_count() == 1
    with pytest.raises(Unavailable):
        write_partition(cfg, 1, 0, rows(LINES[50:100]))
    assert connections.idle_count() == 0


def test_a_worker_keeps_one_idle_connection_whatever_rings_it_saw(ring):
    from floering.spark_driver import connections
    connections.close_all()
    write_partition(config(ring, "q6"), 0, 0, rows(LINES[:50]))
    first = next(iter(connections._idle.values()))
    write_partition(config(ring, "q6", batch_size=500), 0, 1, rows(LINES[50:100]))
    assert connections.idle_count() == 1
    assert next(iter(connections._idle.values())) is not first
    assert first._closed                                        # the replaced one is closed
    connections.close_all()


# The Arrow path: the words as Spark SQL split them, in Arrow arrays.

def word_arrays(lines, cut=1000):
    """The lines' words in Arrow arrays of `cut` words (as mapInArrow's batches)."""
    pa = pytest.importorskip("pyarrow")
    flat = [w for line in lines for w in split_words(line)]
    return [pa.array(flat[i:i + cut], pa.string()) for i in range(0, len(flat), cut)]


def test_the_sql_pattern_is_split_words_pattern():
    from floering.mapper.words import _WORD
    from floering.spark_driver.maps import SQL_WORD_MAPS, WORD_PATTERN
    assert WORD_PATTERN == _WORD.pattern
    assert "floering.mapper.words:split_words" in SQL_WORD_MAPS


@pytest.mark.parametrize("combine", [False, True])
def test_arrow_words_retried_after_a_failure_half_way_count_once(ring, tmp_path, combine):
    from floering.spark_driver.partition import write_words
    before, dups0 = state(ring)
    query = f"qa-{combine}"
    faulty = config(ring, query, combine=combine, fail_once=str(tmp_path / "marker"))
    parts = [LINES[:600], LINES[600:]]
    with pytest.raises(InjectedFailure):
        write_words(faulty, 0, 0, word_arrays(parts[0]))      # half of it reaches the ring
    got_half, _ = state(ring)
    assert Counter(got_half) != Counter(before)
    sent = write_words(faulty, 0, 0, word_arrays(parts[0], cut=777))   # the retry
    assert sent > 0
    write_words(faulty, 0, 1, word_arrays(parts[1]))
    got, dups1 = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)
    assert dups1 > dups0                                      # the retry's prefix was dropped


def test_arrow_combining_flushes_every_n_keys_where_the_words_fall_not_the_batches(ring):
    """Bounded memory: totals go out every `combine_keys` distinct keys; the flush points
    depend only on the words, so a replay cut into other Arrow batches sends the same
    tuples under the same seqs and the ring drops every one."""
    from floering.spark_driver.partition import write_words
    before, _ = state(ring)
    expected = words(LINES)
    cfg = config(ring, "qb", combine=True, combine_keys=300)
    sent = write_words(cfg, 0, 0, word_arrays(LINES, cut=1000))
    assert len(expected) < sent < sum(expected.values())     # several flushes, fewer tuples
    got, dups = state(ring)
    assert Counter(got) - Counter(before) == expected
    assert write_words(cfg, 0, 0, word_arrays(LINES, cut=4093)) == sent   # a replay
    got2, dups2 = state(ring)
    assert got2 == got and dups2 - dups == sent
    one_flush = write_words(config(ring, "qc", combine=True), 0, 0, word_arrays(LINES))
    assert one_flush == len(expected)                           # under the bound: one per key
    assert write_words(cfg, 0, 1, []) == 0


def test_arrow_every_tuple_counts_exactly(ring):
    from floering.spark_driver.partition import write_words
    before, _ = state(ring)
    cfg = config(ring, "qd")
    assert write_words(cfg, 0, 0, word_arrays(LINES)) == sum(words(LINES).values())
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)


def test_row_path_combining_flushes_every_n_keys(ring):
    before, _ = state(ring)
    cfg = config(ring, "qe", combine=True, combine_keys=250)
    sent = write_partition(cfg, 0, 0, rows(LINES))
    assert len(words(LINES)) < sent < sum(words(LINES).values())
    assert write_partition(cfg, 0, 0, rows(LINES)) == sent       # a replay, the same flushes
    got, _ = state(ring)
    assert Counter(got) - Counter(before) == words(LINES)


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "rows"])
def test_combining_the_fault_falls_on_a_flush_so_a_rerun_without_it_is_exact(
        ring, tmp_path, arrow):
    """A driver killed while a combining task hung is rerun without the fault: the
    rerun must send the same totals under the same seqs, so the fault may only stop a
    task where it sends its totals anyway (here mid-partition: 300 keys a flush)."""
    from floering.spark_driver.partition import write_words

    def write(cfg):
        if arrow:
            return write_words(cfg, 0, 0, word_arrays(LINES[:600]))
        return write_partition(cfg, 0, 0, rows(LINES[:600]))

    before, dups0 = state(ring)
    query = f"qf-{arrow}"
    with pytest.raises(InjectedFailure):
        write(config(ring, query, combine=True, combine_keys=300,
                     fail_once=str(tmp_path / f"marker-{arrow}")))
    partial, _ = state(ring)
    assert 0 < sum((Counter(partial) - Counter(before)).values()) < sum(
        words(LINES[:600]).values())                              # stopped mid-partition
    write(config(ring, query, combine=True, combine_keys=300))    # the rerun, no fault
    got, dups1 = state(ring)
    assert Counter(got) - Counter(before) == words(LINES[:600])
    assert dups1 > dups0


# The lines path: the lines in Arrow arrays, split into words by the mapper's kernel.

def line_arrays(lines, cut=500):
    pa = pytest.importorskip("pyarrow")
    return [pa.array(lines[i:i + cut], pa.string()) for i in range(0, len(lines), cut)]


@pytest.mark.parametrize("combine", [False, True])
def test_arrow_lines_split_by_the_kernel_retried_after_a_failure_count_once(
        ring, tmp_path, combine):
    from floering.spark_driver.partition import write_lines
    before, dups0 = state(ring)
    query = f"ql-{combine}"
    faulty = config(ring, query, combine=combine, combine_keys=400,
                    fail_once=str(tmp_path / "marker"))
    parts = [LINES[:600] + [None, "", "İSTANBUL \u212aELVIN"], LINES[600:]]
    with pytest.raises(InjectedFailure):
        write_lines(faulty, 0, 0, line_arrays(parts[0]))      # half of it reaches the ring
    sent = write_lines(faulty, 0, 0, line_arrays(parts[0], cut=77))   # the retry
    assert sent > 0
    assert write_lines(faulty, 0, 0, line_arrays(parts[0], cut=1000)) == sent   # a replay
    write_lines(faulty, 0, 1, line_arrays(parts[1]))
    got, dups1 = state(ring)
    everything = [line for line in parts[0] + parts[1] if line is not None]
    assert Counter(got) - Counter(before) == words(everything)
    assert dups1 > dups0                                      # the retry's prefix was dropped
