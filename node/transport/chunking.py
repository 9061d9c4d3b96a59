"""Checkpoints in chunks: a range's whole state (a new replica's first copy, a
handoff's new holder, a replica out of sync), or a delta over a chunk's size, goes as
a run of messages of at most CHUNK_ENTRIES entries and CHUNK_BYTES (1 MiB) each, a
larger entry alone in its chunk, so that its cost is bounded per message: a deadline that
grows with the chunk's bytes, not one fixed for a shipment of any size; only the chunk
that failed is sent again, never what arrived; and neither side holds the whole range
encoded at once. Up to WINDOW chunks of a range are on their way at once, so the
sender encodes the next while the receiver decodes the last (one at a time, each side
waited for the other); the receiver keeps those that overtake a missing one. Pure: no
gRPC, no clock of its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.wire.codec import entry_columns
from floering.wire.errors import InvalidArgument, Overloaded, Unavailable
from floering.node.core.state_wire import StateColumns, StateRun

COLUMNS = object()           # fill's key for the frames of column states kept as they are
CHUNK_ENTRIES = 16_384       # entries per chunk: each takes a few ms of the event loop
MIN_RATE = 4 << 20           # bytes/s a chunk's deadline allows on top of the base one
MAX_CHUNKS = 1 << 20         # a range of 68 G entries: anything beyond is not a checkpoint
WINDOW = 4                   # chunks of one range on their way at once


def chunk_count(entries: int, size: int = CHUNK_ENTRIES) -> int:
    return max(1, -(-entries // size))


def chunks_of(items, size: int = CHUNK_ENTRIES,
              skip: int = 0) -> Iterator[tuple[list, list]]:
    """The keys and states of a checkpoint's states (a dict or layered mapping), in the
    order pack_entries encodes them, `size` at a time as two lists (the columns a chunk
    is encoded as), after the first `skip` chunks. `items` must not change while this
    is read."""
    _, keys, states = entry_columns(items)
    if skip:
        for column in (keys, states):
            for _ in islice(column, skip * size):
                pass
    while chunk_keys := list(islice(keys, size)):
        yield chunk_keys, list(islice(states, len(chunk_keys)))


def chunks_at(items, counts: list[int], skip: int = 0) -> Iterator[tuple[list, list]]:
    """As chunks_of, in chunks of `counts` entries each (a plan of planned_counts),
    from chunk `skip` + 1 on."""
    _, keys, states = entry_columns(items)
    if skip:
        for column in (keys, states):
            for _ in islice(column, sum(counts[:skip])):
                pass
    for n in counts[skip:]:
        yield list(islice(keys, n)), list(islice(states, n))


def planned_counts(items, max_entries: int = CHUNK_ENTRIES,
                   max_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """A checkpoint's states in chunks of at most `max_entries` entries and
    `max_bytes` bytes (node.core.chunks): (entries, encoded) per chunk, in order, the
    bytes of the first only (b"" after). The sender keeps the counts, which
    chunks_at follows; the bytes of a lone chunk go as they are."""
    return packed_chunks(column_slices(items), max_bytes, max_entries, keep=1)


def chunk_deadline(base: float, nbytes: int) -> float:
    return base + nbytes / MIN_RATE


class Completed(NamedTuple):
    states: dict    # what is in already; `parts` still go in, in order: see `fill`
    parts: list
    tail: object


class Columns:
    """A chunk's entries as decoded: keys and states, two sequences of equal length,
    and how many of them are in the range's dict (`fill`). Iterates as (key, state)."""

    __slots__ = ("column_keys", "column_states", "at")

    def __init__(self, keys, states) -> None:
        self.column_keys, self.column_states, self.at = keys, states, 0

    def __iter__(self):
        return zip(self.column_keys, self.column_states)


def fill(states: dict, parts: list, step: int | None = None) -> Iterator[None]:
    """Put `parts` (chunks' entries, in order, as given to Reassembly.add) into
    `states`, the later of a key's entries winning, each part let go once it is in:
    Columns `step` entries at a time (all at once without), yielding after each step;
    another part (a dict, or (key, state) pairs) whole. Inserting into a dict of a
    whole range is most of a replica's cost of taking in a full checkpoint: in steps,
    the caller lets its event loop run in between. A caller that stops between two
    steps leaves the rest of `parts` as it was: a later fill goes on."""
    while parts:
        part = parts[0]
        if isinstance(part, StateColumns):      # kept as columns: a table takes them
            states.setdefault(COLUMNS, []).append(part)
            done = True
        elif isinstance(part, Columns):
            keys, values, at = part.column_keys, part.column_states, part.at
            end = len(keys) if step is None else min(len(keys), at + step)
            # zip hands dict.update one pair at a time: no tuple per entry is kept
            states.update(zip(keys[at:end], values[at:end]))
            part.at = end
            done = end == len(keys)
        else:
            states.update(part)
            done = True
        if done:
            parts.pop(0)
        if step is not None:
            yield


def whole_states(done: Completed):
    """A completed range's states, what was still to go in put in at once."""
    for _ in fill(done.states, done.parts):
        pass
    return received(done.states)


def received(states: dict) -> dict | StateRun:
    """What `fill` made of a range's chunks: the dict, or, when frames of column
    states came, a StateRun (the dict of any other entries, then the frames, in
    order). Never a key of the range: COLUMNS is an object of its own."""
    frames = states.pop(COLUMNS, None)
    if frames is None:
        return states
    return StateRun([states, *frames] if states else frames)


@dataclass
class Staged:
    seq: object
    chunks: int
    held: int = 0
    touched: float = 0.0
    states: dict = field(default_factory=dict)   # the chunks held in a row, put in
    pending: list = field(default_factory=list)  # held in a row, still to go in
    ahead: dict = field(default_factory=dict)    # chunk -> its entries, past a gap
    tail: object = None                          # what came with the last chunk


