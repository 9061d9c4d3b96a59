"""The bytes of requests a node reads at once (node.transport.budget.RequestBytes),
and the interceptor that takes them before gRPC reads a request
(node.transport.intercept): in-process, a real grpc.aio server on loopback."""

import asyncio
import gc

import grpc
import msgpack
import pytest

from floering.wire.errors import Overloaded
from floering.node.transport.budget import RequestBytes
from floering.node.transport.intercept import CallLimiter
from floering.node.transport.server import flow_options

MiB = 1 << 20


async def test_a_caller_reads_at_most_its_share_and_another_caller_is_not_held_back():
    budget = RequestBytes(MiB, per_identity=4 * MiB, total=6 * MiB, wait=5)
    held = [await budget.reserve("a") for _ in range(4)]
    fifth = asyncio.create_task(budget.reserve("a"))
    await asyncio.sleep(0.01)
    assert not fifth.done()
    # another caller is not behind a's queue, up to the node-wide bound
    other = [await budget.reserve("b"), await budget.reserve("b")]
    third_b = asyncio.create_task(budget.reserve("b"))
    await asyncio.sleep(0.01)
    assert not third_b.done() and budget.held == 6 * MiB
    # a request read keeps only its own bytes
    budget.keep(held[0], 100)
    assert budget.held == 5 * MiB + 100 and budget.by_identity["a"] == 3 * MiB + 100
    await asyncio.sleep(0.01)
    assert not fifth.done() and not third_b.done()   # a at its share, b at the total's
    # room goes to the waiting calls that fit, in their order
    budget.release(held[1])
    assert (await asyncio.wait_for(fifth, 1)).size == MiB
    await asyncio.sleep(0.01)
    assert not third_b.done()
    budget.release(other[0])
    assert (await asyncio.wait_for(third_b, 1)).size == MiB
    for h in (*held, *other, fifth.result(), third_b.result()):
        budget.release(h)
    assert budget.held == 0 and budget.by_identity == {}
    stats = budget.stats()
    assert 0.02 <= stats.pop("request_budget_wait_seconds") < 2
    assert stats == dict(request_budget_refused=0, request_budget_waited=2,
                         request_budget_waiting=0, request_budget_bytes=0,
                         request_budget_peak_bytes=6 * MiB,
                         request_budget_limit_bytes=6 * MiB)


async def test_a_call_that_finds_no_room_is_refused_after_the_wait_and_leaves_nothing():
    budget = RequestBytes(MiB, per_identity=MiB, wait=0.05)
    first = await budget.reserve("a")
    with pytest.raises(Overloaded):
        await budget.reserve("a")
    assert budget.refused == 1 and budget.waited == 1 and budget.wait_seconds >= 0.05
    waiting = asyncio.create_task(budget.reserve("a"))
    await asyncio.sleep(0.01)
    assert budget.stats()["request_budget_waiting"] == 1
    waiting.cancel()                               # the caller went away
    with pytest.raises(asyncio.CancelledError):
        await waiting
    budget.release(first)
    assert budget.held == 0 and budget.by_identity == {} and not budget._waiting
    # a cancelled wait is counted, not refused
    assert budget.refused == 1 and budget.waited == 2 and budget.wait_seconds >= 0.06
    assert (await budget.reserve("a")).size == MiB
    assert budget.stats()["request_budget_peak_bytes"] == MiB


async def serve(handler, limit=1000, message=2 * MiB):
    """A grpc.aio server on loopback with the node's call limiter and flow settings,
    one unary method /t.T/M whose request is bytes."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", message), *flow_options()],
        interceptors=[CallLimiter(limit, RequestBytes(message))])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"M": grpc.unary_unary_rpc_method_handler(handler)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.parametrize("size, at_once", [
    (2 * MiB, 4),       # each holds a whole message: four, the caller's share
    (100, 10),          # once read, a small request holds only its own bytes
])
async def test_a_callers_requests_are_read_and_held_up_to_its_share_of_bytes(size, at_once):
    inside, most, gate = 0, 0, asyncio.Event()

    async def handler(request, context):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await gate.wait()
        inside -= 1
        return len(request).to_bytes(4, "big")

    server, port = await serve(handler)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/M")
            calls = [asyncio.ensure_future(call(b"x" * (size - i), timeout=20))
                     for i in range(10)]
            await asyncio.sleep(1.0)
            assert most == at_once
            gate.set()
            replies = await asyncio.gather(*calls)
        assert replies == [(size - i).to_bytes(4, "big") for i in range(10)]
        assert most == at_once
    finally:
        await server.stop(None)


async def test_refused_calls_let_go_of_their_requests_without_the_garbage_collector():
    """An aborted call's error, kept by gRPC's state of the call, holds the frames
    (and the errors) that hold the request: a cycle. Its bytes must not wait for the
    garbage collector (with it off here)."""
    async def handler(request, context):
        try:
            msgpack.unpackb(request)          # ExtraData holds the rest of the bytes
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad: {exc!r:.40}")

    server, port = await serve(handler)
    gc.collect()
    gc.disable()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/M")
            for _ in range(12):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(b"\x01" * MiB, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kept = sum(held_bytes(o) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await server.stop(None)
    assert kept < MiB, f"{kept} bytes of requests held by unreachable cycles"


def held_bytes(obj) -> int:
    """Bytes of large bytes objects `obj` (a frame, an error, a container) holds."""
    if type(obj).__name__ == "frame":
        values = list(obj.f_locals.values())
    elif isinstance(obj, BaseException):
        values = list(obj.args)
    elif isinstance(obj, dict):
        values = list(obj.values())
    elif isinstance(obj, (tuple, list)):
        values = list(obj)
    else:
        return 0
    return sum(len(v) for v in values if isinstance(v, (bytes, bytearray)) and len(v) >= MiB // 2)


async def test_a_stream_cancelled_while_waiting_for_its_turn_raises_cancelled_and_loses_no_turn():
    """A waiting stream cancelled, and its turn passed over by give() before it ran
    again: it raises CancelledError (not an error of the queue), and the turns left
    are still counted right: the next waiter gets one, then all are given back."""
    from floering.node.transport.budget import Turns
    turns = Turns(per_identity=1)
    await turns.take("a")                       # held
    first, second, third = (asyncio.create_task(turns.take("a")) for _ in range(3))
    await asyncio.sleep(0)
    first.cancel()                              # its future is cancelled at once ...
    turns.give("a")                             # ... and passed over here, before it ran
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)           # the turn went to the next waiter
    assert turns.holding("a") == 1 and turns.wanted("a")
    turns.give("a")
    await asyncio.wait_for(third, 1)
    turns.give("a")
    assert turns.holding("a") == 0 and turns._waiting == {}
