"""The simulation's mappers (tests/support/simulation.py): each a source driving the
production mapper machine (`mapper/machine.py`: routing, the ring it adopts, when it
fetches the ring, what a refusal means, the orphaned-ring rule) and piece chooser.
Like the asyncio delivery, this is only an executor: it carries batches to the nodes
and acks back over the simulation's fake network, fetches views, and keeps time."""

from __future__ import annotations

from collections import Counter, defaultdict

from floering.mapper.machine import WATCH_LIMIT, MapperMachine, OnFailure
from floering.mapper.outbox import Outbox, PendingBatch
from floering.mapper.ring_watch import Look
from floering.mapper.sharing import chooser_for
from floering.wire.balancers import balancer
from floering.node.core.batch import decode_payload, encode_payload, encode_seqs
from floering.wire.errors import FloeError, Unavailable
from floering.wire.pieces import COMBINED_SOURCE, base_of
from floering.wire.ring import Ring

ACK_TIMEOUT = 0.4           # a stream with no ack for this long fails (as a broken one)
TICK = 0.1                  # the delivery's progress check (batching.linger_loop)
WATCH_EVERY = 0.025         # a watch's polls (Delivery._watch_ring)
BACKOFF = (0.02, 0.2)       # a failed stream is reopened after this, doubling


class SimMapper:
    """One mapper process: a source with its own machine, streams and chooser."""

    alive = True
    paused_until = 0.0
    slow_until = 0.0

    def __init__(self, name: str, ring: Ring, combining: bool = False) -> None:
        # A combining mapper (mapper/combining.py) sends one tuple per key and batch,
        # its count, under a source whose tuples the nodes merge as states.
        self.combining = combining
        self.address = name
        self.name = COMBINED_SOURCE + name if combining else name
        # The production piece chooser of the ring's balancer (None: keys not shared).
        self.chooser = chooser_for(balancer(ring.balancer))
        self.next_seq = 1
        # The production machine decides everything; the simulation carries messages.
        self.machine = MapperMachine(0.0)
        self.machine.adopt(ring, ring.to_wire())
        self.routed: dict[int, tuple[int, float]] = {}   # batch id -> (ring stamp, sent at)
        self.last_ack: dict[str, float] = {}             # node -> when it last acked
        self.backoff: dict[str, float] = {}              # node -> its next reopen's wait
        self.reopening: set[str] = set()                 # nodes whose stream reopens soon
        self.watch: tuple[Ring, float] | None = None     # a watch: (its ring, deadline)

    @property
    def ring(self) -> Ring:
        return self.machine.known_ring

    @property
    def wire(self) -> bytes:
        return self.machine.wire

    @property
    def outbox(self) -> Outbox:
        return self.machine.outbox

    def waited_since(self, node: str) -> float | None:
        """As a Push stream's: when its oldest unanswered send went, or its last ack
        when that came later (None: nothing unanswered)."""
        sent = [self.routed[b.id][1] for b in self.outbox.undelivered.values()
                if node in b.waiting_for and b.id in self.routed]
        if not sent:
            return None
        return max(min(sent), self.last_ack.get(node, 0.0))


