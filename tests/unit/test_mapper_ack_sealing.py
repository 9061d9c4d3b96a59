"""A token's next batch goes as soon as a reply completes its last one's delivery,
not at the batcher's next tick: on a fake clock (the batcher, the delivery, one
node's stream of replies), and with real node processes, durable, against a Counter."""

import asyncio

import grpc
import pytest

from floering.mapper.batching import Batcher, linger_loop, seal_and_drain
from floering.mapper.delivery import Delivery, NodeSender
from floering.mapper.routing import Router
from floering.node.core.batch import encode_payload, encode_seqs
from floering.mapper.outbox import PendingBatch
from floering.wire.ring import Ring
from floering.v1 import floe_pb2

MEMBERS = {f"n{i}": f"h:{i}" for i in range(3)}
BASE = Ring.initial(MEMBERS, 1, 4)


class FakeDelivery:
    """What seal_and_drain and linger_loop use of a delivery: its undelivered batches,
    submit, the progress check, the hook."""

    def __init__(self) -> None:
        self.undelivered: dict = {}
        self.submitted: list = []
        self.on_delivered = None

    def submit(self, batch) -> None:
        self.submitted.append(batch)
        self.undelivered[batch.id] = batch

    def check_progress(self) -> None:
        pass


def batcher_on(now: list) -> Batcher:
    return Batcher(Router(BASE), None, "src", batch_size=100, clock=lambda: now[0])


def test_a_busy_tokens_buffer_goes_once_its_batch_is_delivered_with_no_time_passing():
    now = [50.0]
    batcher, delivery = batcher_on(now), FakeDelivery()
    batcher.emit("word", 1)
    seal_and_drain(batcher, delivery, linger=0.05)
    [first] = delivery.submitted                      # nothing on its way: it went
    batcher.emit("word", 1)
    batcher.emit("other", 1)
    token, other = first.token, BASE.token_for_key("other")
    assert other != token
    seal_and_drain(batcher, delivery, linger=0.05)
    # the busy token keeps filling its buffer (Nagle's rule per token); the other goes
    assert [b.token for b in delivery.submitted[1:]] == [other]
    assert token in batcher.buffers
    del delivery.undelivered[first.id]                # its last ack came
    seal_and_drain(batcher, delivery, linger=0.05)    # as the reply's hook does
    assert [b.token for b in delivery.submitted[2:]] == [token]
    assert delivery.submitted[2].born == 50.0 and now == [50.0]    # no tick, no linger
    assert not batcher.buffers and not batcher.sealed


def test_with_nothing_open_the_hook_submits_what_is_sealed_and_seals_nothing():
    now = [1.0]
    batcher, delivery = batcher_on(now), FakeDelivery()
    for i in range(100):                              # a full buffer seals by itself
        batcher.emit("word", 1)
    assert len(batcher.sealed) == 1 and not batcher.buffers
    seal_and_drain(batcher, delivery, linger=0.05)
    assert len(delivery.submitted) == 1 and not batcher.sealed


async def test_the_linger_loop_hands_the_hook_to_the_delivery_while_it_runs():
    now = [1.0]
    batcher, delivery = batcher_on(now), FakeDelivery()
    task = asyncio.create_task(linger_loop(batcher, delivery, linger=10.0))
    await asyncio.sleep(0)
    assert delivery.on_delivered is not None
    batcher.emit("word", 1)
    delivery.undelivered[99] = PendingBatch(99, BASE.token_for_key("word"), "src", 1, 1, 1,
                                            b"", b"", 0.0, tokens=BASE.tokens)
    delivery.on_delivered()
    assert not delivery.submitted                      # its token is busy
    del delivery.undelivered[99]
    delivery.on_delivered()
    assert [b.token for b in delivery.submitted] == [BASE.token_for_key("word")]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert delivery.on_delivered is None               # a stopped client seals nothing


