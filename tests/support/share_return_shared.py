"""Helpers of tests/cluster/test_share_return.py that other test files use too: BAND, WITHIN,
ring_of, seconds_to_even, uneven.
"""

import time

import pytest

from tests.support.helpers import live_ring


BAND = 0.25          # a member's share may be this far from the mean


WITHIN = 30.0        # seconds


ring_of = live_ring


def uneven(ring) -> dict[str, float]:
    """Members further than BAND from the mean share, with their share of the mean."""
    mean = 1 / len(ring.nodes)
    shares = {n: ring.share_of(n) / mean for n in ring.nodes}
    return {n: round(s, 2) for n, s in shares.items() if abs(s - 1) > BAND}


def seconds_to_even(cluster, members: int) -> float:
    started = time.monotonic()
    while True:
        ring = ring_of(cluster)
        if len(ring.nodes) == members and not uneven(ring) and not ring.extras:
            return time.monotonic() - started
        if time.monotonic() - started > WITHIN:
            pytest.fail(f"shares not within {BAND:.0%} of the mean after {WITHIN:.0f} s: "
                        f"{uneven(ring)} ({ring.describe()})")
        time.sleep(0.2)
