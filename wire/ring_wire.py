"""A ring view's wire encoding, bounded before anything is built, and the replica walk
every ring derives in linear time. Pure.

Every view is attacker-controlled input (any member's certificate may send one). Its
size is checked on the bytes, and msgpack is told the largest array, map and string
a view may hold, so an oversized view is refused from its headers, before its objects
exist; what is built from it then costs time linear in its size.
"""

from __future__ import annotations

from typing import Sequence

import msgpack

from floering.wire.errors import InvalidArgument

# The stamp packs the version above a 24-bit digest into one uint64 on the wire.
MAX_VERSION = 1 << 40     # a token's generation too: its next change must fit the wire
# A process draws its incarnation from the clock (ns, ~2**61 today): it fits an int64.
MAX_INCARNATION = 1 << 63
# No ring grows this large (splits stop at --max-tokens, 4096 by default).
MAX_RING_TOKENS = 1 << 16
# The encoding of a ring of MAX_RING_TOKENS tokens, each with a long owner name and
# some extras, stays well below this.
MAX_VIEW_BYTES = 16 << 20
# Replicas per range: far above any deployment (each is a full copy of the range).
MAX_REPLICATION = 64
# The longest string a view holds: a member's name or address, the reducer's identity.
MAX_VIEW_STRING = 1024
# The keys of a view's map (ring.Ring.to_wire): a few more are tolerated.
MAX_VIEW_FIELDS = 32


def decode_view(data: bytes) -> dict:
    """The map a view encodes, refused (InvalidArgument) when its bytes or any array,
    map or string in it exceed the bounds above: checked from the encoding's headers."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgument("a ring view is bytes")
    if len(data) > MAX_VIEW_BYTES:
        raise InvalidArgument(f"a ring view of {len(data)} bytes: over the limit of "
                              f"{MAX_VIEW_BYTES}")
    try:
        d = msgpack.unpackb(data, max_array_len=MAX_RING_TOKENS, max_map_len=MAX_VIEW_FIELDS,
                            max_str_len=MAX_VIEW_STRING, max_bin_len=0, max_ext_len=0)
    except Exception as exc:
        raise InvalidArgument(f"not a valid ring: {str(exc)[:200]}") from None
    if type(d) is not dict:
        raise InvalidArgument("not a valid ring: a ring view is a msgpack map")
    replication = d.get("replication")
    if type(replication) is not int or not 0 <= replication <= MAX_REPLICATION:
        raise InvalidArgument(f"not a valid ring: replication must be 0 to {MAX_REPLICATION}")
    return d


def replica_walks(owners: Sequence[str], replication: int) -> tuple[tuple[str, ...], ...]:
    """Per token index, the up to `replication` distinct nodes after its owner met
    walking clockwise (the owner's excluded). One backward pass over the ring twice
    round, keeping only the replication + 1 nearest distinct owners ahead (a list kept
    most-recent-first: a node further back cannot be among the nearest without being
    met again first): O(tokens * replication), never tokens squared."""
    n = len(owners)
    keep = replication + 1
    ahead: list[str] = []           # distinct owners ahead of the current index, nearest first
    walks: list[tuple[str, ...]] = [()] * n
    if replication <= 0:
        return tuple(walks)
    for j in range(2 * n - 1, -1, -1):
        owner = owners[j % n]
        if j < n:
            walks[j] = tuple([x for x in ahead if x != owner][:replication])
        if owner in ahead:
            ahead.remove(owner)
        ahead.insert(0, owner)
        if len(ahead) > keep:
            ahead.pop()
    return tuple(walks)
