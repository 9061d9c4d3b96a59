"""Server interceptors' plumbing: a handler run inside a per-call context, and the
bound on calls served at once."""

from __future__ import annotations

import contextlib
import inspect

import grpc

from floering.node.core.errors import TooLarge
from floering.node.transport.status import abort


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
    """Refuses a call, RESOURCE_EXHAUSTED naming the flag, while `limit` calls are
    being served (a stream counts until it ends)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        return None if handler is None else around(handler, self._slot)

    @contextlib.asynccontextmanager
    async def _slot(self, request, context):
        if self.active >= self.limit:
            await abort(context, TooLarge(f"{self.limit} calls are being served, the most "
                                          f"at once (--max-concurrent-rpcs)"))
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
