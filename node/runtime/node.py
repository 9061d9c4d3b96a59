"""The asyncio shell around NodeCore: a bounded inbound queue with one applier task,
a checkpoint loop, and graceful stop. Network calls go through a `peers` object
(node.transport.peers in production), so this module imports no gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

import msgpack

from node.config import NodeConfig
from node.core.batch import Limits
from node.core.detector import (ALIVE, DEAD, REFUSED, SUSPECT, TIMED_OUT, DetectorConfig,
                                FailureDetector, Probe, combine, indirect_via)
from node.core.errors import Fenced, FloeError, InvalidArgument, Refused, StaleRing, Unavailable
from node.core.handoff import (Handoff, HandoffState, leave_moves, retired_extras,
                               split_ring)
from node.core.load import LoadConfig, LoadMonitor, choose_shed, clockwise_nodes
from node.core.membership import (decide_start, founding_ring, ready_to_decide, refill_moves,
                                  rejoin_name, restarted)
from node.core.node_core import NodeCore, RingChange
from node.core.reducers import Reducer
from node.core.ring import Ring
from node.core.split_point import plan_split
from node.runtime.events import EventLog

log = logging.getLogger("floe.node")

# Load shedding splits ranges only while the ring has fewer than this many times the
# tokens its members started with (an operator's `floe split` is not limited).
SPLIT_GROWTH = 4


@dataclass
class StreamState:
    """One inbound Push stream. After a refused batch the stream is dead: batches
    queued behind it must not be applied, or a gap would open in the source's seqs."""

    failed: bool = False


@dataclass
class _Inbound:
    batches: list
    stream: StreamState
    done: asyncio.Future = field(repr=False)
    applied: int = 0                       # batches of it already applied


