"""The mapper's undelivered batches and the rules that fit them to a ring. Pure: no
I/O, no clock, no event loop; the stream executor (`mapper/delivery.py`) and the
simulation both drive it.

A batch is delivered once every destination of its token (primary + replicas) has
acknowledged it. When the ring changes, every undelivered batch is fitted to the new
ring in resend order: cut by key where a split added tokens, merged again where parts
meet in one token (a split that died with its node), so each token's batches keep
increasing, disjoint seqs (the nodes' dedup keeps one watermark per range and source).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from floering.node.core.batch import (decode_payload, decode_seqs, encode_batch, encode_payload,
                             encode_seqs, group_by_part, is_versioned)
from floering.wire.errors import FloeError
from floering.wire.ring import Ring


@dataclass(eq=False)
class PendingBatch:
    id: int
    token: int
    source: str
    first_seq: int
    last_seq: int
    count: int
    payload: bytes
    seqs: bytes
    born: float = 0.0                                   # monotonic time of its first emit
    waiting_for: set[str] = field(default_factory=set)  # destinations yet to ack
    tokens: tuple = ()        # the ring's tokens its keys were routed with
    order: tuple = ()         # resend order, when a split made it a part of another batch
    inputs: int = 0           # tuples emitted into it, when combining made them fewer
    # monotonic times of its way (0.0: not yet; `Delivery.stages`): handed to the
    # delivery, first written to a stream, first acknowledged
    submitted: float = 0.0
    sent: float = 0.0
    first_ack: float = 0.0

    def sort_key(self) -> tuple:
        return self.order or (self.id,)


class Outbox:
    def __init__(self) -> None:
        self.undelivered: dict[int, PendingBatch] = {}
        self._part_ids = itertools.count(1 << 48)   # ids of batches a split cut in parts

    def __len__(self) -> int:
        return len(self.undelivered)

    def add(self, batch: PendingBatch, ring: Ring) -> list[tuple[PendingBatch, tuple[str, ...]]]:
        """A new batch: what to send where (several parts if the ring was cut since
        its keys were routed)."""
        self.undelivered[batch.id] = batch
        return self.route(batch, ring)

    def route(self, batch: PendingBatch, ring: Ring) -> list[tuple[PendingBatch, tuple[str, ...]]]:
        """Fit one batch to `ring`; every destination of each part must ack anew."""
        if batch.tokens is not ring.tokens and batch.tokens != ring.tokens:
            parts = self.resplit(batch, ring)
            if parts is not None:
                return [sent for part in parts for sent in self.route(part, ring)]
        destinations = ring.destinations(batch.token)
        batch.waiting_for = set(destinations)
        return [(batch, destinations)]

    def reroute(self, ring: Ring) -> list[tuple[PendingBatch, tuple[str, ...]]]:
        """Every undelivered batch, fitted to a new ring, in resend order."""
        return [sent for batch in self.fitted(ring) for sent in self.route(batch, ring)]

    def acked(self, batch: PendingBatch, node: str) -> bool:
        """`node` acknowledged `batch`; True when that completes its delivery. An ack
        of a batch no longer undelivered (merged, cut, or dropped) counts for nothing."""
        batch.waiting_for.discard(node)
        return not batch.waiting_for and self.undelivered.pop(batch.id, None) is not None

    def drop(self, batch: PendingBatch) -> None:
        """A batch the ring refuses for good (bad input)."""
        self.undelivered.pop(batch.id, None)

    # ------------------------------------------------------------ the algebra

    def fitted(self, ring: Ring) -> list[PendingBatch]:
        """Undelivered batches in resend order, fitted to `ring`: cut by key where a
        split added tokens; and where parts meet again in one token (the split died
        with its node before anyone else learnt it), merged, so that each token's
        batches still carry increasing, disjoint seqs (dedup keeps one watermark)."""
        batches: list[PendingBatch] = []
        for batch in sorted(self.undelivered.values(), key=PendingBatch.sort_key):
            if batch.tokens is not ring.tokens and batch.tokens != ring.tokens:
                batches += self.resplit(batch, ring) or [batch]
            else:
                batches.append(batch)
        per_token: dict[int, list[PendingBatch]] = {}
        for batch in batches:
            stack = per_token.setdefault(batch.token, [])
            while stack and stack[-1].source == batch.source and \
                    batch.first_seq <= stack[-1].last_seq:
                batch = self.merge(stack.pop(), batch, ring)
            stack.append(batch)
        return sorted((b for stack in per_token.values() for b in stack),
                      key=PendingBatch.sort_key)

    def merge(self, a: PendingBatch, b: PendingBatch, ring: Ring) -> PendingBatch:
        """One batch holding the tuples of both (a tuple in both once), seqs sorted."""
        tuples: dict = {}
        for batch in (a, b):
            keys, values = decode_payload(batch.payload, batch.count)
            seqs = decode_seqs(batch.first_seq, batch.last_seq, batch.count, batch.seqs)
            tuples.update(zip(seqs, zip(keys, values)))
        seqs = sorted(tuples)
        merged = PendingBatch(next(self._part_ids), a.token, a.source, seqs[0], seqs[-1],
                              len(seqs), encode_like((a, b), [tuples[s][0] for s in seqs],
                                                     [tuples[s][1] for s in seqs]),
                              encode_seqs(seqs), min(a.born, b.born), tokens=ring.tokens,
                              order=min(a.sort_key(), b.sort_key()))
        self.undelivered.pop(a.id, None)
        self.undelivered.pop(b.id, None)
        self.undelivered[merged.id] = merged
        return merged

    def resplit(self, batch: PendingBatch, ring: Ring) -> list[PendingBatch] | None:
        """A batch sealed before the ring was cut may hold keys of several ranges now:
        split it by key into one batch per token, seqs kept (dedup stays exact: every
        part of a range inherits its watermarks). None when it still fits one token."""
        batch.tokens = ring.tokens
        try:
            keys, values = decode_payload(batch.payload, batch.count)
            seqs = decode_seqs(batch.first_seq, batch.last_seq, batch.count, batch.seqs)
            tokens = [ring.token_for_key(k) for k in keys]
        except FloeError:
            return None            # the nodes refuse it as they would have anyway
        if all(t == tokens[0] for t in tokens):
            batch.token = tokens[0]
            return None
        grouped = group_by_part(tokens, keys, values, seqs)
        self.undelivered.pop(batch.id, None)
        parts = []
        for i, (token, (k, v, s)) in enumerate(sorted(grouped.items())):
            part = PendingBatch(next(self._part_ids), token, batch.source, s[0], s[-1], len(s),
                                encode_like((batch,), k, v), encode_seqs(s), batch.born,
                                tokens=ring.tokens, order=batch.sort_key() + (i,))
            self.undelivered[part.id] = part
            parts.append(part)
        return parts


def encode_like(batches, keys, values) -> bytes:
    """Parts and merges keep their batches' payload format: columns when all were."""
    if all(is_versioned(b.payload) for b in batches):
        return encode_batch(keys, values)
    return encode_payload(keys, values)
