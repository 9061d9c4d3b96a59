"""Limits a hostile or careless caller meets, on real node processes with mutual TLS as
`floe up` sets it up: a value over the size limit refuses its whole batch, the call
slots are capped per identity over all its connections, a source idle past
--source-expiry loses its watermarks (so a flood of sources cannot lock its own
identity out for good), and a stream of large keys goes in batches a node takes."""

from __future__ import annotations

import time
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.chaos.hostile import IdleStreams
from floering.floe.cluster import LocalCluster, channel
from floering.mapper import RingClient
from floering.node.core.batch import DEFAULT_LIMITS, encode_payload
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.wire.tls import TlsFiles
from tests.support.helpers import floe_run, wait_for

pytestmark = pytest.mark.multiprocess

KEY_BYTES = DEFAULT_LIMITS.max_key_bytes        # 64 KiB: the largest key a node takes


def another_client(cluster, name: str):
    """A client certificate of its own from the ring's CA, as an operator makes one
    (`floe cert NAME --out DIR`): another identity, in a directory of its own."""
    workdir = cluster.tls_dir.parent.parent        # beside floe-cluster/, as floe up's
    out = workdir / f"{name}-tls"
    done = floe_run(workdir, "cert", name, "--out", str(out))   # finds the cluster's CA
    assert done.returncode == 0, done.stderr
    return TlsFiles.in_dir(out, "client")


def keys_of_token(ring, token: int, count: int, prefix: str) -> list[str]:
    keys = []
    for i in range(1_000_000):
        if ring.token_for_key(f"{prefix}{i}") == token:
            keys.append(f"{prefix}{i}")
            if len(keys) == count:
                return keys
    raise AssertionError(f"fewer than {count} keys reach token {token}")


def push_one(ch, ring, token: int, source: str, seq: int, keys: list, values: list):
    """One batch of `keys` and `values` at seqs seq.. to the node behind `ch`."""
    b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=source, first_seq=seq,
                       last_seq=seq + len(keys) - 1, count=len(keys), id=seq,
                       payload=encode_payload(keys, values))
    return list(floe_pb2_grpc.DataPlaneStub(ch).Push(
        iter([floe_pb2.PushRequest(batches=[b])]), timeout=20))


def serving(cluster, address: str) -> bool:
    with cluster.channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                     timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_value_over_a_mebibyte_refuses_its_whole_batch_and_the_node_serves_on(tmp_path):
    words = [f"w{i % 97}" for i in range(3000)]
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=tls) as client:
            client.emit_many(words)
            client.flush()
            ring = client.ring
        token = ring.tokens[0]
        owner = ring.address(ring.owner_of_token(token))
        fresh = keys_of_token(ring, token, 5, "fresh")
        huge = b"v" * (DEFAULT_LIMITS.max_value_bytes + 1)
        with channel(owner, tls) as ch:
            with pytest.raises(grpc.RpcError) as refused:
                push_one(ch, ring, token, "big-values", 1, fresh, [1, 1, huge, 1, 1])
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"over the limit of {DEFAULT_LIMITS.max_value_bytes} bytes" in \
                refused.value.details(), refused.value.details()
            # the same source goes on: nothing of the refused batch was applied, and a
            # refused batch takes no seq
            push_one(ch, ring, token, "big-values", 1, fresh[:2], [1, 1])
        assert serving(cluster, owner)
        with RingClient(cluster.seeds, tls=tls) as client:
            client.emit_many(words)
            client.flush()
            got = dict(client.scan())
    want = Counter(words * 2)
    want.update(fresh[:2])
    assert got == want


