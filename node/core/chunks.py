"""Entries in chunks bounded in bytes, whatever their count: what one message of a
Scan, an InspectRange or a checkpoint shipment carries. A chunk holds at most
`max_entries` entries and at most `max_bytes` bytes of them encoded; an entry larger
than `max_bytes` on its own travels alone in its chunk (the gRPC message limit bounds
it then). Entries are encoded a slice at a time (a C call per slice): a slice that
does not fit is taken entry by entry.

Also here: how many scans a node serves at once (per caller and in all), and a scan's
walk of the ranges it owns, one range at a time, never a copy of the whole state.
Pure: no I/O, no clock."""

from __future__ import annotations

from collections import Counter
from itertools import islice
from typing import Iterable, Iterator

from floering.node.core.codec import entry_columns, pack
from floering.node.core.errors import Overloaded, StaleRing
from floering.node.core.pieces import RESERVED

CHUNK_BYTES = 1 << 20        # bytes of encoded entries per message, a lone large entry aside
# Entries encoded per C call while chunks are cut: a slice is encoded whole before its
# size is known, so this bounds what is encoded beyond a chunk (64 of the largest
# entries) while keeping the calls few.
SLICE_ENTRIES = 64
MAX_SCANS = 32               # scans a node streams at once
MAX_SCANS_PER_CALLER = 8     # of them, by one caller (a certificate's identity)


def _header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return (b"\xdc" + n.to_bytes(2, "big")) if n < 1 << 16 else (b"\xdd" + n.to_bytes(4, "big"))


def column_slices(items, step: int = SLICE_ENTRIES) -> Iterator[tuple[list, list]]:
    """A dict's or a layered mapping's (node.core.codec.entry_columns) keys and states
    in the order pack_entries encodes them, `step` at a time."""
    _, keys, states = entry_columns(items)
    while chunk_keys := list(islice(keys, step)):
        yield chunk_keys, list(islice(states, len(chunk_keys)))


def pair_slices(pairs: Iterable, step: int = SLICE_ENTRIES) -> Iterator[tuple[list, list]]:
    """(key, state) pairs as (keys, states) lists, `step` at a time."""
    pairs = iter(pairs)
    while part := list(islice(pairs, step)):
        yield [k for k, _ in part], [s for _, s in part]


def packed_chunks(slices: Iterable[tuple[list, list]], max_bytes: int = CHUNK_BYTES,
                  max_entries: int = 1 << 30) -> Iterator[tuple[int, bytes]]:
    """(entries, msgpack [keys, states]) per chunk of the entries `slices` give, in
    order; at least one chunk (empty when there are no entries). The bytes are
    exactly pack_entries of the chunk's entries. A slice that does not fit what is
    left of the chunk is encoded again entry by entry."""
    keys: list = []
    states: list = []
    n = size = 0
    emitted = False

    def chunk() -> tuple[int, bytes]:
        header = _header(n)
        return n, b"".join((b"\x92", header, *keys, header, *states))

    for ks, vs in slices:
        while ks:
            if n >= max_entries:
                yield chunk()
                emitted = True
                keys, states, n, size = [], [], 0, 0
            room = max_entries - n
            if len(ks) > room:                  # the rest of the chunk, then on
                ks, vs, rest = ks[:room], vs[:room], (ks[room:], vs[room:])
            else:
                rest = ((), ())
            pk, pv = pack(ks), pack(vs)
            hl = len(_header(len(ks)))
            body = len(pk) + len(pv) - 2 * hl
            if size + body <= max_bytes:
                keys.append(memoryview(pk)[hl:])
                states.append(memoryview(pv)[hl:])
                n, size = n + len(ks), size + body
                ks, vs = rest
                continue
            del pk, pv
            for k, v in zip(ks, vs):        # entry by entry
                a, b = pack(k), pack(v)
                if n and (n >= max_entries or size + len(a) + len(b) > max_bytes):
                    yield chunk()
                    emitted = True
                    keys, states, n, size = [], [], 0, 0
                keys.append(a)
                states.append(b)
                n, size = n + 1, size + len(a) + len(b)
            ks, vs = rest
    if n or not emitted:
        yield chunk()


class ScanSlots:
    """How many scans are open, per caller and in all: one more than the node or the
    caller may hold is refused (Overloaded: RESOURCE_EXHAUSTED) before anything is
    read. Each scan holds one range's copy and a chunk: this bounds their memory."""

    def __init__(self, total: int = MAX_SCANS, per_caller: int = MAX_SCANS_PER_CALLER) -> None:
        self.total, self.per_caller = total, per_caller
        self.open: Counter = Counter()

    def take(self, caller: str) -> None:
        if sum(self.open.values()) >= self.total:
            raise Overloaded(f"{self.total} scans are open on this node, the most it serves "
                             f"at once: scan again later")
        if self.open[caller] >= self.per_caller:
            raise Overloaded(f"this caller has {self.per_caller} scans open on this node, "
                             f"the most one caller may: finish one first")
        self.open[caller] += 1

    def give(self, caller: str) -> None:
        self.open[caller] -= 1
        if self.open[caller] <= 0:
            del self.open[caller]


def _marked(key) -> bool:
    return type(key) is bytes and key.startswith(RESERVED)


def scan_pairs(core, pieces_first: bool) -> Iterator[tuple[object, object]]:
    """Every (key, state) of the ranges `core` owns now, one range at a time: each
    range copied (references, not states) as the walk reaches it, so at most one
    range's copy is held. With `pieces_first`, the pieces and outgoing keys of every
    range first (found without a copy, a range at a time between two yields),
    then the rest. A range that left this node before the walk reached it raises
    StaleRing: the reader scans again at the new ring."""
    ranges = list(core.primaries.items())
    if pieces_first:
        for token, rng in ranges:
            _check_still_ours(core, token, rng)
            marked = [kv for kv in rng.state.items() if _marked(kv[0])]
            yield from marked
    for token, rng in ranges:
        _check_still_ours(core, token, rng)
        snapshot = rng.state.snapshot()
        if pieces_first:
            yield from ((k, s) for k, s in snapshot.items() if not _marked(k))
        else:
            yield from snapshot.items()
        del snapshot


def _check_still_ours(core, token: int, rng) -> None:
    if core.primaries.get(token) is not rng:
        raise StaleRing(f"the range of token {token} left {core.node_id} while a scan "
                        f"read it: scan again at ring version {core.ring.version}")
