"""Messages are bounded in bytes, not entries: a range of a few keys whose states are 4 MiB
each (72 MiB, over the gRPC message limit) is scanned, moved and copied to a new replica
after a SIGKILL, in chunks of about a MiB; scans stream without copying a node's whole state
and are bounded per node and per caller; what a node takes in at once is bounded. Chunking
pure first, then real processes (TLS, durable, loopback).

The tests here start real node processes; the in-process ones are in
tests/unit/test_byte_bounds.py.
"""

from __future__ import annotations

import threading
from collections import Counter

import grpc
import psutil
import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper.admin import move
from floering.wire.codec import pack_entries, unpack_entries
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import node_stats, wait_for


PAD = 4 << 20


BULKY = "floering.chaos.bulky:PaddedCount"


def keys_in_one_range(ring, count: int) -> tuple[int, list[str]]:
    token = ring.tokens_of(ring.nodes[0])[0]
    keys = [k for k in (f"big{i}" for i in range(100_000))
            if ring.token_for_key(k) == token][:count]
    assert len(keys) == count
    return token, keys


def settled(cluster, alive) -> bool:
    """Every live node answers and has every range it owns on r+1 nodes."""
    try:
        return all(node_stats(cluster, n.node_id, timeout=10).under_replicated == 0
                   for n in alive)
    except grpc.RpcError:
        return False


def inspect(cluster, address: str, token: int) -> list:
    # A chunk is a state of 4 MiB and its key: over gRPC's default 4 MiB.
    with cluster.channel(address, options=[("grpc.max_receive_message_length",
                                            16 << 20)]) as channel:
        return list(floe_pb2_grpc.QueryPlaneStub(channel).InspectRange(
            floe_pb2.RangeRequest(token=token), timeout=60))


def expect_scan(client, expect: Counter) -> None:
    got = dict(client.scan())
    assert {k: s[0] for k, s in got.items()} == expect
    assert all(len(s[1]) == PAD for s in got.values())


