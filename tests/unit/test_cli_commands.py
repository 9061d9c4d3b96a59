"""The `floe` command end to end: errors in one line, every member's state in status,
ring and locate, positions answered as given, node flags passed through, --version."""

from __future__ import annotations

import argparse
import tomllib

import pytest

from floering.floe.cli import build_parser
from tests.support.helpers import ROOT, floe_run
from tests.support.cli_commands_shared import _one_line_error


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
                    "--reducer", "tests.property.test_reducers:Concat", timeout=60)
    error = _one_line_error(done, "up")
    assert f"the {policy} balancer" in error and "no merge" in error, error
    assert "exited" not in error
    # refused by `floe up` itself: no node was started, no cluster recorded or kept
    assert not (tmp_path / "floe-cluster.json").exists()
    assert not (tmp_path / "floe-cluster" / "logs").exists()
    assert not (tmp_path / "floe-cluster" / "data").exists()
