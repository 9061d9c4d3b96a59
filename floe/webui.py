"""`floe ui`: one page showing the ring live, served on the loopback by default.

    GET /              the page (floe/data/ui.html: plain HTML, inline JS and SVG)
    GET /api/state     the newest snapshot, JSON (floe/webui_state.py says what is in it)
    GET /api/stream    server-sent events: every snapshot as it is made

Everything runs on one event loop, no thread at all: a `Watcher` polls the ring (one
round at a time), and a small HTTP/1.1 server answers, bounded like a node's metrics
endpoint: at most MAX_CONNECTIONS open at once (streams included; one more is answered
503), a request head of at most MAX_HEAD bytes sent within READ_TIMEOUT, one request
per connection, and a stream whose reader falls MAX_BUFFERED bytes behind is closed.
On the loopback, only requests naming it in their Host header are answered (421
otherwise): a web site whose name is made to resolve to 127.0.0.1 cannot read the ring
through its visitor's browser.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import sys
from pathlib import Path

from floering.floe.webui_state import Watcher

PAGE = Path(__file__).resolve().parent / "data" / "ui.html"
DEFAULT_PORT = 8470
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_CONNECTIONS = 32
MAX_HEAD = 8192
READ_TIMEOUT = 5.0
MAX_BUFFERED = 1 << 20
KEEPALIVE = 15.0            # seconds between two messages of a stream, at most


def _answer(status: str, body: bytes = b"", content_type: str = "text/plain") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            f"X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n").encode() + body


def _host(head: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return value.strip().lower()
    return b""


class UiServer:
    """The page, its snapshot and its stream, on the running loop."""

    def __init__(self, watcher: Watcher, page: bytes,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.watcher, self.page, self.max_connections = watcher, page, max_connections
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.refused = 0
        # Host headers answered (None: any); on the loopback only its own names, so a
        # site whose name resolves to 127.0.0.1 cannot read the ring from a browser.
        self.hosts: set[bytes] | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        if host in LOOPBACK:                 # our own names only (see `hosts`)
            self.hosts = {f"{name}:{self.port}".encode() for name in
                          ("127.0.0.1", "localhost", "[::1]")}

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the page is not served yet: start() first")
        return self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if len(self._open) >= self.max_connections:
                self.refused += 1
                writer.write(_answer("503 Service Unavailable", b"too many connections\n"))
                await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
                return
            self._open.add(writer)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            method, _, rest = head.split(b"\r\n", 1)[0].partition(b" ")
            path = rest.partition(b" ")[0].partition(b"?")[0]
            if self.hosts is not None and _host(head) not in self.hosts:
                writer.write(_answer("421 Misdirected Request", b"unknown host\n"))
            elif method != b"GET":
                writer.write(_answer("405 Method Not Allowed"))
            elif path == b"/api/stream":
                await self._stream(reader, writer)
                return
            else:
                writer.write(self._reply(path))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass                             # slow, cut short, too long: closed unanswered
        finally:
            self._open.discard(writer)
            writer.close()

    def _reply(self, path: bytes) -> bytes:
        if path in (b"/", b"/index.html"):
            return _answer("200 OK", self.page, "text/html; charset=utf-8")
        if path == b"/api/state":
            return _answer("200 OK", self.watcher.body, "application/json")
        return _answer("404 Not Found", b"not found\n")

    async def _stream(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Every snapshot as it is made, until the reader hangs up (or falls behind)."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
                     b"retry: 1000\n\n")
        seq = 0
        gone = asyncio.ensure_future(reader.read(MAX_HEAD))    # EOF: the reader left
        try:
            while True:
                newer = asyncio.ensure_future(self.watcher.wait_newer(seq, KEEPALIVE))
                await asyncio.wait([newer, gone], return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    newer.cancel()
                    return
                if newer.result():
                    seq = self.watcher.seq
                    writer.write(b"data: " + self.watcher.body + b"\n\n")
                else:
                    writer.write(b": keepalive\n\n")
                if writer.transport.get_write_buffer_size() > MAX_BUFFERED:
                    return                   # a reader this far behind: let it reconnect
                await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        finally:
            gone.cancel()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()


async def serve(watcher: Watcher, host: str, port: int, ready=None) -> None:
    """Poll and serve until cancelled (SIGINT or SIGTERM stop it quietly)."""
    server = UiServer(watcher, PAGE.read_bytes())
    try:
        await server.start(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OSError(f"port {port} on {host} is in use: pick another --port (0: any "
                          f"free port)") from None
        raise
    poller = asyncio.ensure_future(watcher.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    print(f"floe ui: http://{shown}:{server.port}/ (Ctrl-C stops it)", flush=True)
    if ready is not None:
        ready(server)
    try:
        done, _ = await asyncio.wait([poller, asyncio.ensure_future(stop.wait())],
                                     return_when=asyncio.FIRST_COMPLETED)
        if poller in done:
            poller.result()                  # a bug in the poller: raise it
    finally:
        server.close()
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def add_ui_command(sub, seeds, tls) -> None:
    """`floe ui`; `seeds(args)` and `tls(args, name)` as the other commands find the
    ring and credentials (the client's are enough: the page only reads)."""
    def cmd_ui(args) -> int:
        recorded = None if args.ring or not Path(args.cluster_file).exists() \
            else args.cluster_file
        if args.interval <= 0:
            raise ValueError(f"--interval must be above 0, not {args.interval}")
        if args.host not in LOOPBACK:
            print(f"floe ui: serving on {args.host}: anyone who reaches it sees the "
                  f"ring (no authentication)", file=sys.stderr)
        watcher = Watcher(seeds(args), tls(args, "client"), recorded,
                          interval=args.interval, timeout=min(args.timeout, 5.0))
        asyncio.run(serve(watcher, args.host, args.port))
        return 0

    ui = sub.add_parser("ui", help="serve a live page of the ring: ranges by owner, "
                                   "members, a timeline (loopback only by default)")
    ui.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help=f"the page's port (default: {DEFAULT_PORT}; 0: any free port, "
                         f"printed)")
    ui.add_argument("--host", default="127.0.0.1",
                    help="the address to serve on (default: 127.0.0.1); another than the "
                         "loopback lets anyone who reaches it see the ring")
    ui.add_argument("--interval", type=float, default=0.5,
                    help="seconds between two reads of the ring")
    ui.set_defaults(func=cmd_ui)
