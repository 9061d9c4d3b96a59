"""Mapper side of the balancers that share keys (`node.core.balancers`): which piece
of its key a tuple goes to, and merging the pieces back when reading.

Partial key grouping (`pkg`): a key's two candidates are its pieces 0 and 1, each on
its own place of the ring; the tuple goes to the candidate whose owner this mapper has
sent fewer tuples to so far (the paper's local load estimation: no messages, each
source balances what it sends). Choosing is per tuple, and exact whatever it chooses:
a piece is an ordinary key, and the pieces are merged on every read."""

from __future__ import annotations

from collections import Counter

from node.core.batch import KEY_TYPES
from node.core.errors import InvalidKey
from node.core.pieces import check_user_key, piece_key
from node.core.ring import Ring


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

        def place(key):
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
