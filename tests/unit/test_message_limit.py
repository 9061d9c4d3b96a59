"""A client's channels take replies and send requests only as large as a node's
messages (8 MiB at the default settings), and a larger one fails its call with a
TooLarge that says which side refused it, the sizes and the limit."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from floering.mapper.delivery import Delivery
from floering.node.config import NodeConfig
from floering.wire.errors import TooLarge
from floering.wire.channels import MESSAGE_LIMIT
from floering.node.transport.server import message_bytes
from floering.wire.status import error_from_rpc
from floering.v1 import floe_pb2, floe_pb2_grpc


def test_a_nodes_messages_at_the_defaults_are_a_clients_limit():
    config = NodeConfig(node_id="n0", listen="127.0.0.1:1", peers=(("n0", "127.0.0.1:1"),))
    assert message_bytes(config) == MESSAGE_LIMIT == 8 << 20


class Replies(floe_pb2_grpc.QueryPlaneServicer):
    async def Get(self, request, context):
        return floe_pb2.GetReply(found=True, state=b"x" * (len(request.key) or MESSAGE_LIMIT))


async def test_a_reply_or_request_over_the_limit_is_too_large_and_says_why():
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20),
                                      ("grpc.max_receive_message_length", 64 << 20)])
    floe_pb2_grpc.add_QueryPlaneServicer_to_server(Replies(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    delivery = Delivery([f"127.0.0.1:{port}"], 8, 5.0, None)
    try:
        stub = delivery.query_stub(f"127.0.0.1:{port}")
        fits = await stub.Get(floe_pb2.GetRequest(key=b"k" * (MESSAGE_LIMIT - 64)))
        assert len(fits.state) == MESSAGE_LIMIT - 64
        for key, word in ((b"", "received"), (b"k" * (MESSAGE_LIMIT + 1), "to send")):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Get(floe_pb2.GetRequest(key=key))
            assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            error = error_from_rpc(failed.value)
            assert isinstance(error, TooLarge)
            assert f"{word} is over the caller's limit of {MESSAGE_LIMIT} bytes" in str(error)
            assert "max_message_bytes" in str(error)
    finally:
        await delivery.channels.close()
        await server.stop(0)
