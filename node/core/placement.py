"""Whether a checkpoint cut under an earlier ring still lands where it was meant to.

A checkpoint carries the stamp of the ring its sender cut it under. What that stamp
protects, on the replica taking it in: that the sender is the range's primary, that
we are one of its replicas, and that the range is the one whose keys the checkpoint
holds (the same bounds), so that its watermarks, and the deltas that follow it, compose
exactly with what we hold. A ring change that leaves all three as they were (a
handoff of another range preparing or aborting, a member added or removed elsewhere,
extra destinations of this range coming and going) changes none of it: a checkpoint
cut before it, a full copy of millions of keys halfway through its chunks among
them, is as good after it. A change that moves the range (another primary, one
moving away and back included), cuts it (a split) or drops us from its replicas is
refused as before.

`Placement` is what is compared; `CopyBook` keeps the rings we held last (a few) and
pins each full copy arriving in chunks to its range's placement, so that a copy
outlives any number of ring changes that keep it, and stops at the first that does
not. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from floering.wire.ring import Ring

RECENT_RINGS = 8      # rings held before the current one: a delta cut under one still lands
MAX_PINS = 256        # full copies arriving at once (node.transport.chunking.Reassembly)


class Placement(NamedTuple):
    owner: str
    bounds: tuple[int, int]
    replicas: tuple[str, ...]


def placement(ring: Ring, token: int) -> Placement | None:
    """Where the range of `token` lives in `ring`: None when the ring has no such token."""
    if not ring.has_token(token):
        return None
    return Placement(ring.owner_of_token(token), ring.range_of_token(token),
                     ring.replicas_of_token(token))


def same_for(a: Placement | None, b: Placement | None, sender: str, me: str) -> bool:
    """Both name `sender` as the range's primary and `me` among its replicas, with the
    same bounds: what a checkpoint of `sender`'s to us depends on. (The other replicas
    may differ: they take their own copies.)"""
    return a is not None and b is not None and a.owner == b.owner == sender and \
        a.bounds == b.bounds and me in a.replicas and me in b.replicas


class CopyBook:
    """The rings this node held before its current one (at most RECENT_RINGS), and the
    full copies arriving in chunks pinned to their range's placement (at most
    MAX_PINS: the oldest goes). `adopted(old, new)` on every ring change."""

    def __init__(self, me: str, recent: int = RECENT_RINGS, max_pins: int = MAX_PINS) -> None:
        self.me = me
        self.recent: deque[Ring] = deque(maxlen=recent)
        self.max_pins = max_pins
        # (sender, token) -> (the copy's ring stamp, its placement; None once moved)
        self.pins: dict[tuple[str, int], tuple[int, Placement | None]] = {}

    def adopted(self, old: Ring, new: Ring) -> None:
        """We went from `old` to `new`: remember `old`; a pinned copy whose range the
        change moved, cut or took from us is broken for good."""
        self.recent.append(old)
        for key, (stamp, where) in self.pins.items():
            if where is not None and not same_for(where, placement(new, key[1]), key[0],
                                                  self.me):
                self.pins[key] = (stamp, None)

    def kept_since(self, current: Ring, stamp: int, sender: str, token: int) -> bool:
        """The ring of `stamp` is ours or one we held lately, and every ring we held from
        it to ours places the range of `token` as a checkpoint of `sender`'s to us needs."""
        rings = [*self.recent, current]
        at = next((i for i in range(len(rings) - 1, -1, -1) if rings[i].stamp == stamp), None)
        if at is None:
            return False
        now = placement(current, token)
        return all(same_for(placement(r, token), now, sender, self.me) for r in rings[at:])

    def chunk(self, current: Ring, stamp: int, sender: str, token: int) -> bool:
        """A chunk of a full copy of `sender`'s range of `token`, cut under `stamp`: False
        when the copy's range has moved since (refuse it: the copy is of no use). A
        stamp we cannot judge (one we have not held: a newer ring) is let through, to
        be judged when the copy completes."""
        key = (sender, token)
        pinned = self.pins.get(key)
        if pinned is not None and pinned[0] == stamp:
            return pinned[1] is not None
        if stamp == current.stamp or self.kept_since(current, stamp, sender, token):
            where = placement(current, token)
            if not same_for(where, where, sender, self.me):
                return False       # not our range of the sender's under its own stamp
            self.pins.pop(key, None)
            while len(self.pins) >= self.max_pins:
                del self.pins[next(iter(self.pins))]
            self.pins[key] = (stamp, where)
        return True

    def accepts(self, current: Ring, stamp: int, sender: str, token: int) -> bool:
        """Whether a checkpoint of `sender`'s range of `token` cut under `stamp` lands
        where it was meant to in `current`; a pinned copy's pin goes with it."""
        pinned = self.pins.pop((sender, token), None)
        if stamp == current.stamp:
            return True
        if pinned is not None and pinned[0] == stamp:
            return same_for(pinned[1], placement(current, token), sender, self.me)
        return self.kept_since(current, stamp, sender, token)
