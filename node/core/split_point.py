"""Where the load sits inside a range, and where to cut it (pure).

A node samples the positions of a few keys of every batch it applies (their hashes,
weighted by the batch's size; picked pseudo-randomly, so periodic streams do not alias) and keeps, per range it owns, a bounded table of the
heaviest positions (space-saving: a new position replaces the lightest one and
inherits its weight, so a hot key is never lost for long). Weights decay, so the table
follows the last few seconds. A hot key is one position: it is never cut in two.

`plan_split` is the load-shedding rule for a range hotter than what would even a node
and its neighbour: cut it where the measured tail carries about half the gap, and
hand the tail (which keeps the range's token) to the neighbour, the paper's "move my
token back to p".
"""

from __future__ import annotations

from floering.wire.hashing import HASH_SPACE, position
from floering.wire.ring import Ring

SAMPLES_PER_BATCH = 4


class PositionLoad:
    def __init__(self, per_range: int = 64) -> None:
        self.per_range = per_range
        self.weights: dict[int, dict[int, float]] = {}   # token -> position -> weight
        self._draw = 1

    def _index(self, n: int) -> int:
        # A fixed-seed LCG, not evenly spaced picks: a periodic stream (a, b, a, b...)
        # would alias with fixed offsets and show one hot key where there are two.
        self._draw = (self._draw * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self._draw >> 33) % n

    def record(self, token: int, keys) -> None:
        """A batch of `keys` applied to `token`'s range: sample a few at random."""
        n = len(keys)
        if not n:
            return
        picks = [self._index(n) for _ in range(min(n, SAMPLES_PER_BATCH))]
        weight = n / len(picks)
        table = self.weights.setdefault(token, {})
        for i in picks:
            try:
                pos = position(keys[i])
            except Exception:
                continue    # a bad key: the batch is refused anyway
            if pos in table:
                table[pos] += weight
            elif len(table) < self.per_range:
                table[pos] = weight
            else:
                lightest = min(table, key=table.__getitem__)
                table[pos] = table.pop(lightest) + weight

    def decay(self, factor: float, keep=None) -> None:
        """Age every weight by `factor`; forget ranges not in `keep` (no longer ours)."""
        for token in list(self.weights):
            if keep is not None and token not in keep:
                del self.weights[token]
                continue
            table = self.weights[token]
            for pos in list(table):
                table[pos] *= factor
                if table[pos] < 1e-3:
                    del table[pos]

    def split(self, token: int, part_of_position) -> None:
        """The range was cut: each sampled position goes to its part."""
        table = self.weights.pop(token, None)
        for pos, weight in (table or {}).items():
            self.weights.setdefault(part_of_position(pos), {})[pos] = weight

    def samples(self, token: int) -> dict[int, float]:
        return dict(self.weights.get(token, {}))


def choose_split_point(rng: tuple[int, int], samples: dict[int, float],
                       want: float) -> tuple[int, float] | None:
    """A position p inside `rng` = (lo, hi] such that the samples in (p, hi] (the tail)
    carry the fraction of the range's sampled weight closest to `want` (0..1), as (p,
    that fraction). The cut falls halfway between two sampled positions, never through
    one; None when fewer than two positions were sampled."""
    lo, _ = rng
    size = Ring.range_size(rng)
    offsets = sorted(((pos - lo) % HASH_SPACE, w) for pos, w in samples.items()
                     if Ring.in_range(pos, rng) and w > 0)
    total = sum(w for _, w in offsets)
    if len(offsets) < 2 or total <= 0:
        return None
    best, tail = None, total
    for (here, w), (there, _) in zip(offsets, offsets[1:]):
        tail -= w
        cut = (here + there) // 2                # here <= cut < there
        if not 0 < cut < size:
            continue
        if best is None or abs(tail / total - want) < abs(best[1] / total - want):
            best = (cut, tail)
    if best is None:
        return None
    return (lo + best[0]) % HASH_SPACE, best[1] / total


def plan_split(ring: Ring, me: str, rates: dict[int, float], heir_rates: dict[str, float],
               busy: set[str], moves: dict[int, str],
               samples: dict[int, dict[int, float]],
               min_gain: float = 0.2,
               max_tokens: int | None = None) -> tuple[int, int, str] | None:
    """After the whole-range moves `moves`, is a range left that is hotter than what
    would even me and its neighbour? Then cut it at the measured point so its tail
    carries half the gap: returns (token, cut position, neighbour); the tail keeps the
    token and goes to the neighbour. Only when it narrows that pair's gap by at least
    `min_gain` of the gap, and only while the ring has fewer than `max_tokens` tokens
    (ranges are never merged back, so splits must stop somewhere)."""
    if max_tokens is not None and len(ring.tokens) >= max_tokens:
        return None
    mine = ring.tokens_of(me)
    load = dict(heir_rates)
    left = sum(rates.get(t, 0.0) for t in mine)
    for token, taker in moves.items():
        r = rates.get(token, 0.0)
        left -= r
        load[taker] = load.get(taker, 0.0) + r
    best = None
    for token in mine:
        heir = ring.heir(token)
        r = rates.get(token, 0.0)
        if token in moves or heir is None or heir in busy or r <= 0:
            continue
        there = load.get(heir, 0.0)
        gap = left - there
        if gap <= 0:
            continue
        cut = choose_split_point(ring.range_of_token(token), samples.get(token, {}),
                                 gap / 2 / r)
        if cut is None:
            continue
        at, fraction = cut
        tail = r * fraction
        after = abs(gap - 2 * tail)
        if after <= (1 - min_gain) * gap and (best is None or after < best[0]):
            best = (after, token, at, heir)
    return None if best is None else best[1:]
