"""The `floe` command end to end: errors in one line, every member's state in status, ring and
locate, positions answered as given, node flags passed through, --version.

The tests here start real node processes; the in-process ones are in
tests/unit/test_cli_commands.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from floering.wire.hashing import position
from tests.support.helpers import floe, floe_run, wait_for
from tests.support.cli_commands_shared import _one_line_error


def _free_base(count: int) -> int:
    """A port with `count` free ones after it (checked, not reserved)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65536 and all(_free(base + i) for i in range(count)):
            return base
    pytest.skip("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.multiprocess
def test_up_passes_node_flags_and_scale_add_takes_the_next_ports(tmp_path):
    base = _free_base(4)
    try:
        floe(tmp_path, "up", "--nodes", "2", "--memory", "--insecure", "--base-port",
             str(base), "--reducer", "topk", "--", "--reducer-arg", "k=2")
        shown = json.loads(floe(tmp_path, "status", "--json"))
        assert shown["reducer"] == "floering.node.core.reducers:TopK(k=2)"
        # a node started without k=2 would be refused: the new one got the flags too
        assert "added n2" in floe(tmp_path, "scale", "--add", "1")
        recorded = json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]
        assert [n["address"] for n in recorded] == [f"127.0.0.1:{base + i}" for i in range(3)]
        rows = json.loads(floe(tmp_path, "status", "--json",
                               "--ring", f"127.0.0.1:{base}"))["nodes"]
        assert sorted(r["node_id"] for r in rows) == ["n0", "n1", "n2"]
    finally:
        down = floe_run(tmp_path, "down")
    assert "stopped 3 nodes" in down.stdout, down.stdout + down.stderr


@pytest.mark.multiprocess
def test_ring_locate_and_positions_answered_as_given(tmp_path):
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory", "--insecure")
        ring = json.loads(floe(tmp_path, "ring", "--json"))
        ranges = ring["ranges"]
        assert len(ranges) == 24 and ring["replication"] == 1
        for r in ranges:
            assert r["primary"] not in r["replicas"] and len(r["replicas"]) == 1
        where = json.loads(floe(tmp_path, "locate", "lord", "--json"))
        pos = position("lord")
        assert where["position"] == str(pos)
        lo, hi = int(where["start"]), int(where["end"])
        assert (lo < pos <= hi) if lo < hi else (pos > lo or pos <= hi)
        assert where["primary"] == next(r for r in ranges if r["token"] == where["token"])[
            "primary"]
        text = floe(tmp_path, "locate", "lord")
        assert f"at position {pos}:" in text and f"primary {where['primary']}" in text
        assert f"0x{pos:x}" in floe(tmp_path, "locate", "lord", "--hex")
        assert "token" in floe(tmp_path, "ring").splitlines()[1]
        # a position given in decimal is answered in decimal, in hex in hex
        at = (lo + hi) // 2 if lo < hi else hi // 2
        assert f"at {at} (ring v" in floe(tmp_path, "split", str(at))
        assert f"at {at + 1:#x} (ring v" in floe(tmp_path, "split", hex(at + 1))
        for r in json.loads(floe(tmp_path, "ring", "--json"))["ranges"]:
            assert r["token"].isdigit()
    finally:
        floe_run(tmp_path, "down")


@pytest.mark.multiprocess
def test_user_errors_are_one_line_and_status_shows_every_member(tmp_path):
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory", "--insecure")
        error = _one_line_error(floe_run(tmp_path, "scale", "--remove", "n9"), "scale")
        assert error == "floe scale: no node n9 in this cluster (its nodes: n0, n1, n2)"
        error = _one_line_error(floe_run(tmp_path, "move", "n9", "--to", "5"), "move")
        assert "'n9' is not a member" in error
        error = _one_line_error(floe_run(tmp_path, "split", "2**64"), "split")
        assert "position must be an integer" in error
        _one_line_error(floe_run(tmp_path, "get", "absent"), "get")
        assert json.loads(floe_run(tmp_path, "get", "absent", "--json").stdout) == \
            {"key": "absent", "state": None}
        wait_for(lambda: floe(tmp_path, "status").splitlines()[-1].startswith("HEALTHY: 3 of 3"),
                 20, "a healthy ring")
        recorded = {n["node_id"]: n for n in
                    json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]}
        paused = recorded["n2"]["pid"]
        os.kill(paused, signal.SIGSTOP)          # answers nobody: suspect, then dead
        try:
            shown = json.loads(floe(tmp_path, "status", "--json", "--timeout", "2"))
            states = {n["node_id"]: n["state"] for n in shown["nodes"]}
            assert states["n2"] in ("suspect", "dead") and states["n0"] == "serving"
            assert shown["verdict"].startswith(("DEGRADED", "HEALTHY: 2 of 2")), shown
            error = _one_line_error(floe_run(tmp_path, "scale", "--remove", "n2",
                                             "--timeout", "2"), "scale")
            assert "n2" in error and "UNAVAILABLE" not in error
        finally:
            os.kill(paused, signal.SIGCONT)
    finally:
        floe_run(tmp_path, "down")
