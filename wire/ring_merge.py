"""Merging two ring views (`Ring.merge`), pure.

Every node that merges the same two views reaches the same ring, whichever it held.
Per token the entry with the higher generation wins (a handoff or a removal's
reassignment is never undone); removals and joins of either side are kept; members
heard as two incarnations are removed (they restarted); the version moves past both
unless the newer view already contains everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from floering.wire.errors import InvalidArgument, inert
from floering.wire.ring_wire import MAX_RING_TOKENS, MAX_VERSION

if TYPE_CHECKING:
    from floering.wire.ring import Ring

# token -> (generation, owner, extras, retiring holders)
Entries = dict[int, tuple]

# How far one merge may raise our version. Every change adds one; a node cut off for a
# long time may fall behind by a few thousand. A view further ahead (forged, or relayed
# by a peer a forged one was pushed to) is merged as if it were this far ahead: its
# content is taken whole, its version is absorbed a step at a time. Versions stay a
# max-merge, so nodes that disagree converge (a gap of g closes in g / step exchanges),
# instead of refusing each other for good; and a member needs 2^28 views to run the
# version up to its limit (MAX_VERSION).
MAX_VERSION_STEP = 1 << 12


def check_compatible(mine: "Ring", theirs: "Ring") -> None:
    """Refuse a view no honest member can have sent us: another replication factor,
    balancer or reducer, another address for a member we both know (a member's address never
    changes; a process elsewhere joins under a new name), or implausibly many tokens."""
    if theirs.replication != mine.replication:
        raise InvalidArgument(f"the ring runs r={mine.replication}, the view says "
                              f"r={theirs.replication}")
    if theirs.balancer != mine.balancer:
        raise InvalidArgument(f"the ring runs balancer {mine.balancer}, the view says "
                              f"{inert(theirs.balancer, 40)}")
    if mine.reducer and theirs.reducer and theirs.reducer != mine.reducer:
        raise InvalidArgument(f"the ring runs reducer {mine.reducer}, the view says "
                              f"{inert(theirs.reducer, 200)}")
    ours = dict(mine.addresses)
    for node, address in theirs.addresses:
        if ours.get(node, address) != address:
            raise InvalidArgument(f"the view moves member {inert(node)} from {ours[node]} "
                                  f"to {inert(address)}")
    gone = mine.removed | theirs.removed
    held: dict[str, str] = {}
    for node, address in (*mine.addresses, *theirs.addresses):
        if node not in gone and held.setdefault(address, node) != node:
            # Each end of a call knows the other by its address: two members there
            # would have every channel to it expect the wrong certificate.
            raise InvalidArgument(f"the view places {inert(node)} at {inert(address)}, "
                                  f"where member {inert(held[address])} is")
    if len(theirs.tokens) > MAX_RING_TOKENS or len(theirs.addresses) > MAX_RING_TOKENS:
        raise InvalidArgument(f"the view has {len(theirs.tokens)} tokens and "
                              f"{len(theirs.addresses)} members: implausibly many")
    for token in theirs.lost - mine.lost:
        if not _loss_possible(mine, theirs, token):
            raise InvalidArgument(f"the view marks token {token:#x} lost, which no removal "
                                  f"it holds can have caused")


def _loss_possible(mine: "Ring", theirs: "Ring", token: int) -> bool:
    """A range is lost only when its copies went with removed members
    (`Ring.remove_node`): the view must remove one of the nodes that hold it in our
    ring (two views may disagree on who else does, while a handoff races a
    declaration). A part split off a lost range is lost."""
    if not theirs.has_token(token):
        return False
    cover = token if mine.has_token(token) else mine.token_for_position(token)
    if cover in mine.lost:
        return True
    if cover != token and cover in theirs.lost and _loss_possible(mine, theirs, cover):
        return True
    return bool(set(mine.destinations(cover)) & theirs.removed)


def absorbed_version(mine: "Ring", theirs: "Ring") -> int:
    """The version `theirs` merges as into `mine`: at most MAX_VERSION_STEP ahead (and
    below the limit the stamp allows)."""
    return min(theirs.version, mine.version + MAX_VERSION_STEP, MAX_VERSION - 2)


def merge_rings(a: "Ring", b: "Ring") -> "Ring":
    """`b` merged into `a` (the receiver's view)."""
    check_compatible(a, b)
    if (version := absorbed_version(a, b)) != b.version:
        b = b.with_version(version)
    older, newer = sorted((a, b), key=lambda r: (r.version, r.stamp))
    incarnations, restarted = _merge_incarnations(older, newer)
    if restarted and not (set(older.nodes) | set(newer.nodes)) - (
            older.removed | newer.removed | restarted):
        # Every member restarted: a ring keeps one member, the same one whatever
        # the order of merges (a later view of it merges the same way).
        restarted = restarted - {max(restarted)}
    gone = older.removed | newer.removed | restarted
    if not (set(older.nodes) | set(newer.nodes)) - gone:
        # Two sides of a partition that each removed the other: no member is left to
        # own anything, so the views cannot be merged; the receiver keeps its own.
        raise InvalidArgument(f"the two views remove every member between them "
                              f"({inert(', '.join(sorted(gone)), 200)}): refused")
    entries = _token_entries(older, newer, gone)
    for ring in (older, newer):
        _extend_split_off(ring, entries)
    addresses = dict(older.addresses)
    addresses.update(newer.addresses)
    tokens = tuple(sorted(entries))
    owners_now = {e[1] for e in entries.values()}

    def live(nodes):
        return tuple(x for x in nodes if x not in gone)

    base = type(a)(max(a.version, b.version) + 1, newer.replication, tokens,
                   tuple(entries[t][1] for t in tokens),
                   tuple(sorted(x for x in addresses.items()
                                if x[0] not in gone or x[0] in owners_now)),
                   frozenset(), older.lost | newer.lost,
                   tuple(entries[t][0] for t in tokens),
                   tuple((t, live(entries[t][2])) for t in tokens if live(entries[t][2])),
                   frozenset((t, x) for t in tokens for x in entries[t][3]
                             if x not in gone and x in entries[t][2]),
                   tuple(sorted((n, i) for n, i in incarnations.items()
                                if n in addresses and n not in gone)),
                   newer.balancer, newer.reducer or older.reducer)
    gone_members = gone & set(base.nodes)
    merged = base.without(gone_members) if gone_members else base
    merged = merged.with_membership(base.version, frozenset(gone),
                                    tuple(x for x in merged.addresses if x[0] not in gone))
    if merged.content() == newer.content():
        return newer
    return merged


def _token_entries(older: "Ring", newer: "Ring", gone: frozenset) -> Entries:
    """Each token's winning entry: the higher generation; on a tie the newer view's,
    unless it names a removed owner where the other does not."""
    entries: Entries = {}
    for ring in (older, newer):
        holders = retiring_by_token(ring)
        for i, token in enumerate(ring.tokens):
            entry = (ring.generations[i], ring.owners[i], ring.extras_of(token),
                     holders.get(token, frozenset()))
            held = entries.get(token)
            if held is None or entry[0] > held[0] or (
                    entry[0] == held[0] and not (entry[1] in gone and held[1] not in gone)):
                if held is not None and held[:2] == entry[:2]:
                    # the same change seen from two sides: keep every extra
                    entry = (entry[0], entry[1], tuple(sorted(set(entry[2]) | set(held[2]))),
                             entry[3] | held[3])
                entries[token] = entry
    return entries


def _extend_split_off(ring: "Ring", entries: Entries) -> None:
    """A token `ring` lacks was split off a range it knows whole: what it changed on
    the whole range after the split (extras holding a copy, from someone else's
    commit) holds for the split-off part too."""
    holders = retiring_by_token(ring)
    for token, entry in list(entries.items()):
        if ring.has_token(token):
            continue
        cover = ring.token_for_position(token)
        i = ring.token_index(cover)
        more = ring.extras_of(cover)
        # A tie is two concurrent changes (the part's own, say a prepare, and one of
        # the whole range, say a neighbour's commit marking holders): keep both, as
        # `_token_entries` does for one token.
        if not more or ring.owners[i] != entry[1] or ring.generations[i] < entry[0]:
            continue
        # The part now carries that change: it takes its generation too, so that a
        # later change of the part elsewhere meets it as a tie (both kept) rather
        # than erasing it (merging stays independent of the order views arrive in).
        entries[token] = (ring.generations[i], entry[1], tuple(sorted(set(entry[2]) | set(more))),
                          entry[3] | holders.get(cover, frozenset()))


def retiring_by_token(ring: "Ring") -> dict[int, frozenset]:
    """The retiring holders of each token (one pass: no scan of them per token)."""
    out: dict[int, set] = {}
    for token, node in ring.retiring:
        out.setdefault(token, set()).add(node)
    return {t: frozenset(x) for t, x in out.items()}


def _merge_incarnations(a: "Ring", b: "Ring") -> tuple[dict[str, int], set[str]]:
    """Every incarnation either view heard, and the members heard as two: those
    restarted, so their first process and what it held are gone."""
    known = dict(a.incarnations)
    restarted = set()
    for node, incarnation in b.incarnations:
        if known.setdefault(node, incarnation) != incarnation:
            restarted.add(node)
            known[node] = max(known[node], incarnation)
    return known, restarted
