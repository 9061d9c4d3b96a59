"""A node bound to every interface (0.0.0.0) advertises the address peers and clients
dial: the ring records that address, founding or joining, and traffic reaches it there."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from floering.floe.cluster import _free_ports, node_env, serving
from floering.mapper import RingClient
from floering.wire.tls import TlsFiles
from floering.node.transport.tls import generate

WORDS = ("the quick brown fox jumps over the lazy dog and the dog sleeps " * 20).split()
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "localhost")


def start(tmp_path: Path, node_id: str, args: list[str]) -> subprocess.Popen:
    with open(tmp_path / f"{node_id}.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "floering.node", "--node-id", node_id,
                                 "--replication", "1", "--tls-dir", str(tmp_path / "tls"),
                                 "--startup-grace", "2", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=node_env(),
                                stdin=subprocess.DEVNULL)


def wait_serving(process, address: str, tls: TlsFiles, log: Path) -> None:
    deadline = time.monotonic() + 60
    while not serving(address, tls):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"not serving: {log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.multiprocess
def test_a_node_on_every_interface_is_reached_at_its_advertised_address(tmp_path):
    p0, p1, p2 = _free_ports("127.0.0.1", 3, None)
    a0, a1, a2 = f"127.0.0.1:{p0}", f"127.0.0.2:{p1}", f"127.0.0.3:{p2}"
    generate(tmp_path / "tls", ["n0", "n1", "n2"], hosts=HOSTS)
    tls = TlsFiles.in_dir(tmp_path / "tls", "client")
    peers = f"n0={a0},n1={a1}"
    procs = {}
    try:
        procs["n0"] = start(tmp_path, "n0", ["--listen", a0, "--peers", peers])
        procs["n1"] = start(tmp_path, "n1", ["--listen", f"0.0.0.0:{p1}", "--advertise", a1,
                                             "--peers", peers])
        wait_serving(procs["n0"], a0, tls, tmp_path / "n0.log")
        wait_serving(procs["n1"], a1, tls, tmp_path / "n1.log")
        # a joiner on every interface too: it publishes --advertise, not --listen
        procs["n2"] = start(tmp_path, "n2", ["--listen", f"0.0.0.0:{p2}", "--advertise", a2,
                                             "--peers", f"n2={a2}", "--join", a0])
        wait_serving(procs["n2"], a2, tls, tmp_path / "n2.log")
        with RingClient([a0], tls=tls) as client:
            ring = client.ring
            assert {n: ring.address(n) for n in ring.nodes} == {"n0": a0, "n1": a1, "n2": a2}
            assert set(ring.tokens_of("n1"))                    # n1 serves ranges
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == Counter(WORDS)
        # a client that knows only the advertised address of the wildcard node
        with RingClient([a1], tls=tls) as client:
            assert client.ring.address("n1") == a1
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == Counter(WORDS * 2)
        # n1's replica (n0) reached it at 127.0.0.2: killed, it is declared dead and
        # its ranges are taken over with every count
        procs["n1"].send_signal(signal.SIGKILL)
        procs["n1"].wait()
        deadline = time.monotonic() + 30
        while True:
            with RingClient([a0], tls=tls) as client:
                if "n1" not in client.ring.nodes:
                    assert dict(client.scan()) == Counter(WORDS * 2)
                    break
            assert time.monotonic() < deadline, (tmp_path / "n0.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for process in procs.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