class MapperSide:
    """The mappers' half of `Simulation`: emitting, routing, acks and ring refreshes."""

    @property
    def undelivered(self) -> dict:
        return {(m.name, i): b for m in self.mappers for i, b in m.outbox.undelivered.items()}

    def emit(self, keys: list[str]) -> None:
        mapper = self.mappers[0] if len(self.mappers) == 1 else self.rng.choice(self.mappers)
        by_token = defaultdict(lambda: ([], []))
        place = mapper.chooser.placer(mapper.ring, mapper.ring.token_for_key) \
            if mapper.chooser else None
        for key in keys:
            if place is None:
                piece, token = key, mapper.ring.token_for_key(key)
            else:
                piece, token = place(key)
                self.pieces_sent.add(piece)
            k, s = by_token[token]
            k.append(piece)
            s.append(mapper.next_seq)
            mapper.next_seq += 1
            self.sent[key] += 1
        for token, (k, s) in by_token.items():
            self.batch_ids += 1
            values = [1] * len(k)
            if mapper.combining:        # one tuple per key, its count, seqs of their own
                counted = Counter(k)
                k, values = list(counted), list(counted.values())
                s = list(range(mapper.next_seq, mapper.next_seq + len(k)))
                mapper.next_seq += len(k)
            batch = PendingBatch(self.batch_ids, token, mapper.name, s[0], s[-1], len(s),
                                 encode_payload(k, values), encode_seqs(s),
                                 tokens=mapper.ring.tokens)
            self._send_batches(mapper, mapper.machine.submit(batch))

    def _send_batches(self, mapper: SimMapper, sends) -> None:
        ring = mapper.ring
        for batch, destinations in sends:
            mapper.routed[batch.id] = (ring.stamp, self.now)
            fields = dict(ring_stamp=ring.stamp, token=batch.token, source=batch.source,
                          first_seq=batch.first_seq, last_seq=batch.last_seq,
                          count=batch.count, payload=batch.payload, seqs=batch.seqs)
            for dest in sorted(destinations):
                address = ring.address(dest)
                proc = self.listening[address]
                self.send(mapper, proc, self._node_receive, mapper, proc, dest, batch.id,
                          ring.stamp, dict(fields, stream=self.streams[(mapper.address, address)]))

    def _mapper_ack(self, mapper: SimMapper, batch_id, node, stamp) -> None:
        batch = mapper.outbox.undelivered.get(batch_id)
        # an ack for a batch routed with an older ring: its stream is gone in the client
        if batch is None or mapper.routed[batch_id][0] != stamp:
            return
        mapper.last_ack[node] = self.now
        mapper.backoff.pop(node, None)
        if mapper.machine.acked(batch, node, self.now) is not None:
            self.delivered(mapper, batch)

    def delivered(self, mapper: SimMapper, batch: PendingBatch) -> None:
        """Every destination of `batch` acknowledged it."""
        keys, values = decode_payload(batch.payload, batch.count)
        keys = [base_of(k) for k in keys]
        for key, value in zip(keys, values):
            self.acked[key] += value
        for key in set(keys):
            if self.acked[key] > self.sent[key]:
                raise AssertionError(f"{key} acknowledged more often than sent")

    def stream_refused(self, mapper: SimMapper, node: str, exc: FloeError) -> None:
        """`node` refused a batch with `exc` and ended the mapper's stream to it."""
        self._stream_failed(mapper, node, exc)

    def _stream_failed(self, mapper: SimMapper, node: str, exc: FloeError) -> None:
        """As Delivery.stream_failed: the machine says what the failure means; the
        stream is reopened after a backoff and its unacknowledged batches resent."""
        what = mapper.machine.on_failure(exc)
        if what is OnFailure.GIVE_UP:
            raise AssertionError(f"the simulation sent a batch refused for good: {exc}")
        if what is OnFailure.WATCH:
            self._watch(mapper)
        elif what is OnFailure.REFRESH:
            self.refresh_mapper(mapper)
        if node in mapper.reopening:
            return
        mapper.reopening.add(node)
        wait = mapper.backoff.get(node, BACKOFF[0])
        mapper.backoff[node] = min(wait * 2, BACKOFF[1])
        self.at(self.now + wait, self._reopen, mapper, node, mapper.ring)

    def _reopen(self, mapper: SimMapper, node: str, ring: Ring) -> None:
        """A new stream to `node`, its unacknowledged batches sent again in order
        (nothing to do when the ring changed meanwhile: that re-routed everything)."""
        mapper.reopening.discard(node)
        if not mapper.alive or mapper.ring is not ring or node not in ring.nodes:
            return
        self.reconnect(mapper, ring.address(node))
        again = sorted((b for b in mapper.outbox.undelivered.values() if node in b.waiting_for),
                       key=PendingBatch.sort_key)
        self._send_batches(mapper, [(b, (node,)) for b in again])

    def refresh_mapper(self, mapper: SimMapper) -> None:
        """One ring fetch, as Delivery.fetch_ring: the views of the reachable nodes,
        and the machine's choice among them (a newer ring, or the newest when no node
        holds ours any more: the orphaned-ring rule). A ring adopted re-routes every
        undelivered batch on new streams."""
        machine = mapper.machine
        fetch = machine.begin_fetch(self.now)
        views = [(p.core.ring, p.core.ring.to_wire()) for p in self.procs if self._usable(p)]
        try:
            adopted = machine.fetched(fetch, views, [], "the simulation")
        except FloeError:
            return                      # nobody answered: a later look asks again
        if adopted.ring is None:
            return
        for address in list(self.listening):
            self.reconnect(mapper, address)
        mapper.reopening.clear()
        self._send_batches(mapper, adopted.sends)

    def _watch(self, mapper: SimMapper, every: float = WATCH_EVERY) -> None:
        """As Delivery._watch_ring: poll the ring until it changes, or for a while."""
        if mapper.watch is None:
            mapper.watch = (mapper.ring, self.now + WATCH_LIMIT)
            self._watch_poll(mapper, every)

    def _watch_poll(self, mapper: SimMapper, every: float) -> None:
        since, deadline = mapper.watch or (mapper.ring, self.now)
        if not mapper.alive or not mapper.machine.watching(since, deadline, self.now):
            mapper.watch = None
            return
        self.refresh_mapper(mapper)
        self.at(self.now + every, self._watch_poll, mapper, every)

    def mapper_tick(self, mapper: SimMapper) -> None:
        """The delivery's periodic check: a stream silent past ACK_TIMEOUT fails (the
        transport's part), and the machine says when to look for a newer ring."""
        self.at(self.now + TICK, self.mapper_tick, mapper)
        nodes = sorted({n for b in mapper.outbox.undelivered.values() for n in b.waiting_for})
        waited = {n: mapper.waited_since(n) for n in nodes}
        for node, since in waited.items():
            if since is not None and self.now - since > ACK_TIMEOUT \
                    and node not in mapper.reopening:
                self._stream_failed(mapper, node, Unavailable(
                    f"{node} acknowledged nothing for {ACK_TIMEOUT}s"))
        looks = mapper.machine.tick(self.now, list(waited.values()))
        if Look.REFRESH in looks:
            self.refresh_mapper(mapper)
        if Look.WATCH in looks:
            self._watch(mapper, every=2 * WATCH_EVERY)
