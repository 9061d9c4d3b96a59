"""Helpers of tests/unit/test_bounds.py that other test files use too: push.
"""

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.batch import encode_payload


def push(channel, ring, token, source, seq, keys, payload=None):
    """One batch on its own Push stream; the replies, or the refusal raised."""
    stub = floe_pb2_grpc.DataPlaneStub(channel)
    b = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=source, first_seq=seq,
                       last_seq=seq + len(keys) - 1, count=len(keys), id=seq,
                       payload=payload or encode_payload(keys, [1] * len(keys)))
    return list(stub.Push(iter([floe_pb2.PushRequest(batches=[b])]), timeout=10))
