"""Suite-wide checks. Helpers live in tests/helpers.py.

Every process a test starts, it stops by its own PID: when the session ends, a child of
the test process that is still running (not a reaped or zombie exit) is a stray. The
run fails and names it; it is then stopped by its PID so it cannot outlive the run.
"""

from __future__ import annotations

import os
import signal

import psutil


def running_children(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live, non-zombie process whose parent is `parent`."""
    out = []
    try:
        children = psutil.Process(parent).children()
    except psutil.Error:
        return out
    for child in children:
        try:
            if child.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                continue
            out.append((child.pid, " ".join(child.cmdline())))
        except psutil.Error:
            continue
    return out


def pytest_sessionfinish(session, exitstatus):
    strays = [(pid, cmd) for pid, cmd in running_children(os.getpid())
              if " -m floering.node " in f" {cmd} " or "mapper_proc" in cmd]
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
