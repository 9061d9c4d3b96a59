"""One client cannot starve or shut out the others: call slots shared out by caller identity,
source tables with a share per identity, sources bound to the identity that pushes them.
Unit checks on the core, then real node processes with mutual TLS.

The tests here start real node processes; the in-process ones are in
tests/unit/test_fairness.py.
"""

from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.floe.cluster import LocalCluster
from floering.chaos.hostile import IdleStreams
from floering.mapper import RingClient
from floering.node.core.batch import encode_payload
from floering.node.transport import tls as tls_mod
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import wait_for


@pytest.fixture
def ring3(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, data_dir=tmp_path / "data") as cluster:
        yield cluster


def another_client(cluster, name: str):
    """A second client certificate from the ring's CA: another identity."""
    return tls_mod.issue(cluster.tls_dir, name, "client", ["127.0.0.1", "localhost"])


@pytest.mark.multiprocess
def test_a_thousand_idle_streams_of_one_client_shut_out_nobody(ring3):
    cluster = ring3
    node = cluster.nodes[0]
    alice = another_client(cluster, "alice")
    words = [f"w{i % 101}" for i in range(3000)]
    limit = 1000                            # --max-concurrent-rpcs, the default
    # Watch streams: a node ends an idle Push stream while its caller's others wait
    # to be read, which would give the flooder's slots back
    with IdleStreams(node.address, cluster.tls("client"), 1000, kinds=("watch",)) as idle:
        wait_for(lambda: sum(idle.refused.values()) >= 1000 - limit // 4, 60,
                 "the streams past the client's share refused")
        assert idle.refused == {"RESOURCE_EXHAUSTED": 1000 - limit // 4}, idle.refused
        assert any("a quarter of --max-concurrent-rpcs" in d for d in idle.details)
        # health, stats, a member's call and another client's whole feed all go through
        for name in ("operator", "client", "n1", "alice"):
            with cluster.channel(node.address, name) as ch:
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                stats = lambda: floe_pb2_grpc.QueryPlaneStub(ch).Stats(  # noqa: E731
                    floe_pb2.StatsRequest(), timeout=5)
                if name != "client":
                    stats()
                    continue
                assert idle.ended == 0
                with pytest.raises(grpc.RpcError) as refused:     # the flooder's own
                    stats()
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with cluster.channel(node.address, "n1") as ch:
            floe_pb2_grpc.ControlPlaneStub(ch).GetRing(floe_pb2.GetRingRequest(), timeout=5)
        with RingClient(cluster.seeds, tls=alice) as client:
            client.emit_many(words)
            client.flush()
            assert dict(client.scan()) == Counter(words)
        # a mapper of the flooding identity itself is held back, not failed: it
        # retries until the streams go
        import threading
        same = RingClient(cluster.seeds, tls=cluster.tls("client"))
        done = threading.Event()

        def feed():
            same.emit_many(words)
            same.flush(timeout=120)
            done.set()
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
    feeder.join(120)
    assert done.is_set()
    assert dict(same.scan()) == Counter(words + words)
    same.close()
    events = "".join(open(n.log.replace(".log", ".events.jsonl")).read()
                     for n in cluster.nodes)
    assert '"detected"' not in events


def push_everywhere(cluster, tls, ring, source: str, seq: int, keys_by_token=None):
    """One single-tuple batch of `source` at seq `seq` to every holder of every token
    (a key of that token); returns the status names of the refusals."""
    from floering.floe.cluster import channel
    keys_by_token = keys_by_token or key_per_token(ring)
    refused = []
    for token, key in keys_by_token.items():
        for node in ring.destinations(token):
            with channel(ring.address(node), tls) as ch:
                b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=source,
                                   first_seq=seq, last_seq=seq, count=1, id=1,
                                   payload=encode_payload([key], [1]))
                try:
                    list(floe_pb2_grpc.DataPlaneStub(ch).Push(
                        iter([floe_pb2.PushRequest(batches=[b])]), timeout=10))
                except grpc.RpcError as exc:
                    refused.append(exc.code().name)
    return refused


def key_per_token(ring) -> dict:
    keys = {}
    for i in range(100_000):
        keys.setdefault(ring.token_for_key(f"x{i}"), f"x{i}")
        if len(keys) == len(ring.tokens):
            return keys
    raise AssertionError("a token no key reaches")


