"""Hostile and careless input: forged ring views, poisoned stream numbers, counts past
64 bits. Unit checks on the core, then real node processes fed through the client."""

import time
from collections import Counter
from dataclasses import replace

import grpc
import msgpack
import psutil
import pytest

from floering.floe.cluster import LocalCluster
from floering.node.core.forged_views import forged_views
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.core.batch import Batch, encode_payload
from floering.wire.codec import pack, pack_entries, unpack, unpack_entries
from floering.wire.errors import InvalidArgument, StaleRing
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import MAX_VERSION, Ring
from floering.wire.ring_merge import MAX_VERSION_STEP

MEMBERS = {f"n{i}": f"127.0.0.1:{7100 + i}" for i in range(3)}


def ring() -> Ring:
    return Ring.initial(MEMBERS, 1, 2)


# ------------------------------------------------------------- big integers

@pytest.mark.parametrize("value", [2 ** 64, -(2 ** 63) - 1, 3 ** 200, (1, 2 ** 70, "x")])
def test_states_past_64_bits_travel_exactly(value):
    assert unpack(pack(value)) == value
    assert unpack_entries(pack_entries({"k": value})) == {"k": value}


def test_an_unknown_extension_or_an_endless_number_is_refused():
    with pytest.raises(InvalidArgument):
        unpack(msgpack.packb(msgpack.ExtType(9, b"x")))
    with pytest.raises(InvalidArgument):
        unpack(msgpack.packb(msgpack.ExtType(1, b"9" * 100_000)))


# ----------------------------------------------------------- forged ring views

def test_a_view_with_another_replication_factor_is_refused():
    with pytest.raises(InvalidArgument, match="r=1"):
        ring().merge(replace(ring(), replication=0, version=2))


def test_a_view_moving_a_member_elsewhere_is_refused():
    forged = Ring.initial({**MEMBERS, "n1": "10.6.6.6:7000"}, 1, 2).with_version(5)
    with pytest.raises(InvalidArgument, match="moves member 'n1'"):
        ring().merge(forged)


def test_a_view_far_ahead_is_absorbed_a_step_at_a_time_and_no_version_overflows_the_stamp():
    # Refusing it would split the ring for good (its peers would refuse the node it
    # was pushed to); merged as MAX_VERSION_STEP ahead, every node converges.
    assert ring().merge(ring().with_version(MAX_VERSION_STEP + 5)).version == MAX_VERSION_STEP + 1
    far = ring().merge(ring().without(["n2"]).with_version(MAX_VERSION_STEP))
    assert far.version == MAX_VERSION_STEP and "n2" not in far.nodes   # far, but plausible
    wire = msgpack.unpackb(ring().to_wire())
    wire["version"] = MAX_VERSION             # its stamp would not fit the wire's uint64
    with pytest.raises(InvalidArgument):
        Ring.from_wire(msgpack.packb(wire))


def test_losses_are_accepted_only_with_the_removals_that_cause_them():
    r = ring()
    with pytest.raises(InvalidArgument, match="lost"):
        r.merge(replace(r, lost=frozenset(r.tokens[:1])).with_version(r.version + 1))
    both = r.without(["n0", "n1"])                 # a range and its replica both gone
    assert both.lost and r.merge(both).lost == both.lost
    split = both.split_token(next(iter(both.lost)), next(iter(both.lost)) - 1000)
    assert len(r.merge(split).lost) == len(both.lost) + 1     # its split-off part too


def test_a_refused_view_changes_nothing_on_the_node():
    core = NodeCore("n0", ring(), load_reducer("count"))
    with pytest.raises(InvalidArgument):
        core.adopt_ring(replace(ring(), replication=0, version=9))
    assert core.ring == ring() and not core.fenced


# ------------------------------------------------------- poisoned stream numbers

