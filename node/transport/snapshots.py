"""The Snapshots service (operators only, node.transport.tls): a range read out
whole with its watermarks, and a snapshot's chunk merged into a range. Thin: the
decisions are node.core.snapshots'; chunks are cut as a scan's are (node.core.chunks)
and count against the same per-node and per-caller bounds. Members ask each other
with RangeHeld whether they hold a range a removed member kept (node.core.retired);
`range_held` is that call."""

from __future__ import annotations

import asyncio
from typing import Generator

import grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.wire.codec import pack, unpack, unpack_columns, unpack_columns_sliced
from floering.wire.errors import FloeError, InvalidArgument, Unavailable
from floering.node.core.retired import Held, check_marks_header, held, restore_chunk
from floering.node.core.snapshot_format import MAX_SECTION
from floering.node.core.snapshots import export_columns, export_range, import_chunk
from floering.node.core.state_wire import (ExportSegment, PairSegment, SlicedSegment, decode,
                                           encode_pairs, is_frame)
from floering.wire.status import abort, error_from_rpc
from floering.node.transport.tls import peer_identity

STALL = 30.0              # seconds an export waits for its reader to take a chunk
AT_ONCE_BYTES = 1 << 20   # a chunk's entries decoded in one go up to this, else in steps
MAX_WATERMARK_BYTES = 4 << 20


def _caller(context) -> str:
    who = peer_identity(context)
    return "/".join(who) if who else context.peer()


class Snapshots(floe_pb2_grpc.SnapshotsServicer):
    def __init__(self, service) -> None:
        self.service = service           # node.runtime.service.NodeService

    async def ExportRange(self, request, context):
        service, caller = self.service, _caller(context)
        try:
            reads = read_formats(request.formats)
            core = service.runtime.core
            columns, marks = export_columns(core, request.ring_stamp, request.token) \
                if FRAMES in reads else (None, None)
            if columns is None:
                states, marks = export_range(core, request.ring_stamp, request.token)
            service.scans.take(caller)
        except FloeError as exc:
            await abort(context, exc)
        if columns is not None:       # a table's range: frames of its columns
            chunks, sent = frame_chunks(columns), FRAMES
        elif MSGPACK in reads:
            chunks, sent = packed_chunks(column_slices(states), CHUNK_BYTES), MSGPACK
            del states
        else:                         # a reader of frames only: the entries as the rest
            chunks, sent = pair_frame_chunks(states), FRAMES
            del states
        try:
            first = pack(marks)
            for n, (_, entries) in enumerate(chunks, 1):
                try:
                    await asyncio.wait_for(context.write(floe_pb2.ExportChunk(
                        entries=entries, watermarks=first, chunk=n, format=sent)), STALL)
                except asyncio.TimeoutError:
                    raise Unavailable(f"the reader took no chunk for {STALL}s: "
                                      f"cut off") from None
                first = b""
        except FloeError as exc:
            await abort(context, exc)
        finally:
            chunks.close()
            service.scans.give(caller)

    async def ImportRange(self, request, context):
        runtime = self.service.runtime
        try:
            self.service.check_started()
            keys, states, marks = await chunk_columns_async(request, frames=True)
            held = import_chunk(runtime.core, request.reducer, request.ring_stamp,
                                request.token, request.snapshot, request.chunk,
                                request.chunks, keys, states,
                                marks, request.into_state,
                                runtime.clock())
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.ImportAck(chunks_held=held)

    async def RangeHeld(self, request, context):
        core = self.service.runtime.core
        try:
            self.service.check_started()
            if len(request.watermarks) > MAX_WATERMARK_BYTES:
                raise InvalidArgument(f"watermarks are at most {MAX_WATERMARK_BYTES} bytes")
            check_marks_header(request.watermarks, core.limits)
            want = unpack(request.watermarks) if request.watermarks else {}
            answer = held(core, request.token, want) if request.ring_stamp == core.ring.stamp \
                else Held("", False)
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.HeldReply(role=answer.role, holds=answer.holds, lost=answer.lost,
                                  ring_stamp=core.ring.stamp)

    async def RestoreRange(self, request, context):
        runtime = self.service.runtime
        try:
            self.service.check_started()
            check_marks_header(request.watermarks, runtime.core.limits)
            keys, states, marks = await chunk_columns_async(request, frames=True)
            held_now = restore_chunk(runtime.core, request.ring_stamp, request.token,
                                     request.member, request.retired, request.chunk,
                                     request.chunks, keys, states, marks, runtime.clock())
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.ImportAck(chunks_held=held_now)


