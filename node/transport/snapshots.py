"""The Snapshots service (operators only, node.transport.tls): a range read out
whole with its watermarks, and a snapshot's chunk merged into a range. Thin: the
decisions are node.core.snapshots'; chunks are cut as a scan's are (node.core.chunks)
and count against the same per-node and per-caller bounds."""

from __future__ import annotations

import asyncio

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.node.core.codec import pack, unpack, unpack_columns
from floering.node.core.errors import FloeError, InvalidArgument, Unavailable
from floering.node.core.snapshot_format import MAX_SECTION
from floering.node.core.snapshots import export_range, import_chunk
from floering.node.transport.status import abort
from floering.node.transport.tls import peer_identity

STALL = 30.0              # seconds an export waits for its reader to take a chunk
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
            states, marks = export_range(service.runtime.core, request.ring_stamp,
                                         request.token)
            service.scans.take(caller)
        except FloeError as exc:
            await abort(context, exc)
        chunks = packed_chunks(column_slices(states), CHUNK_BYTES)
        del states
        try:
            first = pack(marks)
            for n, (_, entries) in enumerate(chunks, 1):
                try:
                    await asyncio.wait_for(context.write(floe_pb2.ExportChunk(
                        entries=entries, watermarks=first, chunk=n)), STALL)
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
            entries, marks = request.entries, request.watermarks
            if len(entries) > MAX_SECTION or len(marks) > MAX_WATERMARK_BYTES:
                raise InvalidArgument(f"a chunk's entries are at most {MAX_SECTION} bytes, "
                                      f"its watermarks {MAX_WATERMARK_BYTES}")
            keys, states = unpack_columns(entries)
            held = import_chunk(runtime.core, request.reducer, request.ring_stamp,
                                request.token, request.snapshot, request.chunk,
                                request.chunks, keys, states,
                                unpack(marks) if marks else {}, request.into_state,
                                runtime.clock())
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.ImportAck(chunks_held=held)
