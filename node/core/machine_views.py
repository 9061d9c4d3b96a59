"""How the node machine takes ring views from elsewhere (node.core.evidence): a view
far ahead is absorbed a step at a time, a removal of a member we hold live waits for
our own probe of it, and a removal of us counts only as an answer we asked for. Pure:
a part of NodeMachine (node.core.machine), split out to keep each module small."""

from __future__ import annotations

import logging

from floering.node.core.detector import ALIVE, Probe
from floering.node.core.evidence import removal_claims
from floering.node.core.machine_io import (Gossip, Note, ProbedFor, ProbeFinished, RingSeen,
                                          StartProbe)
from floering.node.core.membership import restarted
from floering.node.core.ring_merge import MAX_VERSION_STEP


class ViewChecks:
    """Mixed into NodeMachine: uses its core, detector, guard, isolation and epoch."""

    def is_process_of(self, node: str, incarnation: int) -> bool:
        """Is the process that answered for `node` the member the ring knows?"""
        return not restarted(self.core.ring, node, incarnation)

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
        if me in claims and not event.pulled:
            # Only a member we ask at its address tells us we were removed.
            guard.counters["own_removal_refused"] += 1
            if guard.report("own", now):
                out.append(self._record(
                    "removal_refused", f"a ring view pushed to {me} removes it: not taken "
                    "on the sender's word; asking every peer for its ring", logging.WARNING,
                    about=[me], count=guard.counters["own_removal_refused"]))
            out.append(Gossip())
            return
        # Removed (by a view we asked for), we rejoin empty: whom else it removes
        # is no longer ours to judge.
        waiting = guard.unverified(claims - {me}, now) if me not in claims else ()
        if waiting:
            guard.hold(view, claims - {me})
            out.append(Note(f"a ring view removes {','.join(sorted(waiting))}: probing "
                            "before it is adopted"))
            self._verify(waiting, now, out)
            return
        self._adopt(view, now, out)
        if self.isolation.view_seen():     # had we been removed, we would be fenced now
            out.append(Note("a peer's ring view reached us: our suspicions count again"))

    def _probed_for(self, event: ProbedFor, now: float, out: list) -> None:
        if event.node in self.core.ring.nodes:
            self.guard.seen_gone(event.node, now)

    def _retry_views(self, now: float, out: list) -> None:
        """Probe again the members of held views (a member declared honestly answers
        as fenced once it learns it)."""
        if not self.guard.pending:
            return
        due = self.guard.due(now)
        for node in sorted(n for n in due if n not in self.core.ring.nodes):
            for view in self.guard.verified(node, False, now)[0]:   # removed meanwhile
                self._ring_seen(RingSeen(view), now, out)
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
        meanwhile, nor if the process at its address is another one: one the ring knows
        as another incarnation, or that a held view knows as another member (a restart
        that joined under a new name)."""
        ring, node = self.core.ring, event.probe.node
        if node not in ring.nodes:
            return False
        if ALIVE in event.indirect:
            return True
        others = {i for view, _ in self.guard.pending.values()
                  for n, i in view.incarnations if n != node}
        return event.direct == ALIVE and not restarted(ring, node, event.incarnation) \
            and event.incarnation not in others

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
        for view in views:
            self._ring_seen(RingSeen(view), now, out)
        return True
