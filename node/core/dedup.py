"""Deduplication by per-source watermarks.

Within one token range, a source's tuples are applied in seq order (the mapper keeps
per-(source, node) order and resends in order), so "everything up to the watermark was
applied" holds and one integer per (range, source) is enough to drop a resent tuple.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from typing import Callable, Sequence

from floering.wire.pieces import COMBINED_SOURCE


def first_new_index(watermark: int, first_seq: int, last_seq: int, count: int,
                    seqs: Callable[[], Sequence[int]]) -> int:
    """Index of the first tuple of a batch past `watermark` (== count: all duplicates).

    `seqs` is called only for a batch that straddles the watermark."""
    if first_seq > watermark:
        return 0
    if last_seq <= watermark:
        return count
    return bisect_right(seqs(), watermark)


# ------------------------------------------------------------ who owns a source
#
# Under TLS a node keeps every source a client or an operator pushes under the caller's
# identity (its certificate's role and name): `bind_source` puts a mark of that
# identity in front of the source id, so the name a range keeps its watermark (and an
# epoch group its floor) under is one no other identity can send. A caller who learns
# or guesses another's source id (a feed's, a Spark query's) gets a source of its own
# with that id, and cannot touch the other's watermark or floor. The binding is in the
# name itself, so checkpoints, replicas, takeovers, splits and the durable store carry
# it as they carry any source. The mark is kept behind a kind prefix that decides how
# a source's tuples are applied (`combined:`). Members (node certificates: a fold's
# batches) and callers in the clear are not marked.

MARK = "@"
MARK_CHARS = 16                               # hex digits of the identity's hash
MARK_LEN = len(MARK) + MARK_CHARS + 1         # "@" + digits + "/"
KIND_PREFIXES = (COMBINED_SOURCE,)


def identity_mark(identity: str) -> str:
    return f"{MARK}{hashlib.sha256(identity.encode()).hexdigest()[:MARK_CHARS]}/"


def bind_source(identity: str, source: str) -> str:
    """`source` as the node keeps it for a caller of `identity` (e.g. "client:alice")."""
    mark = identity_mark(identity)
    for kind in KIND_PREFIXES:
        if source.startswith(kind):
            return kind + mark + source[len(kind):]
    return mark + source


def owner_of(source: str) -> str | None:
    """The identity mark a bound source carries, or None (a member's, or in the clear)."""
    for kind in KIND_PREFIXES:
        if source.startswith(kind):
            source = source[len(kind):]
            break
    if len(source) > MARK_LEN and source[0] == MARK and source[MARK_LEN - 1] == "/":
        return source[:MARK_LEN]
    return None


SHARES = 4          # an identity may hold a quarter of a range's (or node's) sources


def owned_by(sources, owner: str) -> int:
    """How many of `sources` (a range's watermark keys) carry `owner`'s mark."""
    return sum(1 for s in sources if owner_of(s) == owner)
