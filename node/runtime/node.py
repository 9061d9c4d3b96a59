"""The asyncio executor around the node machine (`floering.node.core.machine`): loops and
timers become events, the machine's effects become network calls, log lines and
structured events. A bounded inbound queue with one applier task carries the data
path. Every protocol decision is the machine's; network calls go through a `peers`
object (node.transport.peers in production), so this module imports no gRPC.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

from floering.node.config import NodeConfig
from floering.node.core.detector import DetectorConfig, FailureDetector
from floering.wire.errors import FloeError, InvalidArgument, StaleRing, inert
from floering.node.core.calls import failure_of
from floering.node.core.handoff import Handoff
from floering.node.core.handoff_driver import HandoffDriver
from floering.node.core.load import LoadConfig, LoadMonitor
from floering.node.core.machine import NodeMachine
from floering.node.core.machine_io import (
    BatchApplied, CheckpointAcked, CheckpointDue, CheckpointFailed, CheckpointRoundDone, Exit,
    Farewell, Gossip, HandoffAbandoned, HandoffEnded, HandoffRequested, HeardFrom,
    HeartbeatDue, HeartbeatFailed, LeaveRing, LoadSampled, MapperAhead, MonitorDue, NextRound,
    Note, Record, Reply, Requested, RingSeen, RoundEnded, RoundNow, SendFolds, SendHeartbeat,
    ShedMoved, ShipCheckpoints, Split, SplitRequested, StartProbe, StartShed)
from floering.node.core.membership import answered_by, founding_ring
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import Reducer
from floering.node.core.requests import STATS, RequestLimits
from floering.node.core.retiring import WriteRetired
from floering.wire.ring import Ring
from floering.node.core.shed_round import ShedOutcome
from floering.node.runtime.balancing import PullRanges, hand_all_away, pull_share, shed_load
from floering.node.runtime.events import EventLog
from floering.node.runtime.folds import send_folds
from floering.node.runtime.probing import probe_round
from floering.node.runtime.inbound import (Inbound, InboundQueue, StreamState, mark_seen,
                                          resolve_after)
from floering.node.runtime.startup import decide_membership, record_start

if TYPE_CHECKING:
    from floering.node.runtime.durability import DataDir, Durability
    from floering.node.runtime.retiring import Retiring

log = logging.getLogger("floe.node")

RETIRE_EVERY = 10.0   # seconds between looks for channels to peers the ring has left


class NodeRuntime:
    def __init__(self, config: NodeConfig, reducer: Reducer, peers,
                 incarnation: int | None = None, events: EventLog | None = None,
                 clock=time.monotonic) -> None:
        self.config = config
        self.events = events or EventLog()
        self.reducer = reducer
        self.peers = peers
        self.clock = clock             # the one clock every event is stamped with
        # With --data-dir the member it holds comes back (node.runtime.durability,
        # imported only then: a node in memory does without its store and plan).
        self.disk: DataDir | None = None
        if config.data_dir:
            from floering.node.runtime.durability import open_data_dir
            self.disk = open_data_dir(config.data_dir)
        loaded = self.disk.loaded if self.disk else None
        self.me = loaded.node_id if loaded else config.node_id
        self.durable: Durability | None = None
        # Drawn once per member: peers tell a restart of this node from this process
        # by it (node.core.membership).
        self.incarnation = incarnation or (loaded.incarnation if loaded else time.time_ns())
        self.machine = self._make_machine(config)
        self.inbound = InboundQueue(config.queue_batches, config.max_inbound_bytes)
        self.started_at = clock()
        self.queued_batches = 0        # batches received, not yet applied (load measure)
        self.busy_seconds = 0.0        # time the applier spent applying (load measure)
        self.checkpoint_rounds, self.checkpoint_seconds = 0, 0.0   # /metrics reads them
        self._tasks: list[asyncio.Task] = []
        self._syncing: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self._requests = itertools.count(1)     # ids of handoff requests we wait for
        self._handoffs: dict[int, asyncio.Future] = {}
        self._round_now = asyncio.Event()       # a handoff started: a round at once
        self._next_round = config.checkpoint_interval
        self.left = asyncio.Event()             # set once we left the ring: the process exits
        self.retiring: Retiring | None = None   # what removed members held (node.app)
        self._reply: Reply | None = None        # the last request's, taken by ask()

    def _make_machine(self, config: NodeConfig) -> NodeMachine:
        """The machine of the ring this node would found alone; it serves nothing until
        `confirm_membership` has heard what its peers know."""
        core = self._new_core(self.me, founding_ring(
            self._initial_ring(config), self.me, self.incarnation))
        core.starting = True
        detector = FailureDetector(DetectorConfig(
            min_timeout=config.suspect_min, max_timeout=config.suspect_max,
            probe_timeout=config.probe_timeout, suspicion=config.suspicion,
            lossy_suspicion=config.lossy_suspicion))
        load = LoadMonitor(LoadConfig(
            high_queue=config.high_queue, high_cpu=config.high_cpu, low_queue=config.low_queue,
            low_cpu=config.low_cpu, cooldown=config.balance_cooldown))
        machine = NodeMachine(core, self.incarnation, detector, load, self._new_core,
                              listen=config.advertise, balance=config.balance,
                              max_tokens=config.max_tokens,
                              max_splits_per_minute=config.max_splits_per_minute,
                              repair_delay=config.repair_delay)
        machine.pull_grace = config.share_pull_grace
        machine.driver = HandoffDriver(max(10.0, 20 * config.checkpoint_interval),
                                       config.checkpoint_interval)
        machine.pull_interval = config.share_pull_interval
        machine.limits = RequestLimits(config.max_top, config.max_scan_chunk,
                                       config.max_handoff_timeout)
        machine.started_as = config.node_id
        return machine

    def _initial_ring(self, config: NodeConfig) -> Ring:
        """The configured founders' ring, or the one the data directory held."""
        ring = self.disk.ring if self.disk else None
        return ring or Ring.initial(dict(config.peers), config.replication, config.tokens_per_node,
                                    config.balancer, config.reducer_identity)

    def _new_core(self, node_id: str, ring: Ring) -> NodeCore:
        return NodeCore(node_id, ring, self.reducer, self.config.limits(),
                        verify_keys=self.config.verify_keys)

    async def confirm_membership(self, seeds: list[str] | None = None) -> None:
        """Decide who this process is (node.runtime.startup) and start serving as it."""
        initial, disk = self._initial_ring(self.config), self.disk
        back = disk is not None and disk.loaded is not None
        decision = await decide_membership(self.config, self.peers, self.incarnation, initial,
                                           seeds, self.clock, self.me,
                                           initial.addresses if back else None)
        # the same member, with its state
        if back and disk is not None and decision.node_id == self.me:
            from floering.node.runtime.durability import restore
            self.machine.begin(self.me, initial, restore(disk, self.core, self.clock()))
            self._handle(RingSeen(decision.ring, pulled=True))
        else:
            self.machine.begin(decision.node_id, decision.ring)
        record_start(self.events, decision, self.incarnation, self.config.node_id,
                     joining=seeds is not None)
        if disk is not None:
            from floering.node.runtime.durability import DataDir, Durability
            self.durable = Durability.begin(disk, self.core, self.incarnation,
                                            self.config.fsync_interval)

    def reconfigure(self, config: NodeConfig) -> None:
        """Before start only: the listen address became known after binding."""
        if self._tasks:
            raise RuntimeError("reconfigure after start")
        self.config = config
        self.machine = self._make_machine(config)

    # ------------------------------------------------------------ the facade

    @property
    def core(self) -> NodeCore:
        return self.machine.core

    @property
    def starting(self) -> bool:
        return self.machine.core.starting

    @property
    def serving(self) -> bool:
        """What health checks say: not while starting or gone, nor from being fenced
        until a peer's ring holds the member we rejoined as."""
        return not (self.starting or self.left.is_set() or self.core.fenced
                    or self.machine.rejoined > self.machine.rejoins_seen)

    def ask(self, kind: str, **fields):
        """A request answered by the machine (node.core.requests): its reply's value,
        or the FloeError refusing it raised."""
        self._handle(Requested(kind, fields))
        reply, self._reply = self._reply, None
        assert reply is not None
        if reply.error is not None:
            raise reply.error
        return reply.value

    def adopt(self, ring: Ring, pulled: bool = False, sender: str = "") -> None:
        """A ring view from a peer (`pulled`: its answer to our call; `sender`: the
        member that pushed it, or that we called)."""
        self._handle(RingSeen(ring, pulled, sender))

    def shed_moved(self) -> None:
        self._handle(ShedMoved())

    # ------------------------------------------------------------- effects

    def _handle(self, event) -> list[asyncio.Task]:
        tasks = self._run(self.machine.handle(event, self.clock()))
        if self.durable is not None:
            self.durable.after(self.core)
        return tasks

    def _run(self, effects) -> list[asyncio.Task]:
        """Carry out effects; returns the tasks a caller may await (shipments, farewell)."""
        awaitable = []
        for effect in effects:
            match effect:
                case Record():
                    t = self.events.record(effect.kind, effect.node, stimulus=effect.stimulus,
                                           **dict(effect.fields))
                    if effect.text:
                        log.log(effect.level, effect.text.replace("{t}", f"{t:.6f}"))
                case Note():
                    log.log(effect.level, effect.text)
                case Reply():
                    self._reply = effect
                case Gossip():
                    self.sync_ring(effect.address)
                case SendHeartbeat():
                    self._spawn(self._heartbeat(effect))
                case StartProbe():
                    self._spawn(probe_round(self, effect))
                case ShipCheckpoints():
                    awaitable.append(self._spawn(self._ship(effect)))
                case SendFolds():
                    self._spawn(send_folds(effect, self.peers, self._handle))
                case HandoffEnded():
                    self._handoff_ended(effect)
                case RoundNow():
                    self._round_now.set()
                case NextRound():
                    self._next_round = effect.after
                case StartShed():
                    self._spawn(self.shed_load(reason=effect.reason))
                case PullRanges():
                    self._spawn(pull_share(self, effect))
                case Farewell():
                    awaitable.append(self._spawn(self._farewell(effect.ring)))
                case Exit():
                    self.left.set()
                case Split():
                    pass       # the caller of SplitRequested reads it
                case WriteRetired():
                    assert self.retiring is not None   # a core keeps ranges only with one
                    self.retiring.run([effect])
                case _:
                    raise TypeError(f"unknown effect {effect!r}")
        return awaitable

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.machine.watch_peers(self.clock(), self.config.startup_grace)
        self._tasks = [asyncio.create_task(self._apply_loop(), name="apply"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint"),
                       asyncio.create_task(self._every(self.config.heartbeat_interval,
                                                       self._heartbeat_due), name="heartbeat"),
                       asyncio.create_task(self._every(self.config.heartbeat_interval / 2,
                                                       self._monitor_due), name="monitor"),
                       asyncio.create_task(self._every(0.1, self._load_due), name="load"),
                       asyncio.create_task(self._every(RETIRE_EVERY, self._retire_due),
                                           name="retire-channels")]
        if self.durable is not None:
            self._tasks.append(asyncio.create_task(self.durable.run(), name="group-commit"))
        log.info("node %s up on %s, %s", self.core.node_id, self.config.advertise,
                 self.core.ring.describe())
        self.sync_ring()   # every peer learns our incarnation now

    async def stop(self) -> None:
        """Drain what was queued, ship a final checkpoint, stop the loops."""
        while not self.inbound.empty():
            await asyncio.sleep(0.01)
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        if self.durable is not None:       # the commit loop is gone: the final round ships
            self.durable.sync_now()
        try:
            await asyncio.wait_for(self.checkpoint_once(), self.config.rpc_timeout)
        except (asyncio.TimeoutError, FloeError) as exc:
            log.warning("final checkpoint incomplete: %s", exc)
        if self.durable is not None:
            await self.durable.close()
        await self.peers.close()

    def halt(self) -> None:
        """Stop every loop at once, sending nothing: what a crashed process does."""
        for task in [*self._tasks, *self._background]:
            task.cancel()

    async def _every(self, interval: float, due) -> None:
        while True:
            scheduled = self.clock() + interval
            await asyncio.sleep(interval)
            due(scheduled)

    def _heartbeat_due(self, scheduled: float) -> None:
        self._handle(HeartbeatDue())

    def _monitor_due(self, scheduled: float) -> None:
        self._handle(MonitorDue(scheduled))

    def _retire_due(self, scheduled: float) -> None:
        named = {address for _, address in self.core.ring.addresses}
        self._spawn(self.peers.retire_channels(named))

    def _load_due(self, scheduled: float) -> None:
        self._handle(LoadSampled(self.queued_batches, self.busy_seconds, time.process_time()))

    # ------------------------------------------------------------- data path

    async def submit(self, batches, stream: StreamState) -> asyncio.Future:
        """Queue one request's batches; waits while the queue is full (that wait is
        the flow control the sender feels). Returns a future of [(batch id, PushResult)]."""
        done = asyncio.get_running_loop().create_future()
        # After a refusal the stream ends and nobody awaits the futures behind it: mark
        # their errors seen, or asyncio logs each one as never retrieved.
        done.add_done_callback(mark_seen)
        await self.inbound.put(Inbound(batches, stream, done))
        self.queued_batches += len(batches)
        return done

    async def _apply_loop(self) -> None:
        inbound = self.inbound
        while True:
            item = await inbound.get()
            try:
                if item.done.cancelled():
                    continue
                if item.stream.failed:
                    item.done.set_exception(InvalidArgument("an earlier batch on this stream was refused"))
                    continue
                await self._apply(item)
            finally:
                self.queued_batches -= len(item.batches) - item.applied
                await inbound.done(item)

    async def _apply(self, item: Inbound) -> None:
        acks = []
        machine = self.machine
        core = machine.core            # replaced when we rejoin after being fenced
        started = mark = self.clock()
        wall = time.time()             # what the senders' stream numbers are held to
        try:
            for b in item.batches:
                if self.durable is not None:
                    self.durable.check_writable()
                # A large batch is read and checked over steps (NodeCore.
                # receive_batch_steps), the loop running others between them.
                steps = core.receive_batch_steps(b, mark, wall)
                while True:
                    try:
                        next(steps)
                    except StopIteration as done:
                        result = done.value
                        break
                    if self.clock() - started > 0.003:
                        now = self.clock()
                        self.busy_seconds += now - mark
                        await asyncio.sleep(0)
                        started = mark = self.clock()
                        core = machine.core
                if self.durable is not None:          # the plan decides what is logged
                    self.durable.kept(b, result.applied)
                acks.append((b.id, result))
                if result.applied and b.token in machine.resuming:
                    self._handle(BatchApplied(b.token))
                now = self.clock()
                self.busy_seconds += now - mark
                mark = now
                item.applied += 1
                self.queued_batches -= 1
                if now - started > 0.003:
                    # A long message (or a costly reducer) must not starve heartbeats
                    # and probes: a busy node is not a dead one. The loop runs others
                    # after 3 ms of batches (then one more batch): no step near 5 ms.
                    await asyncio.sleep(0)
                    started = mark = self.clock()
                    core = machine.core
        except FloeError as exc:
            item.stream.failed = True
            if not item.done.done():
                item.done.set_exception(exc)
            if isinstance(exc, StaleRing):
                self._handle(MapperAhead(b.ring_stamp))   # a mapper may know a newer ring
        except Exception as exc:  # a reducer bug must not kill the node
            log.exception("batch %s from %s failed", b.id, inert(b.source))
            item.stream.failed = True
            if not item.done.done():
                item.done.set_exception(InvalidArgument(f"reducer failed: {inert(exc, 200)}"))
        else:
            if self.durable is not None:                  # acknowledged once on disk
                resolve_after(self.durable.committed(), item.done, acks)
            elif not item.done.done():   # the stream may have gone while we yielded
                item.done.set_result(acks)

    # ----------------------------------------------------------- checkpoints

    async def _checkpoint_loop(self) -> None:
        """Rounds one after the other, as far apart as the machine says (NextRound),
        sooner when it asks for one now (RoundNow)."""
        while True:
            started = self.clock()
            try:
                await self.checkpoint_once()
            except Exception:
                log.exception("checkpoint round failed")
            self.checkpoint_rounds += 1
            self.checkpoint_seconds += self.clock() - started
            try:
                self._handle(RoundEnded(started))
            except Exception:
                log.exception("the end of a checkpoint round failed")
            if not self._round_now.is_set():
                try:
                    await asyncio.wait_for(self._round_now.wait(), self._next_round)
                except asyncio.TimeoutError:
                    pass
            self._round_now.clear()

    async def checkpoint_once(self) -> None:
        """One round: cut, ship to every replica concurrently, then merge."""
        for task in self._handle(CheckpointDue()):
            await task

    async def _ship(self, e: ShipCheckpoints) -> None:
        sender = self.machine.node_id
        # Durable: no replica's copy gets ahead of what we come back with from disk.
        synced = self.durable.synced() if self.durable and e.shipments else None

        async def ship(s, address):
            token = s.checkpoint.token
            t0 = time.perf_counter()
            try:
                if synced is not None:
                    await asyncio.shield(synced)
                t1 = time.perf_counter()
                need_full, seq = await self.peers.ship_checkpoint(
                    address, sender=sender, ring_stamp=e.ring_stamp,
                    incarnation=self.incarnation, checkpoint=s.checkpoint,
                    base_seq=s.base_seq)
            except FloeError as exc:
                log.debug("checkpoint of %s to %s failed: %s", token, s.replica, exc)
                self._handle(CheckpointFailed(token, s.replica, exc.refresh_ring, e.epoch,
                                              inert(exc, 200)))
            else:
                if s.checkpoint.full:
                    log.debug("full copy of range %s acknowledged by %s in %.3f s (%.3f s "
                              "waiting for our disk)", token, s.replica,
                              time.perf_counter() - t0, t1 - t0)
                self._handle(CheckpointAcked(token, s.replica, seq, need_full, e.epoch))

        await asyncio.gather(*(ship(s, a) for s, a in zip(e.shipments, e.addresses)))
        self._handle(CheckpointRoundDone(e.tokens, e.behind_before, e.epoch))

    # ------------------------------------------------------ ring and failures

    def sync_ring(self, address: str | None = None) -> None:
        """Exchange ring views with one peer, or all, in the background."""
        if self.starting:
            return   # our view is not confirmed yet: it must not spread
        if address is None and self._syncing is not None and not self._syncing.done():
            return
        core = self.core
        targets = [address] if address else [a for n, a in core.ring.addresses
                                             if n != core.node_id]

        async def exchange(target):
            try:
                wire, certificate = await self._offer_ring(target, self.core.ring)
                # the member the answering certificate names ("@addr": nobody)
                self.adopt(Ring.from_wire(wire), pulled=True,
                           sender=answered_by(self.core.ring, target, certificate))
            except FloeError as exc:
                if isinstance(exc, InvalidArgument):
                    log.warning("ring view from %s refused: %s", target, exc)

        async def run():
            await asyncio.gather(*(exchange(t) for t in targets))

        task = self._spawn(run())
        if address is None:
            self._syncing = task

    async def _heartbeat(self, e: SendHeartbeat) -> None:
        try:
            theirs, incarnation, _ = await self.peers.heartbeat(
                e.address, sender=self.machine.node_id, ring_stamp=e.ring_stamp,
                incarnation=self.incarnation, timeout=self.config.heartbeat_interval * 4)
        except FloeError as exc:
            self._handle(HeartbeatFailed(e.address, failure_of(exc)))
            return
        self._handle(HeardFrom(e.node, theirs, incarnation, e.address))

    # -------------------------------------------------------------- handoffs

    async def hand_off(self, moves: dict[int, str], timeout: float | None = None,
                       still_ours: bool = False) -> Handoff:
        """Hand token ranges to other nodes live (node.core.handoff_driver runs it, in
        line behind a running one). Returns the finished Handoff: committed, or aborted
        with a reason; raises InvalidArgument when it is refused. `still_ours`: the
        node's own round asks (machine_io.HandoffRequested)."""
        request = next(self._requests)
        done = self._handoffs[request] = asyncio.get_running_loop().create_future()
        try:
            self._handle(HandoffRequested(dict(moves), timeout or 0.0, request, still_ours))
        except FloeError:
            del self._handoffs[request]          # refused at once
            raise
        try:
            return await done
        finally:
            del self._handoffs[request]
            if not done.done():                      # cancelled: nobody waits any more
                self._handle(HandoffAbandoned("the node stopped running it", request))

    def _handoff_ended(self, effect: HandoffEnded) -> None:
        done = self._handoffs.get(effect.request)
        if done is None or done.done():
            return
        h = effect.handoff
        if effect.refused:
            done.set_exception(InvalidArgument(getattr(h, "reason", "refused")))
        else:
            done.set_result(h)

    async def split_range(self, position: int) -> tuple[int, int]:
        """Cut our range holding `position` at it: returns (head token = position,
        tail token = the range's token)."""
        effects = self.machine.handle(SplitRequested(position), self.clock())
        self._run(effects)
        split = next(e for e in effects if isinstance(e, Split))
        return split.position, split.token

    async def leave(self, timeout: float | None = None) -> None:
        """Scale-in: hand every range away (node.runtime.balancing.hand_all_away),
        leave the ring (removed for good) and stop."""
        await hand_all_away(self, timeout or 30.0)
        for task in self._handle(LeaveRing()):
            await task
        self.left.set()

    def _offer_ring(self, address: str, ring: Ring):
        """An ExchangeRing call offering `ring`: answered with (the peer's view, the
        member its certificate names)."""
        return self.peers.exchange_ring(address, sender=self.machine.node_id,
                                        ring_wire=ring.to_wire(), version=ring.version,
                                        reducer=self.reducer.name)

    async def _farewell(self, ring: Ring) -> None:
        await asyncio.gather(*(self._offer_ring(a, ring) for _, a in ring.addresses),
                             return_exceptions=True)

    # --------------------------------------------------------- load balancing

    async def shed_load(self, reason: str, depth: int = 0, share: dict[int, str] | None = None,
                        member: str = "") -> ShedOutcome:
        return await shed_load(self, reason, depth, share, member)

    # --------------------------------------------------------------- queries

    def stats(self) -> dict:
        """The machine's stats and this process's."""
        return dict(self.ask(STATS), address=self.config.advertise,
                    queue_length=self.inbound.qsize(), queued_bytes=self.inbound.nbytes,
                    pid=os.getpid(), uptime=self.clock() - self.started_at,
                    moved_bytes=getattr(self.peers, "moved_bytes", 0),
                    checkpoint_bytes=getattr(self.peers, "checkpoint_bytes", 0),
                    checkpoint_rounds=self.checkpoint_rounds,
                    checkpoint_seconds=self.checkpoint_seconds)
