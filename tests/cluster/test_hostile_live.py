"""Hostile and careless input: forged ring views, poisoned stream numbers, counts past 64 bits.
Unit checks on the core, then real node processes fed through the client.

The tests here start real node processes; the in-process ones are in
tests/unit/test_hostile.py.
"""

import time
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.node.core.forged_views import forged_views
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.core.batch import encode_payload
from floering.wire.codec import unpack_entries
from tests.support.hostile_shared import ring, rss_mib


# In the clear: what a node refuses from anyone who can reach its port, by validation
# alone (tests/cluster/test_tls.py: what the certificates refuse first).
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
    from tests.support.helpers import events_of
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