class Reassembly:
    """The receiving side: each (sender, token)'s full checkpoint, chunk by chunk.
    `add` answers how many chunks of it are held in a row from the first (the sender
    goes on from the next) and, once they are all there, the whole states. A chunk
    that overtook a missing one is kept, if it is at most `window` past the last held
    in a row; one further is not taken; a resend of one held is acknowledged again. At
    most `max_open` ranges at a time (the least recently touched goes), each dropped
    after `idle` seconds without a chunk."""

    def __init__(self, max_open: int = 256, idle: float = 120.0,
                 window: int = WINDOW) -> None:
        self.max_open = max_open
        self.idle = idle
        self.window = window
        self.open: dict[tuple[str, int], Staged] = {}

    def add(self, sender: str, token: int, seq, chunk: int, chunks: int,
            states, now: float, tail=None) -> tuple[int, Completed | None]:
        """(chunks held in a row, the whole range once `chunk` completes it, else None).
        `states`: the chunk's entries, Columns, a dict or (key, state) pairs (an
        iterator will do: it is read once, by `fill`, and must not change till then),
        the later of a key's entries winning. `tail`: what the last chunk carries
        besides (its watermarks). `seq`: what tells one checkpoint of the range
        from another (compared for equality only). Nothing is inserted here: see
        `filling` and `Completed`."""
        if not 1 <= chunk <= chunks <= MAX_CHUNKS:
            raise InvalidArgument(f"chunk {chunk} of {chunks}: needs 1 <= chunk <= chunks "
                                  f"<= {MAX_CHUNKS}")
        self._expire(now)
        key = (sender, token)
        staged = self.open.get(key)
        if staged is None or staged.seq != seq or staged.chunks != chunks:
            if chunk > self.window:
                self.open.pop(key, None)
                return 0, None              # nothing of this one here: start over
            if staged is None and len(self.open) >= self.max_open:
                oldest = min(self.open, key=lambda k: self.open[k].touched)
                if self.open[oldest].touched >= now:
                    raise Overloaded(f"{len(self.open)} full checkpoints arriving at once")
                del self.open[oldest]
            staged = self.open[key] = Staged(seq, chunks)
        staged.touched = now
        if chunk <= staged.held or chunk > staged.held + self.window:
            return staged.held, None         # a resend (held) or too far ahead (not taken)
        if chunk == chunks:
            staged.tail = tail
        if chunk > staged.held + 1:
            staged.ahead[chunk] = states
            return staged.held, None
        staged.pending.append(states)
        staged.held = chunk
        while (later := staged.ahead.pop(staged.held + 1, None)) is not None:
            staged.pending.append(later)
            staged.held += 1
        if staged.held < chunks:
            return staged.held, None
        del self.open[key]
        return staged.held, Completed(staged.states, staged.pending, staged.tail)

    def filling(self, sender: str, token: int, step: int) -> Iterator[None]:
        """fill() what arrived of (sender, token)'s range into its states, in steps:
        as each chunk arrives, so the range's dict grows as it comes."""
        staged = self.open.get((sender, token))
        if staged is not None:
            yield from fill(staged.states, staged.pending, step)

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self.open.items() if now - s.touched > self.idle]:
            del self.open[key]


class SendWindow:
    """The sending side's bookkeeping of one full checkpoint in chunks: which chunk to
    send next, with at most `window` on their way and none further than `window` past
    what the receiver holds in a row; what a reply or a failure changes. The caller
    does the sending (node.transport.peers)."""

    def __init__(self, total: int, window: int, retries: int, what: str = "") -> None:
        self.total, self.window, self.retries = total, window, retries
        self.what = what       # the shipment, as an error names it
        self.next = 1          # the chunk to send next
        self.held = 0          # what the receiver last said it holds in a row
        self.flying = 0        # calls on their way
        self.failures = 0      # failed calls in a row
        self.sends = 0
        self.lowest = total    # the least any reply since the last rewind said it held

    def to_send(self) -> int | None:
        """The next chunk to send now, or None until a call comes back."""
        if self.flying >= self.window:
            return None
        if self.next > min(self.total, self.held + self.window):
            if self.flying:
                return None
            # All answered, yet not all held: a reply that said less than the others
            # may be the later one (a receiver that forgot), so go on from the least.
            self.held = min(self.held, self.lowest)
            self.next, self.lowest = self.held + 1, self.total
        self.sends += 1
        # Room for every chunk twice (a receiver that forgot all it held, once) and a
        # window sent again for each failure the retries allow, twice over.
        if self.sends > 2 * self.total + 2 * (self.retries + 1) * self.window:
            raise Unavailable(f"{self.what or 'the receiver'} keeps losing the chunks of "
                              f"a full checkpoint")
        self.flying += 1
        self.next += 1
        return self.next - 1

    def answered(self, sent: int, held: int) -> bool:
        """The receiver took `sent` and holds `held` chunks in a row: True once it
        holds them all."""
        self.flying -= 1
        self.failures = 0
        if held >= self.total:
            return True
        self.lowest = min(self.lowest, held)
        if sent > held + self.window:
            # Not kept (the receiver lost what it had): go on from what it holds.
            self.held = held
            self.next = min(self.next, held + 1)
        else:                             # replies overtake each other too
            self.held = max(self.held, held)
        return False

    def failed(self, sent: int, retriable: bool) -> bool:
        """The call carrying `sent` failed: True to give the shipment up."""
        self.flying -= 1
        self.failures += 1
        if not retriable or self.failures > self.retries:
            return True
        self.next = min(self.next, sent)  # this one again
        return False
