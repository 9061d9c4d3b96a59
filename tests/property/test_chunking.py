"""Full checkpoints in chunks: the pure reassembly, and a real grpc.aio server taking
one through failed and lost chunks."""

from __future__ import annotations

import asyncio
import gc
import weakref

import grpc
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floering.v1 import floe_pb2_grpc
from floering.wire.errors import InvalidArgument, StaleRing, Unavailable
from floering.node.core.ranges import Checkpoint, FullStates
from floering.node.transport.chunking import (Reassembly, SendWindow, chunk_count, chunks_of,
                                              Columns, fill, whole_states)
from floering.node.transport.peers import PeerPool, channel_options
from floering.node.transport.server import ControlPlane
from tests.support.event_loop_shared import Replica


def test_chunks_cover_a_layered_range_in_encoding_order_and_resume_anywhere():
    master = {f"k{i}": i for i in range(10)}
    delta = {"k3": 30, "new": 1}
    full = FullStates(master, delta)
    pairs = [p for keys, states in chunks_of(full, 4) for p in zip(keys, states)]
    assert dict(pairs) == {**master, **delta}
    assert len(pairs) == 12 and chunk_count(12, 4) == 3
    assert [p for keys, states in chunks_of(full, 4, skip=2)
            for p in zip(keys, states)] == pairs[8:]
    assert [len(keys) for keys, _ in chunks_of(full, 5)] == [5, 5, 2]
    assert list(chunks_of({}, 4)) == [] and chunk_count(0) == 1


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(1, 7), st.integers(1, 4), st.data())
def test_chunks_delivered_with_losses_resends_and_gaps_end_in_the_whole_states(
        n, size, window, data):
    states = {f"k{i}": i for i in range(n)}
    chunks = list(chunks_of(states, size))
    total = len(chunks)
    box = Reassembly(window=window)
    chunk, done, sends = 1, None, 0
    while done is None:
        sends += 1
        assert sends < 20 * total
        fate = data.draw(st.sampled_from(["ok", "ok", "ok", "lost", "reply lost", "stray"]))
        if fate == "lost":
            continue                                     # never arrived: sent again
        if fate == "stray":                              # an old or future chunk arrives
            stray = data.draw(st.integers(1, total))
            held, done = box.add("p", 7, 1, stray, total, zip(*chunks[stray - 1]), now=1.0)
            chunk = held + 1
            continue
        held, done = box.add("p", 7, 1, chunk, total, zip(*chunks[chunk - 1]), now=1.0)
        if fate == "reply lost" and done is None:
            continue                                     # the same chunk again
        chunk = held + 1
    assert whole_states(done) == states and not box.open


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 5), st.data())
def test_a_window_of_chunks_over_a_link_that_loses_reorders_and_forgets_ends_whole(
        total, window, data):
    """The sender's bookkeeping against the real receiver, every call's fate drawn:
    answered in any order, failed on the way, or landing on a receiver that forgot
    what it had."""
    states = {f"k{i}": i for i in range(total * 3)}
    chunks = list(chunks_of(states, 3))
    # Five failures at most (never more in a row than the retries allow) and one
    # receiver that forgets: within the shipment's bound on sends, past which it
    # raises Unavailable (and fails this test). Each forgetting costs a run again.
    box, run = Reassembly(window=window), SendWindow(total, window, retries=5)
    flying, done, failures_left, forgets_left = [], None, 5, 1
    while done is None:
        while (chunk := run.to_send()) is not None:
            assert chunk <= run.held + window and run.flying <= window
            flying.append(chunk)
        sent = flying.pop(data.draw(st.integers(0, len(flying) - 1)))
        fate = data.draw(st.sampled_from(["ok", "ok", "ok", "failed", "forgot"]))
        if fate == "failed" and failures_left:
            failures_left -= 1
            assert not run.failed(sent, retriable=True)
            continue
        if fate == "forgot" and forgets_left:
            forgets_left -= 1
            box.open.clear()
        held, whole = box.add("p", 7, 1, sent, total, zip(*chunks[sent - 1]), now=1.0)
        if run.answered(sent, held):
            done = whole
    assert whole_states(done) == states and not box.open


def test_a_chunk_failing_past_its_retries_or_for_good_ends_the_shipment():
    run = SendWindow(3, 2, retries=1)
    assert [run.to_send(), run.to_send(), run.to_send()] == [1, 2, None]
    assert not run.failed(1, retriable=True) and run.to_send() == 1
    assert run.failed(2, retriable=True)          # the second failure in a row
    assert SendWindow(3, 2, retries=5).failed(1, retriable=False)


