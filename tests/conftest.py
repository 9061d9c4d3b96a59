"""Suite-wide checks. Helpers live in tests/helpers.py.

Every process a test starts, it stops by its own PID: when the session ends, a child of
the test process that is still running (not a reaped or zombie exit) is a stray. The
run fails and names it; it is then stopped by its PID so it cannot outlive the run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def running_children(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live, non-zombie process whose parent is `parent`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == parent and state not in ("Z", "X"):
            out.append((int(entry.name), cmdline))
    return out


def pytest_sessionfinish(session, exitstatus):
    if not Path("/proc").is_dir():
        return
    strays = [(pid, cmd) for pid, cmd in running_children(os.getpid())
              if " -m node " in f" {cmd} " or "mapper_proc" in cmd]
    if not strays:
        return
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    session.config.pluginmanager.get_plugin("terminalreporter").write_line(
        "stray processes left running by the tests (now killed): "
        + "; ".join(f"{pid}: {cmd[:120]}" for pid, cmd in strays), red=True)
    session.exitstatus = 1