class NodeRuntime:
    def __init__(self, config: NodeConfig, reducer: Reducer, peers,
                 incarnation: int | None = None, events: EventLog | None = None) -> None:
        self.config = config
        self.events = events or EventLog()
        self.reducer = reducer
        self.peers = peers
        # Drawn once per process: peers tell a restart of this node from this process
        # by it (node.core.membership).
        self.incarnation = incarnation or time.time_ns()
        self.core = self._make_core(config)
        self.inbound: asyncio.Queue[_Inbound] = asyncio.Queue(config.queue_batches)
        self.started_at = time.monotonic()
        self.queued_batches = 0        # batches received, not yet applied (load measure)
        self.busy_seconds = 0.0        # time the applier spent applying (load measure)
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.detector = FailureDetector(DetectorConfig(
            min_timeout=config.suspect_min, max_timeout=config.suspect_max,
            probe_timeout=config.probe_timeout, suspicion=config.suspicion))
        self.rejoined = 0              # times this process rejoined as a new member
        self._syncing: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self.handoff: Handoff | None = None     # the one handoff this node runs, if any
        self._handoff_lock = asyncio.Lock()
        self.leaving = False
        self.left = asyncio.Event()             # set once we left the ring: the process exits
        self.load = LoadMonitor(LoadConfig(
            high_queue=config.high_queue, high_cpu=config.high_cpu, low_queue=config.low_queue,
            low_cpu=config.low_cpu, cooldown=config.balance_cooldown))
        # Ranges taken over whose first new tuples are not applied yet: token -> the
        # dead owner. Logged once applied, so recovery can be timed to that moment.
        self._resuming: dict[int, str] = {}

    def _make_core(self, config: NodeConfig) -> NodeCore:
        """The ring this node would found alone; it serves nothing until
        `confirm_membership` has heard what its peers know."""
        core = self._new_core(config.node_id, founding_ring(
            self._initial_ring(config), config.node_id, self.incarnation))
        core.starting = True
        return core

    @staticmethod
    def _initial_ring(config: NodeConfig) -> Ring:
        return Ring.initial(dict(config.peers), config.replication, config.tokens_per_node)

    def _new_core(self, node_id: str, ring: Ring) -> NodeCore:
        return NodeCore(node_id, ring, self.reducer,
                        Limits(max_batch_bytes=self.config.max_batch_bytes),
                        verify_keys=self.config.verify_keys)

    async def confirm_membership(self, seeds: list[str] | None = None) -> None:
        """Ask the peers (or, joining, the seeds) for their rings and decide who this
        process is: a founding member taking its place, a joiner, or the restart of a
        member whose state died with its process (that member is declared dead at
        once and this process joins empty under a new name).

        Alone a process cannot tell a restart from a fresh start, so it waits for a
        running peer's answer, or for every founding peer to answer as starting too (a
        fresh cluster); after --startup-grace, starting peers' answers suffice."""
        config = self.config
        joining = seeds is not None
        targets = seeds if joining else [a for n, a in config.peers if n != config.node_id]
        started = time.monotonic()
        log_at = started + 5.0
        while True:
            seen, starting, errors = await self._ask_peers(targets)
            if joining and not seen:
                raise Unavailable("no seed to join answered: " + "; ".join(errors))
            waited = time.monotonic() - started >= config.startup_grace
            if ready_to_decide(len(seen), starting, len(targets), joining, waited):
                break
            if time.monotonic() >= log_at:
                log.warning("%s is waiting for a running peer to confirm its place in the "
                            "ring (%d of %d answered, all starting): %s", config.node_id,
                            len(seen), len(targets), "; ".join(errors) or "-")
                log_at += 5.0
            await asyncio.sleep(0.2)
        for ring in seen:
            if ring.replication != config.replication:
                raise ValueError(f"the ring runs r={ring.replication}, this node was started "
                                 f"with --replication {config.replication}")
        decision = decide_start(config.node_id, self.incarnation, config.listen, seen,
                                None if joining else self._initial_ring(config))
        self.core = self._new_core(decision.node_id, decision.ring)
        self.events.record("started", decision.node_id, incarnation=self.incarnation,
                           replaces=decision.replaces, why=decision.why, joining=joining)
        if decision.replaces:
            t = self.events.record("detected", decision.node_id, about=[decision.replaces],
                                   why="restarted: " + decision.why)
            log.warning("declaring %s dead at %.6f: %s; this process holds none of its "
                        "state and joins empty as %s", decision.replaces, t,
                        decision.why, decision.node_id)
        elif decision.node_id != config.node_id:
            log.warning("%s; this process joins empty as %s", decision.why, decision.node_id)
        elif joining:
            log.info("%s joins ring v%d", decision.node_id, decision.ring.version)

    async def _ask_peers(self, targets: list[str]) -> tuple[list[Ring], int, list[str]]:
        """One round: the rings that answered, how many of them are starting peers'
        founding rings, and what the others said."""
        timeout = min(self.config.rpc_timeout, 1.0)
        answers = await asyncio.gather(*(self.peers.ring_at_start(a, timeout)
                                         for a in targets), return_exceptions=True)
        seen, starting, errors = [], 0, []
        for address, answer in zip(targets, answers):
            if isinstance(answer, FloeError):
                errors.append(f"{address}: {answer}")
            elif isinstance(answer, BaseException):
                raise answer
            else:
                wire, is_starting = answer
                seen.append(Ring.from_wire(wire))
                starting += is_starting
        return seen, starting, errors

    def reconfigure(self, config: NodeConfig) -> None:
        """Before start only: the listen address became known after binding."""
        if self._tasks:
            raise RuntimeError("reconfigure after start")
        self.config = config
        self.core = self._make_core(config)

    @property
    def starting(self) -> bool:
        return self.core.starting

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        # Peers are starting too: do not suspect one before we have heard it once.
        self.detector.watch(self.core.monitored_primaries(), time.monotonic(),
                            grace=self.config.startup_grace)
        self._tasks = [asyncio.create_task(self._apply_loop(), name="apply"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint"),
                       asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
                       asyncio.create_task(self._monitor_loop(), name="monitor"),
                       asyncio.create_task(self._load_loop(), name="load")]
        log.info("node %s up on %s, %s", self.core.node_id, self.config.listen,
                 self.core.ring.describe())
        self.sync_ring()   # every peer learns our incarnation now

    async def stop(self) -> None:
        """Drain what was queued, ship a final checkpoint, stop the loops."""
        self._stopping = True
        while not self.inbound.empty():
            await asyncio.sleep(0.01)
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        try:
            await asyncio.wait_for(self.checkpoint_once(), self.config.rpc_timeout)
        except (asyncio.TimeoutError, FloeError) as exc:
            log.warning("final checkpoint incomplete: %s", exc)
        await self.peers.close()

    # ------------------------------------------------------------- data path

    async def submit(self, batches, stream: StreamState) -> asyncio.Future:
        """Queue one request's batches; waits while the queue is full (that wait is
        the flow control the sender feels). Returns a future of [(batch id, PushResult)]."""
        done = asyncio.get_running_loop().create_future()
        # After a refusal the stream ends and nobody awaits the futures behind it: mark
        # their errors seen, or asyncio logs each one as never retrieved.
        done.add_done_callback(_seen)
        await self.inbound.put(_Inbound(batches, stream, done))
        self.queued_batches += len(batches)
        return done

    async def _apply_loop(self) -> None:
        inbound = self.inbound
        while True:
            item = await inbound.get()
            core = self.core           # replaced when we rejoin after being fenced
            try:
                if item.done.cancelled():
                    continue
                if item.stream.failed:
                    item.done.set_exception(InvalidArgument("an earlier batch on this stream was refused"))
                    continue
                await self._apply(core, item)
            finally:
                self.queued_batches -= len(item.batches) - item.applied

    async def _apply(self, core: NodeCore, item: _Inbound) -> None:
        acks = []
        started = mark = time.monotonic()
        try:
            for b in item.batches:
                result = core.receive_batch(b.ring_stamp, b.token, b.source, b.first_seq,
                                            b.last_seq, b.count, b.payload, b.seqs,
                                            b.stream)
                acks.append((b.id, result))
                if self._resuming and result.applied and b.token in self._resuming:
                    self._applying_again(b.token)
                now = time.monotonic()
                self.busy_seconds += now - mark
                mark = now
                item.applied += 1
                self.queued_batches -= 1
                if now - started > 0.01:
                    # A long message (or a costly reducer) must not starve heartbeats
                    # and probes: a busy node is not a dead one.
                    await asyncio.sleep(0)
                    started = mark = time.monotonic()
                    core = self.core
        except FloeError as exc:
            item.stream.failed = True
            if not item.done.done():
                item.done.set_exception(exc)
            if isinstance(exc, StaleRing) and Ring.version_of_stamp(b.ring_stamp) >= core.ring.version:
                self.sync_ring()   # a mapper knows a newer ring than we do
        except Exception as exc:  # a reducer bug must not kill the node
            log.exception("batch %s from %s failed", b.id, b.source)
            item.stream.failed = True
            if not item.done.done():
                item.done.set_exception(InvalidArgument(f"reducer failed: {exc!r}"))
        else:
            if not item.done.done():   # the stream may have gone while we yielded
                item.done.set_result(acks)

    # ----------------------------------------------------------- checkpoints

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_interval
        while True:
            started = time.monotonic()
            try:
                await self.checkpoint_once()
                self._refill()
            except Exception:
                log.exception("checkpoint round failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def checkpoint_once(self) -> None:
        """Cut, ship to every replica concurrently, then merge: one round."""
        core = self.core
        shipments = core.plan_checkpoints()
        if not shipments:
            return
        ring = core.ring

        async def ship(s):
            try:
                need_full, seq = await self.peers.ship_checkpoint(
                    ring.address(s.replica), sender=core.node_id, ring_stamp=ring.stamp,
                    incarnation=self.incarnation, checkpoint=s.checkpoint,
                    base_seq=s.base_seq)
            except FloeError as exc:
                log.debug("checkpoint of %s to %s failed: %s", s.checkpoint.token, s.replica, exc)
                core.checkpoint_failed(s.checkpoint.token, s.replica)
                if exc.refresh_ring:
                    self.sync_ring(ring.address(s.replica))
            else:
                core.checkpoint_acked(s.checkpoint.token, s.replica, seq, need_full)

        behind_before = set(core.under_replicated())
        await asyncio.gather(*(ship(s) for s in shipments))
        for token in {s.checkpoint.token for s in shipments}:
            core.checkpoint_done(token)
        busy = self.handoff.moves if self.handoff is not None else ()
        retired = retired_extras(core, busy)
        if retired is not None and core is self.core:
            self.adopt(retired)
            self.sync_ring()
        if behind_before and not core.under_replicated() and not core.ring.pristine:
            t = self.events.record("re_replicated", core.node_id)
            log.info("re-replicated at %.6f: every range of %s is on r+1 nodes again",
                     t, core.node_id)

    # ------------------------------------------------------ ring and failures

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def adopt(self, ring) -> RingChange | None:
        """Merge a ring view from anywhere; act on what it changes here."""
        before = self.core.ring
        change = self.core.adopt_ring(ring)
        if change is None:
            return None
        new = change.ring
        log.info("ring v%d -> v%d (%s)", before.version, new.version, new.describe())
        if change.fenced:
            if self.leaving:
                self.events.record("left", self.core.node_id, ring_version=new.version)
                log.info("%s left the ring at v%d", self.core.node_id, new.version)
                self.left.set()
            else:
                self._rejoin_empty(new)
            return change
        if change.taken_over:
            previous = {t: before.owner_of_token(t) for t in change.taken_over}
            t = self.events.record("taken_over", self.core.node_id,
                                   previous=sorted(set(previous.values())),
                                   tokens=sorted(change.taken_over))
            log.info("took over %d ranges at %.6f from %s: tokens %s", len(change.taken_over),
                     t, ",".join(sorted(set(previous.values()))),
                     ",".join(map(str, sorted(change.taken_over))))
            self._resuming.update(previous)
        for token in change.lost:
            self.events.record("lost", self.core.node_id, token=token)
            log.error("range of token %d LOST: every copy died; its queries will fail", token)
        self.detector.watch(self.core.monitored_primaries(), time.monotonic())
        return change

    def _refill(self) -> None:
        """Hand ranges to a member that owns none when ours lack replicas for want of
        owners (a restarted node comes back empty): the ring is whole again without
        waiting for an operator."""
        core = self.core
        if (self.handoff is not None or self._handoff_lock.locked() or self.leaving
                or core.fenced or core.starting):
            return
        moves = refill_moves(core.ring, core.node_id)
        if moves:
            log.info("refilling %s with %d ranges: ours lack replicas",
                     ",".join(sorted(set(moves.values()))), len(moves))
            self._spawn(self.hand_off(moves))

    def _applying_again(self, token: int) -> None:
        previous = self._resuming.pop(token)
        if token in self.core.primaries:
            t = self.events.record("applying_again", self.core.node_id, token=token,
                                   previous=previous)
            log.info("applying again at %.6f: range of token %d taken over from %s",
                     t, token, previous)

    def _rejoin_empty(self, ring: Ring) -> None:
        """We were declared dead (paused or cut off too long): everything we hold is
        stale. Come back as a new incarnation with no state and no tokens; the ring
        gives it ranges only through a handoff, like any new node."""
        node_id = rejoin_name(self.core.node_id, ring)
        self.events.record("fenced", self.core.node_id, ring_version=ring.version,
                           rejoins_as=node_id)
        log.error("%s was declared dead in ring v%d: dropping all state, rejoining empty "
                  "as %s", self.core.node_id, ring.version, node_id)
        joined = ring.add_node(node_id, self.config.listen, (), self.incarnation)
        self.core = self._new_core(node_id, joined)
        self.detector.watch((), time.monotonic())
        self._resuming.clear()
        self.rejoined += 1
        self.sync_ring()

    def sync_ring(self, address: str | None = None) -> None:
        """Exchange ring views with one peer, or all, in the background."""
        if self.starting:
            return   # our view is not confirmed yet: it must not spread
        if address is None and self._syncing is not None and not self._syncing.done():
            return
        ring = self.core.ring
        targets = [address] if address else [a for n, a in ring.addresses
                                             if n != self.core.node_id]

        async def exchange(target):
            try:
                wire = await self.peers.exchange_ring(
                    target, sender=self.core.node_id, ring_wire=self.core.ring.to_wire(),
                    version=self.core.ring.version, reducer=self.reducer.name)
            except FloeError:
                return
            self.adopt(Ring.from_wire(wire))

        async def run():
            await asyncio.gather(*(exchange(t) for t in targets))

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if address is None:
            self._syncing = task

    def sign_of_life(self, node: str) -> None:
        """Any message from `node` (or answer): clears a suspicion of it."""
        self.detector.heard(node, time.monotonic())

    def heard_from(self, node: str, ring_stamp: int, address: str | None = None,
                   incarnation: int = 0) -> None:
        if self._restarted(node, incarnation):
            return
        self.sign_of_life(node)
        if ring_stamp != self.core.ring.stamp:
            self.sync_ring(address or self._address_of(node))

    def _restarted(self, node: str, incarnation: int) -> bool:
        """A message from `node` as another process than the ring knows: the member
        restarted and lost its state; declare it dead now, whoever answers at its
        address (the new process joins under a new name)."""
        ring = self.core.ring
        if not restarted(ring, node, incarnation):
            return False
        known = ring.incarnation_of(node)
        t = self.events.record("detected", self.core.node_id, about=[node],
                               why=f"restarted: incarnation {incarnation}, the ring knows {known}")
        log.warning("declaring %s dead at %.6f: it restarted (incarnation %d, the ring "
                    "knows %d)", node, t, incarnation, known)
        if self.adopt(ring.with_incarnation(node, incarnation)) is not None:
            self.sync_ring()
        return True

    def _address_of(self, node: str) -> str | None:
        try:
            return self.core.ring.address(node)
        except ValueError:
            return None

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval
        while True:
            await asyncio.sleep(interval)
            if self.core.fenced:
                continue
            ring = self.core.ring
            for node in self.core.heartbeat_targets():
                self._spawn(self._heartbeat(node, ring.address(node), ring.stamp))

    async def _heartbeat(self, node: str, address: str, version: int) -> None:
        try:
            theirs, incarnation = await self.peers.heartbeat(
                address, sender=self.core.node_id, ring_stamp=version,
                incarnation=self.incarnation, timeout=self.config.heartbeat_interval * 4)
        except FloeError as exc:
            if isinstance(exc, (StaleRing, Fenced)):
                self.sync_ring(address)
            return
        if self._restarted(node, incarnation):
            return
        self.sign_of_life(node)
        if theirs != self.core.ring.stamp:
            self.sync_ring(address)

    async def _monitor_loop(self) -> None:
        tick = self.config.heartbeat_interval / 2
        while True:
            scheduled = time.monotonic() + tick
            await asyncio.sleep(tick)
            now = time.monotonic()
            self.detector.tick(scheduled, now)     # our own lag makes us a lenient judge
            if self.core.fenced:
                continue
            for probe in self.detector.due_probes(now):
                self._spawn(self._probe(probe))

    async def _probe(self, probe: Probe) -> None:
        """One probe round of a suspect: directly and through a third node (a broken
        link between two live nodes must not remove either). The detector decides
        what the outcome means: alive, dead, or still suspected (probed again)."""
        core = self.core
        ring = core.ring
        node = probe.node
        if node not in ring.nodes:
            self.detector.abandon(probe)
            return
        address = ring.address(node)
        via = indirect_via(ring, core.node_id, node)

        failure = ""

        async def direct():
            nonlocal failure
            try:
                _, incarnation = await self.peers.heartbeat(
                    address, sender=core.node_id, ring_stamp=ring.stamp,
                    incarnation=self.incarnation, timeout=probe.deadline)
            except (Refused, Fenced) as exc:
                failure = f": {exc}"
                return REFUSED          # nothing listens, or it knows it was removed
            except Unavailable:
                return TIMED_OUT        # a deadline or a stalled handshake: maybe only slow
            except FloeError:
                return ALIVE            # it answered, if only with an error
            if restarted(ring, node, incarnation):
                failure = ": another process answers at its address"
                return REFUSED          # it restarted: the member we watch is gone
            return ALIVE

        async def indirect():
            if via is None:
                return TIMED_OUT
            try:
                alive = await self.peers.probe(ring.address(via), node, probe.deadline)
            except FloeError:
                return TIMED_OUT
            return ALIVE if alive else TIMED_OUT

        try:
            outcome = combine(*await asyncio.gather(direct(), indirect()))
        except BaseException:
            self.detector.abandon(probe)       # cancelled: a later tick probes again
            raise
        if self.core is not core or core.fenced:
            self.detector.abandon(probe)
            return   # we were fenced meanwhile: a stale incarnation must not declare anyone
        verdict = self.detector.probe_result(probe, outcome, time.monotonic())
        if verdict == SUSPECT and probe.round == 0:
            self.events.record("suspected", self.core.node_id, about=[node],
                               deadline_ms=round(1000 * probe.deadline))
            log.info("suspecting %s: no answer within %.0f ms, probing again", node,
                     1000 * probe.deadline)
        if verdict != DEAD or node not in self.core.ring.nodes:
            return  # alive, still suspected, or someone else declared it meanwhile
        if outcome == REFUSED:
            why = f"it refused our probe{failure}" + (f" and {via} could not reach it" if via else "")
        else:
            why = (f"neither we nor {via} got an answer for "
                   f"{1000 * (time.monotonic() - probe.suspected_since):.0f} ms of suspicion "
                   f"({probe.round + 1} probe rounds)")
        t = self.events.record("detected", self.core.node_id, about=[node], why=why)
        log.warning("declaring %s dead at %.6f: %s", node, t, why)
        change = self.adopt(self.core.ring.without([node]))
        if change is not None:
            self.sync_ring()   # tell everyone now rather than wait for heartbeats

    async def probe_for(self, target: str, timeout: float) -> bool:
        """Serve an indirect probe: can we reach `target`?"""
        address = self._address_of(target)
        if address is None:
            return False
        try:
            _, incarnation = await self.peers.heartbeat(
                address, sender=self.core.node_id, ring_stamp=self.core.ring.stamp,
                incarnation=self.incarnation, timeout=timeout)
        except FloeError:
            return False
        if restarted(self.core.ring, target, incarnation):
            return False
        self.sign_of_life(target)
        return True

    # -------------------------------------------------------------- handoffs

    async def hand_off(self, moves: dict[int, str], timeout: float | None = None) -> Handoff:
        """Hand token ranges to other nodes live (prepare, final checkpoint, commit).
        Returns the finished Handoff: committed, or aborted with a reason."""
        timeout = timeout or max(10.0, 20 * self.config.checkpoint_interval)
        async with self._handoff_lock:
            await self._settle_extras(moves, time.monotonic() + min(timeout, 5.0))
            core = self.core
            h = Handoff(core.node_id, dict(moves), deadline=time.monotonic() + timeout)
            started = time.monotonic()
            self.adopt(h.prepare(core, time.monotonic()))
            self.sync_ring()
            self.handoff = h
            self.events.record("handoff_prepared", core.node_id, to=sorted(set(moves.values())),
                               tokens=sorted(moves), ring_version=self.core.ring.version)
            log.info("handing %d ranges to %s (ring v%d)", len(moves),
                     ",".join(sorted(set(moves.values()))), self.core.ring.version)
            try:
                while h.state == HandoffState.PREPARED:
                    await self.checkpoint_once()
                    ring = h.step(self.core, time.monotonic())
                    if ring is not None:
                        self.adopt(ring)
                        self.sync_ring()
                    if h.state == HandoffState.PREPARED:
                        await asyncio.sleep(0.01)
            finally:
                self.handoff = None
            if h.state == HandoffState.COMMITTED:
                ms = 1000 * (time.monotonic() - started)
                t = self.events.record("handoff_committed", self.core.node_id,
                                       to=sorted(set(moves.values())), tokens=sorted(moves),
                                       ms=round(ms, 1))
                log.info("handed off %d ranges at %.6f in %.0f ms", len(moves), t, ms)
            else:
                self.events.record("handoff_aborted", self.core.node_id,
                                   to=sorted(set(moves.values())), reason=h.reason)
                log.warning("handoff aborted: %s", h.reason)
            return h

    async def _settle_extras(self, moves: dict[int, str], until: float) -> None:
        """A range still keeping its former holders as extras (another node's handoff
        just committed next to it) cannot be handed on yet; they retire once our
        checkpoints have filled its new replicas, so run rounds until then."""
        while any(self.core.ring.has_token(t) and self.core.ring.extras_of(t) for t in moves) \
                and time.monotonic() < until and not self.core.fenced:
            await self.checkpoint_once()
            await asyncio.sleep(0.02)

    async def split_range(self, position: int) -> tuple[int, int]:
        """Cut our range holding `position` at it (a ring change on this node, told to
        everyone): returns (head token = position, tail token = the range's token).
        Only the owner splits, and never a range being handed off."""
        async with self._handoff_lock:
            core = self.core
            token, split = split_ring(core.ring, core.node_id, position, core.fenced)
            self.adopt(split)
            self.sync_ring()
            self.events.record("split", self.core.node_id, token=token, at=position)
            log.info("split the range of token %#x at %#x (ring v%d)", token, position,
                     self.core.ring.version)
            return position, token

    async def _split_for_shedding(self, ring, rates, heir_rates, busy, moves) -> None:
        """When a single range is hotter than what evens us and its neighbour, cut it at
        the measured point and add its tail to `moves` (the tail keeps the token)."""
        core = self.core
        samples = {t: core.positions.samples(t) for t in ring.tokens_of(core.node_id)}
        plan = plan_split(ring, core.node_id, rates, heir_rates, busy, moves, samples,
                          max_tokens=SPLIT_GROWTH * self.config.tokens_per_node
                          * len(ring.nodes))
        if plan is None:
            log.info("load: no split worth it (rates %s, sampled positions %s, moves %s)",
                     {hex(t): round(r) for t, r in rates.items()},
                     {hex(t): len(v) for t, v in samples.items()}, len(moves))
            return
        token, at, heir = plan
        try:
            await self.split_range(at)
        except FloeError as exc:
            log.info("load: split of token %#x refused: %s", token, exc)
            return
        if self.core.ring.owner_of_token(token) == self.core.node_id:
            moves[token] = heir

    async def leave(self, timeout: float | None = None) -> None:
        """Scale-in: hand every range to its first replica, wait until the new owners
        no longer need our copies, leave the ring (removed for good) and stop."""
        timeout = timeout or 30.0
        deadline = time.monotonic() + timeout
        moves = leave_moves(self.core.ring, self.core.node_id)
        if moves:
            h = await self.hand_off(moves, timeout)
            if h.state != HandoffState.COMMITTED:
                raise InvalidArgument(f"cannot leave: {h.reason}")
        me = self.core.node_id
        while any(me in self.core.ring.extras_of(t) for t in self.core.ring.tokens):
            if time.monotonic() > deadline:
                log.warning("leaving while other ranges still use our copy")
                break
            self.sync_ring()
            await asyncio.sleep(0.05)
        self.leaving = True
        self.adopt(self.core.ring.remove_node(me))
        # Tell everyone before we go; a node we miss learns it from the others.
        ring = self.core.ring
        await asyncio.gather(*(self.peers.exchange_ring(
            a, sender=me, ring_wire=ring.to_wire(), version=ring.version,
            reducer=self.reducer.name) for n, a in ring.addresses), return_exceptions=True)
        self.left.set()

    # --------------------------------------------------------- load balancing

    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            core = self.core
            was = self.load.overloaded
            core.positions.decay(0.5 ** (0.1 / self.load.config.rate_window), core.primaries)
            self.load.sample(now, self.queued_batches, self.busy_seconds,
                             {t: n for t, n in core.applied_by_token.items() if t in core.primaries},
                             time.process_time())
            if self.load.overloaded != was:
                kind = "overloaded" if self.load.overloaded else "relieved"
                t = self.events.record(kind, core.node_id, queue=round(self.load.queue(), 2),
                                       busy=round(self.load.busy(), 3),
                                       cpu=round(self.load.cpu(), 3),
                                       rate=round(self.load.rate(), 1))
                log.info("load: %s at %.6f (queue %.1f batches, busy %.0f%%, cpu %.0f%%, "
                         "%.0f tuples/s)", kind, t, self.load.queue(), 100 * self.load.busy(),
                         100 * self.load.cpu(), self.load.rate())
            if (self.config.balance and self.load.overloaded and self.load.may_move(now)
                    and self.handoff is None and not core.fenced and not self.leaving):
                self.load.moved(now)
                self._spawn(self.shed_load(reason="overloaded"))

    async def shed_load(self, reason: str, depth: int = 0) -> "ShedOutcome":
        """Hand the hottest ranges to the nearest nodes clockwise that are not busy
        themselves; when every one of them is busy, ask the first to shed first (the
        request cascades clockwise, at most once round the ring). If it did move
        ranges, plan again at once with what it freed rather than after a cool-down."""
        outcome = await self._shed_once(reason, depth)
        if outcome.asked and outcome.asked_moved:
            retry = await self._shed_once(f"{reason}, after {outcome.asked} shed", depth,
                                          relieved=outcome.asked)
            outcome = ShedOutcome(f"{outcome.detail}; {retry.detail}", retry.moved)
        return outcome

    async def _shed_once(self, reason: str, depth: int,
                         relieved: str | None = None) -> "ShedOutcome":
        """One planning round: what happened, and the neighbour asked to shed first,
        if any. `relieved` just shed: its overload verdict lags its move, so it is
        judged by its rate."""
        core = self.core
        ring = core.ring
        me = core.node_id
        reach = sorted({n for t in ring.tokens_of(me)
                        for n in clockwise_nodes(ring, t, self.config.balance_reach)})
        stats = await asyncio.gather(*(self.peers.stats(ring.address(n)) for n in reach),
                                     return_exceptions=True)
        rates_of, busy = {}, set()
        for node, st in zip(reach, stats):
            if isinstance(st, BaseException):
                log.info("load: no stats from %s: %r", node, st)
                busy.add(node)           # unreachable: not a place to move load to
                continue
            rates_of[node] = st.apply_rate
            if st.overloaded and node != relieved:
                busy.add(node)
        rates = self.load.token_rates()
        moves = choose_shed(ring, me, rates, rates_of, busy, self.config.balance_reach)
        await self._split_for_shedding(ring, rates, rates_of, busy, moves)
        log.info("load: %s at %.6f, rate %.0f/s, queue %.1f, busy %.0f%%; nodes %s busy %s; "
                 "moving %d ranges", reason, time.time(), self.load.rate(), self.load.queue(),
                 100 * self.load.busy(), {n: round(r) for n, r in rates_of.items()},
                 sorted(busy), len(moves))
        if moves:
            h = await self.hand_off(moves)
            self.load.moved(time.monotonic())
            return ShedOutcome(f"moved {len(moves)} ranges: {h.state} {h.reason}",
                               moved=h.state == HandoffState.COMMITTED)
        heirs = sorted({h for t in ring.tokens_of(me) if (h := ring.heir(t))} & busy)
        if relieved is None and heirs and depth < len(ring.nodes):
            target = heirs[0]
            try:
                moved, detail = await self.peers.request_shed(ring.address(target), me,
                                                              depth + 1)
            except FloeError as exc:
                return ShedOutcome(f"cascade to {target} failed: {exc}")
            return ShedOutcome(f"asked {target} to shed first: {detail}", asked=target,
                               asked_moved=moved)
        return ShedOutcome("nothing to move")

    # --------------------------------------------------------------- queries

    def stats(self) -> dict:
        rates = self.load.token_rates()
        return dict(self.core.stats(), fenced=self.core.fenced,
                    cpu=self.load.cpu(), busy=self.load.busy(), apply_rate=sum(rates.values()),
                    overloaded=self.load.overloaded,
                    tokens=len(self.core.ring.tokens_of(self.core.node_id)),
                    load=msgpack.packb({t: r for t, r in rates.items()}), rejoined=self.rejoined, node_id=self.core.node_id, address=self.config.listen,
                    queue_length=self.inbound.qsize(), reducer=self.reducer.name,
                    pid=os.getpid(), uptime=time.monotonic() - self.started_at)


@dataclass(frozen=True)
class ShedOutcome:
    """What one node's shedding did: `moved` whether it handed ranges away (committed);
    `asked` the neighbour it asked to shed first, and whether that one moved any."""

    detail: str
    moved: bool = False
    asked: str = ""
    asked_moved: bool = False


def _seen(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
