"""Outbound calls from one node to another, each with a deadline; and the encoding of
checkpoint states in steps, between which the event loop runs."""

from __future__ import annotations

import asyncio
import weakref

import grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.chunks import CHUNK_BYTES
from floering.wire.codec import (SLICE, entry_count, pack, pack_entries, pack_entries_sliced,
                             unpack_columns, unpack_entries, unpack_entries_sliced)
from floering.wire.errors import FloeError, StaleRing, Unavailable
from floering.node.core.state_wire import StateColumns, decode as decode_frame, is_frame, plan
from floering.wire.channels import ChannelPool, ServerNames, open_channel, size_options
from floering.node.transport.chunking import (CHUNK_ENTRIES, WINDOW, Columns, SendWindow,
                                              chunk_deadline)
from floering.wire.status import error_from_rpc

CHUNK_RETRIES = 3     # sends of one chunk that may fail in a row before the shipment does

# Below these, entries are (un)packed in one go, as fast as can be; above, in steps of
# SLICE entries (a few ms each). msgpack holds the GIL for a whole call, so only steps,
# not a thread, keep the event loop, which answers heartbeats and probes, free.
SLICED_ENTRIES = SLICE
SLICED_BYTES = 16 * SLICE
# A chunk of CHUNK_ENTRIES entries of usual sizes is a few hundred kB, which msgpack
# decodes in a few ms: at once, it costs a third of decoding it in steps.
CHUNK_BYTES_AT_ONCE = 1 << 20


async def pack_entries_async(items) -> bytes:
    """pack_entries(items), yielding to the event loop between steps. `items` must not
    change meanwhile (a checkpoint's states do not until it is shipped)."""
    if entry_count(items) <= SLICED_ENTRIES:
        return pack_entries(items)
    pieces = []
    for piece in pack_entries_sliced(items):
        pieces.append(piece)
        await asyncio.sleep(0)
    return b"".join(pieces)


async def unpack_chunk(data: bytes):
    """A full checkpoint chunk's entries: a frame of column states (node.core.
    state_wire) checked and kept as columns; older msgpack entries decoded in one go
    into Columns when no larger than an honest chunk, else in steps into a dict as
    any large payload is."""
    if is_frame(data):
        return decode_frame(data)
    if len(data) <= CHUNK_BYTES_AT_ONCE:
        return Columns(*unpack_columns(data))
    return await unpack_entries_async(data)


async def unpack_entries_async(data: bytes) -> dict | StateColumns:
    """unpack_entries(data), yielding to the event loop between steps; a frame of
    column states checked and kept as columns (a copy of its buffers, no step)."""
    if is_frame(data):
        return decode_frame(data)
    if len(data) <= SLICED_BYTES:
        return unpack_entries(data)
    out: dict = {}
    for _ in unpack_entries_sliced(out, data):
        await asyncio.sleep(0)
    return out


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    # gRPC waits 1 s (then longer) before reconnecting after a failed connect, and
    # fails calls at once meanwhile: a peer that was still starting would stay unheard,
    # and a probe of it would fail though it is up. Peers are on a LAN: retry fast.
    # gRPC uses min_reconnect_backoff_ms as the deadline of one connection handshake,
    # not as a backoff: a starved peer that takes more than 100 ms to answer it must
    # not put the channel into backoff, so it gets a second (a refused connect, the
    # usual case of a peer still starting or dead, fails at once regardless).
    return [*size_options(max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 1000),
            ("grpc.max_reconnect_backoff_ms", 500)]