def test_chunks_that_overtake_a_missing_one_are_kept_within_the_window():
    box = Reassembly(window=3)
    assert box.add("p", 1, 5, 3, 4, {"c": 3}, now=0.0) == (0, None)      # ahead: kept
    assert box.add("p", 1, 5, 4, 4, [("d", 4)], now=0.0, tail=b"w") == (0, None)  # too far
    assert box.add("p", 1, 5, 1, 4, {"a": 1, "c": 0}, now=0.0) == (1, None)
    assert box.add("p", 1, 5, 4, 4, [("d", 4)], now=0.0, tail=b"w") == (1, None)  # now ahead
    held, done = box.add("p", 1, 5, 2, 4, {"b": 2}, now=0.0)             # fills the gap
    assert held == 4 and done.tail == b"w" and not box.open
    # a later chunk's entry for a key wins, whatever order the chunks arrived in
    assert whole_states(done) == {"a": 1, "b": 2, "c": 3, "d": 4}


@pytest.mark.parametrize("step", [1, 2, 3, 4096])
def test_a_range_goes_into_its_dict_in_steps_the_later_entry_winning(step):
    parts = [Columns(("a", "b"), (1, 1)), {"b": 2, "c": 2}, [("c", 3)],
             zip(["c", "d"], [4, 4]), Columns(("d", "e", "f"), (5, 5, 5)), Columns((), ())]
    states: dict = {}
    steps = sum(1 for _ in fill(states, parts, step))
    assert states == {"a": 1, "b": 2, "c": 4, "d": 5, "e": 5, "f": 5} and parts == []
    # columns a step at a time (a zero-length one takes a step too), others whole
    assert steps == -(-2 // step) + 3 + -(-3 // step) + 1
    # a caller that stops between two steps loses nothing: a later fill goes on
    parts = [Columns(("a", "b", "c"), (1, 1, 1)), {"c": 2, "d": 2}]
    states = {}
    steps = fill(states, parts, 2)
    next(steps)
    steps.close()
    assert states == {"a": 1, "b": 1} and len(parts) == 2
    assert list(fill(states, parts, None)) == [] and parts == []
    assert states == {"a": 1, "b": 1, "c": 2, "d": 2}


def test_a_range_grows_as_its_chunks_arrive_and_completes_with_the_rest():
    box = Reassembly(window=2)
    assert box.add("p", 1, 5, 1, 3, Columns(("a", "b"), (1, 1)), now=0.0) == (1, None)
    assert list(box.filling("p", 1, 1)) == [None, None]
    assert box.open[("p", 1)].states == {"a": 1, "b": 1}
    assert box.add("p", 1, 5, 3, 3, {"c": 3}, now=0.0, tail=b"w") == (1, None)  # ahead
    assert list(box.filling("p", 1, 1)) == []                  # nothing in a row yet
    held, done = box.add("p", 1, 5, 2, 3, {"b": 2, "c": 2}, now=0.0)
    assert held == 3 and done.states == {"a": 1, "b": 1} and len(done.parts) == 2
    assert whole_states(done) == {"a": 1, "b": 2, "c": 3} and done.tail == b"w"
    assert list(box.filling("p", 1, 1)) == []                  # nothing open any more


def test_a_new_checkpoint_replaces_one_half_arrived_and_bounds_hold():
    box = Reassembly(max_open=2, idle=10.0, window=2)
    assert box.add("p", 1, 5, 1, 3, {"a": 1}, now=0.0) == (1, None)
    assert box.add("p", 1, 6, 3, 3, {"b": 1}, now=0.0) == (0, None)   # not the one begun
    assert ("p", 1) not in box.open
    assert box.add("p", 1, 6, 1, 2, {"a": 2}, now=0.0) == (1, None)
    held, done = box.add("p", 1, 6, 2, 2, {"b": 2}, now=0.0)
    assert held == 2 and whole_states(done) == {"a": 2, "b": 2} and done.tail is None
    for bad in ((0, 3), (4, 3), (1, 0), (2, 1 << 30)):
        with pytest.raises(InvalidArgument):
            box.add("p", 1, 1, *bad, {}, now=0.0)
    box.add("p", 1, 1, 1, 2, {}, now=0.0)
    box.add("p", 2, 1, 1, 2, {}, now=1.0)
    box.add("p", 3, 1, 1, 2, {}, now=2.0)            # the least recently touched goes
    assert set(box.open) == {("p", 2), ("p", 3)}
    box.add("q", 9, 1, 1, 2, {}, now=20.0)           # the idle ones expire
    assert set(box.open) == {("q", 9)}


class Flaky(ControlPlane):
    """Fails chunk calls as a lossy link would: the first send of some chunks never
    reaches the replica, and the replica forgets what it held once."""

    def __init__(self, service, fail: set[int], forget_at: int | None = None,
                 delay: float = 0.0) -> None:
        super().__init__(service)
        self.fail, self.forget_at, self.calls = set(fail), forget_at, []
        self.delay, self.at_once, self.most_at_once = delay, 0, 0
        self.stale: set[int] = set()      # chunks refused as the range having moved

    async def ShipCheckpoint(self, request, context):
        self.calls.append(request.chunk)
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            await asyncio.sleep(self.delay)
            return await self._ship(request, context)
        finally:
            self.at_once -= 1

    async def _ship(self, request, context):
        if request.chunk in self.stale:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"StaleRing: token {request.token} moved")
        if request.chunk in self.fail:
            self.fail.discard(request.chunk)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "lost on the way")
        if request.chunk == self.forget_at:
            self.forget_at = None
            self.chunks.open.clear()
        return await super().ShipCheckpoint(request, context)