def test_a_refused_batch_does_not_retire_its_sources_stream():
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    core = NodeCore("n0", ring(), load_reducer("count"))
    token = ring().token_for_key(key)
    with pytest.raises(StaleRing):      # a wrong ring stamp: refused...
        core.receive_batch(Batch(12345, token, "s", 1, 1, 1, encode_payload([key], [1]),
                                 stream=2 ** 64 - 1))
    # ...so the source's real stream still delivers
    ok = Batch(ring().stamp, token, "s", 1, 1, 1, encode_payload([key], [1]), stream=7)
    assert core.receive_batch(ok).applied == 1


def test_a_stream_numbered_far_past_the_nodes_clock_is_refused_and_retires_nothing():
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    core = NodeCore("n0", ring(), load_reducer("count"))
    token = ring().token_for_key(key)
    wall = 1_800_000_000.0
    now_us = int(wall * 1e6)

    def batch(seq, stream):
        return Batch(ring().stamp, token, "s", seq, seq, 1, encode_payload([key], [1]),
                     stream=stream)
    with pytest.raises(InvalidArgument, match="ahead of this node's clock"):
        core.receive_batch(batch(1, 2 ** 64 - 1), wall=wall)
    with pytest.raises(InvalidArgument):
        core.receive_batch(batch(1, now_us + 3601 * 10 ** 6), wall=wall)
    # the real stream, numbered by a clock a few minutes fast, still delivers
    assert core.receive_batch(batch(1, now_us + 300 * 10 ** 6), wall=wall).applied == 1
    assert core.receive_batch(batch(2, now_us + 301 * 10 ** 6), wall=wall).applied == 1
    assert core.items() and dict(core.items())[key] == 2


def test_the_sources_a_node_tracks_are_bounded_and_idle_ones_make_room():
    from floering.node.core.batch import Limits
    from floering.wire.errors import TooLarge
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    core = NodeCore("n0", ring(), load_reducer("count"),
                    Limits(max_sources_per_node=3, source_expiry=60.0))

    def batch(source, seq=1):
        return Batch(ring().stamp, token, source, seq, seq, 1, encode_payload([key], [1]),
                     stream=5)
    for i in range(3):
        core.receive_batch(batch(f"s{i}"), now=0.0)
    with pytest.raises(TooLarge, match="max-sources-per-node"):
        core.receive_batch(batch("s3"), now=30.0)
    assert len(core.streams.newest) == 3
    core.receive_batch(batch("s0", 2), now=40.0)    # s0 is active again; s1, s2 idle
    assert core.receive_batch(batch("s4"), now=90.0).applied == 1
    assert set(core.streams.newest) == {"s0", "s4"}
    assert dict(core.items())[key] == 5             # every accepted batch counted once


# ------------------------------------------------------------ real processes

# In the clear: what a node refuses from anyone who can reach its port, by validation
# alone (tests/test_tls.py: what the certificates refuse first).
@pytest.fixture
def cluster(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=False) as cluster:
        yield cluster


@pytest.mark.multiprocess
def test_counts_past_64_bits_stay_exact_through_queries_checkpoints_and_a_crash(cluster):
    with RingClient(cluster.seeds) as client:
        client.emit("big", 2 ** 64 - 1)
        client.emit("big", 1)
        client.emit("big", 2 ** 63)
        client.emit_many(["small"] * 10)
        client.flush()
        want = 2 ** 64 + 2 ** 63
        assert client.get("big") == want
        assert client.top(1)[0][:2] == ("big", want)
        ring = client.ring
        owner = ring.owner("big")
        client.flush()
    cluster.kill(owner)                         # the heir rebuilds from checkpoint + backups
    with RingClient([n.address for n in cluster.nodes if n.node_id != owner],
                    timeout=15.0) as client:
        assert client.get("big") == want
        assert dict(client.scan()) == {"big": want, "small": 10}


