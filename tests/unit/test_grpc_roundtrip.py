"""Real grpc.aio servers on ephemeral loopback ports, in this process."""

import asyncio
from collections import Counter

import grpc
import msgpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.app import start_node
from floering.node.config import NodeConfig
from floering.node.core.batch import encode_payload

WORDS = "to be or not to be that is the question whether tis nobler".split() * 30


@pytest.fixture
async def node():
    running = await start_node(NodeConfig(node_id="n0", listen="127.0.0.1:0",
                                          peers=(("n0", "127.0.0.1:0"),), replication=0, tokens_per_node=1,
                                          max_batch_bytes=1 << 16))
    yield running
    await running.stop()


def batch(ring_version, token, payload, count, first=1, source="t", **kw):
    return floe_pb2.Batch(ring_stamp=ring_version, token=token, source=source,
                          first_seq=first, last_seq=first + count - 1, count=count,
                          payload=payload, id=kw.pop("id", 1), **kw)


async def push(address, *batches):
    async with grpc.aio.insecure_channel(address) as channel:
        call = floe_pb2_grpc.DataPlaneStub(channel).Push(
            iter([floe_pb2.PushRequest(batches=[b]) for b in batches]))
        return [ack async for reply in call for ack in reply.acks]


async def test_health_and_ring(node):
    async with grpc.aio.insecure_channel(node.address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        view = await floe_pb2_grpc.ControlPlaneStub(channel).GetRing(floe_pb2.GetRingRequest())
        assert view.version == 1 and view.reducer == "count"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await floe_pb2_grpc.ControlPlaneStub(channel).GetRing(
                floe_pb2.GetRingRequest(expect_reducer="sum"))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "count" in info.value.details()
        stats = await floe_pb2_grpc.QueryPlaneStub(channel).Stats(floe_pb2.StatsRequest())
        assert (stats.node_id, stats.ring_share, stats.keys, stats.reducer) == ("n0", 1.0, 0, "count")


async def test_client_round_trip_is_exact(node):
    def run():
        with RingClient([node.address], batch_size=64) as client:
            client.emit_many(WORDS)
            client.emit("question", 5)
            client.flush()
            return dict(client.scan()), client.get("question"), client.get("absent"), client.top(2)

    got, question, absent, top = await asyncio.to_thread(run)
    expect = Counter(WORDS)
    expect["question"] += 5
    assert got == expect
    assert question == expect["question"] and absent is None
    assert sorted(top) == [("be", 60), ("to", 60)]


@pytest.mark.parametrize("make, code, words", [
    (lambda t, v: batch(v, t, b"\xc1", 1), grpc.StatusCode.INVALID_ARGUMENT, "msgpack"),
    (lambda t, v: batch(v, t, msgpack.packb([[1.5], [1]]), 1), grpc.StatusCode.INVALID_ARGUMENT, "keys"),
    (lambda t, v: batch(v, t, msgpack.packb([["a"], ["x"]]), 1), grpc.StatusCode.INVALID_ARGUMENT, "int"),
    (lambda t, v: batch(v, t, b"\x92\x91\xa2\xff\xfe\x91\x01", 1), grpc.StatusCode.INVALID_ARGUMENT, "UTF-8"),
    (lambda t, v: batch(v, t, b"x" * 70_000, 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "limit"),
    (lambda t, v: batch(v + 1, t, encode_payload(["a"], [1]), 1), grpc.StatusCode.FAILED_PRECONDITION, "version"),
    (lambda t, v: batch(v, t - 1, encode_payload(["a"], [1]), 1), grpc.StatusCode.FAILED_PRECONDITION, "token"),
])
async def test_bad_input_gets_a_clear_status_and_changes_nothing(node, make, code, words):
    token = node.runtime.core.ring.tokens[0]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await push(node.address, make(token, node.runtime.core.ring.stamp))
    assert info.value.code() == code
    assert words.lower() in info.value.details().lower()
    assert node.runtime.core.stats()["keys"] == 0
    # the node keeps serving
    acks = await push(node.address, batch(node.runtime.core.ring.stamp, token, encode_payload(["ok"], [1]), 1))
    assert [a.applied for a in acks] == [1]


async def test_batches_after_a_refused_one_on_the_stream_are_not_applied(node):
    token = node.runtime.core.ring.tokens[0]
    good_then_bad_then_good = [batch(node.runtime.core.ring.stamp, token, encode_payload(["a"], [1]), 1, first=1, id=1),
                               batch(node.runtime.core.ring.stamp, token, b"\xc1", 1, first=2, id=2),
                               batch(node.runtime.core.ring.stamp, token, encode_payload(["b"], [1]), 1, first=3, id=3)]
    with pytest.raises(grpc.aio.AioRpcError):
        await push(node.address, *good_then_bad_then_good)
    await asyncio.sleep(0.05)                # time to apply "b", were it to be applied
    assert dict(node.runtime.core.items()) == {"a": 1}


async def test_resent_stream_is_deduplicated(node):
    token = node.runtime.core.ring.tokens[0]
    b = batch(node.runtime.core.ring.stamp, token, encode_payload(["a", "b"], [1, 1]), 2)
    first = await push(node.address, b)
    again = await push(node.address, b)
    assert (first[0].applied, again[0].applied, again[0].duplicates) == (2, 0, 2)
    assert dict(node.runtime.core.items()) == {"a": 1, "b": 1}


async def test_a_write_on_a_stream_the_node_ended_is_its_status_not_a_crash(node):
    """The mapper's sender writes, then the node ends the stream (here by refusing a
    batch; a node killed between two writes ends it the same way): the next write
    must raise the stream's status as the project's error, which the sender retries
    or reports. gRPC itself raises InvalidStateError there, which once killed the
    sender's task and stranded its batches until the ring changed."""
    from floering.mapper.delivery import write
    from floering.wire.errors import FloeError, InvalidArgument
    token = node.runtime.core.ring.tokens[0]
    bad = batch(node.runtime.core.ring.stamp, token, b"\xc1", 1)
    async with grpc.aio.insecure_channel(node.address) as channel:
        call = floe_pb2_grpc.DataPlaneStub(channel).Push()
        await write(call, floe_pb2.PushRequest(batches=[bad]), "n0")
        assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(asyncio.InvalidStateError):        # what gRPC does
            await call.write(floe_pb2.PushRequest(batches=[bad]))
        with pytest.raises(FloeError) as info:                 # what the sender sees
            await write(call, floe_pb2.PushRequest(batches=[bad]), "n0")
        assert isinstance(info.value, InvalidArgument) and "msgpack" in str(info.value)


async def test_a_sender_outlives_an_unexpected_error_and_delivers(node, monkeypatch):
    """Whatever a stream raises, the sender task resends on a new stream: here the
    first write of the first stream fails with an error nobody planned for."""
    import floering.mapper.delivery as delivery
    real, failures = delivery.write, []

    async def write_failing_once(call, request, name):
        if not failures:
            failures.append(name)
            raise RuntimeError("an unplanned failure")
        await real(call, request, name)
    monkeypatch.setattr(delivery, "write", write_failing_once)

    def run():
        with RingClient([node.address], batch_size=64, timeout=10) as client:
            client.emit_many(WORDS)
            client.flush()
            return dict(client.scan())
    assert await asyncio.to_thread(run) == Counter(WORDS) and failures == ["n0"]
