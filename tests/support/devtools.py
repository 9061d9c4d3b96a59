"""A headless Chromium driven through its DevTools protocol, for the tests of the web
page: the browser is started here and stopped here by its PID (its own child
processes too), and spoken to over a small WebSocket client (RFC 6455: text frames,
masked from the client; enough for DevTools' JSON messages)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import psutil


def chromium() -> str | None:
    """The chromium binary (Debian's `chromium` package), if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class WebSocket:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parts = urlparse(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the WebSocket handshake")
            head += chunk
        head, _, self._buffer = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(head.decode(errors="replace"))

    def send(self, text: str) -> None:
        payload = text.encode()
        size = len(payload)
        if size < 126:
            header = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the browser closed the WebSocket")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def receive(self) -> str:
        """The next text message (fragments joined; pings answered)."""
        parts = []
        while True:
            first, second = self._read(2)
            opcode, size = first & 0x0F, second & 0x7F
            if size == 126:
                size = struct.unpack("!H", self._read(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(size)
            if opcode == 0x8:
                raise ConnectionError("the browser closed the WebSocket")
            if opcode == 0x9:
                self.sock.sendall(struct.pack("!BB", 0x8A, 0x80) + b"\0\0\0\0")
                continue
            if opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if first & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """Headless Chromium showing one page; `evaluate` runs JavaScript in it."""

    def __init__(self, url: str, profile: Path, timeout: float = 30.0) -> None:
        binary = chromium()
        if binary is None:
            raise RuntimeError("chromium is not installed (scripts/setup.sh installs it)")
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ws: WebSocket | None = None
        self._id = 0
        try:
            self._attach(profile, url, timeout)
        except BaseException:
            self.close()
            raise

    def _attach(self, profile: Path, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        active = profile / "DevToolsActivePort"
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            try:
                port = int(active.read_text().split()[0])
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                            timeout=5) as answer:
                    targets = json.load(answer)
                page = next(t for t in targets if t.get("type") == "page"
                            and t.get("url", "").startswith(url))
                break
            except (OSError, ValueError, IndexError, StopIteration):
                if time.monotonic() > deadline:
                    raise TimeoutError("chromium's DevTools did not come up") from None
                time.sleep(0.1)
        self.ws = WebSocket(page["webSocketDebuggerUrl"])

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        """Stop the browser by its PID, then any of its processes still running."""
        if self.ws is not None:
            self.ws.close()
            self.ws = None
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            family = []
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        _, alive = psutil.wait_procs(family, timeout=5)
        for child in alive:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