@pytest.mark.multiprocess
def test_forged_ring_views_are_refused_and_the_ring_keeps_serving(cluster):
    with RingClient(cluster.seeds) as client:
        client.emit_many(["w"] * 50)
        client.flush()
        ring = client.ring
    node = cluster.nodes[0]
    forged = list(forged_views(ring).values())
    before = rss_mib(node.pid)
    with grpc.insecure_channel(node.address) as channel:
        stub = floe_pb2_grpc.ControlPlaneStub(channel)
        for _ in range(20):
            for view in forged:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ExchangeRing(floe_pb2.RingView(version=view.version,
                                                        ring=view.to_wire(),
                                                        sender="mallory"), timeout=5)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rss_mib(node.pid) - before < 32
    with RingClient(cluster.seeds) as client:
        assert client.ring.stamp == ring.stamp
        client.emit_many(["w"] * 50)
        client.flush()
        assert dict(client.scan()) == Counter(["w"] * 100)


@pytest.mark.multiprocess
def test_requests_past_a_limit_get_resource_exhausted_and_the_node_keeps_serving(cluster):
    with RingClient(cluster.seeds) as client:
        client.emit_many(["w"] * 20)
        client.flush()
        ring = client.ring
    node = cluster.nodes[0]
    token = ring.tokens_of(node.node_id)[0]
    before = rss_mib(node.pid)
    with grpc.insecure_channel(node.address) as channel:
        query = floe_pb2_grpc.QueryPlaneStub(channel)
        for call in (lambda: query.Top(floe_pb2.TopRequest(k=10 ** 9), timeout=5),
                     lambda: list(query.Scan(floe_pb2.ScanRequest(chunk=10 ** 9), timeout=5))):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-" in refused.value.details()
        push = floe_pb2_grpc.DataPlaneStub(channel).Push(iter([floe_pb2.PushRequest(batches=[
            floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source="s" * 10_000,
                           first_seq=1, last_seq=1, count=1, id=1,
                           payload=encode_payload(["x"], [1]))])]), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            list(push)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(refused.value.details()) < 300          # the id is not echoed back
    assert rss_mib(node.pid) - before < 32
    with RingClient(cluster.seeds) as client:
        client.emit_many(["w"] * 20)
        client.flush()
        assert dict(client.scan()) == {"w": 40}
        assert client.top(3)[0][:2] == ("w", 40)


@pytest.mark.multiprocess
def test_a_range_larger_than_a_chunk_is_inspected_in_chunks_and_scan_still_reads_it(tmp_path):
    words = [f"w{i}" for i in range(400)]
    with LocalCluster.up(2, 1, workdir=tmp_path, tls=False,
                         extra_args=["--max-scan-chunk", "5"]) as cluster:
        with RingClient(cluster.seeds) as client:
            client.emit_many(words)
            client.flush()
            ring = client.ring
        node = cluster.nodes[0]
        sizes = Counter(ring.token_for_key(w) for w in words)
        large = next(t for t in ring.tokens_of(node.node_id) if sizes[t] > 5)
        with grpc.insecure_channel(node.address) as channel:
            query = floe_pb2_grpc.QueryPlaneStub(channel)
            chunks = list(query.InspectRange(floe_pb2.RangeRequest(token=large), timeout=5))
        assert {c.role for c in chunks} == {"primary"}
        assert {k: s for c in chunks for k, s in unpack_entries(c.entries).items()} == \
            {w: 1 for w in words if ring.token_for_key(w) == large}
        with RingClient(cluster.seeds) as client:
            assert dict(client.scan()) == Counter(words)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / (1 << 20)


