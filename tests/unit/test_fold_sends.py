"""Sending a round's folds: one Push stream per destination node, and a fold counted
as taken only when that node acknowledged its batch. Real grpc.aio servers on loopback
ports, in this process."""

from collections import Counter

import grpc
import pytest

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.app import start_node
from floering.node.config import NodeConfig
from floering.node.core.folding import FoldSend
from floering.node.core.machine_io import SendFolds
from floering.node.runtime.folds import FOLDS_PER_MESSAGE, send_folds
from floering.node.transport.peers import PeerPool
from floering.wire.pieces import fold_key

FOLDS = 2 * FOLDS_PER_MESSAGE + 44          # three messages, the last one short


def folds_of(counts: Counter, seq: int = 1) -> list[FoldSend]:
    """One fold per (key, piece index): the piece's count on its way to its key."""
    return [FoldSend(fold_key(key, index, 0), seq, key, 1)
            for key, n in counts.items() for index in range(n)]


def effect(folds, token: int, addresses, ring_stamp: int) -> SendFolds:
    return SendFolds(tuple(folds), (token,) * len(folds),
                     (tuple(addresses),) * len(folds), ring_stamp, epoch=1)


async def sent(e: SendFolds, peers: PeerPool) -> dict[bytes, bool]:
    answers = []
    await send_folds(e, peers, answers.append)
    assert [a.out_key for a in answers] == [f.out_key for f in e.folds]
    return {a.out_key: a.ok for a in answers}


def held(node, keys) -> dict:
    return {k: node.runtime.core.get(k)[1] for k in keys}


@pytest.fixture
async def node():
    running = await start_node(NodeConfig(node_id="n0", listen="127.0.0.1:0",
                                          peers=(("n0", "127.0.0.1:0"),), replication=0,
                                          tokens_per_node=1))
    yield running
    await running.stop()


async def test_a_rounds_folds_are_merged_exactly_once_into_their_keys(node):
    counts = Counter({f"w{i}": 1 + i % 5 for i in range(FOLDS // 3)})
    folds = folds_of(counts)
    ring = node.runtime.core.ring
    e = effect(folds, ring.tokens[0], [node.address], ring.stamp)
    peers = PeerPool(timeout=30.0, max_message_bytes=1 << 22)
    try:
        assert all((await sent(e, peers)).values())
        assert held(node, counts) == dict(counts)
        assert all((await sent(e, peers)).values())       # sent again: dropped
        assert held(node, counts) == dict(counts)
        assert node.runtime.core.stats()["duplicates"] == len(folds)
    finally:
        await peers.close()


class EndsEarly(floe_pb2_grpc.DataPlaneServicer):
    """Acknowledges the first `acks` messages of a stream, then ends it: with OK, as a
    node ends a stream whose turn it gives to another of its caller's, or with an
    error."""

    def __init__(self, acks: int, code: grpc.StatusCode | None, shift: int = 0) -> None:
        self.acks, self.code, self.shift = acks, code, shift

    async def Push(self, request_iterator, context):
        answered = 0
        async for request in request_iterator:
            if answered == self.acks:
                break
            answered += 1
            yield floe_pb2.PushReply(acks=[floe_pb2.PushAck(id=b.id + self.shift, applied=1)
                                           for b in request.batches])
        if self.code is not None:
            await context.abort(self.code, "refused")


@pytest.mark.parametrize("acks,code,shift", [(0, None, 0), (1, None, 0),
                                             (1, grpc.StatusCode.FAILED_PRECONDITION, 0),
                                             (3, None, 1)])
async def test_a_fold_the_node_did_not_acknowledge_is_not_taken(acks, code, shift):
    """Shifted: the acks name other batches than were sent, which counts as none."""
    server = grpc.aio.server()
    floe_pb2_grpc.add_DataPlaneServicer_to_server(EndsEarly(acks, code, shift), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    peers = PeerPool(timeout=30.0, max_message_bytes=1 << 22)
    try:
        folds = folds_of(Counter({f"w{i}": 1 for i in range(FOLDS)}))
        taken = await sent(effect(folds, 7, [f"127.0.0.1:{port}"], 1), peers)
        acked = 0 if shift else acks * FOLDS_PER_MESSAGE
        assert [taken[f.out_key] for f in folds] == [True] * acked + [False] * (FOLDS - acked)
    finally:
        await peers.close()
        await server.stop(None)


async def test_a_fold_is_taken_only_if_every_node_of_its_range_took_it(node):
    server = grpc.aio.server()
    floe_pb2_grpc.add_DataPlaneServicer_to_server(EndsEarly(0, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    peers = PeerPool(timeout=30.0, max_message_bytes=1 << 22)
    try:
        ring = node.runtime.core.ring
        folds = folds_of(Counter({"alpha": 3}))
        both = effect(folds, ring.tokens[0], [node.address, f"127.0.0.1:{port}"], ring.stamp)
        assert not any((await sent(both, peers)).values())
        assert held(node, ["alpha"]) == {"alpha": 3}         # the one node that took them
        unknown = effect(folds, ring.tokens[0], [node.address, None], ring.stamp)
        assert not any((await sent(unknown, peers)).values())
    finally:
        await peers.close()
        await server.stop(None)


async def test_a_rounds_folds_for_one_node_travel_on_one_stream(node):
    ring = node.runtime.core.ring
    folds = folds_of(Counter({f"w{i}": 1 for i in range(FOLDS)}))
    peers = PeerPool(timeout=30.0, max_message_bytes=1 << 22)
    calls = []
    real = peers.push_many

    async def counted(address, batches, per_message):
        calls.append((address, len(batches)))
        return await real(address, batches, per_message)

    peers.push_many = counted
    try:
        assert all((await sent(effect(folds, ring.tokens[0], [node.address], ring.stamp),
                               peers)).values())
        assert calls == [(node.address, FOLDS)]
    finally:
        await peers.close()
