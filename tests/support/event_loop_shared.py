"""Helpers of tests/unit/test_event_loop.py that other test files use too: Replica,
replica_server.
"""

import grpc
import pytest

from floering.v1 import floe_pb2_grpc
from floering.node.transport.peers import channel_options
from floering.node.transport.server import ControlPlane


class Replica:
    """The node facade, as far as ShipCheckpoint uses it."""

    def __init__(self) -> None:
        self.received: list = []

    def check_started(self) -> None:
        """Taking a full checkpoint in chunks (a million keys goes so)."""

    def check_copy_chunk(self, sender: str, ring_stamp: int, token: int) -> None:
        """Every chunk's range is where it was: this replica holds one ring."""

    async def receive_checkpoint(self, sender, ring_stamp, incarnation, token, seq,
                                 base_seq, full, states, watermarks):
        self.received.append((token, seq, full, states, watermarks))
        return False, seq, ring_stamp


@pytest.fixture
async def replica_server():
    replica = Replica()
    server = grpc.aio.server(options=channel_options(1 << 28))
    floe_pb2_grpc.add_ControlPlaneServicer_to_server(ControlPlane(replica), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield replica, f"127.0.0.1:{port}"
    await server.stop(None)