@pytest.mark.multiprocess
def test_a_source_flood_of_one_identity_leaves_others_their_sources(tmp_path):
    words = [f"w{i % 53}" for i in range(2000)]
    with LocalCluster.up(3, 1, workdir=tmp_path, data_dir=tmp_path / "data",
                         extra_args=["--max-sources-per-range", "64"]) as cluster:
        mallory = another_client(cluster, "mallory")
        alice = another_client(cluster, "alice")
        with RingClient(cluster.seeds, tls=alice) as client:
            ring = client.ring
        token = ring.tokens[0]
        key = key_per_token(ring)[token]
        from floering.floe.cluster import channel
        outcomes = Counter()
        with channel(ring.address(ring.owner_of_token(token)), mallory) as ch:
            for i in range(64):                 # the whole range's worth of new sources
                b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=f"flood{i}",
                                   first_seq=1, last_seq=1, count=1, id=1,
                                   payload=encode_payload([key], [1]))
                try:
                    list(floe_pb2_grpc.DataPlaneStub(ch).Push(
                        iter([floe_pb2.PushRequest(batches=[b])]), timeout=10))
                    outcomes["OK"] += 1
                except grpc.RpcError as exc:
                    assert "its share" in exc.details(), exc.details()
                    outcomes[exc.code().name] += 1
        assert outcomes == {"OK": 16, "RESOURCE_EXHAUSTED": 48}    # a quarter of 64
        # a new source of another identity, in that range and every other: taken
        with RingClient(cluster.seeds, tls=alice) as client:
            client.emit_many(words + [key])
            client.flush()
    # the whole ring restarted on its data: the bindings and shares come back with it
    with LocalCluster.up(workdir=tmp_path, data_dir=tmp_path / "data",
                         extra_args=["--max-sources-per-range", "64"]) as cluster:
        mallory = another_client(cluster, "mallory")      # a new CA: the same names
        alice = another_client(cluster, "alice")
        with RingClient(cluster.seeds, tls=mallory) as client:
            ring = client.ring
        with channel(ring.address(ring.owner_of_token(token)), mallory) as ch:
            b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source="flood-again",
                               first_seq=1, last_seq=1, count=1, id=1,
                               payload=encode_payload([key], [1]))
            with pytest.raises(grpc.RpcError) as refused:
                list(floe_pb2_grpc.DataPlaneStub(ch).Push(
                    iter([floe_pb2.PushRequest(batches=[b])]), timeout=10))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "its share" in refused.value.details()
        with RingClient(cluster.seeds, tls=alice) as client:        # a new source again
            client.emit_many(words)
            client.flush()
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            client.emit_many(words)
            client.flush()
            want = Counter(words * 3 + [key])
            want[key] += 16
            assert dict(client.scan()) == want


@pytest.mark.multiprocess
def test_a_feeds_seqs_cannot_be_taken_ahead_by_whoever_learns_or_guesses_its_source(tmp_path):
    import hashlib
    import os
    import stat
    from pathlib import Path
    from floering.floe.feed import check_inputs, feed_key
    from tests.support.helpers import floe
    rng_words = [f"word{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(5000)]
    text = Path(tmp_path / "corpus.txt")
    text.write_text("\n".join(" ".join(rng_words[i:i + 10]) for i in range(0, 5000, 10)))
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        mallory = another_client(cluster, "mallory")
        with RingClient(cluster.seeds, tls=mallory) as client:
            ring = client.ring
        # the id the feed once used: anyone could compute it from the file
        st = os.stat(text)
        guessed = "feed-" + hashlib.sha256(
            f"{text.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
        # the id it uses now, known here from the cluster's key (as if it leaked)
        key = feed_key(tmp_path / "floe-cluster")
        leaked = check_inputs([str(text)], key=key)[0].source
        assert leaked != guessed
        last = 2 ** 64 - 1
        assert push_everywhere(cluster, cluster.tls("client"), ring, guessed, last) == []
        assert push_everywhere(cluster, mallory, ring, leaked, last) == []
        floe(tmp_path, "feed", str(text))
        key_file = tmp_path / "floe-cluster" / "feed.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert key_file.read_bytes() == key                   # made once, kept
        floe(tmp_path, "feed", str(text))                     # a rerun: not counted again
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            got = dict(client.scan())
        want = Counter(rng_words)
        for k in key_per_token(ring).values():     # the attackers' own tuples: one each
            want[k] += 2
        assert got == want


@pytest.mark.multiprocess
def test_an_epoch_group_cannot_be_ended_by_another_identity(tmp_path):
    from floering.mapper import epoch_seq, epoch_source
    keys = [f"k{i}" for i in range(100)]
    group = "query-0a1b2c"                   # known to the attacker
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        mallory = another_client(cluster, "mallory")
        driver = cluster.tls("client")

        def run_epoch(epoch):
            for member in range(2):
                with RingClient(cluster.seeds, tls=driver,
                                source=epoch_source(group, member),
                                first_seq=epoch_seq(epoch, 0)) as client:
                    client.emit_many(keys[member::2] * 3)
                    client.flush()
                    ring = client.ring
            return ring
        ring = run_epoch(0)
        # an epoch far ahead under the driver's group: would end every earlier epoch
        assert push_everywhere(cluster, mallory, ring, epoch_source(group, "x"),
                               epoch_seq(7, 0)) == []
        run_epoch(1)
        with RingClient(cluster.seeds, tls=driver) as client:
            got = dict(client.scan())
        want = Counter(keys * 6)
        want.update(key_per_token(ring).values())           # mallory's own tuples
        assert got == want


@pytest.mark.multiprocess
def test_a_word_of_five_megabytes_is_refused_alone_and_the_rest_is_counted(tmp_path):
    from pathlib import Path
    from floering.floe.feed import MAX_WORD_BYTES
    from floering.mapper import words_of_lines
    from tests.support.helpers import floe_run
    lines = [" ".join(f"w{chr(97 + (i * 7 + j) % 26)}" for j in range(20)) for i in range(250)]
    huge = "z" * (5 << 20)
    edge = "y" * MAX_WORD_BYTES                            # the longest taken
    lines[100] += f" {huge} tail {edge}"
    text = Path(tmp_path / "corpus.txt")
    text.write_text("\n".join(lines))
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        fed = floe_run(tmp_path, "feed", str(text))
        assert fed.returncode == 0, fed.stderr
        assert f"a word of {5 << 20:,} bytes refused" in fed.stderr, fed.stderr
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            got = dict(client.scan())
    want = Counter(w for w in words_of_lines(lines) if w != huge)
    assert edge in want and got == want


@pytest.mark.multiprocess
def test_a_combining_client_counts_past_64_bits_exactly(tmp_path):
    words = [f"w{i % 31}" for i in range(3000)]
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), batch_size=50) as client:
            assert client.source.startswith("combined:")
            client.emit_many(words)
            for _ in range(3):
                client.emit_many(["big"] * 4, 2 ** 63)
                client.flush()                  # each flush succeeds, nothing dropped
            client.emit_many(["neg"] * 5, -(2 ** 63))
            client.flush()
            got = dict(client.scan())
    want = Counter(words)
    want["big"] = 3 * 4 * 2 ** 63
    want["neg"] = -5 * 2 ** 63
    assert got == want


