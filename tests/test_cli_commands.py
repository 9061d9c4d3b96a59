"""The `floe` command end to end: errors in one line, every member's state in status,
ring and locate, positions answered as given, node flags passed through, --version."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import tomllib

import pytest

from floering.floe.cli import build_parser
from floering.wire.hashing import position
from tests.helpers import ROOT, floe, floe_run, wait_for


def _one_line_error(done, command: str) -> str:
    """A refusal: exit code not 0, one line on stderr naming the command, no traceback."""
    assert done.returncode != 0, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"floe {command}: ") and "Traceback" not in done.stderr
    return done.stderr.strip()


def _subcommands(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _subcommands(sub)


def test_every_option_has_help_that_shows_its_default():
    parser = build_parser()
    missing = []
    for name, sub in [("floe", parser), *_subcommands(parser)]:
        shown = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}: no help")
            elif not any(action.default is v for v in (None, False, argparse.SUPPRESS)) and \
                    f"default: {action.default}" not in shown.replace("\n", " ") and \
                    "default" not in action.help:
                missing.append(f"{name} {action.option_strings[0]}: default not shown")
    assert not missing, missing


@pytest.mark.parametrize("command", [["status"], ["get", "k"], ["top", "3"], ["ring"],
                                     ["locate", "k"]])
def test_every_read_command_takes_json_and_the_global_options_after_it(command):
    args = build_parser().parse_args([*command, "--json", "--ring", "h:1", "--timeout", "4"])
    assert (args.json, args.ring, args.timeout) == (True, "h:1", 4.0)


def test_version_comes_from_the_package():
    done = floe_run(ROOT, "--version")
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.returncode == 0 and done.stdout.strip() == f"floe {wanted}"


def test_floe_node_is_the_node_with_its_own_flags(tmp_path):
    done = floe_run(tmp_path, "node", "--help")
    assert done.returncode == 0 and "--reducer-arg" in done.stdout
    bad = floe_run(tmp_path, "node", "--node-id", "x", "--replication", "-1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_node_flags_are_refused_by_commands_other_than_up(tmp_path):
    error = _one_line_error(floe_run(tmp_path, "status", "--", "--balance"), "status")
    assert "only `floe up` takes node flags" in error


def test_no_cluster_is_one_line(tmp_path):
    error = _one_line_error(floe_run(tmp_path, "ring"), "ring")
    assert "no cluster recorded" in error


@pytest.mark.parametrize("policy", ["pkg", "dkg", "dchoices", "wchoices", "smalops"])
def test_up_refuses_a_sharing_balancer_with_a_reducer_without_merge_before_any_node(
        tmp_path, policy):
    done = floe_run(tmp_path, "up", "--nodes", "2", "--insecure", "--balancer", policy,
                    "--reducer", "tests.test_reducers:Concat", timeout=60)
    error = _one_line_error(done, "up")
    assert f"the {policy} balancer" in error and "no merge" in error, error
    assert "exited" not in error
    # refused by `floe up` itself: no node was started, no cluster recorded or kept
    assert not (tmp_path / "floe-cluster.json").exists()
    assert not (tmp_path / "floe-cluster" / "logs").exists()
    assert not (tmp_path / "floe-cluster" / "data").exists()


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
