"""/metrics is bounded: no thread per connection, a cap on connections, a deadline to
send a request. A flood of idle connections to a real node process neither grows its
threads nor keeps an honest scrape from being answered."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Gauge

from floering.node.transport.metrics import MetricsServer
from tests.support.metrics_bounds_shared import HOST


def test_the_server_caps_connections_times_out_idle_ones_and_answers_only_get():
    async def run():
        registry = CollectorRegistry()
        Gauge("probe_value", "a value", registry=registry).set(7)
        server = MetricsServer(registry, max_connections=4, read_timeout=0.5)
        await server.start(HOST, 0)
        try:
            async def ask(request: bytes) -> bytes:
                reader, writer = await asyncio.open_connection(HOST, server.port)
                writer.write(request)
                answer = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                return answer
            assert b"probe_value 7.0" in await ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await ask(b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
            assert (await ask(b"GET /x HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
            assert await ask(b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n") == b""
            # idle ones: never more than the cap open; an honest scrape evicts one
            seen = server.accepted
            idle = [await asyncio.open_connection(HOST, server.port) for _ in range(10)]
            deadline = time.monotonic() + 5
            while server.accepted < seen + 10:
                assert time.monotonic() < deadline, server.accepted
                await asyncio.sleep(0.01)
            assert len(server._open) == 4
            assert b"probe_value 7.0" in await ask(b"GET / HTTP/1.1\r\n\r\n")
            assert len(server._open) <= 4 and server.refused == 0
            # and the idle ones are closed by the read deadline, unanswered
            started = time.monotonic()
            for reader, writer in idle:
                try:
                    assert await asyncio.wait_for(reader.read(), 5) == b""
                except ConnectionResetError:
                    pass                       # one evicted for a newer connection
                writer.close()
            assert time.monotonic() - started < 2.0
            assert not server._open
        finally:
            server.close()
    asyncio.run(run())
