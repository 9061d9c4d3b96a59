"""The operator side trusts nothing on disk: everything `floe up` and its nodes write is
private from birth (directories 0700, files 0600), `floe restart` runs no command and
signals no process a cluster file names unless it is that node of this cluster, node ids
never lead out of the cluster's directory, and no node serves in the clear unless told
--insecure. On a real `floe up` (3 nodes, mutual TLS, durable) and real processes.

The tests here start real node processes; the in-process ones are in
tests/unit/test_private_files.py.
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from floering.floe.cluster import LocalCluster, node_env
from floering.floe.records import start_time
from floering.node.files import exposed
from tests.support.helpers import floe, floe_run, wait_for


WORDS = [a + b + c for a in "floe" for b in "ring" for c in "secretxyz"]


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """A default `floe up` (durable, TLS) of 3 nodes, fed a file; its words' counts."""
    work = tmp_path_factory.mktemp("ring")
    floe(work, "up", "--nodes", "3")
    try:
        rng = random.Random(7)
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(50)) for _ in range(200))
        (work / "secret-source.txt").write_text(text)
        floe(work, "feed", str(work / "secret-source.txt"))
        yield work, Counter(text.split())
    finally:
        recorded = LocalCluster.load(work / "floe-cluster.json")
        floe_run(work, "down")
        for node in recorded.nodes:        # stopped: none of ours is left running
            assert not node.alive(), node


def _counts(work: Path) -> Counter:
    top = json.loads(floe(work, "top", "1000", "--json"))
    return Counter({row["key"]: row["state"] for row in top})


@pytest.mark.multiprocess
def test_everything_the_cluster_writes_is_private_from_birth(ring):
    work, expected = ring
    assert _counts(work) == expected
    tree = work / "floe-cluster"
    kinds = {p.name for p in tree.iterdir()}
    assert {"data", "logs", "tls"} <= kinds, kinds
    segments = list(tree.glob("data/*/log/*.log"))
    assert segments and list(tree.glob("data/*/state")), "a durable node writes both"
    assert exposed(tree) == []
    assert stat.S_IMODE((work / "floe-cluster.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(tree.stat().st_mode) == 0o700


@pytest.mark.multiprocess
def test_restart_runs_no_recorded_command_and_signals_no_stranger(ring, tmp_path):
    work, expected = ring
    path = work / "floe-cluster.json"
    honest = path.read_text()
    marker = tmp_path / "pwned"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: start_time(stranger.pid) is not None, 10, "the stranger to start")
        data = json.loads(honest)
        n0 = data["nodes"][0]
        n0.update(cmd=["touch", str(marker)], pid=stranger.pid,
                  create_time=start_time(stranger.pid))
        path.write_text(json.dumps(data))
        for how in ([], ["--kill"]):
            done = floe_run(work, "restart", n0["node_id"], *how)
            assert done.returncode == 1, done.stdout
            assert f"pid {stranger.pid} is not {n0['node_id']}" in done.stderr, done.stderr
            assert "not signalled" in done.stderr
        assert stranger.poll() is None and not marker.exists()
        # the node's own PID with another start time (a PID used again): not it either
        data = json.loads(honest)
        n0 = data["nodes"][0]
        n0["create_time"] += 10
        path.write_text(json.dumps(data))
        done = floe_run(work, "restart", "n0", "--kill")
        assert done.returncode == 1 and "not signalled" in done.stderr, done.stderr
        assert psutil.Process(n0["pid"]).is_running()
        # the flags of a node: only those `floe up` gives
        data = json.loads(honest)
        data["extra_args"] += ["--config", str(tmp_path / "theirs.toml")]
        path.write_text(json.dumps(data))
        done = floe_run(work, "restart", "n1", "--kill")
        assert done.returncode == 1 and "never gives every node: config" in done.stderr, done.stderr
        assert stranger.poll() is None and not marker.exists()
    finally:
        path.write_text(honest)
        stranger.kill()
        stranger.wait()
    # the honest PID with a hostile command: the node restarts, the command never runs
    data = json.loads(honest)
    data["nodes"][0]["cmd"] = ["touch", str(marker)]
    path.write_text(json.dumps(data))
    cluster = LocalCluster.load(path)
    assert all(n.alive() for n in cluster.nodes)
    old = cluster.node("n0")
    floe(work, "restart", "n0", "--kill", timeout=180)
    assert not marker.exists()
    cluster = LocalCluster.load(path)
    fresh = psutil.Process(cluster.node("n0").pid).cmdline()
    assert fresh[:3] == [sys.executable, "-m", "floering.node"], fresh
    assert cluster.node("n0").pid != old.pid and not old.alive()
    assert all(n.alive() for n in cluster.nodes)
    assert _counts(work) == expected


@pytest.mark.multiprocess
def test_no_node_serves_in_the_clear_unless_told_so(tmp_path):
    argv = [sys.executable, "-m", "floering.node", "--node-id", "n0", "--listen",
            "127.0.0.1:0", "--peers", "n0=127.0.0.1:0", "--data-dir", str(tmp_path / "d")]
    done = subprocess.run(argv, capture_output=True, text=True, env=node_env(), timeout=60)
    assert done.returncode == 2 and "no --tls-dir" in done.stderr, done.stderr
    assert "--insecure" in done.stderr and not (tmp_path / "d").exists()
    # told so, on loopback, it serves; and its files are private however it was started
    with LocalCluster.up(2, 1, workdir=tmp_path, tls=False, data_dir=tmp_path / "data") as c:
        assert all("--insecure" in n.cmd and "--tls-dir" not in n.cmd for n in c.nodes)
        with c.channel(c.nodes[0].address) as channel:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                               timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert exposed(tmp_path / "floe-cluster") == exposed(tmp_path / "data") == []
        os.kill(c.nodes[0].pid, 0)                  # ours, alive, before `down`
    assert not any(n.alive() for n in c.nodes)
