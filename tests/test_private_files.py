"""The operator side trusts nothing on disk: everything `floe up` and its nodes write is
private from birth (directories 0700, files 0600), `floe restart` runs no command and
signals no process a cluster file names unless it is that node of this cluster, node ids
never lead out of the cluster's directory, and no node serves in the clear unless told
--insecure. On a real `floe up` (3 nodes, mutual TLS, durable) and real processes."""

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
from floering.floe.records import is_our_node, start_time
from floering.node.config import NodeConfig, check_node_id
from floering.node.files import exposed
from tests.helpers import floe, floe_run, wait_for

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


def test_a_node_id_never_leads_out_of_the_cluster(tmp_path):
    data = tmp_path / "floe-cluster" / "data"
    data.mkdir(parents=True)
    (data / "layout.json").write_text(json.dumps({
        "nodes": [["../../../escaped", "127.0.0.1:1"], ["n1", "127.0.0.1:2"]],
        "replicas": 1, "tokens_per_node": 8, "reducer": "count"}))
    done = floe_run(tmp_path, "up")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "bad node id '../../../escaped'" in done.stderr
    escaped = (data / "../../../escaped").resolve()
    assert not escaped.exists() and not list(tmp_path.rglob("*escaped*"))
    assert not (tmp_path / "floe-cluster" / "tls").exists()
    for bad in ("../x", "a/b", "", ".", "n0#", "x" * 65, "n0\n", "n0#1#2"):
        with pytest.raises(ValueError, match="bad node id"):
            check_node_id(bad)
    assert check_node_id("n0#3") == "n0#3"
    with pytest.raises(ValueError, match="bad node id"):
        check_node_id("n0#3", incarnation=False)
    with pytest.raises(ValueError, match="bad node id"):
        NodeConfig(node_id="n0", listen="127.0.0.1:1",
                   peers=(("n0", "127.0.0.1:1"), ("../up", "127.0.0.1:2")))


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


def test_signal_checks_see_through_a_recycled_or_foreign_pid():
    me = os.getpid()
    assert not is_our_node(me, "n0", "127.0.0.1:1", start_time(me))   # not a node
    assert not is_our_node(me, "n0", "127.0.0.1:1", None)              # no start time
    assert not is_our_node(2 ** 22 + 12345, "n0", "127.0.0.1:1", 1.0)  # gone


def test_down_signals_no_process_a_forged_cluster_file_names(tmp_path):
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                stdin=subprocess.DEVNULL)
    marker = tmp_path / "pwned"
    try:
        wait_for(lambda: start_time(stranger.pid) is not None, 10, "the stranger to start")
        (tmp_path / "floe-cluster.json").write_text(json.dumps({
            "replicas": 1, "reducer": "count", "extra_args": [], "data_dir": None,
            "nodes": [{"node_id": "n0", "address": "127.0.0.1:1", "pid": stranger.pid,
                       "create_time": start_time(stranger.pid), "log": "/etc/passwd",
                       "cmd": ["touch", str(marker)], "peers": "n0=127.0.0.1:1",
                       "join": "", "tokens_per_node": 8}]}))
        loaded = LocalCluster.load(tmp_path / "floe-cluster.json").node("n0")
        assert loaded.log == str(tmp_path / "floe-cluster" / "logs" / "n0.log")
        assert loaded.cmd[:3] == [sys.executable, "-m", "floering.node"]
        done = floe_run(tmp_path, "down", "--kill")
        assert done.returncode == 0 and "killed 0 nodes (1 recorded were not running)" \
            in done.stdout, done.stdout + done.stderr
        assert stranger.poll() is None and not marker.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_up_refuses_node_flags_it_could_not_read_back_before_starting_anything(tmp_path):
    done = floe_run(tmp_path, "up", "--memory", "--", "--events-file", "/tmp/theirs")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "never gives every node: events_file" in done.stderr
    assert not (tmp_path / "floe-cluster.json").exists()
    assert not (tmp_path / "floe-cluster").exists()
