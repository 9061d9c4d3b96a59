"""`floe ui` on real processes, seen in a real headless Chromium: a 4-node cluster's
ring and members show; a member SIGKILLed turns dead on the page within 2 s and its
ranges are drawn under other owners. The server's connections are bounded."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request


from tests.support.helpers import ROOT, floe_run, wait_until
from tests.support.webui_shared import stop, until


async def test_the_server_bounds_its_connections_and_answers_the_snapshot():
    from floering.floe.webui import UiServer
    from floering.floe.webui_state import Watcher

    watcher = Watcher(["127.0.0.1:1"], None, None)
    watcher.publish({"t": 1.0, "verdict": "x", "members": [], "ranges": [], "events": []})
    server = UiServer(watcher, b"<html></html>", max_connections=3)
    await server.start("127.0.0.1", 0)
    streams = []
    host = f"Host: 127.0.0.1:{server.port}\r\n".encode()

    async def ask(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)
        try:
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    try:
        # a page of another site whose name resolves to the loopback gets nothing
        assert (await ask(b"GET /api/state HTTP/1.1\r\nHost: evil.example:80\r\n\r\n")
                ).startswith(b"HTTP/1.1 421")
        assert (await ask(b"GET /api/state HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 421")
        assert (await ask(b"POST / HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 405")
        assert (await ask(b"GET /x HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 404")
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /api/stream HTTP/1.1\r\n" + host + b"\r\n")
            streams.append((reader, writer))
        for reader, _ in streams:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert b"text/event-stream" in head
            retry = await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)
            data = await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)
            assert retry == b"retry: 1000\n\n" and data == b"data: " + watcher.body + b"\n\n"
        assert (await ask(b"GET /api/state HTTP/1.1\r\n" + host + b"\r\n")
                ).startswith(b"HTTP/1.1 503")
        streams.pop()[1].close()            # a stream closed by its reader frees its place

        async def served() -> bool:
            return (await ask(b"GET /api/state HTTP/1.1\r\n" + host + b"\r\n")
                    ).startswith(b"HTTP/1.1 200")
        await wait_until(served, 5, "the closed stream's place freed")
        answer = await ask(b"GET /api/state HTTP/1.1\r\n" + host + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(watcher.body)
        page = await ask(b"GET / HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % server.port)
        assert page.startswith(b"HTTP/1.1 200") and page.endswith(b"<html></html>")
    finally:
        for _, writer in streams:
            writer.close()
        server.close()


def test_a_ring_that_does_not_answer_is_said_on_the_page_and_the_server_keeps_polling(
        tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "FLOE_TLS_DIR"}
    ui = subprocess.Popen([sys.executable, "-m", "floering.floe.cli", "ui", "--port", "0",
                           "--ring", f"127.0.0.1:{port}", "--timeout", "1"], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(env, PYTHONPATH=f"{ROOT}:{ROOT / 'proto'}"))
    try:
        url = ui.stdout.readline().split()[2]

        def state():
            with urllib.request.urlopen(url + "api/state", timeout=5) as answer:
                return json.load(answer)
        snap = until(lambda: state().get("verdict"), 20, "a first read")
        assert snap.startswith("UNKNOWN: the ring does not answer")
        first = state()
        assert first["error"] and first["members"] == [] and first["ranges"] == []
        until(lambda: state()["t"] > first["t"], 10, "another read")
    finally:
        stop(ui)
    assert ui.returncode == 0, ui.stderr.read()


def test_a_busy_port_is_one_line_naming_it(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = floe_run(tmp_path, "ui", "--ring", "127.0.0.1:1", "--port", str(port))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"floe ui: port {port} on 127.0.0.1 is in use: pick another "
                           f"--port (0: any free port)\n")
