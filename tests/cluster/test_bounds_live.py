"""What a node keeps is bounded and checked: replicas decode what they store and drop what
their primary never applied, sources per range are limited and idle ones expire, the inbound
queue is bounded in bytes, and health says NOT_SERVING while a node is fenced. The core with
a fake clock, then the runtime, then real processes.

The tests here start real node processes; the in-process ones are in
tests/unit/test_bounds.py.
"""

import time
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.v1 import floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.core.batch import encode_payload
from tests.support.hostile_shared import rss_mib
from tests.support.bounds_shared import push


@pytest.mark.multiprocess
def test_replicas_refuse_garbage_and_ranges_refuse_sources_past_the_limit(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=True,
                         extra_args=["--max-sources-per-range", "16"]) as cluster:
        client_tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=client_tls) as client:
            words = [f"w{i % 7}" for i in range(300)]
            client.emit_many(words)
            client.flush()
            ring = client.ring
        token = ring.token_for_key("w0")           # the client's source is known there
        key = next(k for k in (f"k{i}" for i in range(5000)) if ring.token_for_key(k) == token)
        owner, replica = ring.owner_of_token(token), ring.replicas_of_token(token)[0]
        address = {n.node_id: n.address for n in cluster.nodes}
        creds = client_tls.channel_credentials()
        pid = {n.node_id: n.pid for n in cluster.nodes}
        before = rss_mib(pid[replica])
        with grpc.secure_channel(address[replica], creds) as channel:
            for payload in (b"\xc1" * 1000, encode_payload([key], ["not a count"])):
                with pytest.raises(grpc.RpcError) as refused:
                    push(channel, ring, token, "garbage", 1, [key], payload)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            sizes = []
            for i in range(300):                   # 300 MiB of garbage: none of it kept
                with pytest.raises(grpc.RpcError):
                    push(channel, ring, token, f"garbage{i}", 1, [key], b"\xc1" * (1 << 20))
                if i % 50 == 49:
                    sizes.append(rss_mib(pid[replica]))
        # The allocator and gRPC keep buffers for reuse (about 90 MiB here, much the
        # same after 150 MiB as after 300; a sample may dip when the allocator trims):
        # a plateau, not garbage kept. Kept garbage would add the 150 MiB pushed
        # between the first half's peak and the end; reuse adds at most a third.
        assert sizes[-1] - before < 128 and sizes[-1] - max(sizes[:3]) < 50, (before, sizes)
        with grpc.secure_channel(address[owner], creds) as channel:
            # the client's source is one; three more fit its identity's share (a
            # quarter of 16), the next is refused
            for i in range(3):
                push(channel, ring, token, f"extra{i}", 1, [key])
            with pytest.raises(grpc.RpcError) as refused:
                push(channel, ring, token, "one-too-many", 1, [key])
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-sources-per-range" in refused.value.details()
            push(channel, ring, token, "extra0", 2, [key])        # known ones flow on
        with RingClient(cluster.seeds, tls=client_tls) as client:
            want = Counter(words)
            want[key] += 4
            assert dict(client.scan()) == want


@pytest.mark.multiprocess
def test_a_flood_of_idle_streams_is_refused_past_the_limit_and_nobody_is_declared_dead(
        tmp_path):
    import threading
    from tests.support.hostile_shared import rss_mib
    limit = 40
    with LocalCluster.up(3, 1, workdir=tmp_path,
                         extra_args=["--max-concurrent-rpcs", str(limit)]) as cluster:
        tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=tls) as client:
            client.emit_many(["w"] * 100)
            client.flush()
        node = cluster.nodes[0]
        before = rss_mib(node.pid)
        hold = threading.Event()

        def idle():                          # a stream that never sends a batch
            while not hold.wait(0.05):
                pass
            return
            yield
        codes, details = [], []
        with grpc.secure_channel(node.address, tls.channel_credentials()) as channel:
            stub = floe_pb2_grpc.DataPlaneStub(channel)
            calls = [stub.Push(idle(), timeout=30) for _ in range(2 * limit)]

            def outcome(call):
                try:
                    list(call)
                    codes.append("OK")
                except grpc.RpcError as exc:
                    codes.append(exc.code().name)
                    details.append(exc.details() or "")
            waiters = [threading.Thread(target=outcome, args=(c,)) for c in calls]
            for w in waiters:
                w.start()
            time.sleep(3)                    # longer than failure detection takes
            refused = codes.count("RESOURCE_EXHAUSTED")
            hold.set()
            for w in waiters:
                w.join(30)
        assert refused >= limit // 2, codes
        assert any("--max-concurrent-rpcs" in d for d in details), details
        assert rss_mib(node.pid) - before < 64
        events = "".join(open(n.log.replace(".log", ".events.jsonl")).read()
                         for n in cluster.nodes)
        assert '"detected"' not in events
        with RingClient(cluster.seeds, tls=tls) as client:
            client.emit_many(["w"] * 100)
            client.flush()
            assert dict(client.scan()) == {"w": 200}
