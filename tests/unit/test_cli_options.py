"""The `floe` command's options: the global ones before or after the command's name,
and a bad count refused in one line."""

from __future__ import annotations

import pytest

from floering.floe.cli import build_parser
from tests.support.helpers import floe_run


@pytest.mark.parametrize("argv", [
    ["status", "--ring", "h:1", "--timeout", "5", "--json"],
    ["--ring", "h:1", "--timeout", "5", "status", "--json"],
    ["--ring", "h:9", "status", "--ring", "h:1", "--timeout", "5", "--json"],
])
def test_global_options_are_taken_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.ring, args.timeout, args.json) == ("h:1", 5.0, True)
    assert args.cluster_file == "floe-cluster.json" and args.tls_dir is None


def test_an_option_not_given_after_the_command_keeps_the_one_given_before():
    args = build_parser().parse_args(["--tls-dir", "certs", "--timeout", "3", "get", "k",
                                      "--ring", "h:1"])
    assert (args.tls_dir, args.timeout, args.ring) == ("certs", 3.0, "h:1")


@pytest.mark.parametrize("k", ["-3", "0", "x"])
def test_top_refuses_a_count_below_one_in_one_line(tmp_path, k):
    done = floe_run(tmp_path, "top", k)
    assert done.returncode == 2
    assert done.stderr.startswith("floe top: argument k:") and done.stderr.count("\n") == 1


def test_a_usage_error_is_one_line_too(tmp_path):
    for argv in (("status", "--no-such-flag"), ("no-such-command",), ("top", "ten")):
        done = floe_run(tmp_path, *argv)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "--help" in done.stderr and "usage:" not in done.stderr


def test_a_ring_that_does_not_answer_is_one_line_after_the_command(tmp_path):
    done = floe_run(tmp_path, "status", "--ring", "127.0.0.1:1", "--timeout", "2")
    assert done.returncode == 1
    assert done.stderr.startswith("floe status: no ring node reachable at 127.0.0.1:1")
    assert "Traceback" not in done.stderr
