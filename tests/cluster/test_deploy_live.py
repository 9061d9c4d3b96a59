"""The systemd unit and the example node settings in deploy/systemd: valid for systemd and for
the node, and a restart the way the unit does it (its KillSignal, then its ExecStart again
on the same data directory) brings the node back as the same member with every acknowledged
count.

The tests here start real node processes; the in-process ones are in
tests/unit/test_deploy.py.
"""

from __future__ import annotations

import shlex
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
from tests.support.deploy_shared import EXAMPLE, PYTHON, unit


WORDS = "in the beginning god created the heaven and the earth and the earth".split()


def exec_start(instance: str, config_path: Path) -> list[str]:
    """The unit's ExecStart for `instance`, run by this interpreter on `config_path`."""
    line = unit()["Service"]["ExecStart"].replace("%i", instance)
    argv = shlex.split(line)
    assert argv[:3] == [PYTHON, "-m", "floering.node"], argv    # the node's own entry
    argv[0] = sys.executable
    at = argv.index("--config")
    assert argv[at + 1] == f"/etc/floe-ring/{instance}.toml", argv
    argv[at + 1] = str(config_path)
    return argv


def node_settings(tmp_path: Path, node_id: str, addresses: dict, tls_dir: Path) -> Path:
    """The example's settings for `node_id` of a ring on loopback."""
    settings = EXAMPLE.read_text()
    peers = ",".join(f"{n}={a}" for n, a in addresses.items())
    for old, new in (('node_id = "n0"', f'node_id = "{node_id}"'),
                     ("n0=10.0.0.1:7000,n1=10.0.0.2:7000,n2=10.0.0.3:7000", peers),
                     ("10.0.0.1:7000", addresses[node_id]),
                     ("/var/lib/floe-ring/n0", str(tmp_path / "data" / node_id)),
                     ("/etc/floe-ring/tls", str(tls_dir))):
        assert old in settings, old
        settings = settings.replace(old, new)
    path = tmp_path / f"{node_id}.toml"
    path.write_text(settings)
    return path


def start_unit(tmp_path: Path, node_id: str, run: int) -> subprocess.Popen:
    with open(tmp_path / f"{node_id}.{run}.log", "w") as log:
        return subprocess.Popen(exec_start(node_id, tmp_path / f"{node_id}.toml"),
                                stdout=log, stderr=subprocess.STDOUT, env=node_env(),
                                cwd=tmp_path)


def stop_unit(process: subprocess.Popen) -> int:
    """What systemd does on stop: the unit's KillSignal, then up to TimeoutStopSec."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=float(unit()["Service"]["TimeoutStopSec"]))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def wait_serving(process, address: str, tls: TlsFiles, log: Path) -> None:
    deadline = time.monotonic() + 60
    while not serving(address, tls):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"not serving: {log.read_text()[-2000:]}"
        time.sleep(0.1)


@pytest.mark.multiprocess
def test_a_restart_as_the_unit_does_it_hands_over_first_and_loses_nothing(tmp_path):
    ports = _free_ports("127.0.0.1", 2, None)
    addresses = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    tls_dir = generate(tmp_path / "tls", list(addresses))
    for node_id in addresses:
        node_settings(tmp_path, node_id, addresses, tls_dir)
    client_tls = TlsFiles.in_dir(tls_dir, "client")
    processes = {n: start_unit(tmp_path, n, 0) for n in addresses}
    try:
        for n, process in processes.items():
            wait_serving(process, addresses[n], client_tls, tmp_path / f"{n}.0.log")
        with RingClient(list(addresses.values()), tls=client_tls) as client:
            client.emit_many(WORDS)
            client.flush()
            assert set(client.ring.tokens_of("n0"))          # n0 owns ranges
        code = stop_unit(processes["n0"])                    # systemctl restart: stop...
        assert code == 0, (tmp_path / "n0.0.log").read_text()   # a clean stop
        assert "n0 left the ring" in (tmp_path / "n0.0.log").read_text()
        with RingClient([addresses["n1"]], tls=client_tls) as client:
            assert "n0" not in client.ring.nodes             # its ranges were handed over
            assert dict(client.scan()) == Counter(WORDS)     # before it exited
        processes["n0"] = start_unit(tmp_path, "n0", 1)      # ... and start
        wait_serving(processes["n0"], addresses["n0"], client_tls, tmp_path / "n0.1.log")
        with RingClient(list(addresses.values()), tls=client_tls) as client:
            assert any(n.startswith("n0#") for n in client.ring.nodes), client.ring.nodes
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == Counter(WORDS * 2)
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_unit(process)
