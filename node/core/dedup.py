"""Deduplication by per-source watermarks.

Within one token range, a source's tuples are applied in seq order (the mapper keeps
per-(source, node) order and resends in order), so "everything up to the watermark was
applied" holds and one integer per (range, source) is enough to drop a resent tuple.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Sequence


def first_new_index(watermark: int, first_seq: int, last_seq: int, count: int,
                    seqs: Callable[[], Sequence[int]]) -> int:
    """Index of the first tuple of a batch past `watermark` (== count: all duplicates).

    `seqs` is called only for a batch that straddles the watermark."""
    if first_seq > watermark:
        return 0
    if last_seq <= watermark:
        return count
    return bisect_right(seqs(), watermark)