@pytest.mark.multiprocess
def test_a_client_that_never_reads_its_acks_is_held_back_not_buffered(cluster):
    with RingClient(cluster.seeds) as client:
        client.emit("w")
        client.flush()
        ring = client.ring
    node = cluster.nodes[0]
    token = ring.tokens_of(node.node_id)[0]
    key = next(k for k in (f"k{i}" for i in range(10_000)) if ring.token_for_key(k) == token)
    payload = encode_payload([key] * 100, [1] * 100)
    before = rss_mib(node.pid)
    sent = []

    def requests():
        for seq in range(1, 2_000_001, 100):
            sent.append(seq)
            yield floe_pb2.PushRequest(batches=[floe_pb2.Batch(
                ring_stamp=ring.stamp, token=token, source="lazy", first_seq=seq,
                last_seq=seq + 99, count=100, id=seq, payload=payload)])

    # A plain 64 KiB receive window: the acks this client leaves unread fill it soon.
    # What the transports still take after that is bounded too: the node's receive
    # window (~13,000 of these 442-byte requests measured here) and as many requests
    # as 64 KiB of acks acknowledge, up to ~20,000 when a busy node packs 64 ids into
    # one reply. A node that read on regardless (--stream-window 10^8) took ~10,000 a
    # second, past 50,000 in 5 s.
    with grpc.insecure_channel(node.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = floe_pb2_grpc.DataPlaneStub(channel).Push(requests(), timeout=30)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(sent) < 50_000:
            time.sleep(0.2)
        held_back = len(sent) < 50_000         # the node stopped reading us
        grown = rss_mib(node.pid) - before
        call.cancel()
    assert held_back, f"all {len(sent)} requests were read without one ack read"
    assert grown < 40, f"the node grew {grown:.0f} MiB"
    with RingClient(cluster.seeds) as client:     # and it keeps serving
        client.emit_many(["w"] * 5)
        client.flush()
        assert client.get("w") == 6


@pytest.mark.parametrize("seqs", [[1, 3, 2], [1, 2, 2], [1, "x", 3], [2, 3, 4]])
def test_bad_explicit_seqs_are_refused_even_in_a_batch_that_is_all_new(seqs):
    from tests.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=1)
    token, fields = c.batches("s", ["a", "b", "c"])[0]
    fields.update(first_seq=1, last_seq=3, seqs=msgpack.packb(seqs), count=3,
                  payload=encode_payload(["a"] * 3, [1] * 3))
    fields["token"] = c.ring.token_for_key("a")
    for node in c.ring.destinations(fields["token"]):     # the primary and the replica
        with pytest.raises(InvalidArgument):
            c.cores[node].receive_batch(Batch(**fields))


def test_hostile_text_in_statuses_is_escaped_and_cut():
    from tests.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=0, tokens_per_node=2)
    key = "evil\n" + "x" * 100_000
    token = c.ring.token_for_key(key)
    other = next(t for t in c.ring.tokens if t != token
                 and c.ring.owner_of_token(t) == c.ring.owner_of_token(token))
    batch = Batch(c.ring.stamp, other, "s", 1, 1, 1, encode_payload([key], [1]))
    with pytest.raises(InvalidArgument) as refused:
        c.cores[c.ring.owner_of_token(other)].receive_batch(batch)
    message = str(refused.value)
    assert len(message) < 200 and "\n" not in message and "\\n" in message
    with pytest.raises(InvalidArgument) as refused:
        load_reducer("count").check_values(("1\n2" * 1000,))
    assert len(str(refused.value)) < 200 and "\n" not in str(refused.value)

    def inert_text(message: str) -> None:
        assert len(message) < 300, message[:300]
        assert not any(ord(ch) < 32 or ch == "\x7f" for ch in message), message
        assert "characters)" in message           # cut, and says how long it was

    # A source id with control characters, of any length the node was told to take:
    # echoed in the status of a batch from one of its replaced streams.
    from floering.node.core.batch import Limits
    source = "mapper\n2024-01-01 INFO forged line\r\x1b[2J\x00" + "s" * 100_000
    core = NodeCore("n0", ring(), load_reducer("count"), Limits(max_source_bytes=200_000))
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    payload = encode_payload([key], [1])
    core.receive_batch(Batch(ring().stamp, token, source, 1, 1, 1, payload, stream=9))
    with pytest.raises(StaleRing) as refused:
        core.receive_batch(Batch(ring().stamp, token, source, 2, 2, 1, payload, stream=8))
    inert_text(str(refused.value))
    # A sender with control characters and a megabyte of text: in the status of a
    # checkpoint for a range it does not own, and in a shed request's reason.
    sender = "n1\nWARNING forged\x1b[31m\x00" + "x" * 1_000_000
    with pytest.raises(StaleRing) as refused:
        core.receive_checkpoint(sender, ring().stamp, token, 1, 0, True, {}, {})
    inert_text(str(refused.value))

    import asyncio
    from types import SimpleNamespace
    from floering.node.runtime.service import NodeService
    reasons = []

    async def shed_load(reason, depth=0, sender=""):
        reasons.append(reason)
    asyncio.run(NodeService(SimpleNamespace(shed_load=shed_load)).shed(sender, 1))
    inert_text(reasons[0])



