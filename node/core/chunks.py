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
from itertools import chain, islice
from typing import Generator, Iterable, Iterator

from floering.wire.codec import entry_columns, pack
from floering.wire.errors import Overloaded
from floering.wire.pieces import RESERVED

CHUNK_BYTES = 1 << 20        # bytes of encoded entries per message, a lone large entry aside
# Entries encoded per C call while chunks are cut. A slice is encoded whole before its
# size is known: it starts at SLICE_ENTRIES and doubles up to MAX_SLICE while slices
# stay under a 32nd of a chunk (small entries: few calls), and falls back as soon as
# one is larger, so what is encoded beyond a chunk stays a few slices' worth.
SLICE_ENTRIES = 64
MAX_SLICE = 1024
MAX_SCANS = 32               # scans a node streams at once
MAX_SCANS_PER_CALLER = 8     # of them, by one caller (a certificate's identity)


def _header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return (b"\xdc" + n.to_bytes(2, "big")) if n < 1 << 16 else (b"\xdd" + n.to_bytes(4, "big"))


def column_slices(items):
    """take(n): the next n keys and states (two lists, empty at the end) of a dict or
    a layered mapping (wire.codec.entry_columns), in pack_entries' order."""
    _, keys, states = entry_columns(items)

    def take(n: int) -> tuple[list, list]:
        chunk_keys = list(islice(keys, n))
        return chunk_keys, list(islice(states, len(chunk_keys)))
    return take


def pair_slices(pairs: Iterable):
    """take(n): the next n of (key, state) `pairs` as (keys, states) lists."""
    pairs = iter(pairs)

    def take(n: int) -> tuple[list, list]:
        part = list(islice(pairs, n))
        return [k for k, _ in part], [s for _, s in part]
    return take


def packed_chunks(take, max_bytes: int = CHUNK_BYTES, max_entries: int = 1 << 30,
                  keep: int = 1 << 62) -> Generator[tuple[int, bytes], None, None]:
    """(entries, msgpack [keys, states]) per chunk of the entries take(n) gives (see
    column_slices), in order; at least one chunk (empty when there are no entries).
    The bytes are exactly pack_entries of the chunk's entries, for the first `keep`
    chunks (then b"": a plan needs the counts only). A slice that does not fit what is left of the
    chunk is encoded again entry by entry."""
    keys: list = []
    states: list = []
    n = size = emitted = 0
    step = SLICE_ENTRIES

    def chunk() -> tuple[int, bytes]:
        if emitted >= keep:
            return n, b""
        header = _header(n)
        return n, b"".join((b"\x92", header, *keys, header, *states))

    while True:
        if n >= max_entries:
            yield chunk()
            emitted += 1
            keys, states, n, size = [], [], 0, 0
        ks, vs = take(min(step, max_entries - n))
        if not ks:
            break
        pk, pv = pack(ks), pack(vs)
        hl = len(_header(len(ks)))
        body = len(pk) + len(pv) - 2 * hl
        if size + body <= max_bytes:
            if emitted < keep:
                keys.append(memoryview(pk)[hl:])
                states.append(memoryview(pv)[hl:])
            n, size = n + len(ks), size + body
            if body * 32 <= max_bytes:
                step = min(step * 2, MAX_SLICE)
            elif body * 8 > max_bytes:
                step = max(step // 4, 1)
            continue
        del pk, pv
        step = SLICE_ENTRIES if body <= max_bytes else 1
        for k, v in zip(ks, vs):            # entry by entry
            a, b = pack(k), pack(v)
            if n and size + len(a) + len(b) > max_bytes:
                yield chunk()
                emitted += 1
                keys, states, n, size = [], [], 0, 0
            if emitted < keep:
                keys.append(a)
                states.append(b)
            n, size = n + 1, size + len(a) + len(b)
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
    """Every (key, state) of the ranges `core` owns as the scan begins, one range at a
    time: each range copied (references, not states) as the walk reaches it, so at
    most one range's copy is held. A range that left this node meanwhile (handed off,
    split) is read as it was when it left: its new holders' scans, begun at the same
    ring, do not read it. With `pieces_first`, the pieces and outgoing keys of every
    range first (found without a copy, a range at a time between two yields), then
    the rest."""
    ranges = list(core.primaries.values())
    if pieces_first:
        for rng in ranges:
            marked = [kv for kv in rng.state.items() if _marked(kv[0])]
            yield from marked
    for rng in ranges:
        pairs = range_copy(rng.state)
        if pieces_first:
            yield from ((k, s) for k, s in pairs if not _marked(k))
        else:
            yield from pairs
        del pairs


def range_copy(state) -> Iterable[tuple[object, object]]:
    """A range's (key, state)s as of now, each key once, whatever applies after: of
    layered dicts, master's keys and states as two lists (16 bytes a key, a third of
    a dict's copy) and the small layers laid over them; of any other store, its
    snapshot()."""
    master, active = getattr(state, "master", None), getattr(state, "active", None)
    inactive = getattr(state, "inactive", None)
    if type(master) is not dict or type(active) is not dict or \
            (inactive is not None and type(inactive) is not dict):
        return state.snapshot().items()
    over = {**inactive, **active} if inactive else dict(active)
    pairs = zip(list(master), list(master.values()))
    if not over:
        return pairs
    return chain((kv for kv in pairs if kv[0] not in over), over.items())
