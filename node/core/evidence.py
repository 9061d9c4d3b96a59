"""What a node needs before a ring view may remove a member it still holds live. Pure.

A removal in a view is only a name in a set, and any member's certificate can send a
view: believed on one member's word, a single call could fence live members and, at
r=1, lose every range two of them held. So a view is adopted only with the ring's own
evidence behind each removal it brings:

- a member we hold live (and not us) that the view removes, or gives another
  incarnation (a restart): our own evidence must say it is gone: our direct probe of
  its address found no answer from that member (refused, none in a probe deadline, or
  the process there answers as another member or incarnation: it rejoined under a new
  name, or restarted), or we could not reach it lately when a peer asked us to (an
  indirect probe: the quorum behind an honest declaration is made of such answers).
  The view waits (at most MAX_PENDING of them, MAX_PER_SENDER from one sender; when
  full, a view already refused goes first) while we probe; while the member answers
  as itself it keeps its place and the view is refused, loudly, and probed again every
  RETRY seconds: a member declared honestly (it was paused or cut off) soon learns it
  and answers as fenced or as the member it rejoined as, and the view is adopted then.
  A SIGKILLed member refuses the probe at once, so a takeover that arrives by gossip
  waits one round trip;
- us: a view that removes us counts only as the answer of a member we called at its
  address (`pulled`), never one pushed to us; a pushed one makes us ask every peer.
  The members that answered so are our accusers; we are removed once they are more
  than half of the other members (an honest declaration has a quorum of the ring
  behind it, so more than half of the members adopt it), or, SETTLE seconds after we
  asked every peer, once they outnumber the members that answered in the last FRESH
  seconds that we are live (those we reach: the others may be cut off from us). Then we are fenced against our own ring less us: the
  other members the views remove are judged, like anyone's, by the member we rejoin
  as. While contested, we ask every peer again every RETRY seconds.

A fenced member answers every probe as gone, and a rejoined one as its new name, so a
member whose removal was declared honestly by one peer is soon confirmed by every
other's probe: the ring converges.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Iterable

from floering.node.core.move_evidence import MoveGuard
from floering.wire.ring import Ring
from floering.wire.ring_merge import MAX_VERSION_STEP

MAX_PENDING = 4            # views held while their removals are verified
MAX_PER_SENDER = 2         # of them, from one sender
MAX_GONE = 4096            # members remembered as found gone
FRESH = 10.0               # seconds a probe finding a member gone, or an answer, counts
RETRY = 1.0                # a held view's members are probed again this often
SETTLE = 0.25              # seconds the answers of every peer, once asked, may take
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
        # stamp -> (view, claims, sender)
        self.pending: dict[int, tuple[Ring, frozenset[str], str]] = {}
        self.verifying: dict[str, object] = {}       # member -> the probe verifying it
        self.gone: dict[str, float] = {}             # member -> when we found it gone
        self.checked: dict[str, float] = {}          # member -> when last probed for a view
        self.refused: set[int] = set()               # held views already reported refused
        self.accusers: set[str] = set()              # members whose answer removes us
        self.vouchers: dict[str, float] = {}         # member -> when it answered us live
        self.asked = -RETRY                          # when we last asked again (accused)
        self.accused_since = 0.0
        self.stalled_at = float("-inf")              # when our own loop last stalled
        self.counters = dict(views_absorbed=0, removals_refused=0, views_held=0,
                             own_removal_refused=0)
        self._reported: dict[str, float] = {}
        self.moves = MoveGuard()                     # views moving live members' ranges

    def reset(self) -> None:
        """We rejoined as a new member: nothing held counts any more."""
        self.pending.clear()
        self.verifying.clear()
        self.gone.clear()
        self.checked.clear()
        self.refused.clear()
        self.accusers.clear()
        self.vouchers.clear()
        self.asked = -RETRY
        self.stalled_at = float("-inf")
        self.moves.reset()

    def unverified(self, claims: frozenset[str], now: float) -> set[str]:
        """The claimed members our own probes have not found gone lately."""
        self.gone = {n: t for n, t in self.gone.items() if now - t <= FRESH}
        return {n for n in claims if n not in self.gone}

    def hold(self, view: Ring, claims: frozenset[str], sender: str = "") -> None:
        """Hold `view` while its removals are verified. A sender holds at most
        MAX_PER_SENDER; when full, a view already refused (a member it removes answered)
        goes first, else the oldest of the sender holding most: one member pushing many
        views cannot push out another's before its probe ends."""
        stamp = view.stamp
        if stamp in self.pending:
            sender = sender or self.pending[stamp][2]
        else:
            mine = [s for s, held in self.pending.items() if held[2] == sender]
            if sender and len(mine) >= MAX_PER_SENDER:
                self._drop(([s for s in mine if s in self.refused] or mine)[0])
            elif len(self.pending) >= MAX_PENDING:
                refused = [s for s in self.pending if s in self.refused]
                count = Counter(held[2] for held in self.pending.values())
                most = max(count.values())
                self._drop(refused[0] if refused else next(
                    s for s, held in self.pending.items() if count[held[2]] == most))
        self.pending[stamp] = (view, claims, sender)
        self.counters["views_held"] += 1

    def _drop(self, stamp: int) -> None:
        del self.pending[stamp]
        self.refused.discard(stamp)

    def abandon(self, probe) -> None:
        if self.verifying.get(probe.node) is probe:
            del self.verifying[probe.node]

    def to_verify(self, claims: Iterable[str]) -> list[str]:
        """Members to start a verification probe of (none is in flight for them)."""
        return sorted(n for n in claims if n not in self.verifying)

    def verified(self, node: str, alive: bool, now: float) -> tuple[list[tuple[Ring, str]], int]:
        """A verification probe of `node` ended. Returns the held views now backed by
        evidence (to adopt, with their senders), and how many were refused for the
        first time (`node` answered: they stay held, probed again every RETRY)."""
        self.verifying.pop(node, None)
        self.checked[node] = now
        if alive:
            self.gone.pop(node, None)
            new = [s for s, held in self.pending.items()
                   if node in held[1] and s not in self.refused]
            self.refused = {s for s in self.refused if s in self.pending} | set(new)
            self.counters["removals_refused"] += len(new)
            return [], len(new)
        self.seen_gone(node, now)
        ready = [s for s, held in self.pending.items() if not self.unverified(held[1], now)]
        views = [self.pending.pop(s) for s in ready]
        self.refused -= set(ready)
        return [(view, sender) for view, _, sender in views], 0

    def seen_gone(self, node: str, now: float) -> None:
        """We could not reach `node` (our own probe, or one a peer asked us for)."""
        self.gone[node] = now
        if len(self.gone) > MAX_GONE:
            self.gone.pop(next(iter(self.gone)))

    def due(self, now: float) -> set[str]:
        """Members of held views to probe again now."""
        claimed = {n for held in self.pending.values() for n in held[1]}
        self.checked = {n: t for n, t in self.checked.items() if n in claimed}
        return {n for n in self.unverified(frozenset(claimed), now) if n not in self.verifying
                and now - self.checked.get(n, -RETRY) >= RETRY}

    # ------------------------------------------------------- our own removal

    def answered_us(self, member: str, removes_us: bool, now: float) -> None:
        """`member`, called at its address, answered with a view that removes us or
        holds us live. A removal is for good: an accuser that holds us live again
        made it up, and accuses no more."""
        if removes_us:
            if not self.accusers:
                self.accused_since = now
            self.accusers.add(member)
            self.vouchers.pop(member, None)
        else:
            self.accusers.discard(member)
            self.vouchers[member] = now

    def removal_backed(self, others: set[str], now: float) -> bool:
        """Do the answers we asked for back our removal? Our accusers among the other
        members are more than half of them, or, SETTLE after we asked every peer, more
        than those that answered lately that we are live. In a ring of two, the other
        member's word alone never does: it counts only if our own loop stalled long
        enough to be declared in the last FRESH seconds (`stalled_at`, set by the
        machine; a rejoin forgets it), as no probe of a live member can confirm its
        death with two members (no quorum). Forgets whoever is no longer a member."""
        self.accusers &= others
        self.vouchers = {n: t for n, t in self.vouchers.items()
                         if n in others and now - t <= FRESH}
        if not self.accusers:
            return False
        if len(others) == 1:
            return now - self.stalled_at <= FRESH
        return 2 * len(self.accusers) > len(others) or (
            self.asked >= self.accused_since and now - self.asked >= SETTLE
            and len(self.accusers) > len(self.vouchers))

    def ask_again(self, now: float) -> bool:
        """We are accused: ask every peer now (at once, then every RETRY)?"""
        if not self.accusers or (now - self.asked < RETRY
                                 and self.asked >= self.accused_since):
            return False
        self.asked = now
        return True

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