def test_a_share_is_asked_for_only_by_the_member_the_certificate_names():
    # A member short of its share is handed ranges by name; another member's
    # certificate asking in its name makes an ordinary shedding request.
    import asyncio
    from types import SimpleNamespace
    from floering.node.runtime.service import NodeService
    asked = []

    async def shed_load(reason, depth=0, sender=""):
        asked.append(sender)
    service = NodeService(SimpleNamespace(shed_load=shed_load))
    asyncio.run(service.shed("n2#1", 0, identity="n2"))
    asyncio.run(service.shed("n2#1", 0, identity="n3"))
    asyncio.run(service.shed("n2", 0, identity="n2"))
    assert asked == ["n2#1", "", "n2"]

@pytest.mark.multiprocess
def test_splits_stop_at_the_token_limit_and_timeouts_are_checked(tmp_path):
    with LocalCluster.up(2, 1, workdir=tmp_path, tokens_per_node=2, tls=False,
                         extra_args=["--max-tokens", "6"]) as cluster:
        node = cluster.nodes[0]
        with RingClient(cluster.seeds) as client:
            ring = client.ring
        token = ring.tokens_of(node.node_id)[0]
        lo, _ = ring.range_of_token(token)
        with grpc.insecure_channel(node.address) as channel:
            control = floe_pb2_grpc.ControlPlaneStub(channel)
            for i in (1, 2):                      # 4 tokens -> 6
                control.Split(floe_pb2.SplitRequest(at=(lo + i * 1000) % 2 ** 64), timeout=10)
            with pytest.raises(grpc.RpcError) as refused:
                control.Split(floe_pb2.SplitRequest(at=(lo + 3000) % 2 ** 64), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-tokens" in refused.value.details()
            for timeout in (float("nan"), -1.0, 1e9):
                with pytest.raises(grpc.RpcError) as refused:
                    control.Move(floe_pb2.MoveRequest(tokens=[token], target="n1",
                                                      timeout=timeout), timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with RingClient(cluster.seeds) as client:
            assert len(client.ring.tokens) == 6
            client.emit_many(["w"] * 10)
            client.flush()
            assert client.get("w") == 10


@pytest.mark.multiprocess
def test_heavy_queries_on_a_large_state_do_not_get_a_node_declared_dead(tmp_path):
    import threading
    from tests.helpers import events_of
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=False) as cluster:
        keys = [f"k{i}" for i in range(300_000)]
        with RingClient(cluster.seeds, batch_size=5000) as client:
            client.emit_many(keys)
            client.flush()
        node = cluster.nodes[0]
        errors = []

        def query():
            with grpc.insecure_channel(node.address) as channel:
                stub = floe_pb2_grpc.QueryPlaneStub(channel)
                try:
                    for _ in range(3):
                        stub.Top(floe_pb2.TopRequest(k=10_000), timeout=30)
                        list(stub.Scan(floe_pb2.ScanRequest(), timeout=30))
                except grpc.RpcError as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=query) for _ in range(4)]
        before, peak = rss_mib(node.pid), 0.0
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss_mib(node.pid))
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert not errors, errors
        print(f"RSS {before:.0f} MiB before, {peak:.0f} MiB at most during the queries")
        # each query holds one copy of the node's ~100 k keys (~25 MiB) at a time
        assert peak - before < 96, (before, peak)
        declared = [e for n in cluster.nodes for e in events_of(cluster, n.node_id)
                    if e["kind"] == "detected"]
        assert not declared, declared
        with RingClient(cluster.seeds) as client:
            assert sum(1 for _ in client.scan()) == len(keys)


