"""Durable nodes (--data-dir): the disk is one more replica of every range a node holds. The
store and the restore path in one process, then real node processes killed together
(SIGKILL, and a power loss that tears every log's tail) and restarted on their data
directories, exact against an independent count.

The tests here start real node processes; the in-process ones are in
tests/simulation/test_durable.py.
"""

import time
from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster, spawn_node
from floering.chaos.durable_faults import SmallDisk, Skipped, fill, tear_every_log
from floering.mapper import RingClient
from floering.node.storage import node_store
from floering.node.storage.node_store import NodeStore
from floering.node.storage.segment_log import SUFFIX
from tests.support.helpers import Feeder, events_of, wait_checkpoint_rounds, wait_for
from tests.support.durable_shared import durable_cluster, restart_all


@pytest.mark.multiprocess
@pytest.mark.parametrize("power_loss", [False, True], ids=["sigkill", "torn-write"])
def test_a_whole_cluster_killed_under_load_comes_back_exact(tmp_path, power_loss):
    with durable_cluster(tmp_path) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        before = sum(feeder.acked.values())
        torn = []
        restart_all(cluster, (lambda: torn.append(tear_every_log(tmp_path / "data")))
                    if power_loss else None)
        feeder.wait_rounds(3, timeout=60)                # the stream goes on after it
        client = feeder.finish()
        assert before > 0 and sum(feeder.acked.values()) > before     # it went on
        got = dict(client.scan())
        assert got == feeder.acked, f"{sum(got.values())} != {sum(feeder.acked.values())}"
        client.close()
        logs = "".join(open(n.log).read() for n in cluster.nodes)
        assert "data directory" in logs and "joins empty" not in logs
        if power_loss:
            assert len(torn[0]) == len(cluster.nodes) and "torn tail cut" in logs


@pytest.fixture
def small_disk(tmp_path):
    """A real 24 MiB filesystem (tmpfs), mounted for the test: needs root."""
    disk = SmallDisk(tmp_path / "disk", 24)
    try:
        disk.__enter__()
    except Skipped as exc:
        pytest.skip(str(exc))
    yield disk.path
    disk.__exit__()


@pytest.mark.multiprocess
def test_a_full_disk_refuses_writes_keeps_serving_reads_and_recovers(tmp_path, small_disk):
    import threading
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(small_disk / "{node}")]) as cluster:
        first = [f"a{i % 50}" for i in range(3000)]
        later = [f"b{i % 50}" for i in range(3000)]
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(first)
            client.flush()
        filler = fill(small_disk)
        done, errors = threading.Event(), []

        def feed_later():
            try:
                # Every tuple sent (not combined): more than the tails of pages hold.
                with RingClient(cluster.seeds, timeout=90, tls=cluster.tls(),
                                combine=False) as c:
                    c.emit_many(later)
                    c.flush()
            except Exception as exc:
                errors.append(exc)
            done.set()
        threading.Thread(target=feed_later, daemon=True).start()
        logs = lambda: "".join(open(n.log).read() for n in cluster.nodes)   # noqa: E731
        deadline = time.monotonic() + 30
        while "refusing batches" not in logs():
            assert time.monotonic() < deadline, "no node noticed the full disk"
            time.sleep(0.2)
        assert not done.is_set()                           # held back, not acknowledged
        with RingClient(cluster.seeds, tls=cluster.tls()) as reader:          # reads are served meanwhile
            assert reader.get("a7") == 60
        filler.unlink()
        assert done.wait(90) and not errors, errors
        assert "takes writes again" in logs()
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            assert dict(client.scan()) == Counter(first) + Counter(later)
        for node in cluster.nodes:
            assert node.alive()


@pytest.mark.multiprocess
def test_floe_down_kill_then_up_on_the_same_data_dir_gives_back_exact_state(tmp_path):
    import json
    from floering.chaos.corpus import kjv_lines
    from floering.mapper import split_words
    from tests.support.helpers import floe, floe_run
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(kjv_lines(1500)))
    expect = Counter(w for line in kjv_lines(1500) for w in split_words(line))
    data = tmp_path / "data"
    floe(tmp_path, "up", "--nodes", "3", "--data-dir", str(data))
    try:
        floe(tmp_path, "feed", str(corpus))
        assert "killed 3 nodes" in floe(tmp_path, "down", "--kill")
        refused = floe_run(tmp_path, "up", "--nodes", "5", "--data-dir", str(data))
        assert refused.returncode == 1 and "--nodes 5 (kept: 3)" in refused.stderr
        again = floe(tmp_path, "up", "--data-dir", str(data))
        assert again.count("pid") == 3                # the kept layout
        assert floe(tmp_path, "get", "lord").strip() == str(expect["lord"])
        status = json.loads(floe(tmp_path, "status", "--json"))
        assert sum(int(n["keys"]) for n in status["nodes"]) == len(expect)
        top = floe(tmp_path, "top", "5")
        assert [int(line.split("\t")[0]) for line in top.splitlines()] == \
            [c for _, c in expect.most_common(5)]
    finally:
        floe_run(tmp_path, "down")


