"""What a replica keeps of other primaries' tuples until their checkpoint covers them.

A replica stores each batch as received (payload bytes, not decoded: backing up costs
almost nothing), per token range and source, in seq order. A checkpoint carries the
primary's per-source watermarks; every batch whose last seq is at or below its
source's watermark is evicted, exactly, with no clock-skew allowance.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

from floering.node.core.batch import (decode_payload, decode_seqs, encode_payload, encode_seqs,
                             group_by_part)
from floering.wire.epochs import effective_mark
from floering.wire.errors import FloeError


@dataclass(frozen=True, slots=True)
class BackupEntry:
    first_seq: int
    last_seq: int
    count: int
    payload: bytes
    seqs: bytes
    stored_at: float = 0.0      # when the replica received it (expiry of the unapplied)

    @property
    def nbytes(self) -> int:
        return len(self.payload) + len(self.seqs)


class BackupStore:
    def __init__(self) -> None:
        self._entries: dict[int, dict[str, deque[BackupEntry]]] = {}
        self.tuples = 0
        self.bytes = 0
        self._changed = False       # since the last check_invariants: else it skips

    def add(self, token: int, source: str, entry: BackupEntry) -> None:
        self._changed = True
        per_source = self._entries.setdefault(token, {})
        queue = per_source.get(source)
        if queue is None:
            queue = per_source[source] = deque()
        elif queue and entry.last_seq <= queue[-1].last_seq:
            # Usually a resend of something held: keep one copy. But when the copy
            # went back (its primary came back from its disk without what it had not
            # synced) an earlier batch is new again: it goes in its place.
            self._insert(queue, entry)
            return
        queue.append(entry)
        self.tuples += entry.count
        self.bytes += entry.nbytes

    def _insert(self, queue: deque, entry: BackupEntry) -> None:
        if any(e.first_seq <= entry.first_seq and entry.last_seq <= e.last_seq for e in queue):
            return                                   # held already
        at = next(i for i, e in enumerate(queue) if e.last_seq >= entry.last_seq)
        if queue[at].last_seq == entry.last_seq:     # it holds more of the same: replace
            old = queue[at]
            queue[at] = entry
            self.tuples += entry.count - old.count
            self.bytes += entry.nbytes - old.nbytes
            return
        queue.insert(at, entry)
        self.tuples += entry.count
        self.bytes += entry.nbytes

    def evict(self, token: int, watermarks: dict[str, int]) -> int:
        """Drop every batch the watermarks cover; return the number of tuples dropped."""
        return self._drop_oldest(token, lambda source, entry: entry.last_seq <= effective_mark(
            watermarks, source))

    def expire(self, token: int, watermarks: dict[str, int], before: float) -> int:
        """Drop the batches received before `before` that the watermarks still do not
        cover: their primary never applied them (it refused them, or never got them
        and its sender resends). Returns the number of tuples dropped."""
        self.evict(token, watermarks)
        return self._drop_oldest(token, lambda source, entry: entry.stored_at < before)

    def _drop_oldest(self, token: int, done) -> int:
        """Per source, drop batches from the oldest while `done(source, entry)`."""
        per_source = self._entries.get(token)
        if not per_source:
            return 0
        self._changed = True
        dropped = 0
        for source, queue in list(per_source.items()):
            while queue and done(source, queue[0]):
                entry = queue.popleft()
                dropped += entry.count
                self.bytes -= entry.nbytes
            if not queue:
                del per_source[source]
        self.tuples -= dropped
        return dropped

    def entries(self, token: int) -> Iterator[tuple[str, BackupEntry]]:
        """The token's batches, per source in seq order."""
        for source, queue in self._entries.get(token, {}).items():
            for entry in queue:
                yield source, entry

    def split_token(self, token: int, part_of) -> None:
        """The token's range was cut: regroup each batch by `part_of(key)` (the token
        a key now belongs to) into one batch per part, keeping its seqs and order. A
        batch that does not decode stays whole (replay skips it, as the primary did)."""
        per_source = self._entries.pop(token, None)
        if not per_source:
            return
        self._changed = True
        for source, queue in per_source.items():
            for entry in queue:
                self.tuples -= entry.count
                self.bytes -= entry.nbytes
                for part, piece in split_entry(entry, part_of, token).items():
                    self.add(part, source, piece)

    def drop_token(self, token: int) -> None:
        self._changed = True
        for queue in self._entries.pop(token, {}).values():
            for entry in queue:
                self.tuples -= entry.count
                self.bytes -= entry.nbytes

    def tokens(self) -> list[int]:
        return list(self._entries)

    def tuples_of(self, token: int) -> int:
        return sum(e.count for _, e in self.entries(token))

    def check_invariants(self) -> None:
        # Every change goes through the methods above, which flag it; checked after
        # each event of a simulation, an unchanged store is not walked again.
        if not self._changed:
            return
        self._changed = False
        tuples = nbytes = 0
        for token, per_source in self._entries.items():
            for source, queue in per_source.items():
                if not queue:
                    raise AssertionError(f"empty queue kept for {token}/{source}")
                # Batches may overlap (two attempts of a retried task batch the same
                # tuples differently); their last seqs still strictly increase.
                for a, b in zip(queue, list(queue)[1:]):
                    if a.last_seq >= b.last_seq:
                        raise AssertionError(f"backup of {token}/{source} out of seq order")
                tuples += sum(e.count for e in queue)
                nbytes += sum(e.nbytes for e in queue)
        if (tuples, nbytes) != (self.tuples, self.bytes):
            raise AssertionError(f"backup totals {self.tuples}/{self.bytes} but entries hold "
                                 f"{tuples}/{nbytes}")


def split_entry(entry: BackupEntry, part_of, whole: int) -> dict[int, BackupEntry]:
    """One batch as {part token: the batch of its keys}, seqs kept."""
    try:
        keys, values = decode_payload(entry.payload, entry.count)
        seqs = decode_seqs(entry.first_seq, entry.last_seq, entry.count, entry.seqs)
        parts = [part_of(key) for key in keys]
    except FloeError:
        return {whole: entry}
    if all(p == parts[0] for p in parts):
        return {parts[0]: entry}
    grouped = group_by_part(parts, keys, values, seqs)
    return {part: BackupEntry(s[0], s[-1], len(s), encode_payload(k, v), encode_seqs(s),
                              entry.stored_at)
            for part, (k, v, s) in grouped.items()}
