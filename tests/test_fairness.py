"""One client cannot starve or shut out the others: call slots shared out by caller
identity, source tables with a share per identity, sources bound to the identity that
pushes them. Unit checks on the core, then real node processes with mutual TLS."""

from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.floe.cluster import LocalCluster
from floering.chaos.hostile import IdleStreams
from floering.mapper import RingClient
from floering.node.core.batch import encode_payload
from floering.node.core.dedup import bind_source, owner_of
from floering.wire.epochs import floor_key
from floering.wire.errors import Busy, TooLarge
from floering.node.core.ranges import PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.slots import (CLIENT, HEALTH, MEMBER, OPERATOR, CallSlots, kind_of,
                                      peer_host)
from floering.node.core.streams import StreamGuard
from floering.node.transport import tls as tls_mod
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.helpers import wait_for


# ------------------------------------------------------------- call slots

def test_one_identity_holds_a_quarter_and_reserved_kinds_get_through_a_full_pool():
    slots = CallSlots(100)
    held = [slots.take(CLIENT, "client:c", f"conn{i % 3}") for i in range(25)]
    with pytest.raises(Busy, match="a quarter of --max-concurrent-rpcs"):
        slots.take(CLIENT, "client:c", "conn9")
    assert slots.refused == 1
    # other identities fill the shared pool ...
    others = [slots.take(CLIENT, f"client:x{i}", f"c{i}") for i in range(slots.shared - 25)]
    with pytest.raises(Busy, match="calls are being served"):
        slots.take(CLIENT, "client:late", "cl")
    # ... and members, health checks and operators still have theirs
    reserved = [slots.take(MEMBER, "node:n1", "p1") for _ in range(slots.reserve[MEMBER])]
    reserved += [slots.take(HEALTH, "client:late", "h")]
    reserved += [slots.take(OPERATOR, "operator:op", "o")
                 for _ in range(slots.reserve[OPERATOR])]
    with pytest.raises(Busy):
        slots.take(MEMBER, "node:n1", "p1")
    with pytest.raises(Busy):
        slots.take(OPERATOR, "operator:op", "o")
    for ticket in held + others + reserved:
        slots.give(ticket)
    assert slots.active == 0 and not slots.by_identity and not slots.by_connection


def test_a_connection_holds_a_quarter_too():
    slots = CallSlots(40)
    for i in range(10):
        slots.take(CLIENT, f"id{i}", "one-connection")
    with pytest.raises(Busy, match="this connection holds 10"):
        slots.take(CLIENT, "id-new", "one-connection")


def test_health_checks_past_their_reserve_count_against_the_callers_quarter():
    slots = CallSlots(100)
    assert slots.reserve[HEALTH] == 2 and slots.per_identity == 25
    held = [slots.take(HEALTH, "ipv4:127.0.0.1", f"c{i}") for i in range(25)]
    assert sum(t.reserved for t in held) == 2       # the reserve's, then its quarter
    with pytest.raises(Busy, match="a quarter of --max-concurrent-rpcs"):
        slots.take(HEALTH, "ipv4:127.0.0.1", "c-new")
    assert slots.in_shared == 23                    # the rest of the pool is others'
    other = slots.take(CLIENT, "ipv4:10.0.0.2", "x")
    for ticket in [*held, other]:
        slots.give(ticket)
    assert slots.active == 0 and not slots.by_identity and not slots.by_connection
    # a caller at its quarter still has its health checks answered from the reserve
    streams = [slots.take(CLIENT, "client:c", f"s{i}") for i in range(25)]
    assert slots.take(HEALTH, "client:c", "h").reserved
    with pytest.raises(Busy):
        slots.take(CLIENT, "client:c", "s-new")
    assert len(streams) == 25


def test_in_the_clear_a_caller_is_its_host_not_its_connection():
    assert peer_host("ipv4:127.0.0.1:50123") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:50123") == "ipv6:[::1]"
    assert peer_host("ipv6:%5B::1%5D:50123") == "ipv6:%5B::1%5D"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
    assert peer_host("?") == "?"


def test_kinds_by_role_and_method():
    assert kind_of("node", "Push", False) == MEMBER
    assert kind_of(None, "Heartbeat", True) == MEMBER       # in the clear: by method
    assert kind_of("client", "Heartbeat", True) == CLIENT   # refused later, by role
    assert kind_of("client", "Check", False) == HEALTH
    assert kind_of("client", "Watch", False) == CLIENT      # a stream is its caller's
    assert kind_of("operator", "Move", False) == OPERATOR


# ------------------------------------------------------- sources and owners

