"""Messages are bounded in bytes, not entries: a range of a few keys whose states are
4 MiB each (72 MiB, over the gRPC message limit) is scanned, moved and copied to a
new replica after a SIGKILL, in chunks of about a MiB; scans stream without copying
a node's whole state and are bounded per node and per caller; what a node takes in at
once is bounded. Chunking pure first, then real processes (TLS, durable, loopback)."""

from __future__ import annotations

import random
import threading
from collections import Counter

import grpc
import psutil
import pytest

from floering.chaos.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper.admin import move
from floering.node.core.chunks import ScanSlots, column_slices, packed_chunks, pair_slices
from floering.node.core.codec import pack_entries, unpack_entries
from floering.node.core.errors import Overloaded
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.helpers import wait_for

PAD = 4 << 20
BULKY = "floering.chaos.bulky:PaddedCount"


# ------------------------------------------------------------------ pure

def entries(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        r = rng.random()
        key = (b"x" * rng.randint(0, 5000) + str(i).encode()) if r < 0.05 else \
            (i if r < 0.3 else f"k{i}\u00e9")
        out[key] = rng.choice([1, 2 ** 70, "s" * rng.randint(0, 3000), (1, 2, 3)])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_chunks_hold_every_entry_once_within_their_bounds(seed):
    rng = random.Random(seed)
    items = entries(rng.choice([0, 1, 5, 100, 3000, 20_000]), seed)
    max_bytes = rng.choice([64, 1000, 10_000, 1 << 20])
    max_entries = rng.choice([1, 7, 1000, 5000, 1 << 30])
    chunks = list(packed_chunks(column_slices(items), max_bytes, max_entries))
    got: dict = {}
    for count, data in chunks:
        part = unpack_entries(data)
        assert len(part) == count <= max_entries
        assert count == 1 or len(data) <= max_bytes + 16   # + the arrays' headers
        got.update(part)
    assert got == unpack_entries(pack_entries(items))
    assert sum(c for c, _ in chunks) == len(items)
    assert len(chunks) == 1 or all(c for c, _ in chunks)
    assert [c for c, _ in packed_chunks(pair_slices(items.items()), max_bytes, max_entries)] \
        == [c for c, _ in chunks]


def test_a_large_entry_travels_alone_and_small_ones_fill_a_chunk():
    items = {f"k{i}": i for i in range(10)}
    items["big"] = b"\0" * (3 << 20)
    items.update({f"m{i}": i for i in range(10)})
    chunks = list(packed_chunks(column_slices(items), 1 << 20))
    assert [c for c, _ in chunks] == [10, 1, 10]
    assert unpack_entries(chunks[1][1]) == {"big": items["big"]}


def test_scans_are_bounded_per_node_and_per_caller():
    slots = ScanSlots(total=3, per_caller=2)
    slots.take("a")
    slots.take("a")
    with pytest.raises(Overloaded, match="this caller"):
        slots.take("a")
    slots.take("b")
    with pytest.raises(Overloaded, match="scans are open on this node"):
        slots.take("c")
    slots.give("a")
    slots.take("c")
    assert slots.open == Counter(a=1, b=1, c=1)


# ---------------------------------------------------------- real processes

def keys_in_one_range(ring, count: int) -> tuple[int, list[str]]:
    token = ring.tokens_of(ring.nodes[0])[0]
    keys = [k for k in (f"big{i}" for i in range(100_000))
            if ring.token_for_key(k) == token][:count]
    assert len(keys) == count
    return token, keys


def node_stats(cluster, node) -> floe_pb2.NodeStats:
    with cluster.channel(node.address) as channel:
        return floe_pb2_grpc.QueryPlaneStub(channel).Stats(floe_pb2.StatsRequest(), timeout=10)


def settled(cluster, alive) -> bool:
    """Every live node answers and has every range it owns on r+1 nodes."""
    try:
        return all(node_stats(cluster, n).under_replicated == 0 for n in alive)
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
            ring = client.refresh_ring()
            wait_for(lambda: settled(cluster, alive), 120, "the last tuples checkpointed")
            holders = [ring.owner_of_token(token), *ring.replicas_of_token(token)]
            assert len(holders) == 2
            for node, role in zip(holders, ("primary", "replica")):
                chunks = inspect(cluster, cluster.node(node).address, token)
                assert {c.role for c in chunks} == {role}
                assert len(chunks) >= 18       # about a chunk per 4 MiB state
                held = {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}
                assert {k: s[0] for k, s in held.items()} == expect