class PeerPool:
    def __init__(self, timeout: float, max_message_bytes: int, credentials=None,
                 chunk_entries: int = CHUNK_ENTRIES, chunk_window: int = WINDOW) -> None:
        self.timeout = timeout
        self.chunk_entries = chunk_entries      # full checkpoints above: in chunks
        self.chunk_window = chunk_window        # chunks of one range on their way at once
        self._options = channel_options(max_message_bytes)
        self._credentials = credentials         # grpc.ChannelCredentials, or None
        # With TLS, a peer must present the certificate of the member our ring places
        # at its address (any node's where it names none): `follow` gives the ring.
        self._ring_of = lambda: None
        self._names = ServerNames(lambda: self._ring_of()) if credentials is not None else None
        self._channels = ChannelPool(self._new_channel, names=self._names)
        # One chunk packed per turn of the event loop, whatever the shipments on their
        # way: each turn of the loop lets the gRPC server accept one new call (a read,
        # a heartbeat), so turns stay short while ranges are re-replicated.
        self._one_chunk = asyncio.Lock()
        # At most chunk_window chunks on their way to one peer, whatever the ranges:
        # the peer accepts them one per turn too, and a read waits behind all of them.
        # Held weakly: a peer's entry lasts while a shipment to it does, so peers that
        # left the ring leave nothing behind.
        self._to_peer: weakref.WeakValueDictionary[str, asyncio.Semaphore] = \
            weakref.WeakValueDictionary()
        # How a checkpoint's states are cut into messages: frames of column states
        # (node.core.state_wire.plan: states, entries, bytes -> pieces to encode).
        self.plan = plan
        self.checkpoint_bytes = 0               # shipped and acknowledged (/metrics)
        # State moved from one node to another, acknowledged: full copies of ranges (a
        # handoff's or split's new holders, new replicas) and pieces merged back.
        self.moved_bytes = 0

    def follow(self, ring_of) -> None:
        """Check each peer's certificate against the ring `ring_of()` returns."""
        self._ring_of = ring_of

    def _new_channel(self, address: str, name: str | None = None) -> grpc.aio.Channel:
        return open_channel(address, self._credentials, self._options, name)

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    async def reconnect(self, address: str) -> None:
        """The next call to `address` connects anew (wire.channels.drop)."""
        await self._channels.drop(address)

    async def retire_channels(self, named) -> list[str]:
        """Close channels to addresses the ring (`named`) left and nobody calls."""
        return await self._channels.retire(named)

    def _control(self, address: str) -> floe_pb2_grpc.ControlPlaneStub:
        return floe_pb2_grpc.ControlPlaneStub(self._channel(address))

    async def ship_checkpoint(self, address: str, *, sender: str, ring_stamp: int,
                              checkpoint, base_seq: int, incarnation: int = 0) -> tuple[bool, int]:
        # As frames of column states (node.core.state_wire): in one message when it
        # fits one, else in chunks. Planned first (a table's export is cut by its
        # offsets; a dict's entries are encoded to learn their size, and let go),
        # then sent chunk by chunk, each encoded as it goes.
        pieces = self.plan(checkpoint.states, self.chunk_entries, CHUNK_BYTES)
        planned: list = []
        while True:
            async with self._one_chunk:       # one chunk planned per turn, node-wide
                piece = next(pieces, None)
            if piece is None:
                break
            planned.append(piece)
            await asyncio.sleep(0)
        if len(planned) > 1:
            try:
                return await self._ship_in_chunks(address, sender, ring_stamp, incarnation,
                                                  checkpoint, base_seq, planned)
            finally:
                # A failure's traceback holds this frame, however long the error lives:
                # it must not hold the range's states (see _ship_in_chunks).
                del checkpoint, pieces, planned
        states = planned[0].encode()
        request = floe_pb2.CheckpointFragment(
            sender=sender, ring_stamp=ring_stamp, incarnation=incarnation,
            token=checkpoint.token,
            checkpoint_seq=checkpoint.seq, base_seq=base_seq, full=checkpoint.full,
            states=states, watermarks=pack(checkpoint.watermarks))
        try:
            reply = await self._control(address).ShipCheckpoint(
                request, timeout=chunk_deadline(self.timeout, len(states)))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        shipped = len(request.states) + len(request.watermarks)
        self.checkpoint_bytes += shipped
        if checkpoint.full and not reply.need_full:
            self.moved_bytes += shipped
        return reply.need_full, reply.checkpoint_seq

    async def _ship_in_chunks(self, address: str, sender: str, ring_stamp: int,
                              incarnation: int, checkpoint, base_seq: int,
                              planned: list) -> tuple[bool, int]:
        """A full checkpoint chunk by chunk (node.transport.chunking), up to
        `chunk_window` chunks on their way at once: each with a deadline for its own
        bytes; a chunk that fails is sent again (up to CHUNK_RETRIES failures in a row;
        one refused as stale ends the shipment at once), and when the receiver says it did not keep one, the run goes on from what it
        holds."""
        total = len(planned)
        run = SendWindow(total, self.chunk_window, CHUNK_RETRIES,
                         what=f"{address} (token {checkpoint.token})")
        watermarks = pack(checkpoint.watermarks)
        control = self._control(address)
        slots = self._to_peer.setdefault(address, asyncio.Semaphore(self.chunk_window))
        flying: dict[asyncio.Future, tuple[int, int]] = {}    # call -> (chunk, bytes)
        error: FloeError | None = None
        call: asyncio.Future | None = None
        done: set[asyncio.Future] = set()

        def request_for(chunk: int) -> floe_pb2.CheckpointFragment:
            return floe_pb2.CheckpointFragment(
                sender=sender, ring_stamp=ring_stamp, incarnation=incarnation,
                token=checkpoint.token, checkpoint_seq=checkpoint.seq,
                full=checkpoint.full, base_seq=base_seq,
                states=planned[chunk - 1].encode(), chunk=chunk, chunks=total,
                watermarks=watermarks if chunk == total else b"")
        try:
            while True:
                while (chunk := run.to_send()) is not None:
                    call, nbytes = await self._start_chunk(control, slots, request_for, chunk)
                    flying[call] = (chunk, nbytes)
                done, _ = await asyncio.wait(flying, return_when=asyncio.FIRST_COMPLETED)
                for call in done:
                    sent, nbytes = flying.pop(call)
                    try:
                        reply = call.result()
                    except grpc.RpcError as exc:
                        error = error_from_rpc(exc)
                        # StaleRing: the range moved since the copy was cut (or the
                        # receiver does not back it up). The same chunk under the
                        # same stamp is refused again: the copy ends at once, and
                        # the next round cuts a new one under the ring as it is.
                        if run.failed(sent, error.retriable and
                                      not isinstance(error, StaleRing)):
                            raise error from None
                        continue
                    self.checkpoint_bytes += nbytes
                    self.moved_bytes += nbytes
                    if run.answered(sent, reply.chunks_held):
                        return reply.need_full, reply.checkpoint_seq
        finally:
            for call in flying:
                call.cancel()
                call.add_done_callback(_retrieved)
            # An error raised here has a traceback through this frame, which holds it
            # (error) or a failed call holding it (call, done): a cycle, which would
            # keep the range's states alive till the cyclic collector ran. States still
            # alive when the range's master next changes are copied whole then.
            error = call = None
            done = set()
            del checkpoint, planned         # and request_for's cells with them

    async def _start_chunk(self, control, slots: asyncio.Semaphore, request_for,
                           chunk: int) -> tuple[asyncio.Future, int]:
        """Start a chunk's call once one of its peer's `slots` is free, one chunk per
        turn of the event loop node-wide (request_for packs it: the costly part). The
        slot is free again when the call ends. (The call, its bytes.)"""
        await slots.acquire()
        call = None
        try:
            async with self._one_chunk:
                request = request_for(chunk)
                call = asyncio.ensure_future(control.ShipCheckpoint(
                    request, timeout=chunk_deadline(self.timeout, len(request.states))))
                call.add_done_callback(lambda _: slots.release())
                await asyncio.sleep(0)        # it starts while the next is packed
        except BaseException:
            if call is None:
                slots.release()
            else:
                call.cancel()
                call.add_done_callback(_retrieved)
            raise
        return call, len(request.states) + len(request.watermarks)

    async def push_many(self, address: str, batches,
                        per_message: int) -> tuple[int, FloeError | None]:
        """Batches, as a mapper pushes them (shared keys' pieces merged back), on one
        stream, `per_message` to a message. (How many the node acknowledged, in order;
        the error that ended the stream before the rest, or None.) `batches` carry
        distinct ids: each ack must name the next one."""
        requests = [floe_pb2.PushRequest(batches=[
            floe_pb2.Batch(ring_stamp=b.ring_stamp, token=b.token, source=b.source,
                           first_seq=b.first_seq, last_seq=b.last_seq, count=b.count,
                           payload=b.payload, seqs=b.seqs, stream=b.stream, id=b.id)
            for b in batches[at:at + per_message]])
            for at in range(0, len(batches), per_message)]
        acked = 0
        error: FloeError | None = None
        try:
            call = floe_pb2_grpc.DataPlaneStub(self._channel(address)).Push(
                iter(requests), timeout=self.timeout)
            async for reply in call:
                ids = [ack.id for ack in reply.acks]
                if ids != [b.id for b in batches[acked:acked + len(ids)]]:
                    call.cancel()
                    error = Unavailable(f"{address} acked batches it was not sent")
                    break
                acked += len(ids)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
        self.moved_bytes += sum(len(b.payload) for b in batches[:acked])
        return acked, error

    async def heartbeat(self, address: str, *, sender: str, ring_stamp: int,
                        incarnation: int = 0,
                        timeout: float | None = None) -> tuple[int, int, str]:
        """Returns the peer's ring stamp, its process incarnation and the member it is."""
        try:
            reply = await self._control(address).Heartbeat(
                floe_pb2.HeartbeatRequest(sender=sender, ring_stamp=ring_stamp,
                                          incarnation=incarnation),
                timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.ring_stamp, reply.incarnation, reply.sender

    async def probe(self, address: str, target: str, timeout: float) -> bool:
        """Ask the node at `address` whether it can reach `target`."""
        try:
            reply = await self._control(address).Probe(
                floe_pb2.ProbeRequest(target=target, timeout=timeout), timeout=timeout * 2)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.alive

    async def stats(self, address: str):
        try:
            return await floe_pb2_grpc.QueryPlaneStub(self._channel(address)).Stats(
                floe_pb2.StatsRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    async def request_shed(self, address: str, sender: str, depth: int) -> tuple[bool, str]:
        """Ask a neighbour to shed its own load first (empty Handoff request); returns
        whether it moved ranges, and what it did."""
        try:
            reply = await self._control(address).RequestShed(
                floe_pb2.ShedRequest(sender=sender, depth=depth), timeout=30.0)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.accepted, reply.detail

    async def get_ring(self, address: str, timeout: float | None = None) -> bytes:
        try:
            reply = await self._control(address).GetRing(floe_pb2.GetRingRequest(),
                                                          timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.ring

    async def ring_at_start(self, address: str, timeout: float) -> tuple[bytes, bool]:
        """A starting node asks a peer for its ring: (ring, whether the peer is
        starting too, in which case the ring is only the one it would found)."""
        try:
            reply = await self._control(address).GetRing(
                floe_pb2.GetRingRequest(starting_ok=True), timeout=timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.ring, reply.starting

    async def exchange_ring(self, address: str, *, sender: str, ring_wire: bytes,
                            version: int, reducer: str) -> tuple[bytes, str | None]:
        """Send our ring view, get the peer's (each side merges the other's), with the
        node whose certificate the answer came under: the one the TLS handshake
        checked the server against ("" when it took any node's, None in the clear)."""
        checked = None if self._names is None else self._names.node_at(address)
        try:    # the channel is picked now, for the same name: no await in between
            reply = await self._control(address).ExchangeRing(
                floe_pb2.RingView(version=version, ring=ring_wire, reducer=reducer,
                                  sender=sender), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return reply.ring, checked

    async def close(self) -> None:
        await self._channels.close()


def _retrieved(call: asyncio.Future) -> None:
    """A call cancelled once its shipment was over: its error is not news."""
    if not call.cancelled():
        call.exception()
