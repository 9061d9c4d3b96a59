"""A cluster file's `reducer` is what `floe restart` and `floe scale --add` pass to a node's
--reducer, which imports the module it names: only a built-in name, or the reducer the
cluster's kept layout records, is ever started; anything else is refused in one line and
nothing runs. Real `floe` processes on forged cluster files.

The tests here start real node processes; the in-process ones are in
tests/unit/test_cluster_file_reducer.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from floering.floe.cluster import LocalCluster
from floering.floe.records import start_time
from tests.support.helpers import floe_run


def gone_pid() -> tuple[int, float]:
    """The PID and start time of a process of ours that has exited (a crashed node's
    record: `floe restart` starts such a node again without signalling anything)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    created = start_time(proc.pid)
    proc.wait()
    return proc.pid, created or 1.0


def forge(tmp_path, reducer: str, data_dir=None) -> None:
    pid, created = gone_pid()
    (tmp_path / "floe-cluster" / "logs").mkdir(parents=True, mode=0o700)   # as `up` left it
    (tmp_path / "floe-cluster.json").write_text(json.dumps({
        "replicas": 1, "reducer": reducer, "extra_args": ["--insecure"],
        "data_dir": data_dir,
        "nodes": [{"node_id": "n0", "address": "127.0.0.1:1", "pid": pid,
                   "create_time": created, "peers": "n0=127.0.0.1:1", "join": "",
                   "tokens_per_node": 8}]}))


def started_from(tmp_path) -> list[int]:
    """Processes whose command line names this cluster's files."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(tmp_path) in part for part in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


@pytest.mark.multiprocess
@pytest.mark.parametrize("reducer", ["forged_reducer_marker:Evil", "os:system"])
def test_restart_from_a_cluster_file_naming_a_foreign_reducer_runs_nothing(tmp_path, reducer):
    marker = tmp_path / "pwned"
    (tmp_path / "forged_reducer_marker.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n")
    forge(tmp_path, reducer)
    for command in (["restart", "n0", "--kill", "--timeout", "15"],
                    ["scale", "--add", "1", "--timeout", "15"]):
        done = floe_run(tmp_path, *command, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "neither a built-in" in done.stderr and "no node is started" in done.stderr
        assert not marker.exists()
        assert started_from(tmp_path) == []
    # what `floe down` and the others read of it still loads; nothing to start
    cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
    assert cluster.refused and cluster.node("n0").cmd == []
