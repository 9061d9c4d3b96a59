"""Payload format 2 over real gRPC with mutual TLS, against real node processes: a
RingClient's columns counted exactly, and every malformed kind of format 2 batch
refused INVALID_ARGUMENT by a primary and by a replica, which go on serving."""

from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.node.core.batch import encode_batch, is_versioned
from tests.support.bounds_shared import push
from tests.support.columns_shared import MALFORMED

ONE_TUPLE = ("invalid UTF-8", "a surrogate", "reserved mark", "malformed piece",
             "key over the limit")


def count_of(name: str) -> int:
    return 1 if name in ONE_TUPLE else 2 if name == "key cuts a character" else 3


@pytest.mark.multiprocess
def test_columns_end_to_end_exact_and_malformed_refused_whole(tmp_path):
    first = [f"w{i % 501}" for i in range(20_000)] + ["é", "日本", ""] * 50
    then = [f"w{i % 97}" for i in range(5_000)] + ["late"]
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=True) as cluster:
        client_tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=client_tls, source="columns", combine=False, columnar=True,
                        batch_size=500) as client:
            formats = []
            submit = client._delivery.submit

            def spy(batch):                    # what the client hands its delivery
                formats.append(is_versioned(batch.payload))
                return submit(batch)
            client._delivery.submit = spy
            client.emit_many(first)
            client.flush()
            assert formats and all(formats)    # every batch went as columns
            assert dict(client.scan()) == Counter(first)
            ring = client.ring
            token = ring.token_for_key("w0")
            owner, replica = ring.owner_of_token(token), ring.replicas_of_token(token)[0]
            address = {n.node_id: n.address for n in cluster.nodes}
            creds = client_tls.channel_credentials()
            for node in (owner, replica):
                with grpc.secure_channel(address[node], creds) as channel:
                    for name, (payload, words) in sorted(MALFORMED.items()):
                        with pytest.raises(grpc.RpcError) as refused:
                            push(channel, ring, token, "bad", 1,
                                 ["x"] * count_of(name), payload)
                        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
                        assert words.lower() in refused.value.details().lower(), name
                    # A well-formed columns batch on the same channel is taken whole.
                    mine = [k for k in (f"k{i}" for i in range(3000))
                            if ring.token_for_key(k) == token][:5]
                    replies = push(channel, ring, token, f"good-{node}", 1, mine,
                                   encode_batch(mine, [1] * len(mine)))
                    assert sum(a.applied for r in replies for a in r.acks) == len(mine)
            client.emit_many(then)
            client.flush()
            expect = Counter(first) + Counter(then) + Counter(mine)
            assert dict(client.scan()) == expect
