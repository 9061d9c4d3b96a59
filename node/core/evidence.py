"""What a node needs before a ring view may remove a member it still holds live. Pure.

A removal in a view is only a name in a set, and any member's certificate can send a
view: believed on one member's word, a single call could fence live members and, at
r=1, lose every range two of them held. So a view is adopted only with the ring's own
evidence behind each removal it brings:

- a member we hold live (and not us) that the view removes, or gives another
  incarnation (a restart): our own evidence must say it is gone: our direct probe of
  it found no answer from that process (refused, or none in a probe deadline), or we
  could not reach it lately when a peer asked us to (an indirect probe: the quorum
  behind an honest declaration is made of such answers). The view waits (at most
  MAX_PENDING of them) while we probe; while the member answers it keeps its place
  and the view is refused, loudly, and probed again every RETRY seconds: a member
  declared honestly (it was paused or cut off) soon learns it and answers as fenced,
  and the view is adopted then. A SIGKILLed member refuses the probe at once, so a
  takeover that arrives by gossip waits one round trip;
- us: a view that removes us counts only as the answer of a member we called at its
  address (`pulled`), never one pushed to us; a pushed one makes us ask every peer.

A fenced member answers every probe as gone, so a member whose removal was declared
honestly by one peer is soon confirmed by every other's probe: the ring converges.
"""

from __future__ import annotations

import logging

from floering.node.core.ring import Ring
from floering.node.core.ring_merge import MAX_VERSION_STEP

MAX_PENDING = 4            # views held while their removals are verified
MAX_GONE = 4096            # members remembered as found gone
FRESH = 10.0               # seconds a probe finding a member gone stays evidence
RETRY = 1.0                # a held view's members are probed again this often
REPORT_EVERY = 5.0         # refusals are logged at most this often (all are counted)


def removal_claims(ring: Ring, view: Ring) -> frozenset[str]:
    """Members live in `ring` that merging `view` would remove: removed by it, or
    heard by it as another incarnation (a restart)."""
    live = set(ring.nodes)
    claims = {n for n in view.removed if n in live}
    claims |= {n for n, i in view.incarnations
               if n in live and ring.incarnation_of(n) not in (0, i)}
    return frozenset(claims)


class ViewGuard:
    """The views held back, the members being verified, and what was refused."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Ring, frozenset[str]]] = {}   # stamp -> (view, claims)
        self.verifying: dict[str, object] = {}       # member -> the probe verifying it
        self.gone: dict[str, float] = {}             # member -> when we found it gone
        self.checked: dict[str, float] = {}          # member -> when last probed for a view
        self.refused: set[int] = set()               # held views already reported refused
        self.counters = dict(views_absorbed=0, removals_refused=0, views_held=0,
                             own_removal_refused=0)
        self._reported: dict[str, float] = {}

    def reset(self) -> None:
        """We rejoined as a new member: nothing held counts any more."""
        self.pending.clear()
        self.verifying.clear()
        self.gone.clear()
        self.checked.clear()
        self.refused.clear()

    def unverified(self, claims: frozenset[str], now: float) -> set[str]:
        """The claimed members our own probes have not found gone lately."""
        self.gone = {n: t for n, t in self.gone.items() if now - t <= FRESH}
        return {n for n in claims if n not in self.gone}

    def hold(self, view: Ring, claims: frozenset[str]) -> None:
        if view.stamp not in self.pending and len(self.pending) >= MAX_PENDING:
            del self.pending[next(iter(self.pending))]       # the oldest goes
        self.pending[view.stamp] = (view, claims)
        self.counters["views_held"] += 1

    def abandon(self, probe) -> None:
        if self.verifying.get(probe.node) is probe:
            del self.verifying[probe.node]

    def to_verify(self, claims: set[str]) -> list[str]:
        """Members to start a verification probe of (none is in flight for them)."""
        return sorted(n for n in claims if n not in self.verifying)

    def verified(self, node: str, alive: bool, now: float) -> tuple[list[Ring], int]:
        """A verification probe of `node` ended. Returns the held views now backed by
        evidence (to adopt), and how many were refused for the first time (`node`
        answered: they stay held, probed again every RETRY)."""
        self.verifying.pop(node, None)
        self.checked[node] = now
        if alive:
            self.gone.pop(node, None)
            new = [s for s, (_, c) in self.pending.items() if node in c and s not in self.refused]
            self.refused = {s for s in self.refused if s in self.pending} | set(new)
            self.counters["removals_refused"] += len(new)
            return [], len(new)
        self.seen_gone(node, now)
        ready = [s for s, (_, c) in self.pending.items() if not self.unverified(c, now)]
        return [self.pending.pop(s)[0] for s in ready], 0

    def seen_gone(self, node: str, now: float) -> None:
        """We could not reach `node` (our own probe, or one a peer asked us for)."""
        self.gone[node] = now
        if len(self.gone) > MAX_GONE:
            self.gone.pop(next(iter(self.gone)))

    def due(self, now: float) -> set[str]:
        """Members of held views to probe again now."""
        claimed = {n for _, c in self.pending.values() for n in c}
        self.checked = {n: t for n, t in self.checked.items() if n in claimed}
        return {n for n in self.unverified(frozenset(claimed), now) if n not in self.verifying
                and now - self.checked.get(n, -RETRY) >= RETRY}

    def absorbed(self, ring: Ring, view: Ring) -> bool:
        """Is `view` further ahead than one merge takes (its version absorbed a step)?"""
        if view.version > ring.version + MAX_VERSION_STEP:
            self.counters["views_absorbed"] += 1
            return True
        return False

    def report(self, kind: str, now: float) -> bool:
        """Log this kind of refusal now? At most once per REPORT_EVERY; all are counted."""
        if now - self._reported.get(kind, -REPORT_EVERY) < REPORT_EVERY:
            return False
        self._reported[kind] = now
        return True


LEVEL = logging.WARNING
