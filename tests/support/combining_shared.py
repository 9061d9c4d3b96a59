"""Helpers of tests/property/test_combining.py that other test files use too: applied.
"""

from __future__ import annotations

from floering.node.core.ranges import PrimaryRange


def applied(batches, reducer, resend=True):
    """Apply the batches to one range per token, each twice when `resend`."""
    ranges: dict = {}
    for b in batches + (batches if resend else []):
        rng = ranges.setdefault(b.token, PrimaryRange(b.token, reducer))
        rng.apply(b.source, b.first_seq, b.last_seq, b.count, b.payload, b.seqs)
    return {k: v for rng in ranges.values() for k, v in rng.state.items()}
