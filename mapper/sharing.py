"""Mapper side of the balancers that share keys (`floering.wire.balancers`): which piece
of its key a tuple goes to. Reads merge the pieces back (`RingClient`, with
`wire.pieces.merge_pieces`).

Partial key grouping (`pkg`): a key's two candidates are its pieces 0 and 1, each on
its own place of the ring; the tuple goes to the candidate whose owner this mapper has
sent fewer tuples to so far (the paper's local load estimation: no messages, each
source balances what it sends). Choosing is per tuple, and exact whatever it chooses:
a piece is an ordinary key, and the pieces are merged on every read."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from floering.mapper.choices import ChoicesChooser
from floering.mapper.plans import EVEN, PlanChooser
from floering.mapper.smalops import SmalopsChooser
from floering.node.core.batch import KEY_TYPES
from floering.wire.errors import InvalidKey
from floering.wire.pieces import check_user_key, piece_key
from floering.wire.ring import Ring
from floering.node.core.sketch import SpaceSaving


class PieceChooser:
    """place(key) -> (the key to send: the key or one of its pieces, its token)."""

    def __init__(self, max_cached: int = 1 << 20) -> None:
        self.sent: Counter = Counter()           # tuples sent per node, by this mapper
        self.max_cached = max_cached
        # key -> (token of piece 0, piece 1, its token), for one ring's tokens
        self._pairs: tuple[tuple, dict] = ((), {})

    def placer(self, ring: Ring, route):
        tokens, pairs = self._pairs
        if tokens != ring.tokens:
            pairs = {}
            self._pairs = (ring.tokens, pairs)
        sent, owner, max_cached = self.sent, ring.owner_of_token, self.max_cached

        def place(key, _seq=0):
            pair = pairs.get(key)
            if pair is None:
                other = piece_key(key, 1)
                pair = (route(key), other, route(other))
                if len(pairs) >= max_cached:
                    pairs.clear()
                pairs[key] = pair
            token, other, other_token = pair
            node, other_node = owner(token), owner(other_token)
            if sent[other_node] < sent[node]:
                key, token, node = other, other_token, other_node
            sent[node] += 1
            return key, token
        return place


def check_key(key) -> None:
    """A key a mapper may emit: str, bytes (not a piece's) or int."""
    if type(key) not in KEY_TYPES:
        raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")
    if type(key) is bytes:
        check_user_key(key)


class DynamicChooser:
    """Dynamic key grouping (`dkg`): a cold key goes to its own node (piece 0); a hot
    one (a Space-Saving sketch of this mapper's keys, bounded to `capacity` counters)
    gets a pool of pieces that grows while even its least loaded candidate carries
    more than the ideal share (in % of what this mapper sent) times 1 + `slack`, and
    shrinks while every one carries less than it times 1 - `slack`. `slack=None` takes
    the reference implementation's thresholds instead, the ideal plus or minus its
    square root (12.5% +- 3.5% on 8 nodes), which leave more imbalance (docs/balance.md).
    A piece joins a pool only if its node is new to the pool and less loaded than every
    candidate already in it. Pools are reviewed every `review_every` tuples once
    `warm_up` tuples were sent. A piece left out of a shrunk pool keeps what it holds:
    reads merge every piece a key may have (`max_pieces`). After each review, the
    sketch and the loads decay by `decay`, so they follow the last few tens of
    thousands of tuples: a key that cools down loses its pool."""

    def __init__(self, max_pieces: int, capacity: int = 256, review_every: int = 1000,
                 warm_up: int = 10_000, decay: float = 0.9,
                 slack: float | None = 0.05) -> None:
        self.max_pieces = max_pieces
        self.sketch = SpaceSaving(capacity)
        self.pools: dict = {}                    # hot key -> its pieces, the key first
        # tuples sent per node by this mapper, decayed at each review
        self.sent: defaultdict[str, float] = defaultdict(float)
        self.total = 0
        self.review_every, self.warm_up, self.decay = review_every, warm_up, decay
        self.slack = slack

    def placer(self, ring: Ring, route):
        sent, owner, pools, sketch = self.sent, ring.owner_of_token, self.pools, self.sketch
        review_every = self.review_every

        def place(key, _seq=0):
            sketch.add(key)
            pool = pools.get(key)
            if pool is None:
                token = route(key)
            else:
                key, token = min(((p, route(p)) for p in pool), key=lambda c: sent[owner(c[1])])
            sent[owner(token)] += 1
            self.total += 1
            if self.total % review_every == 0 and self.total >= self.warm_up:
                self.review(ring, route)
            return key, token
        return place

    def review(self, ring: Ring, route) -> None:
        ideal = 100 / len(ring.nodes)
        margin = math.sqrt(ideal) if self.slack is None else ideal * self.slack
        up, down = ideal + margin, ideal - margin
        weight = sum(self.sent.values()) or 1.0
        load = {n: 100 * self.sent[n] / weight for n in ring.nodes}
        hot = {k for k, _ in self.sketch.above(1 / (4 * len(ring.nodes)))}
        for key in [k for k in self.pools if k not in hot]:
            del self.pools[key]                  # cooled down: back to its own node
        for key in hot:
            pool = self.pools.get(key, (key,))
            holders = [ring.owner(p) for p in pool]
            least = min(load[n] for n in holders)
            if least > up and len(pool) < self.max_pieces:
                for i in range(1, self.max_pieces):
                    piece = piece_key(key, i)
                    node = ring.owner(piece)
                    if piece not in pool and node not in holders and load[node] < least:
                        self.pools[key] = pool + (piece,)
                        break
            elif len(pool) > 1 and max(load[n] for n in holders) < down:
                self.pools[key] = pool[:-1]
                if len(self.pools[key]) == 1:
                    del self.pools[key]
        self.sketch.decay(self.decay)
        for node in self.sent:
            self.sent[node] *= self.decay


def chooser_for(policy, replayable: bool = False, source: str = "", plan=None):
    """The mapper's piece chooser for a ring's balancer (None: keys are not shared).

    `replayable`: the source's seqs may be sent again by another process (a retried
    task of an epoch source, a rerun of a file). A range deduplicates by seq, so a seq
    sent again must go to the piece it went to the first time; a choice made from this
    process's own load counts is not repeatable, so such a source's piece is drawn by
    a hash of (`source`, seq) within a routing `plan` fixed before the first attempt
    (`floering.mapper.plans`; None: pieces 0 and 1 evenly, which every sharing policy
    reads)."""
    if policy.pieces == 1:
        return None
    if replayable:
        return PlanChooser(plan if plan is not None else EVEN, source)
    if policy.name == "pkg":
        return PieceChooser()
    if policy.name == "smalops":
        return SmalopsChooser(policy.pieces)
    if policy.name in ("dchoices", "wchoices"):
        return ChoicesChooser(policy.pieces, every_node=policy.name == "wchoices")
    return DynamicChooser(policy.pieces)