def pending(ring: Ring, id: int, n: int = 3) -> PendingBatch:
    token = ring.tokens[id % len(ring.tokens)]
    keys = [k for k in (f"k{id}-{i}" for i in range(5000)) if ring.token_for_key(k) == token][:n]
    seqs = list(range(id * 100, id * 100 + n))
    return PendingBatch(id, token, "src", seqs[0], seqs[-1], n, encode_payload(keys, [1] * n),
                        encode_seqs(seqs), 7.0, tokens=ring.tokens)


class Replies:
    """A Push call's read side: the given replies, then the end of the stream."""

    def __init__(self, *replies) -> None:
        self.replies = list(replies)

    async def read(self):
        return self.replies.pop(0) if self.replies else grpc.aio.EOF


async def test_a_reply_calls_the_hook_once_and_only_when_it_completes_a_delivery():
    d = Delivery(["h:0"], 8, 1.0, None, clock=lambda: 7.5, wall_ns=lambda: 5_000_000)
    d.adopt(BASE)
    calls = []
    d.on_delivered = lambda: calls.append(sorted(d.undelivered))
    a, b = pending(BASE, 1), pending(BASE, 2)
    for batch in (a, b):
        d.machine.submit(batch)                        # routed, no stream opened
    assert a.waiting_for and len(a.waiting_for) == 2
    first, second = sorted(a.waiting_for)
    senders = {}
    for node in (first, second):
        sender = senders[node] = NodeSender(d, node, MEMBERS[node])
        sender.task.cancel()                           # no stream: replies fed by hand
    ack = lambda *batches: floe_pb2.PushReply(acks=[floe_pb2.PushAck(id=x.id)  # noqa: E731
                                                    for x in batches])
    senders[first].inflight.extend([a])
    await senders[first]._read_acks(Replies(ack(a)))
    assert calls == []                                 # one of two holders: not delivered
    senders[second].inflight.extend([a])
    await senders[second]._read_acks(Replies(ack(a)))
    assert calls == [[b.id]]                           # a delivered: the hook, once
    assert list(d.latencies) == [(0.5, 3)]


async def test_each_delivered_batch_keeps_where_its_time_went_on_the_delivery_clock():
    """Buffer (born -> handed over), queue (-> first write), first ack, last ack."""
    from floering.mapper.delivery import STAGES
    now = [10.0]
    d = Delivery(["h:0"], 8, 1.0, None, clock=lambda: now[0], wall_ns=lambda: 5_000_000)
    d.adopt(BASE)
    a = pending(BASE, 1)
    a.born = 9.0
    d.machine.submit(a)
    a.submitted = d.clock()                           # as Delivery.submit stamps it
    now[0] = 10.25
    first, second = sorted(a.waiting_for)
    senders = {node: NodeSender(d, node, MEMBERS[node]) for node in (first, second)}
    for sender in senders.values():
        sender.task.cancel()
    a.sent = d.clock()                                # as the stream's first write does
    now[0] = 10.5
    ack = floe_pb2.PushReply(acks=[floe_pb2.PushAck(id=a.id)])
    senders[first].inflight.append(a)
    await senders[first]._read_acks(Replies(ack))
    assert not d.stages                                # not delivered yet
    now[0] = 11.5
    senders[second].inflight.append(a)
    await senders[second]._read_acks(Replies(ack))
    assert len(STAGES) == 4
    assert list(d.stages) == [pytest.approx((1.0, 0.25, 0.25, 1.0))]
    assert list(d.latencies) == [(2.5, 3)]


def test_a_batch_handed_to_the_delivery_is_stamped_on_its_clock():
    d = Delivery(["h:0"], 8, 1.0, None, clock=lambda: 4.0, wall_ns=lambda: 5_000_000)
    d.adopt(BASE)
    d._send = lambda sends: None                       # routed, not streamed
    a = pending(BASE, 3)
    d.submit(a)
    assert a.submitted == 4.0 and a.id in d.undelivered and not a.sent
