"""Helpers of tests/unit/test_hostile.py that other test files use too: MEMBERS, ring, rss_mib.
"""

import psutil

from floering.wire.ring import Ring


MEMBERS = {f"n{i}": f"127.0.0.1:{7100 + i}" for i in range(3)}


def ring() -> Ring:
    return Ring.initial(MEMBERS, 1, 2)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / (1 << 20)
