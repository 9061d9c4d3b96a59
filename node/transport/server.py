"""gRPC servicers: thin adapters from protobuf messages to the node's facade
(node.runtime.service) and back. No protobuf object travels past this module."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError
import msgpack
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.batch import FORMATS_METADATA, PAYLOAD_FORMATS, Batch
from floering.wire.codec import pack, unpack
from floering.node.core.dedup import bind_source
from floering.wire.errors import FloeError, InvalidArgument, Unavailable, inert
from floering.node.core.handoff import HandoffState
from floering.wire.pieces import FOLD_SOURCE, is_fold_source
from floering.wire.ring import Ring
from floering.node.runtime.inbound import StreamState
from floering.node.runtime.node import NodeRuntime
from floering.node.runtime.service import NodeService
from floering.node.transport.binding import SERVER_OPTIONS, claim_port
from floering.node.transport.budget import Budgets, ByteBudget, Held, RequestBytes, Turns
from floering.wire.channels import MESSAGE_LIMIT
from floering.node.transport.chunking import CHUNK_ENTRIES, Reassembly, fill, received
from floering.node.transport.intercept import CALLER, CallLimiter
from floering.node.transport.peers import channel_options, unpack_chunk, unpack_entries_async
from floering.node.transport.snapshots import Snapshots
from floering.wire.status import abort
from floering.wire.tls import TlsFiles
from floering.node.transport.tls import Authorizer, node_files, peer_identity

if TYPE_CHECKING:     # prometheus_client is imported only by a node serving metrics
    from floering.node.transport.metrics import NodeMetrics


def listen_host(listen: str) -> str:
    """The host part of a host:port listen address: `127.0.0.1:7000` -> `127.0.0.1`,
    `[::1]:7000` -> `::1`, `localhost:7000` -> `localhost`. ValueError for anything
    else (no port, an unbracketed IPv6 address, brackets around a name)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise ValueError(f"listen address {listen!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            if ipaddress.ip_address(inner).version == 6:
                return inner
        except ValueError:
            pass
        raise ValueError(f"listen address {listen!r}: only an IPv6 address goes in brackets")
    if not host or "[" in host or "]" in host or ":" in host:
        raise ValueError(f"listen address {listen!r} is not host:port (an IPv6 address "
                         f"goes in brackets: [::1]:7000)")
    return host


def is_loopback(listen: str) -> bool:
    """Whether a listen address is on loopback only: an IPv4 address in 127.0.0.0/8,
    ::1 (or an IPv4-mapped 127.x), or the name `localhost`. Any other name counts as
    reachable from elsewhere (it may resolve to anything), as does an unparseable
    address, a wildcard (0.0.0.0, [::]) or a gRPC URI (ipv4:, unix:)."""
    try:
        host = listen_host(listen)
    except ValueError:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False                  # a hostname: 127.evil.com is not loopback
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def node_tls(config) -> TlsFiles | None:
    """The node's credentials (--tls-dir), or None to serve in the clear, which it
    does only on a loopback address: beyond loopback a node never serves without
    credentials, --insecure or not."""
    if config.tls_dir:
        return node_files(config.tls_dir, config.node_id)   # names it as a server
    if not is_loopback(config.listen):
        raise ValueError(
            f"refusing to serve in the clear on {inert(config.listen)}: it is not a "
            f"loopback address (127.0.0.0/8, [::1] or localhost); give --tls-dir "
            f"(--insecure allows no TLS on loopback only)")
    return None

log = logging.getLogger("floe.transport")

SCAN_STALL = 30.0        # seconds a scan waits for its reader to take a chunk
IDLE_TURN = 1.0          # seconds an idle Push stream keeps its turn while others wait
FILL_STEP = CHUNK_ENTRIES   # entries put into a range's dict per turn (some 10 ms)
# What health checks answer for: the server as a whole ("") and each Floe service.
FLOE_SERVICES = tuple(s.full_name for s in floe_pb2.DESCRIPTOR.services_by_name.values())
HEALTH_NAMES = ("", *FLOE_SERVICES)


async def set_health(health: health_aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse
    for name in HEALTH_NAMES:
        await health.set(name, status.SERVING if serving else status.NOT_SERVING)


def batches_of(request, owner: str | None = None) -> list[Batch]:
    """The request's batches as plain values; with `owner` (the caller's identity),
    each source bound to it (node.core.dedup.bind_source)."""
    if owner is None:
        return [Batch(b.ring_stamp, b.token, b.source, b.first_seq, b.last_seq, b.count,
                      b.payload, b.seqs, b.stream, b.id) for b in request.batches]
    return [Batch(b.ring_stamp, b.token, bind_source(owner, b.source), b.first_seq,
                  b.last_seq, b.count, b.payload, b.seqs, b.stream, b.id)
            for b in request.batches]


def refused(exc: Exception) -> asyncio.Future:
    done = asyncio.get_running_loop().create_future()
    done.set_exception(exc)
    return done


class DataPlane(floe_pb2_grpc.DataPlaneServicer):
    def __init__(self, service: NodeService, pushes: RequestBytes | None = None,
                 reading: Turns | None = None) -> None:
        self.service = service
        self.intake = asyncio.Lock()     # one Push message parsed at a time
        # Push messages read but not yet applied, per caller identity and in all
        self.pushes = pushes if pushes is not None else RequestBytes(
            message_bytes(service.runtime.config), wait=None)
        # a caller's streams reading (or holding a message without room) at once
        self.reading = reading if reading is not None else Turns()

    async def _take(self, raw: bytes, who, owner: str | None, may_fold: bool
                    ) -> list[Batch]:
        """One Push message's batches, parsed from its wire bytes once it has room.
        One message is parsed at a time, node-wide, each in a step of the event loop
        of its own, behind whatever else is ready then: several streams' messages
        arriving together are not taken in back to back in one turn of the loop,
        which kept a node's probes unanswered (docs/security.md)."""
        async with self.intake:
            await asyncio.sleep(0)
            try:
                request = floe_pb2.PushRequest.FromString(raw)
            except DecodeError:
                raise InvalidArgument("the message is not a PushRequest") from None
            if not may_fold and any(is_fold_source(b.source) for b in request.batches):
                raise InvalidArgument(
                    f"a {who[0]} may not push under a fold's source "
                    f"({FOLD_SOURCE}...): only nodes merge pieces back")
            return batches_of(request, owner)

    async def _next_message(self, context, caller: str, answered: Callable[[], bool]
                            ) -> tuple[bytes | None, Held | None]:
        """A Push stream's next message and the room it took, or (None, None) at its
        end. gRPC reads a message whole once asked: a caller's streams ask in turns
        (Turns), each holding its turn until its message has room for its wire bytes
        (before it is parsed or queued, and before the stream's next message is asked
        for); until then the sender is held back by flow control, and an idle stream
        holds no room. A stream that holds a turn, has every message answered
        (`answered()`) and gets nothing for IDLE_TURN seconds while another stream of
        its caller waits for a turn is ended (its sender opens a new one when it has
        more): idle streams cannot keep their caller's others from reading. Read with
        context.read(), not the request iterator, which keeps the message it last
        gave until the next one comes (an idle stream held its last message)."""
        reading = self.reading
        await reading.take(caller)
        try:
            message = asyncio.ensure_future(context.read())
            try:
                while not (await asyncio.wait((message,), timeout=IDLE_TURN))[0]:
                    if answered() and reading.wanted(caller):
                        return None, None
                raw = message.result()
            finally:
                message.cancel()
            if raw is grpc.aio.EOF:
                return None, None
            return raw, await self.pushes.reserve(caller, len(raw))
        finally:
            reading.give(caller)

    async def Push(self, request_iterator, context):
        service = self.service
        stream = StreamState()
        # Bounded: a client that does not read its acks stops being read (gRPC flow
        # control then holds it back) instead of growing the node's memory.
        pending: asyncio.Queue = asyncio.Queue(service.stream_window)

        who = peer_identity(context)
        may_fold = who is None or who[0] == "node"     # None: a loopback node in the clear

        # A client's or operator's sources are its own: kept under its identity.
        owner = None if may_fold else f"{who[0]}:{who[1]}"
        pushes, caller = self.pushes, CALLER.get()
        unanswered = 0           # messages read whose reply has not been sent yet

        async def read():
            nonlocal unanswered
            try:
                while True:
                    raw, held = await self._next_message(context, caller,
                                                         lambda: unanswered == 0)
                    if raw is None:
                        break
                    unanswered += 1
                    try:
                        batches = await self._take(raw, who, owner, may_fold)
                        raw = None
                        done = await service.submit(batches, stream)
                    except FloeError as exc:
                        pushes.release(held)
                        await pending.put(refused(exc))
                        return
                    except BaseException:
                        pushes.release(held)
                        raise
                    batches = None
                    # its bytes are held until the applier is done with it
                    done.add_done_callback(lambda _, held=held: pushes.release(held))
                    await pending.put(done)
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
                stamp = service.ring.stamp
                yield floe_pb2.PushReply(acks=[
                    floe_pb2.PushAck(id=batch_id, applied=r.applied, duplicates=r.duplicates,
                                     ring_stamp=stamp) for batch_id, r in acks])
                unanswered -= 1
            await reader  # surfaces a failed read (the client went away)
        finally:
            reader.cancel()


SPOKEN = ",".join(map(str, PAYLOAD_FORMATS))     # told to mappers in GetRing


class ControlPlane(floe_pb2_grpc.ControlPlaneServicer):
    def __init__(self, service: NodeService) -> None:
        self.service = service
        self.chunks = Reassembly()      # full checkpoints arriving in chunks
        self.one_chunk = asyncio.Lock()  # see _take_chunk
        self.inbound = ByteBudget()     # bytes of checkpoints being decoded at once

    def _view(self, ring: Ring, starting: bool = False) -> floe_pb2.RingView:
        return floe_pb2.RingView(version=ring.version, ring=ring.to_wire(),
                                 reducer=self.service.reducer, sender=self.service.node_id,
                                 starting=starting)

    async def GetRing(self, request, context):
        try:
            ring, starting = self.service.ring_view(request.starting_ok,
                                                    request.expect_reducer)
        except FloeError as exc:
            await abort(context, exc)
        await context.send_initial_metadata(((FORMATS_METADATA, SPOKEN),))
        return self._view(ring, starting)

    async def ExchangeRing(self, request, context):
        try:
            who = peer_identity(context)
            ring = self.service.exchange_ring(request.sender, Ring.from_wire(request.ring),
                                              who[1] if who else "")
        except FloeError as exc:
            await abort(context, exc)
        return self._view(ring)

    async def Heartbeat(self, request, context):
        try:
            stamp, incarnation = self.service.heartbeat(request.sender, request.ring_stamp,
                                                        request.incarnation)
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.HeartbeatReply(sender=self.service.node_id, ring_stamp=stamp,
                                       incarnation=incarnation)

    async def Probe(self, request, context):
        return floe_pb2.ProbeReply(alive=await self.service.probe(request.target,
                                                                  request.timeout))

    async def ShipCheckpoint(self, request, context):
        try:
            states = request.states           # each read of the field is a copy
            async with self.inbound.hold(len(states)):
                return await self._ship_checkpoint(request, states)
        except FloeError as exc:
            await abort(context, exc)

    async def _ship_checkpoint(self, request, data: bytes) -> floe_pb2.CheckpointAck:
        held = 0
        states: Mapping
        # A full checkpoint may hold millions of keys: decoded in steps, so that
        # heartbeats and probes are answered meanwhile.
        if request.chunk or request.chunks:
            held, whole = await self._take_chunk(request, data)
            if whole is None:
                return floe_pb2.CheckpointAck(chunks_held=held)
            states, watermarks = whole
        else:
            states = await unpack_entries_async(data)
            watermarks = request.watermarks
        need_full, seq, stamp = await self.service.receive_checkpoint(
            request.sender, request.ring_stamp, request.incarnation, request.token,
            request.checkpoint_seq, request.base_seq, request.full, states,
            unpack(watermarks) if watermarks else {})
        return floe_pb2.CheckpointAck(need_full=need_full, checkpoint_seq=seq, ring_stamp=stamp,
                                      chunks_held=held)

    async def _take_chunk(self, request, data: bytes) -> tuple[int, tuple[Mapping, bytes] | None]:
        """(chunks held in a row, (the whole states, watermarks) once this chunk
        completed the range). One chunk taken in (decoded and put into its range's
        dict) per turn of the event loop: the gRPC server accepts one new call per
        turn, so a turn that takes in several keeps reads and heartbeats waiting
        behind all of them."""
        self.service.check_started()
        self.service.check_copy_chunk(request.sender, request.ring_stamp, request.token)
        async with self.one_chunk:
            # A full copy and a delta of one seq are two checkpoints.
            held, whole = self.chunks.add(
                request.sender, request.token,
                (request.checkpoint_seq, request.base_seq, request.full), request.chunk,
                request.chunks, await unpack_chunk(data), time.monotonic(),
                tail=request.watermarks if request.chunk == request.chunks else None)
            # The chunk that completed the range need not be its last one. Held to the
            # next turn after each step: the next chunk waits.
            steps = self.chunks.filling(request.sender, request.token, FILL_STEP) \
                if whole is None else fill(whole.states, whole.parts, FILL_STEP)
            for _ in steps:
                await asyncio.sleep(0)
        if whole is None:
            return held, None
        if not isinstance(whole.tail, bytes):       # the last chunk's watermarks
            raise InvalidArgument(f"chunks of token {request.token} completed without "
                                  f"their watermarks")
        return held, (received(whole.states), whole.tail)

    def _reply(self, accepted: bool, detail: str) -> floe_pb2.HandoffReply:
        return floe_pb2.HandoffReply(accepted=accepted, detail=detail,
                                     ring_version=self.service.ring.version)

    async def _handoff(self, context, moves: dict[int, str], timeout: float):
        try:
            h = await self.service.hand_off(moves, timeout)
        except FloeError as exc:
            await abort(context, exc)
        return self._reply(h.state == HandoffState.COMMITTED, h.reason)

    async def Move(self, request, context):
        return await self._handoff(context, {int(t): request.target for t in request.tokens},
                                   request.timeout)

    async def Split(self, request, context):
        try:
            head, tail = await self.service.split(request.at)
        except FloeError as exc:
            await abort(context, exc)
        if not request.target:
            return self._reply(True, f"split at {head:#x}: tail token {tail:#x}")
        return await self._handoff(context, {tail: request.target}, request.timeout)

    async def Leave(self, request, context):
        try:
            await self.service.leave(request.timeout)
        except FloeError as exc:
            await abort(context, exc)
        return self._reply(True, "left the ring")

    async def RequestShed(self, request, context):
        who = peer_identity(context)
        shed = await self.service.shed(request.sender, request.depth, who[1] if who else "")
        return self._reply(shed.moved, shed.detail)


class QueryPlane(floe_pb2_grpc.QueryPlaneServicer):
    def __init__(self, service: NodeService) -> None:
        self.service = service

    async def Get(self, request, context):
        try:
            found, state, version = self.service.get(unpack(request.key))
        except FloeError as exc:
            await abort(context, exc)
        return floe_pb2.GetReply(found=found, state=pack(state) if found else b"",
                                 ring_version=version)

    async def Top(self, request, context):
        try:
            return floe_pb2.TopReply(entries=pack(await self.service.top(request.k)))
        except FloeError as exc:
            await abort(context, exc)

    async def Scan(self, request, context):
        """Chunks of at most the keys asked for and CHUNK_BYTES bytes, each encoded
        once the reader took the one before: a reader that stops reading holds one
        range's copy and a chunk, and is cut off after SCAN_STALL seconds."""
        try:
            chunk = self.service.scan_chunk(request.chunk)
            scan = self.service.open_scan(request.ring_stamp, _caller(context), chunk)
        except FloeError as exc:
            await abort(context, exc)
        marks = msgpack.packb(scan.marks) if scan.marks else b""
        epoch = scan.epoch

        def reply(entries: bytes) -> floe_pb2.ScanChunk:
            nonlocal marks, epoch       # the first chunk, even with no keys, has them
            out = floe_pb2.ScanChunk(entries=entries, fold_epoch=epoch, fold_marks=marks)
            marks, epoch = b"", 0
            return out
        await _stream(context, scan, reply)

    async def Stats(self, request, context):
        return floe_pb2.NodeStats(**self.service.stats())

    async def InspectRange(self, request, context):
        try:
            role, chunks = await self.service.inspect_range(request.token, _caller(context))
        except FloeError as exc:
            await abort(context, exc)
        await _stream(context, chunks,
                      lambda entries: floe_pb2.RangeState(role=role, entries=entries))


def _caller(context) -> str:
    """Who is asking, as scans are counted: a certificate's identity, else (in the
    clear, on loopback) the connection."""
    who = peer_identity(context)
    return "/".join(who) if who else context.peer()


async def _stream(context, scan, reply) -> None:
    """Write reply(entries) for each chunk of `scan` (service.ScanRun), each once the
    reader took the one before, then close it; a reader that takes none for
    SCAN_STALL seconds is cut off."""
    try:
        for _, entries in scan.chunks:
            try:
                await asyncio.wait_for(context.write(reply(entries)), SCAN_STALL)
            except asyncio.TimeoutError:
                raise Unavailable(f"the reader took no chunk for {SCAN_STALL}s: cut "
                                  f"off") from None
    except FloeError as exc:
        await abort(context, exc)
    finally:
        scan.close()


def message_bytes(config) -> int:
    """The largest message a node takes: a Push request (batches packed up to about
    2 MiB, the last up to --max-batch-bytes), a chunk of state (1 MiB, or one entry
    alone: a key and state up to this size still move) or a ring view; gRPC refuses
    a larger one from its header. Two batches, at least 8 MiB, never over
    `max_message_bytes`. It sends none larger either (gRPC's send limit): its peers'
    channels take this much, clients' channels.MESSAGE_LIMIT (this, by default)."""
    return min(config.max_message_bytes, max(MESSAGE_LIMIT, 2 * config.max_batch_bytes))


STREAM_WINDOW = 64 << 10     # bytes a call's stream takes in before its request is read


def flow_options() -> list[tuple[str, int]]:
    """HTTP/2 settings that keep a request gRPC has not been asked to read out of the
    node (docs/security.md, *Bytes of requests in flight*): each stream's initial
    window is STREAM_WINDOW, not grown by BDP probing (which opens it to 4 MiB per
    stream when memory is plentiful, so a request arrives whole before any handler
    asks for it); a stream's window opens to its message only once its call is
    admitted and reads it (node.transport.intercept.read_inside). No per-connection
    stream limit (SETTINGS_MAX_CONCURRENT_STREAMS): gRPC clients open a new stream as
    soon as they see one end, before the server has let it go, so a busy connection
    at the limit has streams refused (UNAVAILABLE, not retried); the call slots
    bound the calls of a connection instead."""
    return [("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", STREAM_WINDOW)]


def with_request_budget_stats(runtime: NodeRuntime, requests: RequestBytes | Budgets
                              ) -> None:
    """The node's stats (NodeStats, `floe status --json`, the metrics) also say what
    its budgets of request bytes did: calls refused and waiting, bytes held."""
    base = runtime.stats
    runtime.stats = lambda: dict(base(), **requests.stats())    # type: ignore[method-assign]


def add_data_plane(plane: DataPlane, server: grpc.aio.Server) -> None:
    """floe_pb2_grpc.add_DataPlaneServicer_to_server, but a Push stream's messages
    reach its handler as their wire bytes: their size is known without re-encoding
    them, and each is parsed only once it has room (DataPlane._take)."""
    handlers = {"Push": grpc.stream_stream_rpc_method_handler(
        plane.Push, request_deserializer=None,
        response_serializer=floe_pb2.PushReply.SerializeToString)}
    name = floe_pb2.DESCRIPTOR.services_by_name["DataPlane"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


async def start_server(runtime: NodeRuntime, metrics: NodeMetrics | None = None
                       ) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int]:
    """Serve on runtime.config.listen; returns (server, health, bound port). With
    `metrics`, every call's duration is observed, refused ones included."""
    service = NodeService(runtime)
    config = runtime.config
    tls = node_tls(config)
    interceptors = [metrics.rpc_timer] if metrics else []
    budgets = Budgets(message_bytes(config), total=config.max_request_bytes or None,
                      wait=config.request_wait, push_total=config.max_inbound_bytes)
    with_request_budget_stats(runtime, budgets)
    interceptors.append(CallLimiter(config.max_concurrent_rpcs, budgets.callers,
                                    budgets.members))
    if tls:
        interceptors.append(Authorizer())
    claim_port(config.listen)       # a port another process holds: one clear line
    server = grpc.aio.server(options=[*channel_options(message_bytes(config)),
                                      *SERVER_OPTIONS,          # the port is ours alone
                                      *flow_options()],
                             interceptors=interceptors)
    add_data_plane(DataPlane(service, budgets.pushes, budgets.reading), server)
    floe_pb2_grpc.add_ControlPlaneServicer_to_server(ControlPlane(service), server)
    floe_pb2_grpc.add_QueryPlaneServicer_to_server(QueryPlane(service), server)
    floe_pb2_grpc.add_SnapshotsServicer_to_server(Snapshots(service), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    # Tools (grpcurl, grpcui) list and call the services without the .proto files.
    reflection.enable_server_reflection(
        (*FLOE_SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    try:
        port = (server.add_secure_port(config.listen, tls.server_credentials()) if tls
                else server.add_insecure_port(config.listen))
    except RuntimeError:            # bound meanwhile, or an address it cannot bind
        claim_port(config.listen)
        raise OSError(f"cannot bind {runtime.config.listen}") from None
    if port == 0:
        raise OSError(f"cannot bind {runtime.config.listen}")
    await server.start()
    # SERVING once the node has joined the ring (node.app.start_node): until then it
    # answers nothing but its ring to starting peers.
    await set_health(health, False)
    return server, health, port
