"""The mapper's asyncio side: one Push stream per destination node, acks, resends.

It carries out what the pure mapper machine (`mapper/machine.py`) decides: which
batch goes to which node, when a batch is delivered, which ring to adopt, when to
fetch the ring and what a failure means. A stream that fails is reopened and its
unacknowledged batches are resent in order; a stale-ring refusal or a dead node makes
the client fetch the ring and re-route every undelivered batch. Resends carry the same
(source, seq)s, so the nodes' dedup drops what they already applied. Time comes from
the clocks it is given (`clock`: monotonic seconds; `wall_ns`: wall-clock ns).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Callable

import grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper.machine import WATCH_LIMIT, MapperMachine, OnFailure
from floering.mapper.outbox import Outbox, PendingBatch
from floering.mapper.ring_watch import RETIRE_EVERY, Look
from floering.node.core.batch import formats_said
from floering.wire.errors import FloeError, Unavailable
from floering.wire.ring import Ring
from floering.wire.channels import (MESSAGE_LIMIT, ChannelPool, ServerNames, open_channel,
                                    size_options)
from floering.wire.status import error_from_rpc

log = logging.getLogger("floe.mapper")

STREAM_IDLE = 5.0           # seconds an idle Push stream stays open
# what Delivery.stages keeps of each delivered batch: seconds from its first tuple's
# due time to its hand-over to the delivery (the buffer: Nagle's rule per token, the
# linger), to its first write to a stream, to its first ack, to its last (r+1) ack
STAGES = ("buffer", "queue", "first ack", "last ack")
MESSAGE_BYTES = 2 << 20     # batches are packed into one message up to about this size


class NodeSender:
    """Keeps one Push stream to one node, in order, with a bounded window."""

    def __init__(self, delivery: "Delivery", node: str, address: str) -> None:
        self.delivery = delivery
        self.node = node
        self.address = address
        self.queue: deque[PendingBatch] = deque()
        self.inflight: deque[PendingBatch] = deque()   # sent, unacknowledged, in order
        self.waiting_since: float | None = None        # oldest unanswered send, or last ack
        self.wakeup = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"send-{node}")

    def enqueue(self, batch: PendingBatch) -> None:
        self.queue.append(batch)
        self.wakeup.set()

    def take_all(self) -> list[PendingBatch]:
        batches = list(self.inflight) + list(self.queue)
        self.inflight.clear()
        self.queue.clear()
        self.waiting_since = None
        return batches

    async def _run(self) -> None:
        backoff = 0.02
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if not self.queue:
                continue
            try:
                await self._stream()
                backoff = 0.02
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.task.cancelling() or self.delivery.closing:
                    # A cancel that gRPC turned into an error on the way out (the
                    # call cancelled under a write): still a cancel, or close() would
                    # wait on a sender that backs off and retries for ever.
                    raise asyncio.CancelledError from exc
                if not isinstance(exc, FloeError):
                    # Whatever failed, this task must live on: a dead sender would
                    # strand its batches until the ring changed, which it may never.
                    log.warning("stream to %s failed unexpectedly: %r", self.node, exc)
                    exc = Unavailable(f"stream to {self.node} failed: {exc!r}")
                # Unacknowledged batches go back to the front, in their order.
                self.queue.extendleft(reversed(self.inflight))
                self.inflight.clear()
                self.waiting_since = None
                self.delivery.stream_failed(self, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.2)
                self.wakeup.set()

    async def _stream(self) -> None:
        d = self.delivery
        stream = d.next_stream()
        call = d.data_stub(self.address).Push()
        reader = asyncio.create_task(self._read_acks(call))
        # When the write side fails first, the reader's own error is not the one
        # raised: mark it seen so asyncio does not log it as never retrieved.
        reader.add_done_callback(lambda t: t.cancelled() or t.exception())
        waiter = None
        try:
            while True:
                while self.queue and len(self.inflight) < d.window:
                    # Everything queued (up to the window and a size cap) in one message.
                    batches, size = [], 0
                    if not self.inflight:
                        self.waiting_since = d.clock()
                    now = d.clock()
                    while self.queue and len(self.inflight) < d.window and size < MESSAGE_BYTES:
                        batch = self.queue.popleft()
                        self.inflight.append(batch)
                        batch.sent = batch.sent or now
                        batches.append(to_message(batch, d.known_ring.stamp, stream))
                        size += len(batch.payload) + len(batch.seqs)
                    await write(call, floe_pb2.PushRequest(batches=batches), self.node)
                self.wakeup.clear()
                waiter = asyncio.create_task(self.wakeup.wait())
                idle = not self.queue and not self.inflight
                # Waiting for acks is bounded too: a paused or wedged node must not
                # hold the stream (and flush) forever.
                done, _ = await asyncio.wait({reader, waiter},
                                             timeout=STREAM_IDLE if idle else d.ack_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if reader in done:
                    reader.result()
                    raise Unavailable(f"{self.node} ended the stream")
                if not done:
                    if not idle:
                        raise Unavailable(f"{self.node} acknowledged nothing for "
                                          f"{d.ack_timeout}s")
                    break  # idle for a while: close the stream, reopen on demand
            await call.done_writing()
            await reader
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            reader.cancel()
            if waiter is not None:
                waiter.cancel()
            call.cancel()

    async def _read_acks(self, call) -> None:
        try:
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    if self.inflight:
                        raise Unavailable(f"{self.node} closed the stream with batches unacked")
                    return
                delivered = False
                for ack in reply.acks:
                    batch = self.inflight.popleft()
                    if batch.id != ack.id:
                        raise Unavailable(f"{self.node} acked batch {ack.id}, expected {batch.id}")
                    delivered |= self.delivery.acked(batch, self.node)
                self.waiting_since = self.delivery.clock() if self.inflight else None
                self.wakeup.set()
                if delivered and self.delivery.on_delivered is not None:
                    # a token whose batch is delivered may send its next one now,
                    # not at the batcher's next tick
                    self.delivery.on_delivered()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None


class Delivery:
    """Everything the mapper does on its event loop thread."""

    def __init__(self, seeds: list[str], window: int, rpc_timeout: float,
                 expect_reducer: str | None, credentials=None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_ns: Callable[[], int] = time.time_ns,
                 max_message_bytes: int = MESSAGE_LIMIT) -> None:
        self.seeds = seeds
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.wall_ns = wall_ns
        self.credentials = credentials           # grpc.ChannelCredentials, or None
        self.window = window
        self.rpc_timeout = rpc_timeout
        self.ack_timeout = rpc_timeout
        self.expect_reducer = expect_reducer
        # Every decision: routing, the ring, when to fetch it, what a failure means.
        self.machine = MapperMachine(clock(), retire_every=RETIRE_EVERY)
        self.reducer = ""
        # The payload formats every node that answered for the ring decodes.
        self.formats: frozenset[int] = frozenset((1,))
        # with TLS, each node must present its own certificate (wire.channels); a
        # seed's first channel expects the member this process last saw there
        self.names = ServerNames(lambda: self.ring) if credentials is not None else None
        self._placed: list[str] = []       # seeds whose name came from PLACED
        if self.names is not None:
            self._placed = [a for a in seeds if a in PLACED]
            self.names.place({a: PLACED[a] for a in self._placed})
        self.channels = ChannelPool(self._new_channel, names=self.names)
        self._retiring: asyncio.Task | None = None
        self.closing = False                   # close() began: nothing new starts
        self.senders: dict[str, NodeSender] = {}
        self.fatal: FloeError | None = None
        self.changed = threading.Condition()   # the user thread waits on it in flush()
        self._refreshing: asyncio.Task | None = None
        self._watching: asyncio.Task | None = None
        self._fetching: asyncio.Future | None = None  # the reads' shared refresh
        self.on_ring_change = None             # set by the client (router update)
        # set by the client: called on the loop after a reply that completed the
        # delivery of some batch (its token's buffer may go: batching.seal_and_drain)
        self.on_delivered: Callable[[], None] | None = None
        # (seconds from first emit to the last destination's ack, tuples) per batch
        self.latencies: deque[tuple[float, int]] = deque(maxlen=100_000)
        # where each delivered batch's time went, seconds (STAGES), for the latest ones
        self.stages: deque[tuple[float, float, float, float]] = deque(maxlen=100_000)
        self.last_errors: dict[str, str] = {}        # node -> why its stream last failed

    @property
    def ring(self) -> Ring | None:
        return self.machine.ring

    @property
    def known_ring(self) -> Ring:
        """The ring in use: there is one from the first fetch_ring() on."""
        return self.machine.known_ring

    @property
    def outbox(self) -> Outbox:
        return self.machine.outbox

    @property
    def undelivered(self) -> dict[int, PendingBatch]:
        return self.machine.outbox.undelivered

    def next_stream(self) -> int:
        return self.machine.next_stream(self.wall_ns() // 1000)

    # ------------------------------------------------------------- channels

    def _new_channel(self, address: str, name: str | None = None) -> grpc.aio.Channel:
        # gRPC's default reconnect backoff grows to 2 minutes: a mapper that rode
        # out a whole-cluster restart would wait that long after the nodes are
        # back. Retry within a second instead (min is the handshake's deadline).
        # Replies and requests at most as large as a node's messages (a scan's chunk
        # with one large entry, a Top, a ring), not gRPC's 4 MiB nor anything larger.
        options = [*size_options(self.max_message_bytes),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 1000),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        return open_channel(address, self.credentials, options, name)

    def channel(self, address: str) -> grpc.aio.Channel:
        return self.channels.get(address)

    async def retire_channels(self) -> None:
        """Close the channels to nodes the ring has left that no call took lately;
        the seeds' stay (a ring fetch falls back on them)."""
        if self.ring is not None:
            named = {address for _, address in self.ring.addresses}
            await self.channels.retire(named.union(self.seeds))
            for node in self.last_errors.keys() - set(self.ring.nodes):
                del self.last_errors[node]

    def data_stub(self, address: str) -> floe_pb2_grpc.DataPlaneStub:
        return floe_pb2_grpc.DataPlaneStub(self.channel(address))

    def query_stub(self, address: str) -> floe_pb2_grpc.QueryPlaneStub:
        return floe_pb2_grpc.QueryPlaneStub(self.channel(address))

    # ------------------------------------------------------------------ ring

    async def fetch_ring(self) -> Ring:
        """Ask every known address; adopt the highest ring version any of them has.
        A first fetch that reached no seed under the names placed from an earlier
        ring (their members may have left) asks again accepting any node there, as
        a client that never saw a ring does."""
        try:
            return await self._fetch_ring()
        except Unavailable:
            if self.ring is not None or not self._placed or self.names is None:
                raise
        placed, self._placed = self._placed, []
        self.names.unplace(placed)
        for address in placed:
            await self.channels.drop(address)
        return await self._fetch_ring()

    async def _fetch_ring(self) -> Ring:
        addresses = list(dict.fromkeys(
            self.seeds + ([a for _, a in self.ring.addresses] if self.ring else [])))
        request = floe_pb2.GetRingRequest(expect_reducer=self.expect_reducer or "")

        spoken: dict[str, frozenset] = {}        # address -> the formats it decodes

        async def ask(address):
            stub = floe_pb2_grpc.ControlPlaneStub(self.channel(address))
            call = stub.GetRing(request, timeout=self.rpc_timeout)
            view = await call
            spoken[address] = formats_said(await call.initial_metadata())
            return view

        # How long to wait for slow nodes, and whether a view is news: the machine's.
        m = self.machine
        fetch = m.begin_fetch(self.clock())
        tasks = [asyncio.ensure_future(ask(a)) for a in addresses]
        pending = set(tasks)
        first_view: float | None = None       # when the first view came
        while pending:
            done, pending = await asyncio.wait(pending, timeout=m.fetch_wait(first_view,
                                                                             self.clock()),
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            views = [t.result() for t in done if not t.exception()]
            if m.has_news([v.version for v in views]):
                break          # news: adopt it now; a later refresh finds anything newer
            if first_view is None and views:
                first_view = self.clock()
        for task in pending:
            task.cancel()
        replies = [t.exception() or t.result() for t in tasks if t.done() and not t.cancelled()]
        views = [r for r in replies if isinstance(r, floe_pb2.RingView)]
        errors = [error_from_rpc(r) if isinstance(r, grpc.RpcError) else r
                  for r in replies if not isinstance(r, floe_pb2.RingView)]
        adopted = m.fetched(fetch, [(Ring.from_wire(v.ring), v.ring) for v in views], errors,
                            ", ".join(addresses))
        if adopted.ring is not None:
            self._changed_to(adopted.ring, adopted.sends)
        self.reducer = max(views, key=lambda v: v.version).reducer
        self.formats = frozenset.intersection(*spoken.values()) if spoken else self.formats
        return self.known_ring

    def speaks_columns(self) -> bool:
        """Whether the nodes decode format 2 (columns)."""
        return 2 in self.formats

    async def fetch_ring_after(self, refused_at: float) -> Ring:
        """fetch_ring() for a read refused at `refused_at` (on `clock`): it waits for
        a fetch on its way that began after that, or begins one, as the machine
        decides (MapperMachine.share_fetch)."""
        running = self._fetching is not None and not self._fetching.done()
        if self.machine.share_fetch(refused_at, running, self.clock()):
            self._fetching = asyncio.ensure_future(self.fetch_ring())
            # its outcome is seen even when every caller gave up waiting
            self._fetching.add_done_callback(lambda t: t.cancelled() or t.exception())
        assert self._fetching is not None
        return await asyncio.shield(self._fetching)

    def adopt(self, ring: Ring) -> None:
        """Take `ring` as if a node had sent it."""
        old = self.ring
        sends = self.machine.adopt(ring)
        if old is None:
            remember(ring)
            if self.on_ring_change:
                self.on_ring_change(ring)
            return
        self._changed_to(ring, sends)

    def _changed_to(self, ring: Ring, sends) -> None:
        """The machine took `ring`: the router follows, and every undelivered batch
        goes again, in resend order, to its token's destinations in it (every one of
        them must ack anew) on new streams."""
        remember(ring)
        if self.on_ring_change:
            self.on_ring_change(ring)
        for sender in self.senders.values():
            sender.task.cancel()
            sender.take_all()
        self.senders.clear()
        self._send(sends)

    def check_progress(self) -> None:
        """Called periodically: carries out what the machine decides from the acks'
        progress (mapper/ring_watch.ProgressWatch)."""
        looks = self.machine.tick(self.clock(), [s.waiting_since if s.inflight else None
                                                 for s in self.senders.values()])
        if Look.REFRESH in looks:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.create_task(self._refresh())
            for sender in self.senders.values():
                sender.wakeup.set()
        if Look.WATCH in looks and (self._watching is None or self._watching.done()):
            self._watching = asyncio.create_task(self._watch_ring(interval=0.05))
        if Look.RETIRE in looks and (self._retiring is None or self._retiring.done()):
            self._retiring = asyncio.create_task(self.retire_channels())
            self._retiring.add_done_callback(lambda t: t.cancelled() or t.exception())

    def stream_failed(self, sender: NodeSender, exc: FloeError) -> None:
        log.debug("stream to %s failed: %s", sender.node, exc)
        self.last_errors[sender.node] = str(exc)[:200]
        what = self.machine.on_failure(exc)
        if what is OnFailure.GIVE_UP:
            self._fail(exc, sender)
        elif what is OnFailure.WATCH:
            if self._watching is None or self._watching.done():
                self._watching = asyncio.create_task(self._watch_ring())
        elif what is OnFailure.REFRESH and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.create_task(self._refresh())

    async def _watch_ring(self, interval: float = 0.025, limit: float = WATCH_LIMIT) -> None:
        since, deadline = self.ring, self.clock() + limit
        while self.machine.watching(since, deadline, self.clock()):
            await self._refresh()
            await asyncio.sleep(interval)

    async def _refresh(self) -> None:
        try:
            await self.fetch_ring()
        except FloeError as exc:
            if self.machine.on_refresh_error(exc):
                self._fail(exc, None)
            log.debug("ring refresh failed: %s", exc)

    def _fail(self, exc: FloeError, sender: NodeSender | None) -> None:
        """A batch the ring refuses for good (bad input): drop it, report it."""
        with self.changed:
            self.fatal = self.fatal or exc
            if sender is not None and sender.queue:
                self.machine.give_up(sender.queue.popleft())
            self.changed.notify_all()

    # ------------------------------------------------------------- batches

    def submit(self, batch: PendingBatch) -> None:
        batch.submitted = self.clock()
        self._send(self.machine.submit(batch))

    def _send(self, sends) -> None:
        ring = self.known_ring
        for batch, destinations in sends:
            for node in destinations:
                sender = self.senders.get(node)
                if sender is None:
                    sender = self.senders[node] = NodeSender(self, node, ring.address(node))
                sender.enqueue(batch)

    def waiting_for(self) -> str:
        """Who the undelivered batches wait for, and why their streams last failed:
        what a timeout tells the caller."""
        count: dict[str, int] = {}
        for batch in self.undelivered.values():
            for node in batch.waiting_for:
                count[node] = count.get(node, 0) + 1
        parts = [f"{node} ({n}" + (f"; last error: {self.last_errors[node]}"
                                   if node in self.last_errors else "") + ")"
                 for node, n in sorted(count.items())]
        version = self.ring.version if self.ring is not None else "none"
        return f"waiting for {', '.join(parts) or 'nobody'} at ring v{version}"

    def acked(self, batch: PendingBatch, node: str) -> bool:
        """`node` acknowledged `batch`; True when that completes its delivery."""
        self.last_errors.pop(node, None)
        now = self.clock()
        batch.first_ack = batch.first_ack or now
        latency = self.machine.acked(batch, node, now)
        if latency is None:
            return False
        self.latencies.append((latency, batch.inputs or batch.count))
        if batch.submitted and batch.sent:       # (not a part a ring change cut)
            self.stages.append((batch.submitted - batch.born, batch.sent - batch.submitted,
                                batch.first_ack - batch.sent, now - batch.first_ack))
        with self.changed:
            self.changed.notify_all()
        return True

    async def reopen_streams(self) -> None:
        """Close every Push stream (nothing may be undelivered); the next batch to a
        node opens a new stream with a new, higher number. Channels stay."""
        senders = list(self.senders.values())
        self.senders.clear()
        for sender in senders:
            sender.task.cancel()
        await asyncio.gather(*(s.task for s in senders), return_exceptions=True)

    async def close(self) -> None:
        self.closing = True
        for sender in self.senders.values():
            sender.task.cancel()
        await asyncio.gather(*(s.task for s in self.senders.values()), return_exceptions=True)
        for task in (self._refreshing, self._watching):
            if task:
                task.cancel()
        if self._retiring is not None:      # closing channels: let it finish
            await asyncio.gather(self._retiring, return_exceptions=True)
        await self.channels.close()


# The member each address held in the last ring any client of this process adopted
# ({address: node}), so the next client's seed channels expect it (Delivery.names):
# a Spark worker's later tasks, a script's second client. Names, not channels: safe
# across fork(). Bounded; an address holding two members is left out.
PLACED: dict[str, str] = {}
PLACED_MAX = 4096


def remember(ring: Ring) -> None:
    placed: dict[str, list[str]] = {}
    for node, address in ring.addresses:
        placed.setdefault(address, []).append(node)
    for address, nodes in placed.items():
        PLACED.pop(address, None)             # the newest last: kept longest
        if len(nodes) == 1:
            PLACED[address] = nodes[0]
    _trim()


def _trim() -> None:
    while len(PLACED) > PLACED_MAX:            # the oldest first
        del PLACED[next(iter(PLACED))]


def place(names) -> None:
    """Expect these members ((address, node) pairs: a ring another process saw, e.g.
    the Spark driver's) at addresses this process has not seen a ring name yet."""
    for address, node in list(names)[:PLACED_MAX]:
        if type(address) is str and type(node) is str and address and node:
            PLACED.setdefault(address, node)
    _trim()


async def write(call, request, node: str) -> None:
    """One message on a stream. A stream the node ended (it died, or refused a batch)
    between two writes is the same failure as one that fails mid-write: gRPC
    raises InvalidStateError for the first and an RpcError for the second."""
    try:
        await call.write(request)
    except asyncio.InvalidStateError:
        code = await call.code()
        if code == grpc.StatusCode.OK:
            raise Unavailable(f"{node} ended the stream") from None
        raise error_from_rpc(grpc.aio.AioRpcError(
            code, await call.initial_metadata(), await call.trailing_metadata(),
            await call.details())) from None


def to_message(batch: PendingBatch, ring_stamp: int, stream: int) -> floe_pb2.Batch:
    return floe_pb2.Batch(ring_stamp=ring_stamp, token=batch.token, source=batch.source,
                          first_seq=batch.first_seq, last_seq=batch.last_seq,
                          count=batch.count, payload=batch.payload, seqs=batch.seqs,
                          id=batch.id, stream=stream)
