"""The measures load-balancing policies are compared by, as the papers define them.

- skew S = (W - U) / (M - U): M tuples over R reducers, U = ceil(M / R) the ideal
  share, W the most any reducer took; 0 is perfectly even, 1 all on one reducer
  (the Ray consistent-hashing paper, §6.1.1);
- imbalance max/mean - 1 and the load's standard deviation in % of all tuples per
  reducer (partial and dynamic key grouping);
- distribution cost: reducers holding a piece of each key, averaged over keys
  (dynamic key grouping's DIST_COST; 1.0 when no key is shared);
- merge cost: partial states a key is held as (its pieces and outgoing keys, wherever
  they are), mean and most over keys, and the merges reading every key makes (sum of
  pieces - 1): FlexD's, whose merge cost grows with a key's pieces.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping


def skew(loads: Iterable[int]) -> float:
    loads = list(loads)
    if not loads:
        raise ValueError("skew of no reducers")
    total = sum(loads)
    ideal = math.ceil(total / len(loads))
    if total == ideal:                 # one reducer, or at most one tuple in all
        return 0.0 if len(loads) == 1 or total == 0 else 1.0
    return (max(loads) - ideal) / (total - ideal)


def imbalance(loads: Iterable[int]) -> float:
    loads = list(loads)
    mean = sum(loads) / len(loads)
    return max(loads) / mean - 1 if mean else 0.0


def load_std_percent(loads: Iterable[int]) -> float:
    loads = list(loads)
    total = sum(loads)
    if not total or len(loads) < 2:
        return 0.0
    return statistics.pstdev(100 * x / total for x in loads)


def distribution_cost(holders: Mapping[object, Iterable[str]]) -> float:
    """Mean number of reducers holding a piece of a key, over the keys given."""
    if not holders:
        return 0.0
    return sum(len(set(nodes)) for nodes in holders.values()) / len(holders)


def piece_counts(pieces: Mapping[object, Iterable[object]]) -> tuple[float, int, int]:
    """(mean partial states a key is held as, the most, merges to read every key)."""
    counts = [max(1, len(set(p))) for p in pieces.values()]
    if not counts:
        return 0.0, 0, 0
    return sum(counts) / len(counts), max(counts), sum(c - 1 for c in counts)