async def range_held(channel, token: int, ring_stamp: int, watermarks: dict,
                     timeout: float) -> Held:
    """Ask the member at the other end of `channel` how it holds the range of `token`
    against `watermarks` (FloeError when it cannot answer)."""
    try:
        reply = await floe_pb2_grpc.SnapshotsStub(channel).RangeHeld(floe_pb2.HeldRequest(
            token=token, ring_stamp=ring_stamp, watermarks=pack(watermarks)), timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
    if reply.ring_stamp != ring_stamp:
        return Held("", False)
    return Held(reply.role, reply.holds, reply.lost)


async def restore_range(channel, timeout: float, **fields) -> int:
    """Send one RestoreChunk (its fields, `entries` packed, `watermarks` a dict);
    returns the chunks the range holds (FloeError when refused)."""
    marks = fields.pop("watermarks")
    try:
        reply = await floe_pb2_grpc.SnapshotsStub(channel).RestoreRange(floe_pb2.RestoreChunk(
            watermarks=pack(marks) if marks else b"", **fields), timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
    return reply.chunks_held


class RetiredCalls:
    """RangeHeld and RestoreRange over the channels of a PeerPool."""

    def __init__(self, peers, timeout: float) -> None:
        self.peers, self.timeout = peers, timeout

    def held(self, address: str, token: int, ring_stamp: int, watermarks: dict):
        return range_held(self.peers._channel(address), token, ring_stamp, watermarks,
                          self.timeout)

    def restore(self, address: str, **fields):
        return restore_range(self.peers._channel(address), self.timeout, **fields)


MSGPACK, FRAMES = 1, 2      # an export's entry formats (ExportRangeRequest.formats)
SENDS = (MSGPACK, FRAMES)
MAX_FORMATS = 8


def read_formats(asked) -> frozenset[int]:
    """The formats of those a reader names (ExportRangeRequest.formats, hostile) that
    this node sends: format 1 alone for a reader naming none; INVALID_ARGUMENT for
    more than MAX_FORMATS named, or none this node sends."""
    if len(asked) > MAX_FORMATS:
        raise InvalidArgument(f"an export names at most {MAX_FORMATS} entry formats, "
                              f"not {len(asked)}")
    if not len(asked):
        return frozenset((MSGPACK,))
    both = frozenset(asked) & frozenset(SENDS)
    if not both:
        raise InvalidArgument(f"the reader takes entry formats "
                              f"{', '.join(map(str, sorted(set(asked))))}; this node sends "
                              f"{MSGPACK} (msgpack entries) and {FRAMES} (frames of "
                              f"column states)")
    return both


def pair_frame_chunks(states) -> Generator[tuple[int, bytes], None, None]:
    """(entries, frame) per chunk of a range held outside a table, for a reader of
    frames only: its entries in frames' rest, at most CHUNK_BYTES each."""
    keys = list(states)
    if not keys:
        yield 0, encode_pairs([], [])
        return
    segment = PairSegment(keys, [states[k] for k in keys])
    for piece in segment.pieces(1 << 30, CHUNK_BYTES):
        yield piece.count, piece.encode()


def frame_chunks(view) -> Generator[tuple[int, bytes], None, None]:
    """(entries, frame) per chunk of a table's export (export_columns' view, a cut's
    made a slice at a time as the chunks are asked for): frames of column states
    (node.core.state_wire) of at most CHUNK_BYTES each; one empty frame for none."""
    segment = SlicedSegment(view) if hasattr(view, "slices") else \
        ExportSegment(view if isinstance(view, tuple) else view.buffers)
    if not len(segment):
        yield 0, encode_pairs([], [])
        return
    for piece in segment.pieces(1 << 30, CHUNK_BYTES):
        yield piece.count, piece.encode()


def chunk_columns(request, frames: bool = False) -> tuple:
    """A range chunk's keys, states and watermarks, its sizes checked before decoding;
    a frame of column states is checked (state_wire.decode: sizes, kinds, offsets)
    and, with `frames`, given as it is (StateColumns, None, watermarks), else read as
    its keys and states."""
    entries, marks = request.entries, request.watermarks
    check_chunk_sizes(entries, marks)
    if is_frame(entries):
        frame = decode(entries)
        if frames:
            return frame, None, unpack(marks) if marks else {}
        return (frame.column_keys() + list(frame.rest_keys),
                frame.value_column.tolist() + list(frame.rest_states),
                unpack(marks) if marks else {})
    keys, states = unpack_columns(entries)
    return keys, states, unpack(marks) if marks else {}


async def chunk_columns_async(request, frames: bool = False) -> tuple:
    """chunk_columns(request), a chunk's entries above AT_ONCE_BYTES decoded in steps
    between which the event loop runs (an 8 MiB chunk of small entries takes some
    50 ms; msgpack holds the GIL throughout, so a thread would not free the loop)."""
    entries = request.entries
    if len(entries) <= AT_ONCE_BYTES or is_frame(entries):
        return chunk_columns(request, frames)
    marks = request.watermarks
    check_chunk_sizes(entries, marks)
    columns: list = []
    for _ in unpack_columns_sliced(columns, entries):
        await asyncio.sleep(0)
    keys, states = columns
    return keys, states, unpack(marks) if marks else {}


def check_chunk_sizes(entries: bytes, marks: bytes) -> None:
    if len(entries) > MAX_SECTION or len(marks) > MAX_WATERMARK_BYTES:
        raise InvalidArgument(f"a chunk's entries are at most {MAX_SECTION} bytes, "
                              f"its watermarks {MAX_WATERMARK_BYTES}")
