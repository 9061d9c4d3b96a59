"""The operator side trusts nothing on disk: everything `floe up` and its nodes write is
private from birth (directories 0700, files 0600), `floe restart` runs no command and
signals no process a cluster file names unless it is that node of this cluster, node ids
never lead out of the cluster's directory, and no node serves in the clear unless told
--insecure. On a real `floe up` (3 nodes, mutual TLS, durable) and real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from floering.floe.cluster import LocalCluster
from floering.floe.records import is_our_node, start_time
from floering.node.config import NodeConfig, check_node_id
from tests.support.helpers import floe_run, wait_for


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
