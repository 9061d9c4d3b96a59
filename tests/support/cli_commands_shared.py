"""Helpers of tests/unit/test_cli_commands.py that other test files use too: _one_line_error.
"""

from __future__ import annotations


def _one_line_error(done, command: str) -> str:
    """A refusal: exit code not 0, one line on stderr naming the command, no traceback."""
    assert done.returncode != 0, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"floe {command}: ") and "Traceback" not in done.stderr
    return done.stderr.strip()