@pytest.fixture
async def flaky_replica():
    servers = []

    async def start(**kw):
        replica = Replica()
        plane = Flaky(replica, **kw)
        server = grpc.aio.server(options=channel_options(1 << 26))
        floe_pb2_grpc.add_ControlPlaneServicer_to_server(plane, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return replica, plane, f"127.0.0.1:{port}"
    yield start
    for server in servers:
        await server.stop(None)


async def ship_and_check(address: str, replica, window: int) -> PeerPool:
    """Ship a 1000-key range's full checkpoint in chunks of 100; check that the replica
    took it whole, once, with its watermarks. The pool (closed) keeps its counters."""
    states = {f"key-{i}": i for i in range(1000)}
    peers = PeerPool(timeout=5.0, max_message_bytes=1 << 26, chunk_entries=100,
                     chunk_window=window)
    try:
        need_full, seq = await peers.ship_checkpoint(
            address, sender="p", ring_stamp=5, base_seq=0,
            checkpoint=Checkpoint(7, 3, states, {"s": 9}, full=True))
    finally:
        await peers.close()
    assert (need_full, seq) == (False, 3)
    (token, got_seq, full, got, watermarks), = replica.received
    assert (token, got_seq, full, watermarks) == (7, 3, True, {"s": 9})
    assert got == states
    return peers


async def test_a_full_checkpoint_goes_in_chunks_and_only_a_failed_chunk_is_sent_again(
        flaky_replica):
    replica, plane, address = await flaky_replica(fail={2, 5}, forget_at=7)
    peers = await ship_and_check(address, replica, window=1)
    # 2 and 5 sent twice (failed once); the replica forgot 1-6 on 7's arrival, so it
    # said it held none and they were sent again from 1; nothing else twice
    assert plane.calls == [1, 2, 2, 3, 4, 5, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert peers.moved_bytes > 0 and peers.checkpoint_bytes == peers.moved_bytes


@pytest.mark.parametrize("fail,forget_at", [(set(), None), ({2, 5, 9}, None),
                                            ({1, 10}, 7), ({3}, 4)])
async def test_a_window_of_chunks_goes_at_once_and_arrives_whole_through_losses(
        flaky_replica, fail, forget_at):
    replica, plane, address = await flaky_replica(fail=fail, forget_at=forget_at,
                                                  delay=0.02)
    await ship_and_check(address, replica, window=4)
    assert plane.most_at_once == 4               # never more than the window
    assert sorted(set(plane.calls)) == list(range(1, 11))
    if not fail and forget_at is None:
        assert sorted(plane.calls) == list(range(1, 11))  # nothing sent twice
    # a failed chunk costs at most a window of resends, a replica that forgot, a run
    assert len(plane.calls) <= 10 + 4 * len(fail) + (10 if forget_at else 0)


async def test_a_replica_that_keeps_failing_a_chunk_fails_the_shipment(flaky_replica):
    replica, plane, address = await flaky_replica(fail=set())
    plane.fail = _Always({3})
    await ship_five_chunks_one_at_a_time(address, Unavailable)
    assert plane.calls == [1, 2, 3, 3, 3, 3] and not replica.received


async def ship_five_chunks_one_at_a_time(address: str, fails_with) -> None:
    """A full copy of 500 keys in chunks of 100, one in flight, which fails with
    `fails_with`."""
    peers = PeerPool(timeout=5.0, max_message_bytes=1 << 26, chunk_entries=100,
                     chunk_window=1)
    try:
        with pytest.raises(fails_with):
            await peers.ship_checkpoint(
                address, sender="p", ring_stamp=5, base_seq=0,
                checkpoint=Checkpoint(7, 3, {f"k{i}": i for i in range(500)}, {}, full=True))
    finally:
        await peers.close()


async def test_a_chunk_refused_as_stale_ends_the_shipment_at_once(flaky_replica):
    """A replica refusing a chunk because the range moved since the copy was cut
    refuses it again under the same stamp: it is not sent again."""
    replica, plane, address = await flaky_replica(fail=set())
    plane.stale = {3}
    await ship_five_chunks_one_at_a_time(address, StaleRing)
    assert plane.calls == [1, 2, 3] and not replica.received


class _Always(set):
    def discard(self, _):           # a chunk that fails every time it is sent
        pass


@pytest.mark.parametrize("data", [
    b"\xc1",                                             # never valid msgpack
    msgpack.packb([["a", "b"], [1]]),                    # unequal lengths
    msgpack.packb({"a": 1}),                             # a map, not [keys, states]
    msgpack.packb([1, 2]),                               # not two arrays
    msgpack.packb([["a"], [1], [2]]),                    # three arrays
])
async def test_a_malformed_chunk_is_refused_before_anything_is_staged(data):
    from floering.node.transport.peers import unpack_chunk
    box = Reassembly()
    with pytest.raises(InvalidArgument):
        box.add("p", 1, 1, 1, 2, await unpack_chunk(data), now=0.0)
    assert not box.open


async def test_a_chunk_decodes_in_one_go_or_in_steps_to_the_same_entries():
    from floering.node.transport.peers import CHUNK_BYTES_AT_ONCE, unpack_chunk
    small = {f"k{i}": i for i in range(1000)}
    large = {f"k{i}": "x" * 100 for i in range(CHUNK_BYTES_AT_ONCE // 100 + 1)}
    for states in (small, large):
        data = msgpack.packb([list(states), list(states.values())])
        assert dict(await unpack_chunk(data)) == states


async def test_chunks_of_several_shipments_go_and_are_taken_in_one_per_turn_of_the_loop(
        flaky_replica, monkeypatch):
    # The gRPC server accepts one new call per turn of the event loop: a turn that
    # packs or takes in several chunks keeps a read or a heartbeat waiting behind all
    # of them. Four ranges shipped at once, each with a window of four, still go (are
    # packed) one per turn and are taken in one per turn, four at most on their way.
    from floering.node.core.state_wire import Piece
    replica, plane, address = await flaky_replica(fail=set(), delay=0.01)
    turn, turns_of_adds, turns_of_packs = 0, [], []
    add, encode = plane.chunks.add, Piece.encode

    def counted_add(*args, **kw):
        turns_of_adds.append(turn)
        return add(*args, **kw)
    plane.chunks.add = counted_add

    def counted_encode(piece):                     # a chunk's frame
        turns_of_packs.append(turn)
        return encode(piece)
    monkeypatch.setattr(Piece, "encode", counted_encode)

    async def turns():
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)
    counter = asyncio.create_task(turns())
    peers = PeerPool(timeout=5.0, max_message_bytes=1 << 26, chunk_entries=100,
                     chunk_window=4)
    ranges = {token: {f"r{token}-{i}": i for i in range(1000)} for token in range(4)}
    try:
        replies = await asyncio.gather(*(
            peers.ship_checkpoint(address, sender="p", ring_stamp=5, base_seq=0,
                                  checkpoint=Checkpoint(token, 3, states, {}, full=True))
            for token, states in ranges.items()))
    finally:
        counter.cancel()
        await peers.close()
    assert replies == [(False, 3)] * 4
    assert {token: got for token, _, _, got, _ in replica.received} == ranges
    assert len(turns_of_adds) == 40
    # four ranges, each with a window of four, yet never more than a window of chunks
    # on their way to the one peer: it accepts them one per turn, a read behind them
    assert plane.most_at_once == 4
    # the limit lasts as long as shipments to the peer do: nothing kept per peer after
    assert len(peers._to_peer) == 0
    assert len(set(turns_of_adds)) == 40, sorted(turns_of_adds)
    assert len(turns_of_packs) == 40 and len(set(turns_of_packs)) == 40, sorted(turns_of_packs)


async def test_a_failed_shipment_lets_go_of_the_range_states_at_once(flaky_replica):
    # A full checkpoint's states still alive when the range's master next changes are
    # copied whole then, on the event loop. Nothing but the shipment may hold them, and
    # not a failed one either: without the cyclic collector, they are gone.
    replica, plane, address = await flaky_replica(fail=set())
    plane.fail = _Always({3})
    states = FullStates({f"k{i}": i for i in range(500)}, {})
    held = weakref.ref(states)
    peers = PeerPool(timeout=5.0, max_message_bytes=1 << 26, chunk_entries=100,
                     chunk_window=2)
    gc.disable()
    try:
        try:
            await peers.ship_checkpoint(address, sender="p", ring_stamp=5, base_seq=0,
                                        checkpoint=Checkpoint(7, 3, states, {}, full=True))
        except Unavailable:
            pass
        else:
            raise AssertionError("the shipment should have failed")
        del states
        assert held() is None
    finally:
        gc.enable()
        await peers.close()
