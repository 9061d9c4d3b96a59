"""Helpers of tests/cluster/test_hostile_push.py that other test files use too: PeakRss.
"""

import threading
import time

import psutil


class PeakRss:
    """The most RSS a process had while sampled, above what it had at the start."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.base = self.peak = self.proc.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return (self.peak - self.base) >> 20

    def now(self) -> int:
        return (self.proc.memory_info().rss - self.base) >> 20