@pytest.mark.multiprocess
def test_a_rolling_restart_on_data_dirs_under_load_is_exact(tmp_path):
    """Each node leaves (its ranges go to their replicas: nothing is unavailable),
    restarts on its data directory as a new member and takes its share back."""
    from floering.floe.restart import rolling_restart
    # each comes back as a new member that pulls its share: after 0.5 s, not 3 s
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(tmp_path / "data" / "{node}"), "--share-pull-grace", "0.5",
            "--share-pull-interval", "0.5"]) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        rolling_restart(cluster, report=lambda line: None)
        feeder.wait_rounds(2, timeout=60)                # the stream goes on after it
        client = feeder.finish()
        got = dict(client.scan())
        client.close()
        assert got == feeder.acked
        assert sorted(n.node_id for n in cluster.nodes) == ["n0", "n1", "n2"]


@pytest.mark.multiprocess
def test_a_corrupt_data_dir_is_set_aside_and_its_ranges_come_from_replicas(tmp_path):
    words = [f"w{i % 40}" for i in range(4000)]
    with durable_cluster(tmp_path) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
        victim = cluster.node("n0")
        cluster.kill("n0")
        segment = sorted((tmp_path / "data" / "n0" / "log").glob("*" + SUFFIX))[0]
        data = bytearray(segment.read_bytes())
        assert len(data) > 200
        data[20] ^= 0xFF                           # mid-log: records follow it
        segment.write_bytes(bytes(data))
        cluster.nodes.remove(victim)
        cluster.nodes.append(spawn_node("n0", victim.address, victim.cmd, victim.log))
        cluster.save()
        cluster.wait_ready(60)
        log = open(victim.log).read()
        assert "is corrupt" in log and "00000000000000000001.log: corrupt at byte 0" in log
        assert list((tmp_path / "data").glob("n0.corrupt-*"))
        with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    got = dict(client.scan())
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        assert got == Counter(words)


@pytest.mark.multiprocess
def test_a_corrupt_copy_of_one_range_goes_to_its_heir_and_the_member_keeps_the_rest(tmp_path):
    """The whole cluster is killed; on one node's disk the copy of a range it owns
    has a segment whose checksum no longer matches (RocksDB's own checksums are
    tested above, on the store). That node comes back as itself with every other range it held;
    the damaged range is taken over by its heir from its own copy, as after a
    death, and every count is exact."""
    import json
    words = [f"w{i % 300}" for i in range(6000)]
    damaged = {}
    with durable_cluster(tmp_path) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
            ring = client.refresh_ring()
        wait_checkpoint_rounds(cluster)          # a checkpoint round writes the copies

        def damage():
            store = NodeStore(tmp_path / "data" / "n0")
            owned = [t for t in store.load().copies if ring.owner_of_token(t) == "n0"]
            damaged["token"] = token = owned[0]
            prefix = node_store._key_prefix(token) + node_store.SEGMENT
            key, value = next((k, v) for k, v in store.db.items(from_key=prefix)
                              if k.startswith(prefix))
            store._write([(key, value[:-1] + bytes([value[-1] ^ 0xFF]))], [], sync=True)
            store.close()
        restart_all(cluster, damage)
        token, heir = damaged["token"], ring.heir(damaged["token"])
        with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
            wait_for(lambda: client.refresh_ring().owner_of_token(token) == heir, 30,
                     "the heir to own the damaged range")
            assert dict(client.scan()) == Counter(words)
            assert client.refresh_ring().tokens_of("n0") == tuple(t for t in ring.tokens_of("n0")
                                                           if t != token)
        logs = {n.node_id: open(n.log).read() for n in cluster.nodes}
        assert f"range of token {token} is corrupt" in logs["n0"]
        assert "checksum does not match" in logs["n0"]
        assert "joins empty" not in logs["n0"] and not list((tmp_path / "data").glob("n0.corrupt-*"))
        taken = [e for e in events_of(cluster, heir) if e.get("kind") == "taken_over"]
        assert any(token in e.get("tokens", ()) for e in taken), json.dumps(taken)[:500]
