"""gRPC servicers: thin adapters from protobuf messages to the runtime and core."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from floering.v1 import floe_pb2, floe_pb2_grpc
from node.core.codec import pack, pack_entries, unpack, unpack_entries
from node.core.errors import (Fenced, FloeError, InvalidArgument, ReducerMismatch, StaleRing,
                              Starting)
from node.core.handoff import HandoffState
from node.core.ring import Ring
from node.runtime.node import NodeRuntime, StreamState
from node.transport.peers import channel_options
from node.transport.status import abort

log = logging.getLogger("floe.transport")

SCAN_CHUNK = 5000


class DataPlane(floe_pb2_grpc.DataPlaneServicer):
    def __init__(self, runtime: NodeRuntime) -> None:
        self.runtime = runtime

    async def Push(self, request_iterator, context):
        runtime = self.runtime
        stream = StreamState()
        pending: asyncio.Queue = asyncio.Queue()

        async def read():
            try:
                async for request in request_iterator:
                    await pending.put(await runtime.submit(request.batches, stream))
            finally:
                await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                done = await pending.get()
                if done is None:
                    break
                try:
                    acks = await done
                except FloeError as exc:
                    await abort(context, exc)
                version = runtime.core.ring.stamp
                yield floe_pb2.PushReply(acks=[
                    floe_pb2.PushAck(id=batch_id, applied=r.applied, duplicates=r.duplicates,
                                     ring_stamp=version) for batch_id, r in acks])
            await reader  # surfaces a failed read (the client went away)
        finally:
            reader.cancel()


class ControlPlane(floe_pb2_grpc.ControlPlaneServicer):
    def __init__(self, runtime: NodeRuntime) -> None:
        self.runtime = runtime

    def _view(self) -> floe_pb2.RingView:
        ring = self.runtime.core.ring
        return floe_pb2.RingView(version=ring.version, ring=ring.to_wire(),
                                 reducer=self.runtime.reducer.name,
                                 sender=self.runtime.core.node_id)

    async def GetRing(self, request, context):
        if self.runtime.starting:
            if not request.starting_ok:
                await abort(context, self._starting())
            view = self._view()
            view.starting = True
            return view
        if request.expect_reducer and request.expect_reducer != self.runtime.reducer.name:
            await abort(context, ReducerMismatch(
                f"the ring runs reducer {self.runtime.reducer.name!r}, "
                f"the caller expects {request.expect_reducer!r}"))
        return self._view()

    def _starting(self) -> Starting:
        return Starting(f"{self.runtime.config.node_id} is starting: it has not yet "
                        f"confirmed its place in the ring")

    async def ExchangeRing(self, request, context):
        if self.runtime.starting:
            await abort(context, self._starting())
        if request.sender:
            self.runtime.sign_of_life(request.sender)
        try:
            self.runtime.adopt(Ring.from_wire(request.ring))
        except FloeError as exc:
            await abort(context, exc)
        return self._view()

    async def Heartbeat(self, request, context):
        if self.runtime.starting:
            await abort(context, self._starting())
        if self.runtime.core.fenced:
            await abort(context, Fenced(f"{self.runtime.core.node_id} was removed from the ring"))
        self.runtime.heard_from(request.sender, request.ring_stamp,
                                incarnation=request.incarnation)
        return floe_pb2.HeartbeatReply(sender=self.runtime.core.node_id,
                                       ring_stamp=self.runtime.core.ring.stamp,
                                       incarnation=self.runtime.incarnation)

    async def Probe(self, request, context):
        timeout = min(max(request.timeout, 0.01), 5.0)
        return floe_pb2.ProbeReply(alive=await self.runtime.probe_for(request.target, timeout))

    async def ShipCheckpoint(self, request, context):
        if self.runtime.starting:
            await abort(context, self._starting())
        self.runtime.heard_from(request.sender, request.ring_stamp,
                                incarnation=request.incarnation)
        core = self.runtime.core
        try:
            watermarks = unpack(request.watermarks) if request.watermarks else {}
            if not isinstance(watermarks, dict):
                raise InvalidArgument("watermarks must be a msgpack map")
            need_full, seq = core.receive_checkpoint(
                request.sender, request.ring_stamp, request.token, request.checkpoint_seq,
                request.base_seq, request.full, unpack_entries(request.states), watermarks)
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.CheckpointAck(need_full=need_full, checkpoint_seq=seq,
                                      ring_stamp=core.ring.stamp)

    def _reply(self, accepted: bool, detail: str) -> floe_pb2.HandoffReply:
        return floe_pb2.HandoffReply(accepted=accepted, detail=detail,
                                     ring_version=self.runtime.core.ring.version)

    async def _handoff(self, context, moves: dict[int, str], timeout: float):
        try:
            h = await self.runtime.hand_off(moves, timeout or None)
        except FloeError as exc:
            await abort(context, exc)
        except ValueError as exc:
            await abort(context, InvalidArgument(str(exc)))
        return self._reply(h.state == HandoffState.COMMITTED, h.reason)

    async def Move(self, request, context):
        return await self._handoff(context, {int(t): request.target for t in request.tokens},
                                   request.timeout)

    async def Split(self, request, context):
        try:
            head, tail = await self.runtime.split_range(request.at)
        except FloeError as exc:
            await abort(context, exc)
        if not request.target:
            return self._reply(True, f"split at {head:#x}: tail token {tail:#x}")
        return await self._handoff(context, {tail: request.target}, request.timeout)

    async def Leave(self, request, context):
        try:
            await self.runtime.leave(request.timeout or None)
        except FloeError as exc:
            await abort(context, exc)
        return self._reply(True, "left the ring")

    async def RequestShed(self, request, context):
        shed = await self.runtime.shed_load(f"asked by {request.sender}", depth=request.depth)
        return self._reply(shed.moved, shed.detail)


class QueryPlane(floe_pb2_grpc.QueryPlaneServicer):
    def __init__(self, runtime: NodeRuntime) -> None:
        self.runtime = runtime

    async def Get(self, request, context):
        core = self.runtime.core
        try:
            key = unpack(request.key)
            found, state = core.get(key)
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.GetReply(found=found, state=pack(state) if found else b"",
                                 ring_version=core.ring.version)

    async def Top(self, request, context):
        try:
            return floe_pb2.TopReply(entries=pack(self.runtime.core.top(request.k or 10)))
        except FloeError as exc:
            await abort(context, exc)

    async def Scan(self, request, context):
        try:
            core = self.runtime.core
            if request.ring_stamp and request.ring_stamp != core.ring.stamp:
                raise StaleRing(f"scan for ring stamp {request.ring_stamp:#x}, node "
                                f"{core.node_id} is at {core.ring.stamp:#x}")
            items = core.snapshot_items()
        except FloeError as exc:
            await abort(context, exc)
        chunk = request.chunk or SCAN_CHUNK
        for start in range(0, len(items), chunk):
            yield floe_pb2.ScanChunk(entries=pack_entries(items[start:start + chunk]))

    async def Stats(self, request, context):
        return floe_pb2.NodeStats(**self.runtime.stats())

    async def InspectRange(self, request, context):
        role, states = self.runtime.core.inspect_range(request.token)
        return floe_pb2.RangeState(role=role, entries=pack_entries(states))


async def start_server(runtime: NodeRuntime) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int]:
    """Serve on runtime.config.listen; returns (server, health, bound port)."""
    server = grpc.aio.server(options=channel_options(runtime.config.max_message_bytes))
    floe_pb2_grpc.add_DataPlaneServicer_to_server(DataPlane(runtime), server)
    floe_pb2_grpc.add_ControlPlaneServicer_to_server(ControlPlane(runtime), server)
    floe_pb2_grpc.add_QueryPlaneServicer_to_server(QueryPlane(runtime), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(runtime.config.listen)
    if port == 0:
        raise OSError(f"cannot bind {runtime.config.listen}")
    await server.start()
    # SERVING once the node has confirmed its place in the ring (node.app.start_node).
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, health, port
