"""Helpers of tests/unit/test_webui.py that other test files use too: stop, until.
"""

from __future__ import annotations

import signal
import subprocess
import time


def stop(ui: subprocess.Popen) -> None:
    if ui.poll() is None:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.wait(10)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait(10)


def until(check, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
