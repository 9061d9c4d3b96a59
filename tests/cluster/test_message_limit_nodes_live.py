"""A client's message limit against real node processes (TLS as `floe up` sets it up): a reply
over the client's `max_message_bytes` and a request over the node's limit each fail their
call TooLarge, naming the side that refused it, the size and the limit; a limit that is not
a size is refused when the client is made.

The tests here start real node processes; the in-process ones are in
tests/unit/test_message_limit_nodes.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper.delivery import Delivery
from floering.v1 import floe_pb2
from floering.wire.channels import MESSAGE_LIMIT
from floering.wire.errors import TooLarge
from floering.wire.status import error_from_rpc


@pytest.mark.multiprocess
def test_messages_over_the_clients_or_the_nodes_limit_are_too_large(tmp_path):
    words = [f"word-{i:05d}".ljust(200, "w") for i in range(20_000)]   # 4 MB
    small = 64 << 10
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=tls) as client:
            client.emit_many(words)
            client.flush()
        # a scan's chunks (5,000 keys, up to 1 MiB: here ~170 KB a range) are over a client's limit of 64 KiB
        with RingClient(cluster.seeds, tls=tls, max_message_bytes=small) as client:
            with pytest.raises(TooLarge) as refused:
                dict(client.scan())
            said = str(refused.value)
            assert f"is over the caller's limit of {small} bytes" in said, said
            assert "received" in said and "max_message_bytes" in said, said
            assert client.get(words[0]) == 1     # a small reply is taken
        # a request over the node's limit (8 MiB), sent by a client allowed 64 MiB
        address = cluster.nodes[0].address

        async def too_large_get():
            delivery = Delivery([address], 8, 10.0, None, tls.channel_credentials(),
                                max_message_bytes=64 << 20)
            try:
                stub = delivery.query_stub(address)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await stub.Get(floe_pb2.GetRequest(key=b"k" * (MESSAGE_LIMIT + 1)),
                                   timeout=10)
                return failed.value
            finally:
                await delivery.channels.close()
        failed = asyncio.run(too_large_get())
        assert failed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        error = error_from_rpc(failed)
        assert isinstance(error, TooLarge)
        assert f"is over the node's limit of {MESSAGE_LIMIT} bytes" in str(error), str(error)
        # the node serves on
        with RingClient(cluster.seeds, tls=tls) as client:
            assert dict(client.scan()) == Counter(words)
