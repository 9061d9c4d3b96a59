"""Deterministic simulation: NodeCores and the mapper's Outbox (production code) over a
seeded in-memory network with a virtual clock, kills, pauses, starved (slow) nodes
and message loss. Failure detection is the production FailureDetector; probes end as
the real transport's do: refused by a killed node, timed out for a paused or cut-off
one, answered late by a starved one.

Everything random comes from one `random.Random(seed)`, time is a number advanced by an
event queue, so a failing seed replays identically. Links behave like the real streams:
FIFO, and a lost message breaks the link until its sender reconnects (a gRPC stream
dies with its first lost message; nothing behind it is delivered).
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from mapper.outbox import Outbox, PendingBatch
from node.core.batch import decode_payload, encode_payload, encode_seqs
from node.core.detector import (ALIVE, DEAD, REFUSED, TIMED_OUT, DetectorConfig,
                                FailureDetector, combine, indirect_via)
from node.core.errors import FloeError, InvalidArgument
from node.core.handoff import Handoff, leave_moves, retired_extras, split_ring
from node.core.membership import decide_start, ready_to_decide, refill_moves, restarted
from node.core.node_core import NodeCore
from node.core.reducers import load_reducer
from node.core.ring import Ring

HEARTBEAT = 0.05
CHECKPOINT = 0.2
ACK_TIMEOUT = 0.4
LATENCY = (0.0005, 0.005)   # one-way delay of a message on a healthy link


@dataclass
class SimNode:
    core: NodeCore
    detector: FailureDetector
    alive: bool = True
    paused_until: float = 0.0
    slow_until: float = 0.0     # starved: everything it sends, reads or does runs late
    slow_delay: float = 0.0     # by up to this many seconds
    handoff: Handoff | None = None
    leaving: bool = False
    incarnation: int = 0


class Simulation:
    def __init__(self, seed: int, nodes: int = 5, replication: int = 1, tokens: int = 2,
                 loss: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.events: list = []
        self.counter = 0
        self.loss = loss
        members = {f"n{i}": f"sim:{i}" for i in range(nodes)}
        self.members = dict(members)       # founding id -> address (a restart reuses it)
        self.incarnations = 0
        # The ring as the founding members leave their start-up exchange: each one's
        # incarnation heard by all (node.core.membership).
        self.founding = Ring.initial(members, replication, tokens)
        inc = {n: self._incarnation() for n in sorted(members)}
        ring = replace(self.founding, incarnations=tuple(sorted(inc.items())))
        cfg = DetectorConfig()
        self.nodes = {n: SimNode(NodeCore(n, ring, load_reducer("count")), FailureDetector(cfg),
                                 incarnation=inc[n])
                      for n in members}
        for node in self.nodes.values():
            node.detector.watch(node.core.monitored_primaries(), 0.0)
        self.dead_from: dict = {}          # (link, stream) -> first message index not delivered
        self.sent_on_link: dict = defaultdict(int)
        self.delivering = None
        self.cut: set[frozenset] = set()   # node pairs that cannot talk (partitions)
        self.stream_no = 0
        self.streams: dict[tuple[str, str], int] = defaultdict(int)
        self.last_on_link: dict[tuple[str, str], float] = defaultdict(float)
        # one simulated mapper
        self.mapper_ring = ring
        self.next_seq = 1
        self.batch_ids = 0
        # The production outbox: which batch goes where, when one is delivered, how
        # batches are fitted to a new ring. The simulation only carries the messages.
        self.outbox = Outbox()
        self.routed: dict[int, tuple[int, float]] = {}   # batch id -> (ring stamp, sent at)
        self.acked = Counter()
        self.sent = Counter()
        self.log: list[str] = []
        self.declared: list[tuple[float, str, str]] = []   # (when, by whom, whom)

    def _incarnation(self) -> int:
        self.incarnations += 1
        return self.incarnations

    # ------------------------------------------------------------ event queue

    def at(self, when: float, action, *args) -> None:
        self.counter += 1
        heapq.heappush(self.events, (when, self.counter, action, args))

    def send(self, src: str, dst: str, action, *args) -> None:
        """FIFO per link. The mapper's links are streams: once a message of a stream is
        lost (or arrives at a paused or dead node, or is refused), neither it nor
        anything sent after it on that stream arrives; what was sent before it still
        does, in order. Node-to-node messages are separate unary calls: each may be
        lost on its own."""
        link = (src, dst)
        if frozenset(link) in self.cut:
            return
        stream = self.streams[link] if src == "m" else None
        self.sent_on_link[link] += 1
        index = self.sent_on_link[link]
        if stream is not None and index >= self.dead_from.get((link, stream), index + 1):
            return
        if self.loss and self.rng.random() < self.loss:
            if stream is not None:
                self._kill_stream(link, stream, index)
            return
        when = max(self.now + self.rng.uniform(*LATENCY) + self._starved(src) + self._starved(dst),
                   self.last_on_link[link])
        self.last_on_link[link] = when
        self.at(when, self._deliver, link, stream, index, action, args)

    def _kill_stream(self, link, stream, index) -> None:
        key = (link, stream)
        self.dead_from[key] = min(self.dead_from.get(key, index), index)

    def _deliver(self, link, stream, index, action, args) -> None:
        src, dst = link
        if stream is not None and index >= self.dead_from.get((link, stream), index + 1):
            return
        for end in (src, dst):
            node = self.nodes.get(end)
            if node is not None and (not node.alive or node.paused_until > self.now):
                if stream is not None:
                    self._kill_stream(link, stream, index)  # the stream times out
                return
        self.delivering = (link, stream, index)
        action(*args)

    def reconnect(self, src: str, dst: str) -> None:
        self.stream_no += 1
        self.streams[(src, dst)] = self.stream_no

    def usable(self, name: str) -> bool:
        node = self.nodes[name]
        return node.alive and node.paused_until <= self.now and not node.core.fenced

    # ------------------------------------------------------------------ nodes

    def _starved(self, name: str) -> float:
        """Extra delay a starved (slow, not stopped) node adds to what it does now."""
        node = self.nodes.get(name)
        if node is None or node.slow_until <= self.now:
            return 0.0
        return self.rng.uniform(0.0, node.slow_delay)

    def tick_node(self, name: str, scheduled: float | None = None) -> None:
        node = self.nodes[name]
        if not node.alive:
            return
        node.detector.tick(self.now if scheduled is None else scheduled, self.now)
        self.at(self.now + HEARTBEAT + self._starved(name), self.tick_node, name,
                self.now + HEARTBEAT)
        if node.paused_until > self.now or node.core.fenced:
            return
        core = node.core
        for target in sorted(core.heartbeat_targets()):
            self.send(name, target, self._heartbeat, name, target, core.ring, node.incarnation)
        for probe in node.detector.due_probes(self.now):
            self._start_probe(name, probe)

    def _heartbeat(self, src: str, dst: str, ring: Ring, incarnation: int) -> None:
        node = self.nodes[dst]
        if restarted(node.core.ring, src, incarnation):   # as the runtime: a restart is a death
            self.log.append(f"{self.now:.3f} {dst} declares {src} (restarted)")
            self.declared.append((self.now, dst, src))
            self._spread(dst, node.core.ring.with_incarnation(src, incarnation))
            return
        node.detector.heard(src, self.now)
        self.adopt(dst, ring)

    def _answer(self, asker: str, target: str, sent: float) -> tuple[str, float | None]:
        """How and when `target` answers a call `asker` sends at `sent`, as the real
        transport behaves: a dead process refuses at once; a cut link or a paused
        process never answers in time (the call times out); a starved one answers late."""
        if frozenset((asker, target)) in self.cut:
            return TIMED_OUT, None
        node = self.nodes[target]
        if not node.alive or node.core.fenced:
            return REFUSED, sent + self.rng.uniform(*LATENCY)
        start = max(sent, node.paused_until)
        return ALIVE, (start + 2 * self.rng.uniform(*LATENCY)
                       + self._starved(target) + self._starved(asker))

    def _start_probe(self, name: str, probe) -> None:
        """One probe round, direct and through a third node, as the runtime runs it."""
        sent, deadline = self.now, probe.deadline
        ring = self.nodes[name].core.ring
        if probe.node not in ring.nodes:
            self.nodes[name].detector.abandon(probe)
            return
        kind, when = self._answer(name, probe.node, sent)
        if when is None or when > sent + deadline:
            direct, direct_at = TIMED_OUT, sent + deadline
        else:
            direct, direct_at = kind, when
        via = indirect_via(ring, name, probe.node)
        indirect, indirect_at = TIMED_OUT, sent
        if via is not None:
            indirect_at = sent + 2 * deadline          # the outer call's deadline
            kind, reached = self._answer(name, via, sent)
            if kind == ALIVE and reached <= indirect_at:
                seen, seen_at = self._answer(via, probe.node, reached)
                if seen == ALIVE and seen_at <= reached + deadline:
                    indirect, indirect_at = ALIVE, min(indirect_at, seen_at)
                else:
                    indirect_at = min(indirect_at, reached + deadline)
            elif kind == REFUSED:
                indirect_at = reached
        outcome = combine(direct, indirect)
        self.at(max(direct_at, indirect_at), self._probe_done, name, probe, outcome, via)

    def _probe_done(self, name: str, probe, outcome: str, via) -> None:
        node = self.nodes[name]
        if not self.usable(name):
            node.detector.abandon(probe)
            return
        verdict = node.detector.probe_result(probe, outcome, self.now)
        suspect = probe.node
        if verdict != DEAD or suspect not in node.core.ring.nodes:
            return
        self.log.append(f"{self.now:.3f} {name} declares {suspect} ({outcome}, via {via})")
        self.declared.append((self.now, name, suspect))
        self.adopt(name, node.core.ring.without([suspect]))
        for other in self.nodes:
            if other != name:
                self.send(name, other, self.adopt, other, node.core.ring)

    def adopt(self, name: str, ring: Ring) -> None:
        node = self.nodes[name]
        change = node.core.adopt_ring(ring)
        if change is None:
            return
        if change.fenced:
            self.log.append(f"{self.now:.3f} {name} fenced at v{change.ring.version}")
            return
        if change.taken_over:
            self.log.append(f"{self.now:.3f} {name} takes over {len(change.taken_over)} "
                            f"ranges at v{change.ring.version}")
        if change.lost:
            self.log.append(f"{self.now:.3f} {name} LOST {len(change.lost)} ranges")
        node.detector.watch(node.core.monitored_primaries(), self.now)

    def checkpoint_node(self, name: str) -> None:
        node = self.nodes[name]
        if not node.alive:
            return
        self.at(self.now + CHECKPOINT, self.checkpoint_node, name)
        if not self.usable(name):
            return
        core = node.core
        shipments = core.plan_checkpoints()
        for s in shipments:
            cp = s.checkpoint
            self.send(name, s.replica, self._receive_checkpoint, name, s.replica,
                      core.ring.stamp, cp, s.base_seq)
        for token in sorted({s.checkpoint.token for s in shipments}):
            core.checkpoint_done(token)   # shipping is asynchronous: merge now
        self._step_handoff(name)
        if node.handoff is None and not node.leaving and self.usable(name):
            moves = refill_moves(core.ring, name)   # as the runtime's checkpoint loop
            if moves:
                self._prepare_moves(name, moves, f"refills {sorted(set(moves.values()))} "
                                                 f"with {len(moves)} ranges")

    # --------------------------------------------------------------- handoffs

    def handoff(self, name: str, to: str = "heir") -> None:
        """`name` hands one of its tokens to its first replica ("heir") or to another
        member picked by the seed ("any"), as the runtime's handoff task does."""
        node = self.nodes[name]
        if not self.usable(name) or node.handoff is not None or not node.core.primaries:
            return
        core = node.core
        token = self.rng.choice(sorted(core.primaries))
        others = [n for n in core.ring.nodes if n != name]
        if not others:
            return
        target = core.ring.heir(token) if to == "heir" else self.rng.choice(others)
        self._prepare_handoff(name, token, target, f"hands {token} to {target}")

    def _prepare_handoff(self, name: str, token: int, target: str, what: str) -> None:
        self._prepare_moves(name, {token: target}, what)

    def _prepare_moves(self, name: str, moves: dict[int, str], what: str) -> None:
        node = self.nodes[name]
        h = Handoff(name, dict(moves), deadline=self.now + 2.0)
        try:
            ring = h.prepare(node.core, self.now)
        except InvalidArgument as exc:
            self.log.append(f"{self.now:.3f} {name} handoff refused: {exc}")
            return
        self.log.append(f"{self.now:.3f} {name} {what}")
        node.handoff = h
        self._spread(name, ring)

    def split(self, name: str, hand_tail: bool = True) -> None:
        """`name` cuts one of its ranges at a seeded position and (as load shedding
        does) hands the tail to its first replica."""
        node = self.nodes[name]
        if not self.usable(name) or node.handoff is not None or not node.core.primaries:
            return
        core = node.core
        token = self.rng.choice(sorted(core.primaries))
        lo, hi = core.ring.range_of_token(token)
        size = Ring.range_size((lo, hi))
        if size < 2:
            return
        at = (lo + self.rng.randrange(1, size)) % (2 ** 64)
        try:
            _, ring = split_ring(core.ring, name, at, core.fenced)
        except InvalidArgument as exc:
            self.log.append(f"{self.now:.3f} {name} split refused: {exc}")
            return
        self.log.append(f"{self.now:.3f} {name} splits {token} at {at}")
        self._spread(name, ring)
        heir = core.ring.heir(token)
        if hand_tail and heir is not None:
            self._prepare_handoff(name, token, heir, f"hands the tail {token} to {heir}")

    def leave(self, name: str) -> None:
        """Scale-in as the runtime does it: hand every range to its first replica, wait
        until no range needs our copy any more, remove ourselves, exit."""
        node = self.nodes[name]
        core = node.core
        if not self.usable(name) or node.handoff is not None:
            return
        try:
            moves = leave_moves(core.ring, name)
        except InvalidArgument as exc:
            self.log.append(f"{self.now:.3f} {name} leave refused: {exc}")
            return
        node.leaving = True
        self.log.append(f"{self.now:.3f} {name} leaves")
        if not moves:
            return
        h = Handoff(name, moves, deadline=self.now + 2.0)
        try:
            ring = h.prepare(core, self.now)
        except InvalidArgument as exc:
            node.leaving = False
            self.log.append(f"{self.now:.3f} {name} leave refused: {exc}")
            return
        node.handoff = h
        self._spread(name, ring)

    def _finish_leave(self, name: str) -> None:
        node = self.nodes[name]
        ring = node.core.ring
        if ring.tokens_of(name) or any(name in ring.extras_of(t) for t in ring.tokens):
            return
        self.log.append(f"{self.now:.3f} {name} left")
        self._spread(name, ring.remove_node(name))
        node.alive = False

    def join(self, name: str, via: str) -> None:
        """A new, empty member joins through `via`'s view, then `via` hands it a token
        (the delayed transition: extra replica first, owner once it holds the range)."""
        if not self.usable(via):
            return
        self.log.append(f"{self.now:.3f} {name} joins via {via}")
        ring = self.nodes[via].core.ring.add_node(name, f"sim:{name}", ())
        node = SimNode(NodeCore(name, ring, load_reducer("count")),
                       FailureDetector(DetectorConfig()))
        self.nodes[name] = node
        self.at(self.now + HEARTBEAT, self.tick_node, name)
        self.at(self.now + CHECKPOINT, self.checkpoint_node, name)
        self._spread(name, ring)
        self.at(self.now + 0.05, self.handoff, via, "any")

    def _spread(self, name: str, ring: Ring) -> None:
        self.adopt(name, ring)
        for other in sorted(self.nodes):
            if other != name:
                self.send(name, other, self.adopt, other, self.nodes[name].core.ring)

    def _step_handoff(self, name: str) -> None:
        node = self.nodes[name]
        h = node.handoff
        retired = retired_extras(node.core, busy=h.moves if h else ())
        if retired is not None:
            self._spread(name, retired)
        if h is None:
            if node.leaving and self.usable(name):
                self._finish_leave(name)
            return
        ring = h.step(node.core, self.now)
        if ring is not None:
            self._spread(name, ring)
        if h.state != "prepared":
            self.log.append(f"{self.now:.3f} {name} handoff {h.state} {h.reason}")
            node.handoff = None
            if node.leaving and h.state != "committed":
                node.leaving = False

    def _receive_checkpoint(self, src, dst, stamp, cp, base_seq) -> None:
        node = self.nodes[dst]
        node.detector.heard(src, self.now)
        try:
            need_full, seq = node.core.receive_checkpoint(
                src, stamp, cp.token, cp.seq, base_seq, cp.full, dict(cp.states),
                dict(cp.watermarks))
        except FloeError:
            self.send(dst, src, self._checkpoint_failed, src, cp.token, dst, node.core.ring)
            return
        self.send(dst, src, self._checkpoint_acked, src, cp.token, dst, seq, need_full)

    def _checkpoint_acked(self, name, token, replica, seq, need_full) -> None:
        self.nodes[name].core.checkpoint_acked(token, replica, seq, need_full)

    def _checkpoint_failed(self, name, token, replica, ring) -> None:
        self.nodes[name].core.checkpoint_failed(token, replica)
        self.adopt(name, ring)

    # ----------------------------------------------------------------- mapper

    @property
    def undelivered(self) -> dict:
        return self.outbox.undelivered

    def emit(self, keys: list[str]) -> None:
        by_token = defaultdict(lambda: ([], []))
        for key in keys:
            k, s = by_token[self.mapper_ring.token_for_key(key)]
            k.append(key)
            s.append(self.next_seq)
            self.next_seq += 1
            self.sent[key] += 1
        for token, (k, s) in by_token.items():
            self.batch_ids += 1
            batch = PendingBatch(self.batch_ids, token, "m", s[0], s[-1], len(s),
                                 encode_payload(k, [1] * len(k)), encode_seqs(s),
                                 tokens=self.mapper_ring.tokens)
            self._send_batches(self.outbox.add(batch, self.mapper_ring))

    def _send_batches(self, sends) -> None:
        ring = self.mapper_ring
        for batch, destinations in sends:
            self.routed[batch.id] = (ring.stamp, self.now)
            fields = dict(ring_version=ring.stamp, token=batch.token, source=batch.source,
                          first_seq=batch.first_seq, last_seq=batch.last_seq,
                          count=batch.count, payload=batch.payload, seqs=batch.seqs)
            for dest in sorted(destinations):
                self.send("m", dest, self._node_receive, dest, batch.id, ring.stamp,
                          dict(fields, stream=self.streams[("m", dest)]))

    def _node_receive(self, name, batch_id, stamp, fields) -> None:
        try:
            self.nodes[name].core.receive_batch(**fields)
        except FloeError:
            # like the real node: the refusal ends the stream, nothing behind it applies
            link, stream, index = self.delivering
            self._kill_stream(link, stream, index + 1)
            if stream == self.streams[link]:
                self.send(name, "m", self._mapper_refused, self.nodes[name].core.ring)
            return
        self.send(name, "m", self._mapper_ack, batch_id, name, stamp)

    def _mapper_ack(self, batch_id, node, stamp) -> None:
        batch = self.outbox.undelivered.get(batch_id)
        # an ack for a batch routed with an older ring: its stream is gone in the client
        if batch is None or self.routed[batch_id][0] != stamp:
            return
        if self.outbox.acked(batch, node):
            self.acked.update(decode_payload(batch.payload, batch.count)[0])

    def _mapper_refused(self, ring: Ring) -> None:
        self.refresh_mapper()

    def refresh_mapper(self) -> None:
        """As the client does: newest ring among reachable nodes; the outbox fits and
        re-routes everything undelivered."""
        views = [n.core.ring for name, n in self.nodes.items() if self.usable(name)]
        if not views:
            return
        best = max(views, key=lambda r: r.version)
        for node in list(self.nodes):
            self.reconnect("m", node)
        self.mapper_ring = best
        self._send_batches(self.outbox.reroute(best))

    def mapper_tick(self) -> None:
        self.at(self.now + 0.1, self.mapper_tick)
        stalled = [b for b in self.undelivered.values()
                   if self.now - self.routed[b.id][1] > ACK_TIMEOUT]
        if stalled:
            self.refresh_mapper()

    # -------------------------------------------------------------- scenario

    def run(self, until: float, emit_until: float, faults: list) -> None:
        for name in self.nodes:
            self.at(self.rng.uniform(0, HEARTBEAT), self.tick_node, name)
            self.at(self.rng.uniform(0, CHECKPOINT), self.checkpoint_node, name)
        self.at(0.1, self.mapper_tick)
        words = [f"w{i}" for i in range(40)]
        t = 0.0
        while t < emit_until:
            self.at(t, self.emit, [self.rng.choice(words) for _ in range(self.rng.randint(1, 8))])
            t += self.rng.uniform(0.005, 0.03)
        for when, action, args in faults:
            self.at(when, action, *args)
        while self.events and self.events[0][0] <= until:
            self.now, _, action, args = heapq.heappop(self.events)
            action(*args)
            self.check_invariants()

    def restart(self, name: str, answering: float = 1.0) -> None:
        """The process of `name` dies and the same command starts again at once: it asks
        the peers it reaches (each answers with probability `answering`) for their
        rings and decides who it is (`node.core.membership.decide_start`), exactly as
        the runtime does. Its old self is then dead; it joins empty under a new name."""
        node = self.nodes[name]
        if not node.alive:
            return
        self.log.append(f"{self.now:.3f} restart {name}")
        node.alive = False
        self._start_again(name, answering, self._incarnation())

    def _start_again(self, name: str, answering: float, incarnation: int) -> None:
        """The new process asks its peers; with no running peer answering it waits
        and asks again (it cannot tell a restart from a fresh start alone)."""
        base = name.split("#", 1)[0]
        peers = [other for other in sorted(self.nodes) if other != name]
        seen = [self.nodes[other].core.ring for other in peers
                if self.usable(other) and frozenset((name, other)) not in self.cut
                and self.rng.random() < answering]
        # Every peer in the simulation runs (none is starting), as the runtime judges it.
        if not ready_to_decide(len(seen), 0, len(peers), False, False):
            self.log.append(f"{self.now:.3f} {base} (restarted) hears no peer yet")
            self.at(self.now + 0.2, self._start_again, name, answering, incarnation)
            return
        initial = self.founding if base in self.members else None
        decision = decide_start(base, incarnation, self.members.get(base, f"sim:{base}"),
                                seen, initial)
        if decision.node_id in self.nodes and self.nodes[decision.node_id].alive:
            raise AssertionError(f"{decision.node_id} restarted under a live member's name")
        self.log.append(f"{self.now:.3f} {base} starts as {decision.node_id}"
                        + (f", declaring {decision.replaces} dead" if decision.replaces else ""))
        if decision.replaces:
            self.declared.append((self.now, decision.node_id, decision.replaces))
        fresh = SimNode(NodeCore(decision.node_id, decision.ring, load_reducer("count")),
                        FailureDetector(DetectorConfig()), incarnation=incarnation)
        self.nodes[decision.node_id] = fresh
        fresh.detector.watch(fresh.core.monitored_primaries(), self.now)
        self.at(self.now + HEARTBEAT, self.tick_node, decision.node_id)
        self.at(self.now + CHECKPOINT, self.checkpoint_node, decision.node_id)
        self._spread(decision.node_id, decision.ring)

    def restart_latest(self, base: str) -> None:
        """Restart whatever process now runs the founding id `base` (`n3#1`, ...)."""
        live = [n for n, node in self.nodes.items()
                if n.split("#", 1)[0] == base and node.alive]
        if live:
            self.restart(live[0])

    def kill(self, name: str) -> None:
        self.log.append(f"{self.now:.3f} kill {name}")
        self.nodes[name].alive = False

    def partition(self, name: str, others: list[str], seconds: float) -> None:
        self.log.append(f"{self.now:.3f} cut {name} from {','.join(others)} for {seconds:.2f}s")
        pairs = {frozenset((name, o)) for o in others}
        self.cut |= pairs
        self.at(self.now + seconds, self._heal, pairs)

    def _heal(self, pairs) -> None:
        self.log.append(f"{self.now:.3f} heal")
        self.cut -= pairs

    def pause(self, name: str, seconds: float) -> None:
        self.log.append(f"{self.now:.3f} pause {name} {seconds:.2f}s")
        self.nodes[name].paused_until = self.now + seconds

    def slow(self, name: str, seconds: float, delay: float) -> None:
        """Starve `name` for `seconds`: alive, but every message it sends or reads,
        every answer and every tick of its own runs up to `delay` seconds late."""
        self.log.append(f"{self.now:.3f} slow {name} by up to {delay:.2f}s for {seconds:.2f}s")
        node = self.nodes[name]
        node.slow_until, node.slow_delay = self.now + seconds, delay

    # ------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        latest = max((n.core.ring for name, n in self.nodes.items() if self.usable(name)),
                     key=lambda r: r.version, default=None)
        if latest is None:
            return
        for name, node in self.nodes.items():
            if not self.usable(name):
                continue
            node.core.check_invariants()
            if node.core.ring.stamp == latest.stamp:
                # one primary per token per ring: this node applies exactly its tokens
                for token in node.core.primaries:
                    if latest.owner_of_token(token) != name:
                        raise AssertionError(f"{name} applies token {token} it does not own")
        for key, count in self.acked.items():
            if count > self.sent[key]:
                raise AssertionError(f"{key} acknowledged more often than sent")

    def under_replicated(self) -> dict[str, list[int]]:
        """Ranges of usable owners not yet on all their replicas."""
        return {name: n.core.under_replicated() for name, n in self.nodes.items()
                if self.usable(name) and n.core.under_replicated()}

    def final_state(self) -> tuple[Counter, set]:
        """Counts held by the owners in the newest ring, and the keys in lost ranges."""
        ring = max((n.core.ring for name, n in self.nodes.items() if self.usable(name)),
                   key=lambda r: r.version)
        state, lost_keys = Counter(), set()
        for name, node in self.nodes.items():
            if not self.usable(name) or node.core.ring.stamp != ring.stamp:
                continue
            for token, rng in node.core.primaries.items():
                for key, count in rng.state.snapshot().items():
                    state[key] += count
                if token in node.core.lost_tokens:
                    lost_keys |= set(rng.state.snapshot())
        lost_positions = {t for t in ring.lost}
        for key in self.sent:
            if ring.token_for_key(key) in lost_positions or any(
                    ring.token_for_key(key) in n.core.lost_tokens
                    for name, n in self.nodes.items() if self.usable(name)):
                lost_keys.add(key)
        return state, lost_keys