def test_one_identitys_calls_are_capped_over_all_its_connections(tmp_path):
    """--max-concurrent-rpcs 200: one identity holds 50 calls over its two connections
    (every further stream refused, on either), while another identity, an operator and
    a member are served on theirs. A connection carries one identity, so its own
    quarter is never the bound that refuses first."""
    words = [f"w{i % 13}" for i in range(600)]
    own = [("grpc.use_local_subchannel_pool", 1)]          # a connection each
    with LocalCluster.up(3, 1, workdir=tmp_path,
                         extra_args=["--max-concurrent-rpcs", "200"]) as cluster:
        node = cluster.nodes[0]
        alice = another_client(cluster, "alice")
        # Watch streams: a node ends an idle Push stream while its caller's others
        # wait to be read, which would give the flooder's slots back
        watch = ("watch",)
        with IdleStreams(node.address, cluster.tls("client"), 40, own, watch) as one, \
                IdleStreams(node.address, cluster.tls("client"), 40, own, watch) as two:
            refused = lambda: sum(one.refused.values()) + sum(two.refused.values())  # noqa: E731
            wait_for(lambda: refused() >= 30, 30, "the streams past the quarter refused")
            time.sleep(0.5)                     # none more is refused late
            assert Counter(one.refused) + Counter(two.refused) == {"RESOURCE_EXHAUSTED": 30}
            assert any("'client:client' holds 50 calls" in d
                       for d in one.details + two.details), one.details + two.details
            for name in ("operator", "n1"):
                with cluster.channel(node.address, name) as ch:
                    floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(), timeout=5)
            with RingClient(cluster.seeds, tls=alice) as client:
                client.emit_many(words)
                client.flush()
                assert dict(client.scan()) == Counter(words)
            assert one.ended == two.ended == 0
            with cluster.channel(node.address) as ch:     # the flooder's own: refused
                with pytest.raises(grpc.RpcError) as busy:
                    floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(), timeout=5)
                assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # the streams gone, the identity is served again
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            client.emit_many(words)
            client.flush()
            assert dict(client.scan()) == Counter(words * 2)


EXPIRY = 10.0      # --source-expiry, its least


def test_a_flood_of_sources_expires_and_its_identity_may_push_new_ones(tmp_path):
    """--max-sources-per-range 16: mallory's flood takes its quarter (4) of a range;
    its next new sources are refused until --source-expiry after the flood, then
    taken. An expired source's watermark is gone: its seq 1 is applied once more (why
    the expiry must outlast every resend). alice's tuples stay exact throughout."""
    words = [f"w{i % 29}" for i in range(1000)]
    with LocalCluster.up(3, 1, workdir=tmp_path,
                         extra_args=["--max-sources-per-range", "16",
                                     "--source-expiry", str(EXPIRY)]) as cluster:
        mallory = another_client(cluster, "mallory")
        alice = another_client(cluster, "alice")
        with RingClient(cluster.seeds, tls=alice) as client:
            client.emit_many(words)
            client.flush()
            ring = client.ring
        token = ring.tokens[0]
        key, = keys_of_token(ring, token, 1, "k")
        outcomes: Counter = Counter()
        with channel(ring.address(ring.owner_of_token(token)), mallory) as ch:
            for i in range(8):
                try:
                    push_one(ch, ring, token, f"flood{i}", 1, [key], [1])
                    outcomes["OK"] += 1
                    flooded = time.monotonic()
                except grpc.RpcError as exc:
                    assert "its share" in exc.details(), exc.details()
                    outcomes[exc.code().name] += 1
            assert outcomes == {"OK": 4, "RESOURCE_EXHAUSTED": 4}   # a quarter of 16
            tries: list[tuple[float, str]] = []
            deadline = flooded + EXPIRY + 20
            while time.monotonic() < deadline:
                try:
                    push_one(ch, ring, token, "after", 1, [key], [1])
                    tries.append((time.monotonic() - flooded, "OK"))
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
                    tries.append((time.monotonic() - flooded, exc.code().name))
                time.sleep(0.5)
            assert tries[-1][1] == "OK", tries
            assert tries[-1][0] >= EXPIRY, tries          # not before the expiry
            assert any(t >= EXPIRY / 2 for t, what in tries if what != "OK"), tries
            push_one(ch, ring, token, "flood0", 1, [key], [1])     # its watermark is gone
        with RingClient(cluster.seeds, tls=alice) as client:
            client.emit_many(words)
            client.flush()
            got = dict(client.scan())
    want = Counter(words * 2)
    want[key] += 4 + 1 + 1
    assert got == want


@pytest.mark.parametrize("combine", [False, True], ids=["every-tuple", "combined"])
def test_a_stream_of_large_keys_goes_in_batches_a_node_takes(tmp_path, combine):
    """Keys of 64 KiB: a token's 1,000 tuples (or 4,096 combined keys) would be far
    over --max-batch-bytes (4 MiB) and the 8 MiB message limit; sealed by bytes they
    go in batches of about 1 MiB, every one counted exactly."""
    keys = [f"{i:05d}".ljust(KEY_BYTES, "k") for i in range(400)]
    # one token a node: about 130 keys (8 MiB) a token
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=1) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), combine=combine) as client:
            client.emit_many(keys)
            for key in keys[:50]:
                client.emit(key)
            client.emit_many(keys[100:300])
            client.flush(timeout=120)
            got = dict(client.scan())
    assert got == Counter(keys) + Counter(keys[:50]) + Counter(keys[100:300])
