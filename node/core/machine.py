"""The node machine: every protocol decision a reducer node makes, as one pure object.

`NodeMachine.handle(event, now)` takes a frozen event (`floering.node.core.machine_io`) and
returns the effects to carry out. It owns the node's protocol state (NodeCore: ring
and ranges; the failure detector; the load monitor; the handoff it runs) and reads no
clock, does no I/O and draws no randomness, so the asyncio runtime and the
deterministic simulation drive exactly the same decisions.

`epoch` counts the members this process has been (it grows when a fenced node rejoins
under a new name): a call begun as an earlier member reports with its epoch and is
discarded by value, never applied to the member that replaced it. Ring views from
elsewhere are checked first (node.core.machine_views).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from floering.node.core.calls import direct_evidence, refreshes, via_evidence
from floering.node.core.detector import (ALIVE, DEAD, EXCHANGE, REFUSED, TIMED_OUT, FailureDetector,
                                Isolation, combine, declaration, indirect_vias, suspicion_note)
from floering.wire.errors import FloeError, InvalidArgument, inert
from floering.node.core.handoff import (Handoff, HandoffState, SplitBudget, leave_moves, retired_extras, split_ring, unpinned)
from floering.node.core.handoff_driver import HandoffDriver, Request
from floering.node.core.folding import FOLDING_BALANCERS, routed
from floering.node.core.evidence import ViewGuard
from floering.node.core.load import LoadMonitor
from floering.node.core.machine_views import ViewChecks
from floering.node.core.machine_io import (
    BatchApplied, CheckpointAcked, CheckpointDue, CheckpointFailed, CheckpointRoundDone, Exit,
    Farewell, FoldAnswered, Gossip, HandoffAbandoned, HandoffEnded, HandoffRequested,
    HeardFrom, HeartbeatDue, HeartbeatFailed, LeaveRing, LoadSampled, MapperAhead, MonitorDue,
    NextRound, Note, ProbeAbandoned, ProbeAnswered, ProbedFor, ProbeFinished, Record, Reply,
    Requested, RingSeen, RoundEnded,
    RoundNow, SendFolds, SendHeartbeat, ShedMoved, ShipCheckpoints, SignOfLife, Split,
    SplitRequested, StartProbe, StartShed)
from floering.node.core.membership import (RecentDonors, refill_moves, rejoin_name, removal_losses, restarted)
from floering.node.core.node_core import NodeCore, RingChange
from floering.wire.ring import Ring
from floering.node.core.requests import RequestLimits, answer
from floering.node.core.retiring import Retiring
from floering.node.core.shares import FAILING_ROUNDS, SharePulling
from floering.node.core.shedding import PeerLoad, ShedPlan, plan_shed, with_split_tail


# How long a requested handoff waits for the extras of its ranges to retire (another
# handoff just committed next to them) before it is prepared anyway.
SETTLE_SECONDS = 5.0


# After a member leaves, new replicas' full copies wait this long (seconds, the
# --repair-delay default): the heirs answer redirected reads before copies compete for CPU.
REPAIR_DELAY = 0.5


class NodeMachine(ViewChecks, SharePulling):
    def __init__(self, core: NodeCore, incarnation: int, detector: FailureDetector,
                 load: LoadMonitor, make_core: Callable[[str, Ring], NodeCore],
                 listen: str = "", balance: bool = False, max_tokens: int = 4096,
                 max_splits_per_minute: int = 60, repair_delay: float = 0.0) -> None:
        self.core = core
        self.incarnation = incarnation
        self.detector = detector
        self.load = load
        self.make_core = make_core
        self.listen = listen
        self.balance = balance
        self.max_tokens = max_tokens     # splits stop there: a ring's size is bounded
        self.splits = SplitBudget(max_tokens, max_splits_per_minute)
        # After a member leaves, new replicas' full copies wait: the takeover goes first.
        self.repair_delay = repair_delay
        self.repair_after = 0.0
        self.epoch = 0
        self.stimuli = 0                 # events handled so far: names each one
        self._stimulus = ""
        self.rejoined = 0                # times this process rejoined as a new member
        self.handoff: Handoff | None = None
        self.driver = HandoffDriver()    # the handoff running, those in line, round pace
        self.leaving = False
        # Ranges taken over whose first new tuples are not applied yet: token -> the
        # dead owner. Recorded once applied, so recovery can be timed to that moment.
        self.resuming: dict[int, str] = {}
        self.donors = RecentDonors()     # members that handed us ranges: no refill target
        self.failing: dict[tuple[int, str], int] = {}   # (token, replica) -> failed rounds
        self.isolation = Isolation()     # were we cut off? then views first, suspicions after
        self.guard = ViewGuard()         # views held until our own probes back their removals
        self.retiring: Retiring | None = None   # what removed members held (RetainingCore)
        self.limits = RequestLimits()    # what callers may ask (node.core.requests)
        self.started_as = ""             # the name this process was started as
        self.rejoins_seen = 0            # rejoins a peer's view has shown us in
        self._handlers: dict[type, Callable[[Any, float, list], None]] = {
            RingSeen: self._view_seen, HeardFrom: self._heard_from,
            SignOfLife: self._sign_of_life, HeartbeatFailed: self._heartbeat_failed,
            HeartbeatDue: self._heartbeat_due, MonitorDue: self._monitor_due,
            ProbeFinished: self._probe_finished, ProbeAbandoned: self._probe_abandoned,
            ProbeAnswered: self._probe_answered,
            ProbedFor: self._probed_for,
            CheckpointDue: self._checkpoint_due, CheckpointAcked: self._checkpoint_acked,
            CheckpointFailed: self._checkpoint_failed,
            CheckpointRoundDone: self._round_done, RoundEnded: self._round_ended,
            BatchApplied: self._batch_applied, LoadSampled: self._load_sampled,
            HandoffRequested: self._handoff_requested, SplitRequested: self._split,
            HandoffAbandoned: self._handoff_abandoned,
            LeaveRing: self._leave_ring, MapperAhead: self._mapper_ahead,
            FoldAnswered: self._fold_answered, Requested: self._requested,
            ShedMoved: self._shed_moved,
        }

    @property
    def node_id(self) -> str:
        return self.core.node_id

    def handle(self, event, now: float) -> list:
        """The effects of `event` at time `now`. Raises InvalidArgument for a request
        the node refuses (an impossible handoff, split or leave)."""
        out: list = []
        self.stimuli += 1
        what = event.kind if type(event) is Requested else type(event).__name__
        self._stimulus = f"{self.core.node_id}:{self.stimuli}:{what}"
        self._handlers[type(event)](event, now, out)
        return out

    def handle_into(self, event, now: float, out: list) -> None:
        """`event`'s effects into `out`, as part of the stimulus being handled."""
        self._handlers[type(event)](event, now, out)

    def _requested(self, event: Requested, now: float, out: list) -> None:
        """A caller's request, answered by one Reply (node.core.requests)."""
        try:
            value = answer(self, event.kind, event.fields, now, out)
        except FloeError as exc:
            out.append(Reply(event.request_id, error=exc))
        else:
            out.append(Reply(event.request_id, value))

    # ------------------------------------------------------------- lifecycle

    def begin(self, node_id: str, ring: Ring, core: NodeCore | None = None) -> None:
        """The start-up decision is made (node.core.membership): serve as `node_id`,
        empty, or as `core` (a member back from its data directory)."""
        self.core = core or self.make_core(node_id, ring)

    def watch_peers(self, now: float, grace: float) -> None:
        """Start watching the primaries we back up; peers are starting too, so none is
        suspected before `grace` has passed or we heard it once."""
        self.detector.watch(self.core.monitored_primaries(), now, grace=grace)

    def _record(self, kind: str, text: str = "", level: int = logging.INFO, **fields) -> Record:
        return Record(kind, self.core.node_id, tuple(sorted(fields.items())), level, text,
                      self._stimulus)

    # ------------------------------------------------------------ ring views

    def _adopt(self, ring: Ring, now: float, out: list) -> RingChange | None:
        """Merge a ring view; act on what it changes here."""
        before = self.core.ring
        change = self.core.adopt_ring(ring)
        if change is None:
            return None
        new = change.ring
        out.append(Note(f"ring v{before.version} -> v{new.version} ({new.describe()})"))
        me = self.core.node_id
        if set(before.nodes) - set(new.nodes):
            self.repair_after = now + self.repair_delay
        if change.fenced:
            if self.leaving:
                out.append(self._record("left", f"{me} left the ring at v{new.version}",
                                   ring_version=new.version))
                out.append(Exit())
            else:
                self._rejoin_empty(new, now, out)
            return change
        if change.taken_over:
            previous = {t: before.owner_of_token(t) for t in change.taken_over}
            olds = sorted(set(previous.values()))
            tokens = sorted(change.taken_over)
            out.append(self._record("taken_over", f"took over {len(tokens)} ranges at {{t}} "
                               f"from {','.join(olds)}: tokens {','.join(map(str, tokens))}",
                               previous=olds, tokens=tokens))
            self.resuming.update(previous)
            self.donors.saw(new, olds, now)
        for token in change.lost:
            out.append(self._record("lost", f"range of token {token} LOST: every copy died; "
                               "its queries will fail", logging.ERROR, token=token))
        self.detector.watch(self.core.monitored_primaries(), now)
        return change

    def _rejoin_empty(self, ring: Ring, now: float, out: list) -> None:
        """We were declared dead: rejoin as a new member with no state and no tokens (a
        RetainingCore kept what it held as retired ranges), given ranges by handoffs."""
        old, kept = self.core.node_id, getattr(self.core, "retired", None)
        node_id = rejoin_name(old, ring)
        if kept and self.retiring is not None:     # written before the store is wiped
            self.core.retired = []         # type: ignore[attr-defined]  # a RetainingCore
            out.extend(self.retiring.keep(kept, f"{old} was removed from the ring", old))
        what = "dropping its ranges" if kept is None else f"keeping its {len(kept)} ranges retired"
        out.append(self._record("fenced", f"{old} was declared dead in ring v{ring.version}: "
                           f"{what}, rejoining empty as {node_id}",
                           logging.ERROR, ring_version=ring.version, rejoins_as=node_id))
        self.core = self.make_core(node_id, ring.add_node(node_id, self.listen, (),
                                                          self.incarnation))
        self.detector.watch((), now)
        self.resuming.clear()
        self.isolation = Isolation()
        self.guard.reset()
        self.rejoined += 1
        self.epoch += 1
        if self.handoff is not None:
            self._abort_handoff("this node was removed from the ring", now, out)
        out.append(Gossip())

    def _view_seen(self, event: RingSeen, now: float, out: list) -> None:
        self._ring_seen(event, now, out)
        if self.core.node_id in event.ring.nodes:
            self.rejoins_seen = self.rejoined     # a peer knows who we are now

    # ------------------------------------------------------- signs of life

    def _sign_of_life(self, event: SignOfLife, now: float, out: list) -> None:
        self.detector.heard(event.node, now)

    def _heard_from(self, event: HeardFrom, now: float, out: list) -> None:
        if self._restarted(event.node, event.incarnation, now, out):
            return
        self.detector.heard(event.node, now)
        if event.ring_stamp != self.core.ring.stamp:
            out.append(Gossip(event.address or self.address_of(event.node)))

    def _restarted(self, node: str, incarnation: int, now: float, out: list) -> bool:
        """A message from `node` as another process than the ring knows: the member
        restarted and lost its state; declare it dead now, whoever answers at its
        address (the new process joins under a new name)."""
        ring = self.core.ring
        if not restarted(ring, node, incarnation):
            return False
        known = ring.incarnation_of(node)
        out.append(self._record("detected", f"declaring {node} dead at {{t}}: it restarted "
                           f"(incarnation {incarnation}, the ring knows {known})",
                           logging.WARNING, about=[node],
                           why=f"restarted: incarnation {incarnation}, the ring knows {known}"))
        if self._adopt(ring.with_incarnation(node, incarnation), now, out) is not None:
            out.append(Gossip())
        return True

    def _mapper_ahead(self, event: MapperAhead, now: float, out: list) -> None:
        if Ring.version_of_stamp(event.ring_stamp) >= self.core.ring.version:
            out.append(Gossip())

    def _heartbeat_failed(self, event: HeartbeatFailed, now: float, out: list) -> None:
        if refreshes(event.failure):
            out.append(Gossip(event.address))

    # ------------------------------------------------------ failure detection

    def _heartbeat_due(self, event: HeartbeatDue, now: float, out: list) -> None:
        if self.core.fenced:
            return
        ring = self.core.ring
        for node in sorted(self.core.heartbeat_targets()):
            out.append(SendHeartbeat(node, ring.address(node), ring.stamp))

    def _monitor_due(self, event: MonitorDue, now: float, out: list) -> None:
        self.detector.tick(event.scheduled, now)     # our own lag makes us a lenient judge
        if self.core.fenced:
            return
        self._retry_views(now, out)
        self._expire_handoff(now, out)
        ring = self.core.ring
        for probe in self.detector.due_probes(now):
            if probe.node not in ring.nodes:
                self.detector.abandon(probe)
                continue
            vias = indirect_vias(ring, self.core.node_id, probe.node)
            out.append(StartProbe(probe, ring.address(probe.node), vias,
                                  tuple(map(ring.address, vias)), ring.stamp, self.epoch))

    def _probe_answered(self, event: ProbeAnswered, now: float, out: list) -> None:
        """What the round's calls mean (node.core.calls), judged as a ProbeFinished."""
        direct = direct_evidence(event.direct)
        answered = event.direct is None
        self._probe_finished(ProbeFinished(
            event.probe, direct, tuple(via_evidence(f, reached) for f, reached in event.vias),
            event.epoch, event.incarnation if answered else 0,
            f": {event.why}" if direct == REFUSED else "",
            event.member if answered else ""), now, out)

    def _probe_abandoned(self, event: ProbeAbandoned, now: float, out: list) -> None:
        self.guard.abandon(event.probe)
        self.detector.abandon(event.probe)   # the suspicion stays; a later tick probes again

    def _probe_finished(self, event: ProbeFinished, now: float, out: list) -> None:
        """The detector decides what a round means: alive, dead, or still suspected
        (probed again). Only our own refused connection is conclusive; a timeout counts
        with a quorum of the ring behind it, once we know we were not cut off, and only
        after the lossy suspicion if declaring would lose ranges (it may be starved)."""
        probe = event.probe
        if self._verification_finished(event, now, out):
            return
        if event.epoch != self.epoch or self.core.fenced:
            self.detector.abandon(probe)
            return   # a stale incarnation must not declare anyone
        node = probe.node
        direct, failure = event.direct, event.failure
        if direct == ALIVE and not self.is_process_of(node, event.incarnation, event.member):
            direct, failure = REFUSED, f": {event.member or 'another process'} answers there"
        members = len(self.core.ring.nodes)
        outcome, step = self.isolation.judge(combine(direct, event.indirect, members))
        if step:    # a quorum again: views first, suspicions after (or: no quorum)
            out.append(Gossip() if step == EXCHANGE else Note(Isolation.NOTE, logging.WARNING))
        losing = removal_losses(self.core, node) if outcome == TIMED_OUT else []
        verdict = self.detector.probe_result(probe, outcome, now, lossy=bool(losing))
        if note := suspicion_note(probe, verdict, losing, self.detector, now):
            out.append(self._record(note[0], note[1], note[2], **note[3]))
        if verdict != DEAD or node not in self.core.ring.nodes:
            return  # alive, still suspected, or someone else declared it meanwhile
        why = declaration(outcome, failure, event.indirect, members, probe, now)
        out.append(self._record("detected", f"declaring {node} dead at {{t}}: {why}",
                           logging.WARNING, about=[node], why=why))
        if self._adopt(self.core.ring.without([node]), now, out) is not None:
            out.append(Gossip())   # tell everyone now rather than wait for heartbeats

    # ------------------------------------------------------------ checkpoints

    def _checkpoint_due(self, event: CheckpointDue, now: float, out: list) -> None:
        core = self.core
        expired = core.expire_idle_sources(now)
        if expired:
            out.append(Note(f"forgot the dedup watermarks of {len(expired)} sources idle "
                            f"for --source-expiry: {inert(', '.join(expired))}"))
        self._send_folds(now, out)
        behind = bool(core.under_replicated())
        shipments = tuple(core.plan_checkpoints(now, full_copies=now >= self.repair_after))
        ring = core.ring
        out.append(ShipCheckpoints(
            shipments, tuple(ring.address(s.replica) for s in shipments), ring.stamp,
            tuple(sorted({s.checkpoint.token for s in shipments})), behind, self.epoch))

    def full_copies_due_in(self, now: float) -> float:
        """Seconds until the full copies held back after a member left may go
        (`repair_delay`), 0 when they may go now: the checkpoint loop starts a round
        then rather than at its next tick."""
        return max(0.0, self.repair_after - now)

    def _send_folds(self, now: float, out: list) -> None:
        """Pieces idle long enough are merged back into their keys (node.core.folding)."""
        core = self.core
        if core.ring.balancer in FOLDING_BALANCERS and not (core.fenced or core.starting):
            if folds := core.folds.review(core, now):
                out.append(SendFolds(folds, *routed(core.ring, folds), core.ring.stamp,
                                     self.epoch))

    def _fold_answered(self, event: FoldAnswered, now: float, out: list) -> None:
        ok = event.ok and event.epoch == self.epoch
        self.core.folds.answered(self.core, event.out_key, event.seq, ok)

    def _checkpoint_acked(self, event: CheckpointAcked, now: float, out: list) -> None:
        if event.epoch != self.epoch:
            return
        self.core.checkpoint_acked(event.token, event.replica, event.seq, event.need_full)
        if self.failing.pop((event.token, event.replica), 0) >= FAILING_ROUNDS:
            out.append(self._record("checkpoints_resumed", f"{event.replica} takes the "
                                    f"checkpoints of token {event.token} again",
                                    token=event.token, replica=event.replica))

    def _checkpoint_failed(self, event: CheckpointFailed, now: float, out: list) -> None:
        if event.epoch != self.epoch:
            return
        self.core.checkpoint_failed(event.token, event.replica)
        key = (event.token, event.replica)
        self.failing[key] = failed = self.failing.get(key, 0) + 1
        if failed == FAILING_ROUNDS:
            out.append(self._record(
                "checkpoints_failing", f"{event.replica} has refused or missed the last "
                f"{failed} checkpoints of token {event.token}; the range is "
                f"under-replicated: {event.why}", logging.WARNING, token=event.token,
                replica=event.replica, why=event.why))
        if event.refresh:
            out.append(Gossip(self.address_of(event.replica)))

    def _round_done(self, event: CheckpointRoundDone, now: float, out: list) -> None:
        """Merge the round, retire extras whose new replicas are filled, and move the
        handoff this node runs one step on."""
        if event.epoch != self.epoch:
            return
        core = self.core
        for token in event.tokens:
            core.checkpoint_done(token)
        # failure counts of ranges we no longer own go with them: the map stays bounded
        self.failing = {k: n for k, n in self.failing.items() if k[0] in core.primaries}
        h = self.handoff
        busy = h.moves if h is not None and h.state == HandoffState.PREPARED else ()
        retired = retired_extras(core, busy)
        if retired is not None:
            self._adopt(retired, now, out)
            out.append(Gossip())
        if event.behind_before and not core.under_replicated() and not core.ring.pristine:
            out.append(self._record("re_replicated", f"re-replicated at {{t}}: every range "
                               f"of {core.node_id} is on r+1 nodes again"))
        self._step_handoff(now, out)

    def _round_ended(self, event: RoundEnded, now: float, out: list) -> None:
        """A checkpoint round (begun at `event.started`) is over: refill a member that
        owns nothing, or pull our share, then say when the next round starts."""
        self._refill(now, out)
        out.append(NextRound(self.driver.pause(now, event.started,
                                               self.full_copies_due_in(now))))

    def _refill(self, now: float, out: list) -> None:
        """Hand ranges to a member that owns none when ours lack replicas for want of
        owners (a restarted node comes back empty): the ring is whole again without
        waiting for an operator."""
        core = self.core
        if self.handoff is not None or self.leaving or core.fenced or core.starting:
            return
        moves = refill_moves(core.ring, core.node_id, self.donors.quiet(core.ring, now))
        if moves:
            to = ",".join(sorted(set(moves.values())))
            out.append(Note(f"refilling {to} with {len(moves)} ranges: ours lack replicas"))
            try:
                self._request_handoff(moves, 0.0, 0, now, out)
            except InvalidArgument as exc:
                out.append(Note(f"refilling {to} refused: {exc}", logging.WARNING))
        else:
            self._pull_due(now, out)    # a member short of its share asks for ranges

    # --------------------------------------------------------------- handoffs

    def _handoff_requested(self, event: HandoffRequested, now: float, out: list) -> None:
        """Hand ranges away now, or once the running handoff ended (in line, bounded).
        Refused at once (InvalidArgument) when it could start and cannot be prepared."""
        self._request_handoff(event.moves, event.timeout, event.request, now, out,
                              event.still_ours)

    def _request_handoff(self, moves: dict, timeout: float, request: int, now: float,
                         out: list, still_ours: bool = False) -> None:
        req = self.driver.request(moves, timeout, request, still_ours=still_ours)
        if req is None:
            out.append(Note(f"handoff of {len(moves)} ranges waits for the running one"))
            return
        try:
            self._start_handoff(req, now, out)
        except InvalidArgument:
            self.driver.ended()          # nothing waited: the driver is idle again
            raise                        # the caller hears why

    def _start_handoff(self, req: Request, now: float, out: list) -> None:
        """Start one: a range still keeping its former holders as extras waits (up to
        SETTLE_SECONDS) for our checkpoints to retire them before it is prepared."""
        moves = dict(req.moves)
        if req.still_ours:
            # nothing left of ours: prepare refuses it with the first token's reason
            moves = {t: to for t, to in moves.items() if t in self.core.primaries} or moves
        h = Handoff(self.core.node_id, moves, deadline=now + req.timeout)
        h.settle_until = now + min(req.timeout, SETTLE_SECONDS)
        out.append(RoundNow())           # its steps come at the ends of rounds
        if not self._settling(h, now):
            self._prepare(h, now, out)
        self.handoff = h

    def _next_handoff(self, req: Request | None, now: float, out: list) -> None:
        """Start the next in line; one refused now is told to its waiter as refused."""
        while req is not None:
            try:
                self._start_handoff(req, now, out)
                return
            except InvalidArgument as exc:
                h = Handoff(self.core.node_id, dict(req.moves), deadline=now)
                h.abort(str(exc))
                out.append(self._record("handoff_aborted", f"handoff refused: {h.reason}",
                                        logging.WARNING, to=sorted(set(req.moves.values())),
                                        reason=h.reason))
                out.append(HandoffEnded(h, req.request, refused=True))
                _, req = self.driver.ended()

    def _settling(self, h: Handoff, now: float) -> bool:
        ring = self.core.ring
        return (now < h.settle_until and not self.core.fenced
                and any(ring.has_token(t) and ring.extras_of(t) for t in h.moves))

    def _prepare(self, h: Handoff, now: float, out: list) -> None:
        ring = h.prepare(self.core, now)
        self._adopt(ring, now, out)
        out.append(Gossip())
        to = sorted(set(h.moves.values()))
        version = self.core.ring.version
        out.append(self._record("handoff_prepared", f"handing {len(h.moves)} ranges to "
                           f"{','.join(to)} (ring v{version})", to=to,
                           tokens=sorted(h.moves), ring_version=version))

    def _step_handoff(self, now: float, out: list) -> None:
        h = self.handoff
        if h is None:
            return
        if h.state == HandoffState.NEW:
            if self._settling(h, now):
                return
            try:
                self._prepare(h, now, out)
            except InvalidArgument as exc:
                self._abort_handoff(str(exc), now, out)
            return
        ring = h.step(self.core, now)
        if ring is not None:
            self._adopt(ring, now, out)
            out.append(Gossip())
        if h.finished:
            self._end_handoff(now, out)

    def _expire_handoff(self, now: float, out: list) -> None:
        """A handoff past its deadline ends even while no round does (rounds stuck)."""
        h = self.handoff
        if h is None or now <= h.deadline:
            return
        if h.state == HandoffState.PREPARED:
            self._step_handoff(now, out)
        else:
            self._abort_handoff("timed out before it could be prepared", now, out)

    def _handoff_abandoned(self, event: HandoffAbandoned, now: float, out: list) -> None:
        """Whoever waited for a handoff went away: one in line is dropped; the running
        one is aborted and the extras it pinned cleared, so the next may start."""
        h = self.handoff
        if h is None or not self.driver.abandoned(event.request):
            return
        ring = self.core.ring
        mine = [t for t in h.moves if h.state == HandoffState.PREPARED
                and ring.has_token(t) and ring.owner_of_token(t) == self.core.node_id]
        self._abort_handoff(event.reason, now, out)
        cleared = unpinned(ring, mine)
        if cleared is not None:
            self._adopt(cleared, now, out)
            out.append(Gossip())

    def _abort_handoff(self, reason: str, now: float, out: list) -> None:
        h = self.handoff
        if h is not None and not h.finished:
            h.abort(reason)
        self._end_handoff(now, out)

    def _end_handoff(self, now: float, out: list) -> None:
        h, self.handoff = self.handoff, None
        if h is None:
            raise InvalidArgument("no handoff to end")
        to = sorted(set(h.moves.values()))
        if h.state == HandoffState.COMMITTED:
            ms = round(1000 * (now - h.prepared_at), 1)
            out.append(self._record("handoff_committed", f"handed off {len(h.moves)} ranges at "
                                    f"{{t}} in {ms:.0f} ms", to=to, tokens=sorted(h.moves), ms=ms))
        else:
            out.append(self._record("handoff_aborted", f"handoff aborted: {h.reason}",
                               logging.WARNING, to=to, reason=h.reason))
        done, nxt = self.driver.ended()
        out.append(HandoffEnded(h, done.request if done else 0))
        self._next_handoff(nxt, now, out)

    def _split(self, event: SplitRequested, now: float, out: list) -> None:
        """Cut our range holding the position at it (a ring change told to everyone).
        Only the owner splits, and never a range being handed off."""
        core = self.core
        self.splits.check(len(core.ring.tokens), now)
        token, split = split_ring(core.ring, core.node_id, event.position, core.fenced)
        if self.handoff is not None and token in self.handoff.moves:
            raise InvalidArgument(f"token {token:#x} is being handed off")
        self.splits.spend(now)
        self._adopt(split, now, out)
        out.append(Gossip())
        out.append(self._record("split", f"split the range of token {token:#x} at "
                           f"{event.position:#x} (ring v{self.core.ring.version})",
                           token=token, at=event.position))
        out.append(Split(token, event.position))

    # ---------------------------------------------------------------- leaving

    def leave_moves(self) -> dict[int, str]:
        """Scale-in: our ranges spread over the others (refused for the last member)."""
        if self.core.fenced:
            raise InvalidArgument(f"{self.core.node_id} was removed from the ring")
        return leave_moves(self.core.ring, self.core.node_id)

    def copy_in_use(self) -> bool:
        """Does some range still keep our copy as an extra (its new replicas are not
        filled yet)? Leaving then would take a copy its owner still counts on."""
        me, ring = self.core.node_id, self.core.ring
        return any(me in ring.extras_of(t) for t in ring.tokens)

    def _leave_ring(self, event: LeaveRing, now: float, out: list) -> None:
        self.leaving = True
        ring = self.core.ring.remove_node(self.core.node_id)
        out.append(Farewell(ring))     # a member we miss learns it from the others
        self._adopt(ring, now, out)

    # --------------------------------------------------------- load balancing

    def _batch_applied(self, event: BatchApplied, now: float, out: list) -> None:
        previous = self.resuming.pop(event.token, None)
        if previous is not None and event.token in self.core.primaries:
            out.append(self._record("applying_again", f"applying again at {{t}}: range of "
                               f"token {event.token} taken over from {previous}",
                               token=event.token, previous=previous))

    def _load_sampled(self, event: LoadSampled, now: float, out: list) -> None:
        core, load = self.core, self.load
        was = load.overloaded
        core.positions.decay(0.5 ** (0.1 / load.config.rate_window), core.primaries)
        load.sample(now, event.queued, event.busy_seconds,
                    {t: n for t, n in core.applied_by_token.items() if t in core.primaries},
                    event.cpu_seconds)
        if load.overloaded != was:
            kind, text, fields = load.transition()
            out.append(self._record(kind, text, **fields))
        if (self.balance and load.overloaded and load.may_move(now) and self.handoff is None
                and not core.fenced and not self.leaving):
            load.moved(now)
            out.append(StartShed("overloaded"))

    def plan_shed(self, peers: dict[str, PeerLoad | None], *, reach: int,
                  tokens_per_node: int, depth: int, relieved: str | None = None) -> ShedPlan:
        core = self.core
        samples = {t: core.positions.samples(t) for t in core.ring.tokens_of(core.node_id)}
        return plan_shed(core.ring, core.node_id, self.load.token_rates(), peers, samples,
                         reach=reach, tokens_per_node=tokens_per_node, depth=depth,
                         relieved=relieved)

    def shed_moves(self, plan: ShedPlan) -> dict[int, str]:
        return with_split_tail(plan, self.core.ring, self.core.node_id)

    def _shed_moved(self, event: ShedMoved, now: float, out: list) -> None:
        self.load.moved(now)       # the cool-down counts from the end of the move