def test_a_bound_source_keeps_its_kind_and_its_epoch_group_under_its_owner():
    a, b = bind_source("client:a", "s"), bind_source("client:b", "s")
    assert a != b and owner_of(a) != owner_of(b) and owner_of(a) is not None
    assert owner_of("s") is None and owner_of("fold:xyz") is None
    combined = bind_source("client:a", "combined:s")
    assert combined.startswith("combined:") and owner_of(combined) == owner_of(a)
    group_a = floor_key(bind_source("client:a", "query#3"))
    group_b = floor_key(bind_source("client:b", "query#3"))
    assert group_a != group_b and owner_of(group_a) == owner_of(a)


def push_one(rng, source, seq=1, now=0.0, max_sources=8):
    return rng.apply(source, seq, seq, 1, encode_payload(["k"], [1]), b"", now=now,
                     max_sources=max_sources)


def test_one_identitys_flood_refuses_only_its_own_new_sources():
    rng = PrimaryRange(1, load_reducer("count"))
    flood = [bind_source("client:mallory", f"m{i}") for i in range(2)]
    for source in flood:
        push_one(rng, source)
    with pytest.raises(TooLarge, match="its share"):
        push_one(rng, bind_source("client:mallory", "m2"))
    assert push_one(rng, flood[0], seq=2) == (1, 0)         # its known ones flow on
    for i in range(2):
        assert push_one(rng, bind_source("client:alice", f"a{i}")) == (1, 0)
    assert push_one(rng, "clear0") == (1, 0)                # unbound: the range's bound only
    assert rng.state.snapshot() == {"k": 6}


def test_the_stream_map_gives_an_identity_a_quarter_of_the_node():
    guard = StreamGuard(8, 100.0, 3600.0)
    for i in range(2):
        source = bind_source("client:mallory", f"m{i}")
        guard.check(source, 1, 0.0, None)
        guard.accept(source, 1, 0.0)
    with pytest.raises(TooLarge, match="its share"):
        guard.check(bind_source("client:mallory", "m2"), 1, 0.0, None)
    guard.check(bind_source("client:alice", "a0"), 1, 0.0, None)
    # once idle past the expiry they leave, and the identity may open new ones
    guard.check(bind_source("client:mallory", "m2"), 1, 200.0, None)


# ---------------------------------------------------- real processes, TLS

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
    with IdleStreams(node.address, cluster.tls("client"), 1000) as idle:
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
    from tests.helpers import floe
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
    from tests.helpers import floe_run
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


# ------------------------------------------------------- combining overflow

def test_a_combined_count_past_64_bits_goes_as_several_tuples_none_lost():
    from floering.mapper.batching import batcher_for
    from floering.node.core.batch import decode_payload
    from floering.node.core.reducers import reducer_identity
    from floering.wire.ring import Ring
    from floering.mapper.combining import HIGHEST, LOWEST

    class Delivery:
        ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 4,
                            reducer=reducer_identity("count", {}))
        on_ring_change = None
    batcher = batcher_for(Delivery(), "m1", False, 1000, 1)
    sent = Counter()
    for key, value, times in (("big", 2 ** 63, 5), ("neg", -(2 ** 62), 9), ("w", 1, 7),
                              ("big", HIGHEST, 3), ("edge", HIGHEST, 1)):
        batcher.emit_many([key] * times, value)
        sent[key] += value * times
    batcher.seal_all()
    batches = []
    batcher.drain(batches.append)
    got = Counter()
    for b in batches:
        keys, values = decode_payload(b.payload, b.count)
        assert all(LOWEST <= v <= HIGHEST for v in values)
        for k, v in zip(keys, values):
            got[k] += v
    assert got == sent
    seqs = [s for b in batches for s in range(b.first_seq, b.last_seq + 1)]
    assert seqs == list(range(1, len(seqs) + 1))               # no seq lost or reused


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


def test_a_query_refused_busy_is_called_again_until_it_is_served():
    import asyncio
    import time
    from floering.mapper.queries import query
    from floering.wire.status import details_for

    busy = grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), details_for(Busy("all taken")))
    calls = []

    class Delivery:
        ring = object()
        clock = staticmethod(time.monotonic)

    async def make_call(ring):
        calls.append(ring)
        if len(calls) < 4:
            raise busy
        return "served"
    assert asyncio.run(query(Delivery(), 10.0, make_call)) == "served"
    assert len(calls) == 4

    async def always_busy(ring):
        raise busy
    with pytest.raises(Busy):
        asyncio.run(query(Delivery(), 0.1, always_busy))


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