@pytest.mark.multiprocess
def test_a_source_flood_of_one_identity_does_not_shut_a_node(tmp_path):
    from floering.floe.cluster import channel
    words = [f"w{i % 53}" for i in range(1000)]
    with LocalCluster.up(3, 1, workdir=tmp_path,
                         extra_args=["--max-sources-per-node", "32"]) as cluster:
        mallory = another_client(cluster, "mallory")
        alice = another_client(cluster, "alice")
        with RingClient(cluster.seeds, tls=alice) as client:
            ring = client.ring
        node = ring.nodes[0]
        token = ring.tokens_of(node)[0]
        key = key_per_token(ring)[token]
        outcomes = Counter()
        with channel(ring.address(node), mallory) as ch:
            for i in range(32):
                b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=f"flood{i}",
                                   first_seq=1, last_seq=1, count=1, id=1,
                                   payload=encode_payload([key], [1]))
                try:
                    list(floe_pb2_grpc.DataPlaneStub(ch).Push(
                        iter([floe_pb2.PushRequest(batches=[b])]), timeout=10))
                    outcomes["OK"] += 1
                except grpc.RpcError as exc:
                    assert "--max-sources-per-node" in exc.details(), exc.details()
                    outcomes[exc.code().name] += 1
        assert outcomes == {"OK": 8, "RESOURCE_EXHAUSTED": 24}     # a quarter of 32
        with RingClient(cluster.seeds, tls=alice) as client:
            client.emit_many(words)
            client.flush()
            want = Counter(words)
            want[key] += 8
            assert dict(client.scan()) == want


@pytest.mark.multiprocess
def test_in_the_clear_a_host_holds_a_quarter_of_the_slots_over_all_its_connections(tmp_path):
    words = [f"w{i % 11}" for i in range(500)]
    own = [("grpc.use_local_subchannel_pool", 1)]          # a connection each
    with LocalCluster.up(2, 1, workdir=tmp_path, tls=False,
                         extra_args=["--max-concurrent-rpcs", "200"]) as cluster:
        node = cluster.nodes[0]
        with IdleStreams(node.address, None, 40, own) as one, \
                IdleStreams(node.address, None, 40, own) as two:
            refused = lambda: sum(one.refused.values()) + sum(two.refused.values())  # noqa: E731
            wait_for(lambda: refused() >= 30, 30, "the streams past the host's quarter refused")
            # both connections may have streams refused: their counts add up
            assert Counter(one.refused) + Counter(two.refused) == \
                {"RESOURCE_EXHAUSTED": refused()}
            assert refused() == 30, (one.refused, two.refused)   # 50 held, a quarter of 200
            assert any("'ipv4:127.0.0.1' holds 50 calls" in d
                       for d in one.details + two.details), one.details + two.details
            with cluster.channel(node.address) as ch:       # the health reserve answers
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with RingClient(cluster.seeds) as client:        # the host's streams gone: served
            client.emit_many(words)
            client.flush()
            assert dict(client.scan()) == Counter(words)
