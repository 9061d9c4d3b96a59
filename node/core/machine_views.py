"""How the node machine takes ring views from elsewhere (node.core.evidence): a view
far ahead is absorbed a step at a time, a removal of a member we hold live waits for
our own probe of it, and a removal of us counts only as the answers we asked for of
more than half of the other members (or of all that answer). Pure: a part of
NodeMachine (node.core.machine), split out to keep each module small."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from floering.node.core.detector import ALIVE, FailureDetector, Isolation, Probe
from floering.node.core.evidence import removal_claims
from floering.node.core.machine_io import (Gossip, Note, ProbedFor, ProbeFinished, RingSeen,
                                          StartProbe)
from floering.node.core.membership import restarted
from floering.node.core.move_evidence import move_claims
from floering.wire.ring_merge import MAX_VERSION_STEP, check_compatible

if TYPE_CHECKING:
    from floering.node.core.evidence import ViewGuard
    from floering.node.core.machine_io import Record
    from floering.node.core.node_core import NodeCore, RingChange
    from floering.wire.ring import Ring


class ViewChecks:
    """Mixed into NodeMachine: uses its core, detector, guard, isolation and epoch."""

    core: NodeCore
    detector: FailureDetector
    guard: ViewGuard
    isolation: Isolation
    epoch: int

    if TYPE_CHECKING:
        def _record(self, kind: str, text: str = "", level: int = logging.INFO,
                    **fields: object) -> Record: ...

        def _adopt(self, ring: Ring, now: float, out: list) -> RingChange | None: ...

    def is_process_of(self, node: str, incarnation: int, member: str = "") -> bool:
        """Is the process that answered for `node` (as `member`, when known) the
        member the ring knows? Not if it answers as another member (it rejoined under
        a new name) or as another incarnation (it restarted)."""
        return member in ("", node) and not restarted(self.core.ring, node, incarnation)

    def address_of(self, node: str) -> str | None:
        try:
            return self.core.ring.address(node)
        except ValueError:
            return None

    def _ring_seen(self, event: RingSeen, now: float, out: list) -> None:
        ring, view, me, guard = self.core.ring, event.ring, self.core.node_id, self.guard
        if guard.absorbed(ring, view) and guard.report("absorbed", now):
            out.append(self._record(
                "view_absorbed", f"a ring view at v{view.version} is far ahead of ours "
                f"(v{ring.version}): merged as {MAX_VERSION_STEP} ahead, the rest absorbed "
                f"by later exchanges ({guard.counters['views_absorbed']} such views so far)",
                logging.WARNING, version=view.version, ours=ring.version))
        claims = removal_claims(ring, view)
        if me in claims and (event.sender or not event.pulled):
            self._removes_us(event, now, out)
            return
        if event.pulled and event.sender and me in view.nodes:
            guard.answered_us(event.sender, False, now)       # it holds us live
        # Removed by our own start-up decision, we rejoin empty: whom else it
        # removes is no longer ours to judge.
        waiting = guard.unverified(claims, now) if me not in claims else ()
        if waiting:
            guard.hold(view, claims, event.sender)
            out.append(Note(f"a ring view removes {','.join(sorted(waiting))}: probing "
                            "before it is adopted"))
            self._verify(waiting, now, out)
            return
        if self._moves_unbacked(event, now, out):
            return
        self._adopt(view, now, out)
        if self.isolation.view_seen():     # had we been removed, we would be fenced now
            out.append(Note("a peer's ring view reached us: our suspicions count again"))

    def _removes_us(self, event: RingSeen, now: float, out: list) -> None:
        """A view removes us. Pushed, it is only its sender's word: we ask every peer.
        The answer of a member we called makes it one of our accusers."""
        me, guard = self.core.node_id, self.guard
        if event.pulled:
            check_compatible(self.core.ring, event.ring)   # refused as a merge refuses it
            guard.answered_us(event.sender, True, now)
            self._own_removal(now, out)
            return
        guard.counters["own_removal_refused"] += 1
        if guard.report("own", now):
            out.append(self._record(
                "removal_refused", f"a ring view pushed to {me} removes it: not taken "
                "on the sender's word; asking every peer for its ring", logging.WARNING,
                about=[me], count=guard.counters["own_removal_refused"]))
        out.append(Gossip())

    def _own_removal(self, now: float, out: list, answered: bool = True) -> bool:
        """Are we removed, by the answers we asked for? Then we are fenced against our
        own ring less us (one forged answer cannot remove the members it names beside
        us; the views removing them are judged by the member we rejoin as, when it asks
        every peer). Else the removal is refused while the others hold us live."""
        ring, me, guard = self.core.ring, self.core.node_id, self.guard
        if guard.removal_backed(set(ring.nodes) - {me}, now):
            self._adopt(ring.without([me]), now, out)
            return True
        if guard.ask_again(now):
            out.append(Gossip())        # every peer's answer, before we judge
        if not (guard.accusers and answered):
            return False
        guard.counters["own_removal_refused"] += 1
        if guard.report("own_pulled", now):
            accusers, live = sorted(guard.accusers), sorted(guard.vouchers)
            why = ("a ring of two: not taken on the other member's word alone"
                   if len(ring.nodes) == 2 else
                   f"{','.join(live) or 'no other member yet'} that it is live: not "
                   "taken on a minority's word")
            out.append(self._record(
                "removal_refused", f"{','.join(accusers)} answer that {me} was removed, "
                f"{why}", logging.WARNING, about=[me], accusers=accusers,
                count=guard.counters["own_removal_refused"]))
        return False

    def _probed_for(self, event: ProbedFor, now: float, out: list) -> None:
        if event.node in self.core.ring.nodes:
            self.guard.seen_gone(event.node, now)

    def _retry_views(self, now: float, out: list) -> None:
        """Probe again the members of held views (a member declared honestly answers
        as fenced, or as the member it rejoined as, once it learns it); while our own
        removal is contested, judge it again and ask every peer again."""
        guard, c = self.guard, self.detector.config
        if self.detector.last_late() >= c.min_timeout + c.probe_timeout:
            # our loop stalled as long as a member must be silent to be declared (the
            # shortest suspicion, then a probe): we may have been, while alive
            guard.stalled_at = now
        self._retry_moves(now, out)
        if guard.accusers and self._own_removal(now, out, answered=False):
            return
        if not guard.pending:
            return
        due = guard.due(now)
        for node in sorted(n for n in due if n not in self.core.ring.nodes):
            for view, sender in guard.verified(node, False, now)[0]:   # removed meanwhile
                self._ring_seen(RingSeen(view, sender=sender), now, out)
        self._verify(due, now, out)

    def _verify(self, nodes, now: float, out: list) -> None:
        """Probe each member a view would remove, directly: our own evidence, in one
        round trip when it is dead (refused) and a probe deadline when cut off."""
        ring = self.core.ring
        deadline = self.detector.config.probe_timeout * self.detector.stretch(now)
        for node in self.guard.to_verify(n for n in nodes if n in ring.nodes):
            probe = Probe(node, deadline, now, 0, now)
            self.guard.verifying[node] = probe
            out.append(StartProbe(probe, ring.address(node), (), (), ring.stamp, self.epoch))

    def _answered(self, event: ProbeFinished) -> bool:
        """Did the member itself answer a verification probe? Not if it left our ring
        meanwhile, nor if the process at its address answers as another member (it
        rejoined under a new name) or another incarnation (it restarted). Only the
        answer judges: a held view is the claim being checked."""
        node = event.probe.node
        if node not in self.core.ring.nodes:
            return False
        if ALIVE in event.indirect:
            return True
        return event.direct == ALIVE and self.is_process_of(node, event.incarnation,
                                                            event.member)

    def _verification_finished(self, event: ProbeFinished, now: float, out: list) -> bool:
        """Was this probe one verifying a removal? Then act on it here."""
        node = event.probe.node
        if self.guard.verifying.get(node) is not event.probe:
            return False
        if event.epoch != self.epoch:
            self.guard.verifying.pop(node, None)
            return True
        views, refused = self.guard.verified(node, self._answered(event), now)
        if refused and self.guard.report("removal", now):
            out.append(self._record(
                "removal_refused", f"refused {refused} ring views removing {node}: it "
                f"answers our probe ({self.guard.counters['removals_refused']} refused so "
                "far)", logging.WARNING, about=[node], count=refused))
        for view, sender in views:
            self._ring_seen(RingSeen(view, sender=sender), now, out)
        return True

    # ------------------------------------------------------------ range moves

    def _moves_unbacked(self, event: RingSeen, now: float, out: list) -> bool:
        """Does `event`'s view move a range away from a live member without that
        member's own word (node.core.move_evidence)? Then it is held while the member
        is asked, or refused, and not merged now."""
        moves, view, me = self.guard.moves, event.ring, self.core.node_id
        if (event.pulled and not event.sender) or self.core.starting:
            return False                      # our own start-up decision
        waited = moves.heard(event.sender, view, now, self.core.ring)
        claims = move_claims(self.core.ring, view)
        refused, awaited = moves.judge(claims, me, self.core.ring,
                                       moves.since(view.stamp, now))
        if waited:
            self._recheck_moves(now, out)
        if not (refused or awaited):
            moves.settled(view.stamp)
            return False
        if refused:
            moves.drop(view.stamp, refused=False)
            moves.counters["moves_refused"] += 1
            self._report_moves(sorted(refused), claims, "its own ring says otherwise", now, out)
            return True
        for giver in moves.hold(event, view.stamp, event.sender, awaited, now):
            out.append(Gossip(self.core.ring.address(giver)))
        out.append(Note(f"a ring view moves ranges of {','.join(sorted(awaited))}: asking "
                        "before it is adopted"))
        return True

    def _recheck_moves(self, now: float, out: list) -> None:
        moves = self.guard.moves
        for held in moves.recheck():
            if held.ring.stamp in moves.pending:
                self._ring_seen(held, now, out)

    def _retry_moves(self, now: float, out: list) -> None:
        moves = self.guard.moves
        if not moves.pending:
            return
        if expired := moves.expired(now):
            self._report_moves([], {}, f"no answer backed {expired} of them", now, out)
        self._recheck_moves(now, out)     # a giver removed meanwhile no longer counts
        ring = self.core.ring
        for giver in moves.due(now):
            if giver in ring.nodes and giver != self.core.node_id:
                out.append(Gossip(ring.address(giver)))

    def _report_moves(self, givers: list, claims: dict, why: str, now: float,
                      out: list) -> None:
        guard = self.guard
        if not guard.report("moves", now):
            return
        tokens = sorted(t for g in givers for t in claims.get(g, {}))
        out.append(self._record(
            "move_refused", f"refused a ring view moving ranges of "
            f"{','.join(givers) or 'live members'} without their word: {why} "
            f"({guard.moves.counters['moves_refused']} refused so far)", logging.WARNING,
            about=givers, tokens=tokens[:16], count=guard.moves.counters["moves_refused"]))
