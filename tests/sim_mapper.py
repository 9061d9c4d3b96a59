"""The simulation's mappers (tests/simulation.py): each a source with the production
`Outbox`, ring rule and piece chooser; the simulation carries their batches to the
nodes over its fake network and clock, and their acks back."""

from __future__ import annotations

from collections import Counter, defaultdict

from floering.mapper.outbox import Outbox, PendingBatch
from floering.mapper.ring_watch import choose_ring
from floering.mapper.sharing import chooser_for
from floering.node.core.balancers import balancer
from floering.node.core.batch import decode_payload, encode_payload, encode_seqs
from floering.node.core.pieces import COMBINED_SOURCE, base_of
from floering.node.core.ring import Ring

ACK_TIMEOUT = 0.4


class SimMapper:
    """One mapper process: a source with its own outbox, ring view and streams."""

    alive = True
    paused_until = 0.0
    slow_until = 0.0

    def __init__(self, name: str, ring: Ring, combining: bool = False) -> None:
        # A combining mapper (mapper/combining.py) sends one tuple per key and batch,
        # its count, under a source whose tuples the nodes merge as states.
        self.combining = combining
        self.address = name
        self.name = COMBINED_SOURCE + name if combining else name
        self.ring = ring
        self.wire = ring.to_wire()           # the ring as the nodes sent it
        # The production piece chooser of the ring's balancer (None: keys not shared).
        self.chooser = chooser_for(balancer(ring.balancer))
        self.next_seq = 1
        # The production outbox: which batch goes where, when one is delivered, how
        # batches are fitted to a new ring. The simulation only carries the messages.
        self.outbox = Outbox()
        self.routed: dict[int, tuple[int, float]] = {}   # batch id -> (ring stamp, sent at)


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
            self._send_batches(mapper, mapper.outbox.add(batch, mapper.ring))

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
        if mapper.outbox.acked(batch, node):
            keys, values = decode_payload(batch.payload, batch.count)
            keys = [base_of(k) for k in keys]
            for key, value in zip(keys, values):
                self.acked[key] += value
            for key in set(keys):
                if self.acked[key] > self.sent[key]:
                    raise AssertionError(f"{key} acknowledged more often than sent")

    def stream_refused(self, mapper: SimMapper, node: str, exc) -> None:
        """`node` refused a batch with `exc` and ended the mapper's stream to it."""
        self.refresh_mapper(mapper)

    def refresh_mapper(self, mapper: SimMapper) -> None:
        """The client's own rule (mapper/ring_watch.choose_ring) over the views of the
        reachable nodes: a newer ring, or the newest when none holds ours any more;
        the outbox fits and re-routes everything undelivered."""
        views = [(p.core.ring, p.core.ring.to_wire()) for p in self.procs if self._usable(p)]
        for address in list(self.listening):
            self.reconnect(mapper, address)
        chosen = choose_ring(mapper.ring, mapper.wire, views, began_at_current=True)
        if chosen is None:
            self._send_batches(mapper, mapper.outbox.reroute(mapper.ring))
            return
        mapper.ring, mapper.wire = chosen
        self._send_batches(mapper, mapper.outbox.reroute(mapper.ring))

    def mapper_tick(self, mapper: SimMapper) -> None:
        self.at(self.now + 0.1, self.mapper_tick, mapper)
        stalled = [b for b in mapper.outbox.undelivered.values()
                   if self.now - mapper.routed[b.id][1] > ACK_TIMEOUT]
        if stalled:
            self.refresh_mapper(mapper)
