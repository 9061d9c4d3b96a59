"""Server interceptors' plumbing: a handler run inside a per-call context, and the
bounds on calls served at once and on the bytes of their requests read at once."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import time
import traceback

import grpc

from floering.wire.errors import Busy, FloeError, Overloaded
from floering.node.core.slots import MEMBER, CallSlots, ViewRate, kind_of, peer_host
from floering.node.transport.budget import RequestBytes
from floering.wire.status import abort

log = logging.getLogger("floe.node")
REPORT_EVERY = 10.0         # seconds between two log lines of ring views refused
# The identity of the caller a call is served for (set once the call is admitted):
# a Push stream's messages are counted against it (node.transport.server).
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("floe_caller", default="?")


def around(handler, enter):
    """`handler` with each call run inside `enter(request, context)`, an async context
    manager (`request` is None when the call streams its requests)."""
    if handler.unary_unary:
        async def unary_unary(request, context):
            async with enter(request, context):
                return await handler.unary_unary(request, context)
        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream:
        async def unary_stream(request, context):
            async with enter(request, context):
                replies = handler.unary_stream(request, context)
                if inspect.isasyncgen(replies):
                    async for reply in replies:
                        yield reply
                else:                      # a handler that writes with context.write
                    await replies
        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer)
    if handler.stream_stream:
        async def stream_stream(requests, context):
            try:
                async with enter(None, context):
                    async for reply in handler.stream_stream(requests, context):
                        yield reply
            except BaseException as exc:
                # a refused Push stream's error holds the frames that held its
                # messages (let_go): let them go now, not at the next collection
                let_go(exc)
                raise
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer)

    async def stream_unary(requests, context):
        try:
            async with enter(None, context):
                return await handler.stream_unary(requests, context)
        except BaseException as exc:
            let_go(exc)
            raise
    return grpc.stream_unary_rpc_method_handler(
        stream_unary, handler.request_deserializer, handler.response_serializer)


def let_go(exc: BaseException) -> None:
    """The locals of the finished frames `exc`'s traceback holds dropped (and those
    of the errors it arose from). An aborted call's error is kept by gRPC's state of
    the call, which the handler's frames (in the traceback) hold in turn: a cycle
    that only the garbage collector frees, and it runs by counts of objects, not
    bytes, so the requests those frames and errors hold (up to a message each) pile
    up between its runs: 200 refused calls of 7 MiB on one connection kept a node's
    RSS above 1 GiB after they had all ended."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:     # and the errors it arose from
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
    if isinstance(exc, grpc.aio.AbortError):
        # the status is sent: what the refusal arose from (which may hold the
        # request's bytes, as msgpack's ExtraData does) is of no more use
        exc.__cause__ = exc.__context__ = None


def read_inside(handler, admit, read):
    """`handler`, whose request is one message, served as one whose requests stream,
    so that gRPC reads the request only once the call is admitted: each call runs
    inside `admit(context)`, an async context manager whose value `read(held,
    request, size)` is told the request and its size once read. Without this gRPC
    reads a unary call's request before any handler or interceptor sees the call."""
    deserialize = handler.request_deserializer

    def sized(raw: bytes):
        return len(raw), (raw if deserialize is None else deserialize(raw))

    async def first(requests, context, held):
        # gRPC's reader is an async generator that would keep the message it last
        # gave (see let_go): closed once it gave the request.
        reader = requests.__aiter__()
        try:
            async for size, request in reader:
                try:
                    read(held, request, size)
                except FloeError as exc:
                    await abort(context, exc)
                return request
        finally:
            await reader.aclose()
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")

    if handler.unary_unary:
        async def stream_unary(requests, context):
            request = None
            try:
                async with admit(context) as held:
                    request = await first(requests, context, held)
                    return await handler.unary_unary(request, context)
            except BaseException as exc:
                request = None
                let_go(exc)
                raise
        return grpc.stream_unary_rpc_method_handler(stream_unary, sized,
                                                    handler.response_serializer)

    async def stream_stream(requests, context):
        request = replies = None
        try:
            async with admit(context) as held:
                request = await first(requests, context, held)
                replies = handler.unary_stream(request, context)
                if inspect.isasyncgen(replies):
                    async for reply in replies:
                        yield reply
                else:                      # a handler that writes with context.write
                    await replies
        except BaseException as exc:
            request = replies = None
            let_go(exc)
            raise
    return grpc.stream_stream_rpc_method_handler(stream_stream, sized,
                                                 handler.response_serializer)


