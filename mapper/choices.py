"""D-choices and W-choices (`dchoices`, `wchoices`): partial key grouping with more
than two candidates for the keys too hot for two (Nasir et al., "When two choices are
not enough", the variants the dynamic key grouping work compares with).

A key this mapper sees in at least a `threshold` / n share of its tuples (n nodes;
a Space-Saving sketch of `capacity` counters, decayed every `review_every` tuples, finds
them) is a *head* key. A head key's candidates are pieces on distinct nodes: with
`wchoices` every node the key's pieces reach (up to `max_pieces` of them), with
`dchoices` only d = ceil(p * n) + 1 of them, p the key's share: enough that its
share per candidate is below the mean node's (1 / n) with one candidate to spare. Every
other key has two candidates, pieces 0 and 1, as in `pkg`. Each tuple goes to the
candidate whose node this mapper has sent fewest tuples to. A key that cools down
goes back to two candidates; its other pieces, left idle, are merged back into the key
by their owners (`floering.node.core.folding`)."""

from __future__ import annotations

import math
from collections import defaultdict

from floering.wire.pieces import piece_key
from floering.wire.ring import Ring
from floering.node.core.sketch import SpaceSaving


class ChoicesChooser:
    def __init__(self, max_pieces: int, every_node: bool, threshold: float = 0.2,
                 capacity: int = 256, review_every: int = 1000, decay: float = 0.9) -> None:
        self.max_pieces, self.every_node, self.threshold = max_pieces, every_node, threshold
        self.sketch = SpaceSaving(capacity)
        # tuples sent per node by this mapper, decayed at each review
        self.sent: defaultdict[str, float] = defaultdict(float)
        self.heads: dict = {}                     # head key -> number of candidates
        self.review_every, self.decay = review_every, decay
        self.total = 0
        # (ring tokens, key -> its candidate pieces and their tokens)
        self._cache: tuple[tuple, dict] = ((), {})

    def candidates(self, ring: Ring, route, key, count: int) -> tuple:
        """`count` pieces of `key` on distinct nodes (fewer if its pieces reach fewer),
        piece 0 first: ((piece, token), ...)."""
        chosen, nodes = [], set()
        for i in range(self.max_pieces):
            piece = piece_key(key, i)
            token = route(piece)
            node = ring.owner_of_token(token)
            if node not in nodes:
                chosen.append((piece, token))
                nodes.add(node)
                if len(chosen) == count:
                    break
        return tuple(chosen)

    def placer(self, ring: Ring, route):
        tokens, cache = self._cache
        if tokens != ring.tokens:
            cache = {}
            self._cache = (ring.tokens, cache)
        sent, owner, sketch, heads = self.sent, ring.owner_of_token, self.sketch, self.heads

        def place(key, _seq=0):
            sketch.add(key)
            count = heads.get(key, 2)
            found = cache.get((key, count))
            if found is None:
                if len(cache) >= 1 << 20:
                    cache.clear()
                found = cache[(key, count)] = (self.candidates(ring, route, key, count)
                                               if count > 2 else
                                               ((key, route(key)), (piece_key(key, 1),
                                                                    route(piece_key(key, 1)))))
            key, token = min(found, key=lambda c: sent[owner(c[1])])
            sent[owner(token)] += 1
            self.total += 1
            if self.total % self.review_every == 0:
                self.review(len(ring.nodes))
            return key, token
        return place

    def review(self, nodes: int) -> None:
        """Which keys are head keys now, and how many candidates each gets."""
        heads = {}
        total = self.sketch.total or 1.0
        for key, count in self.sketch.above(self.threshold / nodes):
            wanted = self.max_pieces if self.every_node else \
                math.ceil(count / total * nodes) + 1
            if wanted > 2:
                heads[key] = min(wanted, self.max_pieces)
        self.heads.clear()                        # in place: placers hold this dict
        self.heads.update(heads)
        self.sketch.decay(self.decay)
        for node in self.sent:
            self.sent[node] *= self.decay
