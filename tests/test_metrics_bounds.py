"""/metrics is bounded: no thread per connection, a cap on connections, a deadline to
send a request. A flood of idle connections to a real node process neither grows its
threads nor keeps an honest scrape from being answered."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from prometheus_client import CollectorRegistry, Gauge

from floering.floe.cluster import node_env
from floering.node.transport.metrics import MetricsServer
from tests.helpers import wait_for

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def scrape(port: int, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.fixture
def node(tmp_path):
    port, metrics = free_port(), free_port()
    log = tmp_path / "n0.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "floering.node", "--node-id", "n0", "--listen",
             f"{HOST}:{port}", "--peers", f"n0={HOST}:{port}", "--replication", "0",
             "--insecure", "--metrics-port", str(metrics)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=node_env())
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return scrape(metrics, 1)[0] == 200
            except OSError:
                return False
        wait_for(up, 30, "the node's /metrics")
        yield proc, metrics
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.multiprocess
def test_a_flood_of_idle_connections_grows_no_threads_and_a_scrape_is_answered(node):
    proc, port = node
    watched = psutil.Process(proc.pid)
    before = watched.num_threads()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection((HOST, port), timeout=5))
        # every one accepted by now (the server answers those beyond its cap at once)
        started = time.monotonic()
        status, text = scrape(port)
        took = time.monotonic() - started
        threads = watched.num_threads()
    finally:
        for s in idle:
            s.close()
    assert threads <= before + 1, (before, threads)
    assert status in (200, 503) and took < 2.0, (status, took)
    if status == 200:
        assert 'floe_node_info{address="' in text and "floe_serving 1.0" in text
    wait_for(lambda: scrape(port)[0] == 200, 10, "an answer once the flood is gone")
    assert watched.num_threads() <= before + 1


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