def test_every_key_of_a_batch_is_checked_against_its_token_not_only_the_first():
    from tests.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=0, tokens_per_node=2)
    token = c.ring.token_for_key("a")
    owner = c.ring.owner_of_token(token)
    mine = [k for k in (f"k{i}" for i in range(200)) if c.ring.token_for_key(k) == token][:3]
    stray = next(k for k in (f"s{i}" for i in range(200)) if c.ring.token_for_key(k) != token)
    keys = [mine[0], mine[1], stray, mine[2]]          # the stray key is not the first
    batch = Batch(c.ring.stamp, token, "s", 1, 4, 4, encode_payload(keys, [1] * 4))
    with pytest.raises(InvalidArgument, match="does not belong"):
        c.cores[owner].receive_batch(batch)
    assert c.state() == {}                              # nothing of it was applied
    ok = Batch(c.ring.stamp, token, "s", 1, 3, 3, encode_payload(mine, [1] * 3))
    assert c.cores[owner].receive_batch(ok).applied == 3


def test_a_full_backup_store_refuses_batches_until_checkpoints_make_room():
    from floering.node.core.batch import Limits
    from floering.wire.errors import Overloaded
    r = Ring.initial({"p": "a:1", "b": "a:2"}, 1, 1)
    token = r.tokens_of("p")[0]
    key = next(k for k in (f"k{i}" for i in range(1000)) if r.token_for_key(k) == token)
    primary = NodeCore("p", r, load_reducer("count"))
    replica = NodeCore("b", r, load_reducer("count"), Limits(max_backup_bytes=100))
    batches = [Batch(r.stamp, token, "s", i, i, 1, encode_payload([key], [1]))
               for i in range(1, 40)]
    taken = 0
    for b in batches:
        try:
            replica.receive_batch(b)
        except Overloaded as exc:
            assert "--max-backup-bytes" in str(exc)
            break
        primary.receive_batch(b)
        taken += 1
    assert 0 < taken < len(batches)           # the replica filled up and said so
    for s in primary.plan_checkpoints():      # a checkpoint covers what it holds...
        need_full, seq = replica.receive_checkpoint(
            "p", r.stamp, s.checkpoint.token, s.checkpoint.seq, s.base_seq,
            s.checkpoint.full, dict(s.checkpoint.states), dict(s.checkpoint.watermarks))
        primary.checkpoint_acked(s.checkpoint.token, "b", seq, need_full)
        primary.checkpoint_done(s.checkpoint.token)
    assert replica.replicas.backups.bytes == 0
    replica.receive_batch(batches[taken])     # ...and it takes batches again


def test_a_source_ids_limit_counts_bytes_not_characters():
    from floering.node.core.batch import Limits
    from floering.wire.errors import TooLarge
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    core = NodeCore("n0", ring(), load_reducer("count"), Limits(max_source_bytes=16))

    def batch(source):
        return Batch(ring().stamp, token, source, 1, 1, 1, encode_payload([key], [1]))
    with pytest.raises(TooLarge, match="24 bytes"):
        core.receive_batch(batch("\u20ac" * 8))           # 8 characters, 24 bytes
    assert core.receive_batch(batch("\u20ac" * 5)).applied == 1

