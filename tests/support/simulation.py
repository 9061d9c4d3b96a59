"""Deterministic simulation: N production `NodeMachine`s and the mapper's production
`Outbox` (tests/support/sim_mapper.py) over a seeded in-memory network with a virtual clock, kills, restarts,
pauses, starved (slow) nodes, partitions and message loss; durable nodes keep a
simulated data directory run by the production `DiskPlan` (tests/support/sim_disk.py), and
crash losing what was not synced. It holds no protocol logic:
each process's timers and messages become machine events, and the machine's effects
become messages, exactly as the asyncio runtime does with gRPC.

Everything random comes from one `random.Random(seed)`, time is a number advanced by an
event queue, so a failing seed replays identically. Processes listen on addresses; a
restarted process listens where its predecessor did. Links behave like the real
transport: FIFO; a mapper stream dies with its first lost message (nothing behind it
is delivered); node-to-node calls are unary, each lost on its own, and time out.
A paused process does nothing until it resumes: its timers and the answers to its
calls run late, as an asyncio loop's would.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, replace

from floering.node.core.batch import Batch, Limits, encode_payload
from floering.node.core.detector import (ALIVE, REFUSED, TIMED_OUT, DetectorConfig,
                                FailureDetector)
from floering.wire.errors import (FloeError, InvalidArgument, Overloaded, Refused,
                              StaleRing, Unavailable)
from floering.node.core.load import LoadConfig, LoadMonitor
from floering.node.core.machine import REPAIR_DELAY, NodeMachine
from floering.node.core.machine_io import (
    BatchApplied, CheckpointAcked, CheckpointDue, CheckpointFailed, CheckpointRoundDone, Exit,
    Farewell, FoldAnswered, Gossip, HandoffEnded, HandoffRequested, HeardFrom, HeartbeatDue,
    HeartbeatFailed, LeaveRing, LoadSampled, MapperAhead, MonitorDue, NextRound, Note,
    ProbeAnswered, Record, Reply, Requested, RingSeen, RoundEnded, RoundNow, SendFolds,
    SendHeartbeat, ShedMoved, ShipCheckpoints, Split, SplitRequested, StartProbe,
    StartShed)
from floering.node.core.calls import Failure, failure_of
from floering.node.core.handoff_driver import HandoffDriver
from floering.node.core.membership import answered_by, base_name, decide_start, sender_matches
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.node.core import requests
from floering.node.core.retired import RetainingCore
from floering.node.core.retiring import Retiring, WriteRetired
from floering.wire.ring import Ring
from floering.node.core.forged_views import forged_views
from floering.wire.ring_merge import MAX_VERSION_STEP
from floering.node.core.shares import PullRanges
from floering.node.core.leaving import (CheckAgain, Go, HandAway, HandedAway, HandingRefused,
                                        LeaveFailed, LeaveState, Leaving, begin_leave,
                                        check_leave)
from floering.node.core.startup_round import Answered, AskPeers, Startup, Stop
from floering.node.core.shed_round import (AskToShed, CascadeAnswered, CascadeFailed, Finished,
                                           HandoffDone, HandoffRefused, HandOver, PlanComputed,
                                           PlanRound, ShedRound)
from floering.node.core.shedding import PeerLoad, cut_positions, shed_reach
from floering.wire.balancers import balancer
from floering.wire.pieces import base_of, merge_pieces
from tests.support.sim_disk import SimDisk, SimDurability
from tests.support.sim_durable import DurableNodes, Starter
from tests.support.sim_mapper import MapperSide, SimMapper
from tests.support.sim_retiring import RetiringSide

HEARTBEAT = 0.05
# how a call ends on the simulated network, as node.core.calls names it
CALL_ENDS = {ALIVE: None, REFUSED: Failure.REFUSED, TIMED_OUT: Failure.UNAVAILABLE}
CHECKPOINT = 0.2
HANDOFF_TIMEOUT = 2.0
PULL_SETTLE = 5.0      # seconds past the end a pull's handoff may take to settle
CALL_TIMEOUT = 0.5          # node-to-node calls (checkpoints, ring exchanges)
LATENCY = (0.0005, 0.005)   # one-way delay of a message on a healthy link
REACH = 2                   # nodes clockwise a shedding round may move load to
QUEUE_BATCHES = 16          # a node's inbound queue; a full one holds its senders back
APPLY_SECONDS = 0.0001      # applying one tuple
OVERLOAD_FACTOR = 200       # how much slower an overloaded node applies


class SimProcess:
    """One node process: its machine, where it listens, and what the faults did to it."""

    def __init__(self, machine: NodeMachine, address: str, started_as: str) -> None:
        self.machine = machine
        self.address = address
        self.started_as = started_as
        self.alive = True
        self.paused_until = 0.0
        self.slow_until = 0.0     # starved: everything it sends, reads or does runs late
        self.slow_delay = 0.0     # by up to this many seconds
        self.leaving: Leaving | None = None     # its scale-in, under way
        self.hot_until = 0.0      # overloaded: it applies OVERLOAD_FACTOR times slower
        self.busy_seconds = 0.0   # time its applier spent applying
        self.inbound: deque = deque()   # batches received, not applied yet (bounded)
        self.waiting: deque = deque()   # deliveries held back while the queue is full
        self.applying = False
        self.handoffs: dict[int, object] = {}   # request id -> told how it ended
        self.round_gen = 0        # the one checkpoint round scheduled counts
        self.in_round = False
        self.durable: SimDurability | None = None   # its data directory, if durable
        self.retire_at = 0.0      # its next round about retired ranges (tests/support/sim_retiring.py)
        self.owns_checked: tuple = ()   # (its ring, the latest, its tokens) last found consistent

    @property
    def core(self) -> NodeCore:
        return self.machine.core

    @property
    def name(self) -> str:
        return self.machine.node_id


# Pieces of shared keys are merged back after this long unchanged (10 s in production):
# within a run, and more than a few checkpoint rounds.
PIECE_IDLE = 0.5
# Ring views a member may forge that the protocol could have produced (Simulation.forge)
MEMBER_FORGERIES = ("version far ahead", "removes live members", "moves a live range")


def make_machine(node_id: str, ring: Ring, incarnation: int, address: str,
                 load: LoadConfig = LoadConfig()) -> NodeMachine:
    def make_core(name: str, r: Ring) -> NodeCore:
        # as the runtime's (node.runtime.retiring): a fenced member keeps what it held
        return RetainingCore(name, r, load_reducer("count"), Limits(piece_idle=PIECE_IDLE))
    # Shedding on unless the ring's balancer shares keys instead (node.config does the
    # same): the default ring's `none` runs shedding too, to exercise it everywhere.
    machine = NodeMachine(make_core(node_id, ring), incarnation,
                          FailureDetector(DetectorConfig()), LoadMonitor(load), make_core,
                          listen=address, balance=balancer(ring.balancer).pieces == 1,
                          repair_delay=REPAIR_DELAY)
    machine.driver = HandoffDriver(HANDOFF_TIMEOUT, CHECKPOINT)
    machine.retiring = Retiring()
    return machine


class Simulation(MapperSide, DurableNodes, RetiringSide):
    make_machine = staticmethod(make_machine)

    def __init__(self, seed: int, nodes: int = 5, replication: int = 1, tokens: int = 2,
                 loss: float = 0.0, mappers: int = 1, skew: float = 0.0,
                 durable: bool = False, policy: str = "none", combining: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.events: list = []
        self.counter = 0
        self.loss = loss
        self.tokens = tokens
        self.skew = skew          # share of emitted keys drawn from three hot words
        self.durable = durable    # every node keeps a (simulated) data directory
        self.starting: dict[str, Starter] = {}     # address -> a process not serving yet
        self.members = {f"n{i}": f"sim:n{i}" for i in range(nodes)}   # founding id -> address
        self.incarnations = 0
        # The ring as the founding members leave their start-up exchange: each one's
        # incarnation heard by all (node.core.membership).
        self.founding = Ring.initial(self.members, replication, tokens, policy)
        inc = {n: self._incarnation() for n in sorted(self.members)}
        ring = replace(self.founding, incarnations=tuple(sorted(inc.items())))
        self.procs: list[SimProcess] = []
        # Processes an event may have changed since the invariants were last checked:
        # only those are checked again (the others' state is as it was).
        self.touched: set[SimProcess] = set()
        self.listening: dict[str, SimProcess] = {}     # address -> the latest process there
        for name, address in self.members.items():
            proc = self._spawn_process(self.make_machine(name, ring, inc[name], address), address,
                                       name)
            proc.machine.watch_peers(0.0, 0.0)
            if durable:
                self._keep_on_disk(proc, SimDisk(), None)
        self.dead_from: dict = {}          # (link, stream) -> first message index not delivered
        self.sent_on_link: dict = defaultdict(int)
        self.delivering = None
        self.cut: set[frozenset] = set()   # address pairs that cannot talk (partitions)
        self.stream_no = 0
        self.streams: dict[tuple[str, str], int] = defaultdict(int)
        self.last_on_link: dict[tuple[str, str], float] = defaultdict(float)
        self.mappers = [SimMapper(f"m{i}", ring, combining) for i in range(mappers)]
        self.batch_ids = 0
        self.acked = Counter()
        self.sent = Counter()
        self.pieces_sent: set = set()      # the pieces of shared keys tuples went to
        self.log: list[str] = []
        self.requests = 0            # handoff requests made (their ids)
        self.pulled = False     # a member short of its share was handed ranges
        self.declared: list[tuple[float, str, str]] = []   # (when, by whom, whom)
        self.leave_failures: list[tuple[float, str, str]] = []   # (when, who, why)
        self.start_failures: list[tuple[float, str, str]] = []   # a start-up that stopped
        self.forged_removals: list[tuple[float, str, tuple]] = []  # (when, to whom, whom)
        self.forged_moves: list[tuple] = []   # (when, to whom, token, to, generation)
        self.rogue, self.rogue_until = "", 0.0     # a member answering forged views
        self.forged_answers: list[tuple[float, str, str]] = []  # (when, to whom, other)

    def _incarnation(self) -> int:
        self.incarnations += 1
        return self.incarnations

    def _spawn_process(self, machine: NodeMachine, address: str, started_as: str) -> SimProcess:
        proc = SimProcess(machine, address, started_as)
        self.procs.append(proc)
        self.touched.add(proc)
        self.listening[address] = proc
        return proc

    # ---------------------------------------------------------- who is who

    @property
    def nodes(self) -> dict[str, SimProcess]:
        """Member id -> the process that serves (or last served) as it."""
        return {p.name: p for p in self.procs}

    def process(self, name: str) -> SimProcess | None:
        """The live process serving as member `name`, else the latest process started
        as `name` (a fault aimed at n2 hits the process that rejoined as n2#1)."""
        for p in self.procs:
            if p.alive and p.name == name:
                return p
        started = [p for p in self.procs if p.started_as == name or p.name == name]
        return started[-1] if started else None

    def usable(self, name: str) -> bool:
        p = self.nodes.get(name)
        return p is not None and self._usable(p)

    def _usable(self, p: SimProcess) -> bool:
        return p.alive and p.paused_until <= self.now and not p.core.fenced

    # ------------------------------------------------------------ event queue

    def at(self, when: float, action, *args) -> None:
        self.counter += 1
        heapq.heappush(self.events, (when, self.counter, action, args))

    def on(self, proc: SimProcess, when: float, action, *args) -> None:
        """Run `action` in `proc` at `when`: dropped if it died, late if paused."""
        self.at(when, self._fire, proc, action, args)

    def _fire(self, proc: SimProcess, action, args) -> None:
        if not proc.alive:
            return
        if proc.paused_until > self.now:
            self.at(proc.paused_until, self._fire, proc, action, args)
            return
        self.touched.add(proc)
        action(*args)

    def handle(self, proc: SimProcess, event) -> list:
        """Feed one event to a process's machine and carry out its effects."""
        self.touched.add(proc)
        effects = proc.machine.handle(event, self.now)
        self._run(proc, effects)
        if proc.durable is not None and proc.alive:
            proc.durable.after(proc.core)
        return effects

    def ask(self, proc: SimProcess, kind: str, **fields):
        """A request served by `proc`'s machine (node.core.requests), as the runtime's
        service asks it: the reply's value, or its refusal raised."""
        reply = next(e for e in self.handle(proc, Requested(kind, fields))
                     if isinstance(e, Reply))
        if reply.error is not None:
            raise reply.error
        return reply.value

    # ---------------------------------------------------------------- network

    def send(self, src, dst, action, *args) -> None:
        """FIFO per link (between processes and mappers). A mapper's links are streams: once a
        message of a stream is lost (or arrives at a paused or dead process, or is
        refused), neither it nor anything sent after it on that stream arrives; what
        was sent before it still does, in order. Node-to-node messages are separate
        unary calls: each may be lost on its own."""
        link = (src.address, dst.address)
        if frozenset(link) in self.cut:
            return
        stream = self.streams[link] if isinstance(src, SimMapper) else None
        self.sent_on_link[link] += 1
        index = self.sent_on_link[link]
        if stream is not None and index >= self.dead_from.get((link, stream), index + 1):
            return
        if self.loss and self.rng.random() < self.loss:
            if stream is not None:
                self._kill_stream(link, stream, index)
            return
        when = max(self.now + self.rng.uniform(*LATENCY) + self._starved(src)
                   + self._starved(dst), self.last_on_link[link])
        self.last_on_link[link] = when
        self.at(when, self._deliver, (src, dst), link, stream, index, action, args)

    def _kill_stream(self, link, stream, index) -> None:
        key = (link, stream)
        self.dead_from[key] = min(self.dead_from.get(key, index), index)

    def _deliver(self, ends, link, stream, index, action, args) -> None:
        if stream is not None and index >= self.dead_from.get((link, stream), index + 1):
            return
        for proc in ends:
            if not proc.alive or proc.paused_until > self.now:
                if stream is not None:
                    self._kill_stream(link, stream, index)  # the stream times out
                return
        self.delivering = (link, stream, index)
        self.touched.update(p for p in ends if isinstance(p, SimProcess))
        action(*args)

    def call(self, caller: SimProcess, address: str, serve, on_reply, on_error,
             timeout: float = CALL_TIMEOUT) -> None:
        """A unary call from `caller` to whatever listens at `address`: `serve(server)`
        runs there and returns the reply or raises FloeError; the caller then gets
        `on_reply(reply)` or `on_error(exc)`, or Unavailable once `timeout` passed."""
        def start(server, respond):
            try:
                respond(serve(server), None)
            except FloeError as exc:
                respond(None, exc)
        self.call_later(caller, address, start, on_reply, on_error, timeout)

    def call_later(self, caller: SimProcess, address: str, start, on_reply, on_error,
                   timeout: float) -> None:
        """A call whose server answers when it is done: `start(server, respond)`, and
        `respond(reply, error)` sends the answer back."""
        server = self.listening.get(address)
        done = []

        def finish(callback, value):
            if not done:
                done.append(True)
                callback(value)

        if server is None or not server.alive:
            self.on(caller, self.now + self.rng.uniform(*LATENCY), finish, on_error,
                    Refused(f"nothing listens at {address}"))
            return
        self.on(caller, self.now + timeout, finish, on_error, Unavailable("deadline exceeded"))

        def respond(reply, error):
            if server.alive:
                self.send(server, caller, self.on, caller, self.now, finish,
                          on_reply if error is None else on_error,
                          reply if error is None else error)

        self.send(caller, server, start, server, respond)

    def reconnect(self, mapper: SimMapper, address: str) -> None:
        self.stream_no += 1
        self.streams[(mapper.address, address)] = self.stream_no

    def _starved(self, proc) -> float:
        """Extra delay a starved (slow, not stopped) process adds to what it does now."""
        if proc.slow_until <= self.now:
            return 0.0
        return self.rng.uniform(0.0, proc.slow_delay)

    # --------------------------------------------------------------- effects

    def _run(self, proc: SimProcess, effects) -> None:
        for e in effects:
            match e:
                case Record():
                    self._record(e)
                case Note() | Split() | Reply():
                    pass       # a Reply is read by ask(), a Split by its requester
                case Gossip():
                    self._gossip(proc, e.address)
                case SendHeartbeat():
                    self._heartbeat(proc, e)
                case StartProbe():
                    self._probe(proc, e)
                case ShipCheckpoints():
                    self._ship(proc, e)
                case SendFolds():
                    self._send_folds(proc, e)
                case HandoffEnded():
                    ended = proc.handoffs.pop(e.request, None)
                    if ended is not None:
                        ended(e.handoff, e.refused)
                case RoundNow():
                    if not proc.in_round:
                        self._schedule_round(proc, self.now)
                case NextRound():
                    self._schedule_round(proc, self.now + e.after)
                case Farewell():
                    self._farewell(proc, e.ring)
                case Exit():
                    proc.alive = False
                case StartShed():
                    self.shed_load(proc, e.reason, 0)
                case PullRanges():
                    self._pull(proc, e)
                case WriteRetired():
                    self.write_retired(proc, e)
                case _:
                    raise TypeError(f"unknown effect {e!r}")

    def _record(self, e: Record) -> None:
        fields = dict(e.fields)
        if e.kind == "detected":
            self.declared.append((self.now, e.node, fields["about"][0]))
        shown = " ".join(f"{k}={_show(v)}" for k, v in e.fields if k not in ("why", "ms"))
        self.log.append(f"{self.now:.3f} {e.node} {e.kind}" + (f" {shown}" if shown else ""))

    def _gossip(self, proc: SimProcess, address: str | None) -> None:
        """Exchange ring views, as the ExchangeRing call does: the peer adopts ours and
        answers with its own."""
        ring, me = proc.core.ring, proc.name
        targets = [address] if address else [a for n, a in ring.addresses if n != me]

        def serve(server, ring=ring):
            authenticate(proc, me)
            ours = self.ask(server, requests.EXCHANGE_RING, sender=me, ring=ring,
                            caller=base_name(me))                # its certificate
            return self.answer_view(server, me, ours), base_name(server.name)

        for target in targets:      # the answer is the word of the member its server's
            self.call(proc, target, serve,      # certificate names there, else nobody's
                      lambda answer, t=target: self.handle(proc, RingSeen(
                          answer[0], pulled=True,
                          sender=answered_by(proc.core.ring, t, answer[1]))), _ignore)

    def _farewell(self, proc: SimProcess, ring: Ring) -> None:
        """As the runtime's: the ring without us offered to every member left, in an
        ExchangeRing whose answer nobody reads."""
        me = proc.name

        def serve(server):
            authenticate(proc, me)
            return self.ask(server, requests.EXCHANGE_RING, sender=me, ring=ring,
                            caller=base_name(me))

        for _, address in ring.addresses:
            self.call(proc, address, serve, _ignore, _ignore)

    def answer_view(self, server: SimProcess, caller: str, ring: Ring) -> Ring:
        """The view `server` answers `caller`'s exchange with: its own `ring`, or, while
        it is the rogue member, one removing the caller and another live member."""
        if self.rogue != server.name or self.now >= self.rogue_until:
            return ring
        others = sorted(n for n in ring.nodes if n not in (caller, server.name))
        if caller not in ring.nodes or len(ring.nodes) < 2:
            return ring
        self.forged_answers.append((self.now, caller, others[0] if others else ""))
        return ring.without([caller, *others[:1]])     # a ring of two: the caller alone

    def _heartbeat(self, proc: SimProcess, e: SendHeartbeat) -> None:
        me, incarnation = proc.name, proc.machine.incarnation

        def serve(server):
            authenticate(proc, me)
            return self.ask(server, requests.HEARTBEAT, sender=me, ring_stamp=e.ring_stamp,
                            incarnation=incarnation)

        def answered(reply):
            self.handle(proc, HeardFrom(e.node, reply[0], reply[1], e.address))

        def failed(exc):
            self.handle(proc, HeartbeatFailed(e.address, failure_of(exc)))

        self.call(proc, e.address, serve, answered, failed, timeout=4 * HEARTBEAT)

    def _answer(self, asker: str, address: str,
                sent: float) -> tuple[str, float | None, int, str]:
        """How and when the process at `address` answers a call `asker` sends at
        `sent`, as the real transport behaves: a dead process refuses at once; a cut
        link or a paused process never answers in time (the call times out); a starved
        one answers late. Also the incarnation it answers with, and the member it is."""
        if frozenset((asker, address)) in self.cut:
            return TIMED_OUT, None, 0, ""
        target = self.listening.get(address)
        if target is None or not target.alive or target.core.fenced:
            return REFUSED, sent + self.rng.uniform(*LATENCY), 0, ""
        start = max(sent, target.paused_until)
        asking = self.listening.get(asker)
        return ALIVE, (start + 2 * self.rng.uniform(*LATENCY) + self._starved(target)
                       + self._starved(asking)), target.machine.incarnation, target.name

    def _probe(self, proc: SimProcess, e: StartProbe) -> None:
        """One probe round, direct and through every member named, as the runtime runs
        it: the round ends once every call answered or timed out; how each ended goes
        to the machine, which judges what it means (node.core.calls)."""
        sent, deadline = self.now, e.probe.deadline
        kind, when, incarnation, member = self._answer(proc.address, e.address, sent)
        if when is None or when > sent + deadline:
            direct, direct_at = Failure.UNAVAILABLE, sent + deadline
        else:
            direct, direct_at = CALL_ENDS[kind], when
        answers, ends = [], [direct_at]
        for via_address in e.via_addresses:
            failure, reached, at = self._ask_via(proc, via_address, e.probe.node, sent,
                                                 deadline)
            answers.append((failure, reached))
            ends.append(at)
        self.on(proc, max(ends), self.handle, proc,
                ProbeAnswered(e.probe, direct, tuple(answers), e.epoch, incarnation,
                              "connection refused", member))

    def _ask_via(self, proc: SimProcess, via_address: str, suspect: str, sent: float,
                 deadline: float) -> tuple[Failure | None, bool, float]:
        """How the call asking the member at `via_address` at `sent` whether it reaches
        `suspect` ends (a failure, or None and whether it does), and when."""
        limit = sent + 2 * deadline                    # the outer call's deadline
        kind, reached, _, _ = self._answer(proc.address, via_address, sent)
        if kind == REFUSED:
            return Failure.REFUSED, False, reached
        if reached is None or reached > limit:
            return Failure.UNAVAILABLE, False, limit
        # The member asked serves the Probe as the runtime's probe_for does, through
        # the same decisions (node.core.requests), called directly: the prober's
        # answer is known now, the member's evidence comes when its call ends.
        via = self.listening[via_address]
        where, wait = requests.probe(via.machine, self.now, [], suspect, deadline)
        if not where:
            return None, False, min(limit, reached + wait)
        seen, seen_at, theirs, member = self._answer(via_address, where, reached)
        failure = CALL_ENDS[seen]
        if failure is None and seen_at > reached + wait:
            failure = Failure.UNAVAILABLE       # answered after its deadline
        alive, evidence = requests.probe_evidence(via.machine, suspect, failure, theirs, member)
        at = seen_at if alive else reached + wait
        self.on(via, at, self.handle, via, evidence)
        return None, alive, min(limit, at)

    # ------------------------------------------------------------ timers

    def tick_node(self, proc: SimProcess, scheduled: float) -> None:
        """The heartbeat and monitor loops (one interval in the simulation)."""
        self.on(proc, self.now + HEARTBEAT + self._starved(proc), self.tick_node, proc,
                self.now + HEARTBEAT)
        self.handle(proc, MonitorDue(scheduled))
        self.handle(proc, HeartbeatDue())
        self.retire_tick(proc)

    def _schedule_round(self, proc: SimProcess, when: float) -> None:
        """The next checkpoint round, replacing any scheduled before."""
        proc.round_gen += 1
        self.on(proc, when + self._starved(proc), self.checkpoint_round, proc, proc.round_gen)

    def checkpoint_round(self, proc: SimProcess, gen: int) -> None:
        if gen != proc.round_gen or proc.in_round:
            return
        proc.in_round = True
        self.handle(proc, CheckpointDue())

    def _ship(self, proc: SimProcess, e: ShipCheckpoints) -> None:
        """Ship every checkpoint of a round concurrently; the round is done once each
        was answered or timed out."""
        started, waiting = self.now, [len(e.shipments)]

        def answered(event):
            self.handle(proc, event)
            waiting[0] -= 1
            if waiting[0] == 0:
                self._round_done(proc, e, started)

        if proc.durable is not None and e.shipments:
            # Only what is on its disk: no replica's copy gets ahead of it.
            proc.durable.synced(lambda: self._ship_all(proc, e, answered), lambda exc: [
                answered(CheckpointFailed(s.checkpoint.token, s.replica, exc.refresh_ring,
                                          e.epoch)) for s in e.shipments])
        else:
            self._ship_all(proc, e, answered)
        if not e.shipments:
            self._round_done(proc, e, started)

    def _ship_all(self, proc: SimProcess, e: ShipCheckpoints, answered) -> None:
        me, incarnation = proc.name, proc.machine.incarnation
        for s, address in zip(e.shipments, e.addresses):
            cp = s.checkpoint

            def serve(server, respond, s=s, cp=cp):
                authenticate(proc, me)
                states, watermarks = dict(cp.states), dict(cp.watermarks)
                try:
                    self.ask(server, requests.CHECKPOINT, sender=me, ring_stamp=e.ring_stamp,
                             incarnation=incarnation, watermarks=watermarks)
                    need_full, seq = server.core.receive_checkpoint(
                        me, e.ring_stamp, cp.token, cp.seq, s.base_seq, cp.full, states,
                        watermarks, self.now)
                except FloeError as exc:
                    respond(None, exc)
                    return
                if server.durable is None or need_full:
                    respond((need_full, seq), None)
                else:                     # merged: acknowledged once on disk too
                    server.durable.merged(cp.token, me, states, watermarks, cp.full,
                                          lambda: respond((need_full, seq), None),
                                          lambda exc: respond(None, exc))

            self.call_later(proc, address, serve,
                            lambda reply, s=s: answered(CheckpointAcked(
                                s.checkpoint.token, s.replica, reply[1], reply[0], e.epoch)),
                            lambda exc, s=s: answered(CheckpointFailed(
                                s.checkpoint.token, s.replica, exc.refresh_ring, e.epoch)),
                            CALL_TIMEOUT)

    def _send_folds(self, proc: SimProcess, e: SendFolds) -> None:
        """As node.runtime.folds: each fold pushed to every node of its key's range,
        answered once all took it or one did not."""
        for fold, token, addresses in zip(e.folds, e.tokens, e.addresses):
            batch = Batch(e.ring_stamp, token, fold.source, fold.seq, fold.seq, 1,
                          encode_payload([fold.key], [fold.state]))
            waiting = [len(addresses)]

            def answer(ok: bool, fold=fold, waiting=waiting) -> None:
                if waiting[0] > 0:
                    waiting[0] = waiting[0] - 1 if ok else 0
                    if waiting[0] == 0:
                        self.handle(proc, FoldAnswered(fold.out_key, fold.seq, ok, e.epoch))

            def serve(server, respond, batch=batch) -> None:
                try:
                    if server.durable is not None:
                        server.durable.check_writable()
                    result = server.core.receive_batch(batch, self.now)
                except FloeError as exc:
                    respond(None, exc)
                    return
                if server.durable is None:
                    respond(result, None)
                else:                     # acknowledged once on disk
                    server.durable.kept(batch, result.applied)
                    server.durable.ack(lambda: respond(result, None),
                                       lambda exc: respond(None, exc))

            for address in addresses:
                self.call_later(proc, address, serve, lambda _r, a=answer: a(True),
                                lambda _exc, a=answer: a(False), CALL_TIMEOUT)

    def _round_done(self, proc: SimProcess, e: ShipCheckpoints, started: float) -> None:
        self.handle(proc, CheckpointRoundDone(e.tokens, e.behind_before, e.epoch))
        proc.in_round = False
        self._continue_leave(proc)
        self.handle(proc, RoundEnded(started))      # its NextRound schedules the next

    # --------------------------------------------------------------- handoffs

    def request_handoff(self, proc: SimProcess, moves: dict[int, str], what: str,
                        ended=None, still_ours: bool = False) -> str:
        """Ask `proc`'s machine for a handoff (node.core.handoff_driver runs it, maybe
        behind another); `ended(handoff, refused)` is told how it ended. Returns why it
        was refused at once (nothing told then), or "" when accepted."""
        self.requests += 1
        request = self.requests
        if ended is not None:
            proc.handoffs[request] = ended
        try:
            self.handle(proc, HandoffRequested(dict(moves), 0.0, request, still_ours))
        except FloeError as exc:
            proc.handoffs.pop(request, None)
            self.log.append(f"{self.now:.3f} {proc.name} handoff refused: {exc}")
            return str(exc)
        self.log.append(f"{self.now:.3f} {proc.name} {what}")
        return ""

    def handoff(self, name: str, to: str = "heir", crash_after: tuple | None = None) -> None:
        """`name` hands one of its tokens to its first replica ("heir") or to another
        member picked by the seed ("any"), as an operator's `floe move` does. With
        `crash_after` (delay, downtime), the machine of the node it goes to loses
        power that long after the commit (`crash`)."""
        proc = self.process(name)
        if proc is None or not self._usable(proc) or not proc.core.primaries:
            return
        core = proc.core
        token = self.rng.choice(sorted(core.primaries))
        others = [n for n in core.ring.nodes if n != proc.name]
        if not others:
            return
        target = core.ring.heir(token) if to == "heir" else self.rng.choice(others)
        ended = None
        if crash_after is not None:
            delay, downtime = crash_after

            def ended(h, refused: bool) -> None:
                if h.state == "committed":
                    self.at(self.now + delay, self.crash, target, downtime)
        self.request_handoff(proc, {token: target}, f"hands {token} to {target}", ended)

    def split(self, name: str, hand_tail: bool = True) -> None:
        """`name` cuts one of its ranges at a seeded position and (as load shedding
        does) hands the tail to its first replica."""
        proc = self.process(name)
        if proc is None or not self._usable(proc) or not proc.core.primaries:
            return
        core = proc.core
        token = self.rng.choice(sorted(core.primaries))
        lo, hi = core.ring.range_of_token(token)
        size = Ring.range_size((lo, hi))
        if size < 2:
            return
        at = (lo + self.rng.randrange(1, size)) % (2 ** 64)
        try:
            self.handle(proc, SplitRequested(at))
        except InvalidArgument as exc:
            self.log.append(f"{self.now:.3f} {proc.name} split refused: {exc}")
            return
        heir = proc.core.ring.heir(token)
        if hand_tail and heir is not None:
            self.request_handoff(proc, {token: heir}, f"hands the tail {token} to {heir}")

    def leave(self, name: str) -> None:
        """Scale-in as the runtime does it (node.core.leaving): hand every range away,
        wait until no range needs our copy any more, remove ourselves, exit; a refused
        or aborted handoff fails the leave, reported in the log and `leave_failures`."""
        proc = self.process(name)
        if proc is None or not self._usable(proc) or proc.leaving is not None:
            return
        leaving, effects = begin_leave(proc.machine, self.now + HANDOFF_TIMEOUT)
        if leaving.state != LeaveState.FAILED:
            self.log.append(f"{self.now:.3f} {proc.name} leaves")
            proc.leaving = leaving
        self._run_leave(proc, effects)

    def _run_leave(self, proc: SimProcess, effects: list) -> None:
        leaving = proc.leaving
        match effects:
            case [Go(warning=warning)]:
                if warning:
                    self.log.append(f"{self.now:.3f} {proc.name} {warning}")
                proc.leaving = None
                self.handle(proc, LeaveRing())
            case [LeaveFailed(reason=reason)]:
                self.log.append(f"{self.now:.3f} {proc.name} leave failed: {reason}")
                self.leave_failures.append((self.now, proc.name, reason))
                proc.leaving = None
            case [HandAway(moves=moves, again=again)]:
                def ended(h, refused: bool) -> None:
                    self._run_leave(proc, leaving.handle(
                        HandingRefused(h.reason) if refused
                        else HandedAway(h.state == "committed", h.reason)))

                what = ("hands on ranges that came back while leaving" if again
                        else f"hands {len(moves)} ranges away")
                if refused := self.request_handoff(proc, moves, what, ended, still_ours=True):
                    self._run_leave(proc, leaving.handle(HandingRefused(refused)))
            case [CheckAgain()]:
                if proc.machine.copy_in_use():
                    self._gossip(proc, None)

    def _continue_leave(self, proc: SimProcess) -> None:
        """After each checkpoint round: is our copy still in use, did a range come back?"""
        leaving = proc.leaving
        if leaving is None or leaving.state != LeaveState.WAITING:
            return
        self._run_leave(proc, check_leave(proc.machine, leaving, self.now))

    def join(self, name: str, via: str) -> None:
        """A new, empty member joins through `via`'s view, then `via` hands it a token
        (the delayed transition: extra replica first, owner once it holds the range)."""
        sponsor = self.process(via)
        if sponsor is None or not self._usable(sponsor):
            return
        self.log.append(f"{self.now:.3f} {name} joins via {via}")
        address = f"sim:{name}"
        incarnation = self._incarnation()
        ring = sponsor.core.ring.add_node(name, address, (), incarnation)
        proc = self._spawn_process(self.make_machine(name, ring, incarnation, address), address,
                                   name)
        if self.durable:
            self._keep_on_disk(proc, SimDisk(), None)
        self._start_loops(proc)
        self.at(self.now + 0.05, self.handoff, via, "any")

    def _start_loops(self, proc: SimProcess, grace: float = 0.0) -> None:
        proc.machine.watch_peers(self.now, grace)
        self.on(proc, self.now + HEARTBEAT, self.tick_node, proc, self.now + HEARTBEAT)
        self._schedule_round(proc, self.now + CHECKPOINT)
        self.on(proc, self.now + 0.1, self.load_tick, proc)
        self._gossip(proc, None)      # every peer learns our incarnation now

    # ----------------------------------------------------- mapper deliveries

    def _node_receive(self, mapper: SimMapper, proc: SimProcess, dest: str, batch_id, stamp,
                      fields) -> None:
        """A batch arrives: into the node's bounded queue, or held back (with every
        later arrival, as a full asyncio queue holds its putters) until there is room."""
        item = (mapper, dest, batch_id, stamp, fields, self.delivering)
        if len(proc.inbound) < QUEUE_BATCHES and not proc.waiting:
            proc.inbound.append(item)
        else:
            proc.waiting.append(item)
        self._next_apply(proc)

    def _next_apply(self, proc: SimProcess) -> None:
        """The applier: one batch at a time, each taking its time."""
        if proc.applying or not proc.inbound:
            return
        proc.applying = True
        item = proc.inbound.popleft()
        while proc.waiting and len(proc.inbound) < QUEUE_BATCHES:
            proc.inbound.append(proc.waiting.popleft())
        cost = APPLY_SECONDS * item[4]["count"]
        if proc.hot_until > self.now:
            cost *= OVERLOAD_FACTOR
        self.on(proc, self.now + cost + self._starved(proc), self._apply, proc, item, cost)

    def _apply(self, proc: SimProcess, item, cost: float) -> None:
        """As the runtime's applier: the core decides; a refusal ends the stream."""
        proc.applying = False
        proc.busy_seconds += cost
        mapper, dest, batch_id, stamp, fields, (link, stream, index) = item
        if index < self.dead_from.get((link, stream), index + 1):
            self._apply_batch(proc, mapper, dest, batch_id, stamp, fields, link, stream, index)
        self._next_apply(proc)

    def _apply_batch(self, proc, mapper, dest, batch_id, stamp, fields, link, stream,
                     index) -> None:
        durable = proc.durable

        def refused(exc: FloeError) -> None:
            self._kill_stream(link, stream, index + 1)
            if durable is not None and isinstance(exc, Overloaded):
                return           # its disk is full: the mapper tries again after a while
            if isinstance(exc, StaleRing):
                self.handle(proc, MapperAhead(stamp))
            if stream == self.streams[link]:
                self.send(proc, mapper, self.stream_refused, mapper, dest, exc)

        batch = Batch(**fields)
        try:
            if durable is not None:
                durable.check_writable()
            result = proc.core.receive_batch(batch, self.now)
        except FloeError as exc:
            refused(exc)
            return
        if durable is not None:           # acknowledged once on disk
            durable.kept(batch, result.applied)
        if result.applied and fields["token"] in proc.machine.resuming:
            self.handle(proc, BatchApplied(fields["token"]))

        def ack() -> None:
            self.send(proc, mapper, self._mapper_ack, mapper, batch_id, dest, stamp)
        if durable is None:
            ack()
        else:
            durable.ack(ack, refused)

    # ---------------------------------------------------------- load shedding

    def load_tick(self, proc: SimProcess) -> None:
        """The load loop: the queue's length and the applier's busy time; the machine
        decides whether that is overload and whether to shed."""
        self.on(proc, self.now + 0.1, self.load_tick, proc)
        queued = len(proc.inbound) + len(proc.waiting) + proc.applying
        self.handle(proc, LoadSampled(queued, proc.busy_seconds, 0.0))

    def overload(self, name: str, seconds: float) -> None:
        proc = self.process(name)
        self.log.append(f"{self.now:.3f} overload {proc.name} for {seconds:.2f}s")
        proc.hot_until = self.now + seconds

    def shed_load(self, proc: SimProcess, reason: str, depth: int, respond=None) -> None:
        """The runtime's shedding round (node.core.shed_round), its effects carried out
        over the simulated network and clock."""
        shed = ShedRound(reason, depth)

        def run(effects: list) -> None:
            match effects:
                case [Finished(outcome=outcome)]:
                    self.log.append(f"{self.now:.3f} {proc.name} shed ({reason}): "
                                    f"{outcome.detail}")
                    if respond is not None:
                        respond(outcome, None)
                case [PlanRound() as e]:
                    self._plan_shed(proc, e, lambda computed: run(shed.handle(computed)))
                case [HandOver(moves=moves)]:
                    self._shed_moves(proc, moves, lambda event: run(shed.handle(event)))
                case [AskToShed(node=node, depth=asked_depth)]:
                    self.call_later(
                        proc, proc.core.ring.address(node),
                        lambda server, answer: self.shed_load(
                            server, f"asked by {proc.name}", asked_depth, answer),
                        lambda o: run(shed.handle(CascadeAnswered(o.moved, o.detail))),
                        lambda exc: run(shed.handle(CascadeFailed(str(exc)))),
                        timeout=5.0)

        run(shed.start())

    def _plan_shed(self, proc: SimProcess, e: PlanRound, then) -> None:
        ring = proc.core.ring
        reach = shed_reach(ring, proc.name, REACH)
        loads: dict = {}

        def plan_now() -> None:
            plan = proc.machine.plan_shed(loads, reach=REACH, tokens_per_node=self.tokens,
                                          depth=e.depth, relieved=e.relieved)
            for pos in cut_positions(plan):
                try:
                    self.handle(proc, SplitRequested(pos))
                except FloeError as exc:
                    self.log.append(f"{self.now:.3f} {proc.name} split refused: {exc}")
            then(PlanComputed(proc.machine.shed_moves(plan), plan.ask))

        def got(node: str, value) -> None:
            loads[node] = value
            if len(loads) == len(reach):
                plan_now()

        def serve(server: SimProcess) -> PeerLoad:     # a Stats call, as the runtime's
            st = self.ask(server, requests.STATS)
            return PeerLoad(st["apply_rate"], st["overloaded"])

        for node in reach:
            self.call(proc, ring.address(node), serve, lambda v, n=node: got(n, v),
                      lambda exc, n=node: got(n, None))
        if not reach:
            plan_now()

    def _pull(self, proc: SimProcess, e: PullRanges) -> None:
        """As the runtime's pull: the donor hands what the rule names from its ring."""
        def serve(server: SimProcess) -> bool:
            _, moves = self.ask(server, requests.SHED, sender=proc.name,
                                identity=base_name(proc.name))     # its certificate
            self.pulled |= bool(moves)
            return bool(moves) and not self.request_handoff(
                server, moves, f"hands {len(moves)} ranges to {proc.name}, short of its share",
                still_ours=True)

        self.call(proc, e.address, serve, _ignore, _ignore)

    def _shed_moves(self, proc: SimProcess, moves: dict, then) -> None:
        def ended(h, refused: bool) -> None:
            if refused:
                then(HandoffRefused(h.reason))
                return
            self.handle(proc, ShedMoved())
            then(HandoffDone(h.state == "committed", str(h.state), h.reason))

        if refused := self.request_handoff(proc, moves, f"sheds {len(moves)} ranges to "
                                           f"{','.join(sorted(set(moves.values())))}", ended,
                                           still_ours=True):
            then(HandoffRefused(refused))

    # -------------------------------------------------------------- scenario

    def run(self, until: float, emit_until: float, faults: list) -> None:
        for proc in self.procs:
            first = self.rng.uniform(0, HEARTBEAT)
            self.on(proc, first, self.tick_node, proc, first)
            self._schedule_round(proc, self.rng.uniform(0, CHECKPOINT))
            self.on(proc, self.rng.uniform(0, 0.1), self.load_tick, proc)
        for mapper in self.mappers:
            self.at(0.1, self.mapper_tick, mapper)
        t = 0.0
        while t < emit_until:
            self.at(t, self.emit, [self._word() for _ in range(self.rng.randint(1, 8))])
            t += self.rng.uniform(0.005, 0.03)
        for when, action, args in faults:
            self.at(when, action, *args)
        # A pull begun near the end is followed until the ring is whole again.
        while self.events and (self.events[0][0] <= until or self.pulled and self._unsettled()
                               and self.events[0][0] <= until + PULL_SETTLE):
            self.now, _, action, args = heapq.heappop(self.events)
            action(*args)
            self.check_invariants()

    def _word(self) -> str:
        if self.skew and self.rng.random() < self.skew:
            return f"w{self.rng.randrange(3)}"
        return f"w{self.rng.randrange(40)}"

    def restart(self, name: str, answering: float = 1.0) -> None:
        """The process of `name` dies and the same command starts again at once: it asks
        the peers it reaches (each answers with probability `answering`) for their
        rings and decides who it is (`node.core.membership.decide_start`), exactly as
        the runtime does. Its old self is then dead; it joins empty under a new name."""
        proc = self.process(name)
        if proc is None or not proc.alive:
            return
        self.log.append(f"{self.now:.3f} restart {proc.name}")
        proc.alive = False
        self._start_again(proc, answering, self._incarnation())

    def _start_again(self, old: SimProcess, answering: float, incarnation: int,
                     startup: Startup | None = None) -> None:
        """The new process asks its peers and decides as node.core.startup_round does:
        with no running peer answering it waits and asks again (it cannot tell a
        restart from a fresh start alone); a joiner no peer answers stops."""
        base = base_name(old.started_as)
        initial = self.founding if base in self.members else None
        if startup is None:
            startup = Startup(base, initial is None, self.now, 1.0)
        peers = [p for p in self.procs if p.alive and p.address != old.address]
        seen = [p.core.ring for p in peers
                if self._usable(p) and frozenset((old.address, p.address)) not in self.cut
                and self.rng.random() < answering]
        asked = len({p.address for p in peers})
        # Every peer in the simulation runs (none is starting), as the runtime judges it.
        match startup.handle(Answered(self.now, tuple(seen), 0, asked)):
            case [AskPeers(delay=delay)]:
                self.log.append(f"{self.now:.3f} {base} (restarted) hears no peer yet")
                self.at(self.now + delay, self._start_again, old, answering, incarnation,
                        startup)
                return
            case [Stop(reason=reason)]:           # as the runtime: the process exits
                self.log.append(f"{self.now:.3f} {base} stops: {reason}")
                self.start_failures.append((self.now, base, reason))
                return
        decision = decide_start(base, incarnation, old.address, seen, initial)
        if any(p.alive and p.name == decision.node_id for p in self.procs):
            raise AssertionError(f"{decision.node_id} restarted under a live member's name")
        self.log.append(f"{self.now:.3f} {base} starts as {decision.node_id}"
                        + (f", declaring {decision.replaces} dead" if decision.replaces else ""))
        if decision.replaces:
            self.declared.append((self.now, decision.node_id, decision.replaces))
        proc = self._spawn_process(
            self.make_machine(decision.node_id, decision.ring, incarnation, old.address),
            old.address, base)
        self._start_loops(proc)

    def restart_latest(self, base: str) -> None:
        """Restart whatever process now runs the founding id `base` (`n3#1`, ...)."""
        live = [p for p in self.procs if base_name(p.name) == base and p.alive]
        if live:
            self.restart(live[0].name)

    def forge(self, name: str, kind: str) -> None:
        """Someone who is no member sends `name` a ring view no honest member can have:
        another replication factor, a member moved to another address, or a version
        implausibly far ahead. The node must refuse it and change nothing."""
        if kind in MEMBER_FORGERIES:
            self.forge_as_member(name, kind)
            return
        proc = self.process(name)
        if proc is None or not self._usable(proc):
            return
        forged = forged_views(proc.core.ring)[kind]
        try:
            self.handle(proc, RingSeen(forged))
        except InvalidArgument:
            self.log.append(f"{self.now:.3f} {proc.name} refused a forged view ({kind})")
            return
        raise AssertionError(f"{proc.name} adopted a forged ring view ({kind})")

    def forge_as_member(self, name: str, kind: str) -> None:
        """A member's certificate pushes `name` a view the protocol could produce but
        its holder made up: its version 2^20 ahead (absorbed: `name` moves at most
        MAX_VERSION_STEP + 1 ahead, and the ring converges), or the removal of every
        other live member (held until `name`'s own probes find them gone: never, as
        they answer; nobody is fenced)."""
        proc = self.process(name)
        if proc is None or not self._usable(proc) or proc.core.starting or proc.core.fenced:
            return
        ring = proc.core.ring
        if kind == "moves a live range":
            self._forge_move(proc)
            return
        if kind == "version far ahead":
            forged = ring.with_version(ring.version + (1 << 20))
        else:
            others = [n for n in ring.nodes if n != proc.name and self.usable(n)]
            if len(others) < 2 or len(ring.nodes) - len(others) < 1:
                return
            forged = ring.without(others[:2])
        self.handle(proc, RingSeen(forged))
        after = proc.core.ring
        if kind == "version far ahead":
            assert after.version <= ring.version + MAX_VERSION_STEP + 1, (ring, after)
            self.log.append(f"{self.now:.3f} {proc.name} absorbed a forged view far ahead "
                            f"(v{ring.version} -> v{after.version})")
        else:
            assert not (set(others[:2]) & after.removed), (proc.name, others[:2])
            self.log.append(f"{self.now:.3f} {proc.name} holds a forged view removing "
                            f"{','.join(others[:2])}")
            self.forged_removals.append((self.now, proc.name, tuple(others[:2])))

    def _forge_move(self, proc: SimProcess) -> None:
        """Another live member's certificate pushes `proc` a view giving itself a range
        of a third live member (or of `proc`), under a higher generation: never merged
        on its word (node.core.move_evidence: the giver is asked, and answers it still
        owns the range)."""
        ring = proc.core.ring
        live = [n for n in ring.nodes if self.usable(n)]
        others = [n for n in live if n != proc.name]
        if not others:
            return
        forger = others[0]
        givers = [n for n in live if n != forger and ring.tokens_of(n)]
        if not givers:
            return
        giver = givers[int(self.now * 1000) % len(givers)]
        token = ring.tokens_of(giver)[0]
        forged = ring.with_owners({token: forger})
        self.handle(proc, RingSeen(forged, sender=base_name(forger)))
        assert proc.core.ring.owner_of_token(token) == giver, (proc.name, token, giver)
        i = forged.token_index(token)
        self.forged_moves.append((self.now, proc.name, token, forger, forged.generations[i]))
        self.log.append(f"{self.now:.3f} {proc.name} holds a forged view moving {giver}'s "
                        f"range {token} to {forger}")

    def turn_rogue(self, name: str, victim: str, duration: float) -> None:
        """`name`'s certificate answers every exchange for `duration` with a view
        removing the caller and another live member (answer_view), and pushes `victim`
        a view removing it, which makes it ask every peer. Nobody is fenced while more
        members answer the truth."""
        rogue, target = self.process(name), self.process(victim)
        if rogue is None or target is None or rogue is target or not (
                self._usable(rogue) and self._usable(target)) or target.core.starting:
            return
        self.rogue, self.rogue_until = rogue.name, self.now + duration
        self.log.append(f"{self.now:.3f} {rogue.name} answers forged views until "
                        f"{self.rogue_until:.3f}")
        ring = rogue.core.ring
        if target.name in ring.nodes and len(ring.nodes) >= 2:
            self.handle(target, RingSeen(ring.without([target.name]),
                                         sender=base_name(rogue.name)))

    def forge_checkpoint(self, name: str, kind: str) -> None:
        """`name` is sent a whole checkpoint that would replace its copy of a range it
        backs up: claimed by a member that does not own the range, or by the owner
        under a ring stamp that is not the current one. Refused; the copy is unchanged.
        When `name` is down or backs up nothing, the forger sends it to the first member
        that does (its pick was random anyway), so every scenario forges one."""
        targets = [p for p in [self.process(name), *self.procs] if p is not None
                   and self._usable(p) and not p.core.starting and not p.core.fenced
                   and self._backed(p)]
        if not targets:
            self.log.append(f"{self.now:.3f} no member backs up a range: no checkpoint "
                            f"to forge ({kind})")
            return
        proc = targets[0]
        ring = proc.core.ring
        token = self._backed(proc)[0]
        owner = ring.owner_of_token(token)
        sender, stamp = ((next((n for n in ring.nodes if n != owner), owner), ring.stamp)
                         if kind == "not the owner" else (owner, ring.stamp ^ 1))
        copy = proc.core.replicas.ranges.get(token)
        before = None if copy is None else (dict(copy.copy.master), dict(copy.watermarks))
        try:
            proc.core.receive_checkpoint(sender, stamp, token, 10 ** 9, 0, True,
                                         {"forged": 10 ** 6}, {"forger": 10 ** 12}, self.now)
        except StaleRing:
            copy = proc.core.replicas.ranges.get(token)
            assert (None if copy is None else (dict(copy.copy.master),
                                               dict(copy.watermarks))) == before
            self.log.append(f"{self.now:.3f} {proc.name} refused a forged checkpoint ({kind})")
            return
        raise AssertionError(f"{proc.name} took a forged checkpoint ({kind})")

    @staticmethod
    def _backed(proc) -> list[int]:
        ring = proc.core.ring
        return [t for t in ring.tokens if ring.role_of(proc.name, t) == "replica"]

    def forge_heartbeats(self, name: str, victim: str, seconds: float) -> None:
        """The member `name` sends heartbeats claiming to be `victim` to every other
        member, one per heartbeat interval for `seconds`: as the victim's
        current process (to keep a killed one from being detected) or as a later one
        (to have a live one taken for restarted). Each goes through the server's
        identity check, which must refuse it; the victim's watchers hear nothing."""
        forger, target = self.process(name), self.process(victim)
        if forger is None or target is None or base_name(forger.name) == base_name(victim):
            return
        claims = [(target.name, target.machine.incarnation),
                  (target.name, target.machine.incarnation + 1)]

        def refused(exc):
            if "PERMISSION_DENIED" in str(exc):
                self.log.append(f"{self.now:.3f} {forger.name} sent a forged heartbeat as "
                                f"{target.name}: refused")

        def beat(left: int):
            ring = forger.core.ring
            sender, incarnation = claims[left % 2]
            # every other member, the victim's watchers among them
            for replica in sorted(set(ring.nodes) - {forger.name, sender}):
                def serve(server, sender=sender, incarnation=incarnation):
                    authenticate(forger, sender)
                    self.handle(server, HeardFrom(sender, ring.stamp, incarnation))
                    return server.core.ring.stamp

                self.call(forger, ring.address(replica), serve, _ignore, refused)
            if left > 0:
                self.on(forger, self.now + HEARTBEAT, beat, left - 1)

        beat(max(1, int(seconds / HEARTBEAT)))

    def kill(self, name: str) -> None:
        proc = self.process(name)
        self.log.append(f"{self.now:.3f} kill {proc.name}")
        proc.alive = False

    def partition(self, name: str, others: list[str], seconds: float) -> None:
        self.log.append(f"{self.now:.3f} cut {name} from {','.join(others)} for {seconds:.2f}s")
        pairs = {frozenset((self.process(name).address, self.process(o).address))
                 for o in others}
        self.cut |= pairs
        self.at(self.now + seconds, self._heal, pairs)

    def _heal(self, pairs) -> None:
        self.log.append(f"{self.now:.3f} heal")
        self.cut -= pairs

    def pause(self, name: str, seconds: float) -> None:
        self.log.append(f"{self.now:.3f} pause {name} {seconds:.2f}s")
        self.process(name).paused_until = self.now + seconds

    def slow(self, name: str, seconds: float, delay: float) -> None:
        """Starve `name` for `seconds`: alive, but every message it sends or reads,
        every answer and every tick of its own runs up to `delay` seconds late."""
        self.log.append(f"{self.now:.3f} slow {name} by up to {delay:.2f}s for {seconds:.2f}s")
        proc = self.process(name)
        proc.slow_until, proc.slow_delay = self.now + seconds, delay

    # ------------------------------------------------------------- invariants

    def _latest(self) -> Ring | None:
        """The newest ring a usable process holds (the first of the newest version);
        a plain loop: it runs after every event."""
        latest = None
        for p in self.procs:
            if self._usable(p) and (latest is None or p.core.ring.version > latest.version):
                latest = p.core.ring
        return latest

    def check_invariants(self) -> None:
        touched, self.touched = self.touched, set()
        if not touched:
            return
        latest = self._latest()
        if latest is None:
            return
        for p in touched:
            if not self._usable(p):
                continue
            p.core.check_invariants()
            if p.core.ring.stamp == latest.stamp:
                # one primary per token per ring: this node applies exactly its tokens
                # (rings are immutable: the same three found consistent need no walk)
                ring, tokens, seen = p.core.ring, (p.name, *p.core.primaries), p.owns_checked
                if seen and seen[0] is ring and seen[1] is latest and seen[2] == tokens:
                    continue
                for token in p.core.primaries:
                    if latest.owner_of_token(token) != p.name:
                        raise AssertionError(f"{p.name} applies token {token} it does not own")
                p.owns_checked = (ring, latest, tokens)

    def _unsettled(self) -> bool:
        usable = [p for p in self.procs if self._usable(p)]
        return bool(self.under_replicated()) or len({p.core.ring.stamp for p in usable}) > 1 \
            or any(p.machine.handoff is not None for p in usable)

    def under_replicated(self) -> dict[str, list[int]]:
        """Ranges of usable owners not yet on all their replicas."""
        return {p.name: p.core.under_replicated() for p in self.procs
                if self._usable(p) and p.core.under_replicated()}

    def final_state(self) -> tuple[Counter, set]:
        """Counts held by the owners in the newest ring, and the keys in lost ranges."""
        ring = self._latest()
        state, lost_keys = Counter(), set()
        usable = [p for p in self.procs if self._usable(p)]
        for p in usable:
            if p.core.ring.stamp != ring.stamp:
                continue
            for token, rng in p.core.primaries.items():
                for key, count in merge_pieces(rng.state.snapshot().items(),
                                               lambda a, b: a + b).items():
                    state[key] += count                 # a key's pieces merged
                if token in p.core.lost_tokens:
                    lost_keys |= {base_of(k) for k in rng.state.snapshot()}
        for key in set(self.sent) | self.pieces_sent:
            token = ring.token_for_key(key)
            if token in ring.lost or any(token in p.core.lost_tokens for p in usable):
                lost_keys.add(base_of(key))
        return state, lost_keys


def authenticate(caller: SimProcess, sender: str) -> None:
    """What the server's interceptor checks before any member call runs: the caller's
    certificate names the id its process was founded as, and speaks only for it."""
    if not sender_matches(base_name(caller.name), sender):
        raise FloeError(f"PERMISSION_DENIED: the certificate names node "
                        f"{base_name(caller.name)}, the message claims sender {sender}")


def _ignore(_value) -> None:
    pass


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)
