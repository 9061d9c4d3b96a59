"""/metrics is bounded: no thread per connection, a cap on connections, a deadline to send a
request. A flood of idle connections to a real node process neither grows its threads nor
keeps an honest scrape from being answered.

The tests here start real node processes; the in-process ones are in
tests/unit/test_metrics_bounds.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from floering.floe.cluster import node_env
from tests.support.helpers import wait_for
from tests.support.metrics_bounds_shared import HOST


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
