"""`floe status` on real processes: HEALTHY only while every member the ring and the
cluster file record serves; a SIGKILLed node makes it DEGRADED, naming the node and
why, and `--check` exits 3. Node ids are taken with or without a member's `#k`."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support.helpers import floe, floe_run, wait_for

pytestmark = pytest.mark.multiprocess


def _verdict(tmp_path) -> str:
    return json.loads(floe(tmp_path, "status", "--json"))["verdict"]


def test_a_killed_node_is_degraded_by_name_and_ids_with_or_without_their_incarnation(tmp_path):
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory")
        healthy = "HEALTHY: 3 of 3 members serving; every range on r+1 nodes"
        wait_for(lambda: _verdict(tmp_path) == healthy, 30, "a healthy ring")
        assert floe_run(tmp_path, "status", "--check").returncode == 0

        floe(tmp_path, "restart", "n1")               # in memory: it comes back as n1#1
        wait_for(lambda: _verdict(tmp_path) == healthy, 30, "healthy after the restart")
        shown = json.loads(floe(tmp_path, "status", "--json"))
        assert {n["node_id"] for n in shown["nodes"] if n["state"] == "serving"} == \
            {"n0", "n1#1", "n2"}
        floe(tmp_path, "restart", "n1#1")             # the name status shows is taken
        wait_for(lambda: _verdict(tmp_path) == healthy, 30, "healthy after the second")
        out = floe(tmp_path, "scale", "--remove", "n1#2")
        assert out.startswith("n1 handed its ranges")
        two = "HEALTHY: 2 of 2 members serving; every range on r+1 nodes"
        wait_for(lambda: _verdict(tmp_path) == two, 30, "two members, healthy")

        recorded = {n["node_id"]: n["pid"] for n in
                    json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]}
        assert set(recorded) == {"n0", "n2"}
        os.kill(recorded["n2"], signal.SIGKILL)
        wanted = (f"DEGRADED: 1 of 2 members serving; every range on r+1 nodes; dead: n2 "
                  f"(process {recorded['n2']} gone)")
        wait_for(lambda: _verdict(tmp_path) == wanted, 30, "n2 named dead")
        checked = floe_run(tmp_path, "status", "--check")
        assert checked.returncode == 3, checked.stdout + checked.stderr
        assert checked.stdout.splitlines()[-1] == wanted
        assert floe_run(tmp_path, "status").returncode == 0     # without --check: a report
        out = floe(tmp_path, "restart", "n2")         # a process gone is started again
        assert "restarted 1 nodes" in out
        wait_for(lambda: _verdict(tmp_path) == two, 30, "healthy again after the restart")
        assert floe_run(tmp_path, "status", "--check").returncode == 0
    finally:
        floe_run(tmp_path, "down", "--kill")