@pytest.mark.multiprocess
def test_a_range_of_72_mib_is_scanned_moved_and_copied_again_after_a_kill(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, reducer=BULKY, tokens_per_node=2,
                         data_dir=tmp_path / "data",
                         node_args=["--reducer-arg", f"pad={PAD}"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls(), combine=False) as client:
            token, keys = keys_in_one_range(client.ring, 18)
            words = keys * 3 + keys[:5]
            client.emit_many(words)
            client.flush()
            expect = Counter(words)
            wait_for(lambda: settled(cluster, cluster.nodes), 120, "every range on r+1 nodes")
            expect_scan(client, expect)

            ring = client.refresh_ring()
            owner = ring.owner_of_token(token)
            target = next(n for n in ring.nodes if n != owner)
            detail = move(ring, target, token, timeout=120, tls=cluster.tls("operator"))
            assert "handed" in detail
            client.emit_many(keys[:3])
            client.flush()
            expect.update(keys[:3])
            expect_scan(client, expect)

            ring = client.refresh_ring()
            assert ring.owner_of_token(token) == target
            replica = next(n for n in ring.replicas_of_token(token))
            cluster.kill(replica)
            alive = [n for n in cluster.nodes if n.node_id != replica]
            wait_for(lambda: settled(cluster, alive) and
                     replica not in client.refresh_ring().nodes, 120,
                     "the range on r+1 nodes again")
            client.emit_many(keys[3:6])
            client.flush()
            expect.update(keys[3:6])
            expect_scan(client, expect)
            wait_for(lambda: settled(cluster, alive), 120, "the last tuples checkpointed")
            # The two survivors may still hand ranges between them after the kill (a
            # share pull): the holders are the ring's once they hold the range as it
            # says, read again until they do.
            held_as_the_ring_says: dict = {}

            def holders_agree() -> bool:
                ring = client.refresh_ring()
                holders = [ring.owner_of_token(token), *ring.replicas_of_token(token)]
                assert len(holders) == 2
                held_as_the_ring_says.clear()
                for node, role in zip(holders, ("primary", "replica")):
                    chunks = inspect(cluster, cluster.node(node).address, token)
                    if {c.role for c in chunks} != {role}:
                        return False
                    held_as_the_ring_says[node] = chunks
                return True

            wait_for(holders_agree, 120, "the range's holders as the ring places them")
            for chunks in held_as_the_ring_says.values():
                assert len(chunks) >= 18       # about a chunk per 4 MiB state
                held = {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}
                assert {k: s[0] for k, s in held.items()} == expect


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / (1 << 20)


@pytest.mark.multiprocess
def test_slow_scan_readers_hold_a_chunk_each_are_bounded_and_others_are_answered(tmp_path):
    words = [f"w{i}" for i in range(600_000)]
    with LocalCluster.up(3, 1, workdir=tmp_path, data_dir=tmp_path / "data") as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
        node = cluster.nodes[0]
        before = rss_mib(node.pid)
        with cluster.channel(node.address) as channel:
            query = floe_pb2_grpc.QueryPlaneStub(channel)
            calls = [query.Scan(floe_pb2.ScanRequest(), timeout=120) for _ in range(40)]
            opened, refused = [], []
            for call in calls:          # each reads one chunk, then stalls
                try:
                    first = next(call)
                    opened.append(len(unpack_entries(first.entries)))
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "scans open on this node" in exc.details()
                    refused.append(exc)
            assert len(opened) == 8 and len(refused) == 32     # one caller's bound
            assert all(0 < n <= 5000 for n in opened)
            held = rss_mib(node.pid) - before
            # Another identity scans the whole ring meanwhile, exactly.
            with RingClient(cluster.seeds, tls=cluster.tls("operator")) as other:
                assert dict(other.scan()) == Counter(words)
            with RingClient(cluster.seeds, tls=cluster.tls()) as same:
                assert same.get("w7") == 1
            after = rss_mib(node.pid) - before
            for call in calls:
                call.cancel()
        print(f"\n8 slow readers: RSS +{held:.0f} MiB; after an honest scan +{after:.0f} MiB "
              f"(from {before:.0f} MiB)")
        assert held < 60
        assert after < 150


def at_once(calls) -> list:
    """Run every call in its own thread, all at once: each one's error (or None)."""
    errors: list = [None] * len(calls)

    def one(i):
        try:
            calls[i]()
        except grpc.RpcError as exc:
            errors[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return errors


@pytest.mark.multiprocess
def test_concurrent_large_messages_are_refused_or_taken_in_a_bounded_budget(tmp_path):
    big = [("grpc.max_send_message_length", 128 << 20)]
    with LocalCluster.up(3, 1, workdir=tmp_path, data_dir=tmp_path / "data") as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many([f"w{i}" for i in range(1000)])
            client.flush()
            ring = client.ring
        node = cluster.nodes[0]
        token = ring.tokens_of(node.node_id)[0]
        before = rss_mib(node.pid)
        # 12 Push requests of 62 MB: over the message limit, refused from their header.
        payload = b"\0" * (62 << 20)
        with cluster.channel(node.address, options=big) as channel:
            data = floe_pb2_grpc.DataPlaneStub(channel)
            request = floe_pb2.PushRequest(batches=[floe_pb2.Batch(
                ring_stamp=ring.stamp, token=token, source="s", first_seq=1, last_seq=1,
                count=1, payload=payload)])
            errors = at_once([lambda: list(data.Push(iter([request]), timeout=60))] * 12)
        assert all(e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                   for e in errors), errors
        refused = rss_mib(node.pid) - before
        before = rss_mib(node.pid)
        # 12 checkpoints of 7 MiB from a peer, under the limit: decoded within the
        # node's inbound budget (32 MiB at once), the rest wait their turn. Each costs
        # a few times its bytes before any handler runs (gRPC's and protobuf's copies).
        states = pack_entries({f"k{i}": b"\1" * (1 << 20) for i in range(7)})
        with cluster.channel(node.address, name=cluster.nodes[1].node_id,
                             options=big) as channel:
            control = floe_pb2_grpc.ControlPlaneStub(channel)
            fragment = floe_pb2.CheckpointFragment(
                sender=cluster.nodes[1].node_id, ring_stamp=ring.stamp + 1, token=token,
                checkpoint_seq=1, full=True, states=states)
            errors = at_once([lambda: control.ShipCheckpoint(fragment, timeout=60)] * 12)
        # Decoded, then refused for its ring: never taken as a copy.
        assert all(e is not None and e.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                                  grpc.StatusCode.RESOURCE_EXHAUSTED)
                   for e in errors), errors
        taken = rss_mib(node.pid) - before
        print(f"\n12 x 62 MB refused: RSS +{refused:.0f} MiB; 12 x 7 MiB taken in: "
              f"+{taken:.0f} MiB more")
        # Their bytes in flight when the header was read: 1,040 MiB when 62 MB
        # messages were taken (a 64 MiB limit).
        assert refused < 300
        assert taken < 6 * 12 * 7               # a few copies of what was sent
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            assert dict(client.scan()) == Counter(f"w{i}" for i in range(1000))
