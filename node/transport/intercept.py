"""Server interceptors' plumbing: a handler run inside a per-call context, and the
bound on calls served at once."""

from __future__ import annotations

import contextlib
import inspect
import logging
import time

import grpc

from floering.node.core.errors import Busy
from floering.node.core.slots import CallSlots, ViewRate, kind_of, peer_host
from floering.node.transport.status import abort

log = logging.getLogger("floe.node")
REPORT_EVERY = 10.0         # seconds between two log lines of ring views refused


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
            async with enter(None, context):
                async for reply in handler.stream_stream(requests, context):
                    yield reply
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer)

    async def stream_unary(requests, context):
        async with enter(None, context):
            return await handler.stream_unary(requests, context)
    return grpc.stream_unary_rpc_method_handler(
        stream_unary, handler.request_deserializer, handler.response_serializer)


class CallLimiter(grpc.aio.ServerInterceptor):
    """Refuses a call, RESOURCE_EXHAUSTED (`Busy`, which clients retry), past its share
    of the `limit` calls served at once (node.core.slots: reserved slots for members,
    health checks and operators; a quarter of the limit per caller identity, in the
    clear its host, and per connection). A stream holds its slot until it ends."""

    def __init__(self, limit: int) -> None:
        # (node.transport.tls imports this module: its names are taken here)
        from floering.node.transport.tls import NODE_ONLY, peer_identity
        self.limit = limit
        self.slots = CallSlots(limit)
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

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        node_only = method in self._node_only
        peer_identity, slots = self._identity, self.slots
        pushes_view = method == "ExchangeRing"

        @contextlib.asynccontextmanager
        async def slot(request, context):
            connection = context.peer() or "?"
            who = peer_identity(context)
            if who is None:
                # in the clear a caller is its host: a new connection is not a new caller
                kind, identity = kind_of(None, method, node_only), peer_host(connection)
            else:
                kind, identity = kind_of(who[0], method, node_only), f"{who[0]}:{who[1]}"
            try:
                if pushes_view and who is not None:
                    self._take_view(identity, len(request.ring))
                ticket = slots.take(kind, identity, connection)
            except Busy as exc:
                await abort(context, exc)
            try:
                yield
            finally:
                slots.give(ticket)

        return around(handler, slot)

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