class CallLimiter(grpc.aio.ServerInterceptor):
    """Refuses a call, RESOURCE_EXHAUSTED (`Busy`, which clients retry), past its share
    of the `limit` calls served at once (node.core.slots: reserved slots for members,
    health checks and operators; a quarter of the limit per caller identity, in the
    clear its host, and per connection). A stream holds its slot until it ends.

    A call whose request is one message is admitted before gRPC reads it: its slot
    taken, then room for its request in `inbound` (node.transport.budget.RequestBytes),
    or for a member's in `members` (a budget of its own), so one caller cannot make
    the node read more requests at once than its share of bytes. A stream's caller
    identity is told to its handler (CALLER)."""

    def __init__(self, limit: int, inbound: RequestBytes | None = None,
                 members: RequestBytes | None = None) -> None:
        # (node.transport.tls imports this module: its names are taken here)
        from floering.node.transport.tls import NODE_ONLY, peer_identity
        self.limit = limit
        self.slots = CallSlots(limit)
        self.inbound, self.members = inbound, members
        self.views = ViewRate()           # ring views pushed, per caller identity
        self._reported = -REPORT_EVERY
        self._node_only, self._identity = NODE_ONLY, peer_identity

    @property
    def refused(self) -> int:
        """Calls refused Busy so far: past a bound of slots, or of views pushed."""
        return self.slots.refused + self.views.refused

    @property
    def active(self) -> int:
        return self.slots.active

    def _caller(self, context, method: str, node_only: bool) -> tuple[str, str, bool]:
        """(kind of call, caller identity, whether its certificate says who it is)."""
        who = self._identity(context)
        if who is None:
            # in the clear a caller is its host: a new connection is not a new caller
            return kind_of(None, method, node_only), peer_host(context.peer() or "?"), False
        return kind_of(who[0], method, node_only), f"{who[0]}:{who[1]}", True

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        node_only = method in self._node_only
        slots, inbound, members = self.slots, self.inbound, self.members
        pushes_view = method == "ExchangeRing"

        @contextlib.asynccontextmanager
        async def admit(context, reads: bool = True):
            kind, identity, named = self._caller(context, method, node_only)
            try:
                ticket = slots.take(kind, identity, context.peer() or "?")
            except Busy as exc:
                await abort(context, exc)
            CALLER.set(identity)
            budget = members if kind == MEMBER else inbound
            held = None
            try:
                if reads and budget is not None:
                    try:
                        held = await budget.reserve(identity)
                    except Overloaded as exc:
                        await abort(context, exc)
                yield (identity, named, budget, held)
            finally:
                if held is not None:
                    budget.release(held)
                slots.give(ticket)

        def read(admitted, request, size: int) -> None:
            identity, named, budget, held = admitted
            if held is not None:
                budget.keep(held, size)
            if pushes_view and named:
                self._take_view(identity, len(request.ring))

        if handler.request_streaming:
            @contextlib.asynccontextmanager
            async def slot(request, context):
                # a stream's requests are bounded by its handler (Push: its window
                # and the pushes' budget per message), not here: an idle stream
                # must not hold room
                async with admit(context, reads=False):
                    yield
            return around(handler, slot)

        return read_inside(handler, admit, read)

    def _take_view(self, identity: str, size: int) -> None:
        now = time.monotonic()
        try:
            self.views.take(identity, now, size)
        except Busy as exc:
            if now - self._reported >= REPORT_EVERY:
                self._reported = now
                log.warning("ring views refused: %s (%d refused so far)", exc,
                            self.views.refused)
            raise
