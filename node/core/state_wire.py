"""State that moves between nodes as column buffers: a handoff's or a new replica's
full copy of a range, and a checkpoint's delta, in frames of column states.

A frame (little-endian throughout):

    header   b"\\xc1FS", version (1 byte), value width W (1 byte: 1, 2, 4 or 8),
             count n (uint32), key bytes K (uint64), rest bytes R (uint32)   21 bytes
    kinds    n bytes: 0 str, 1 bytes, 2 int (as node.core.columnar.buffers)
    offsets  n + 1 uint32: key i is keys[offsets[i]:offsets[i + 1]]; 0 first, K last
    keys     K bytes: each key as hashing.key_bytes gives it, end to end
    values   n signed integers of W bytes: each key's state (W the least that holds
             the frame's states, so small counts cost a byte or two)
    rest     R bytes: msgpack [keys, states] of the entries whose key or state is
             not a table's (a float, None, a big int, a tuple key), over the columns

0xc1 is a byte msgpack never writes: a frame never reads as the older msgpack
[keys, states] entries (wire.codec), which a receiver still takes. Every field
is the sender's: `decode` checks the sizes add up to the frame's exactly, the count
(bounded by the frame's bytes), the kinds, the offsets (0 first, K last, never
decreasing) and the rest before anything reads them; a key's bytes are checked when
it is decoded or installed (a table checks them in its own pass). The columns are
packed and checked in one pass by the state table's kernel (node.core.columnar:
compiled, or its pure-Python fallback): both write and read the same bytes.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Iterator

from floering.wire.codec import pack, unpack_columns
from floering.node.core.columnar import pack_frame_columns, unpack_frame_columns
from floering.node.core.columnar.buffers import KIND_INT, decode_key, encode_keys, valid_key
from floering.wire.errors import InvalidArgument

MAGIC = b"\xc1FS"
VERSION = 1
_HEAD = struct.Struct("<3sBBIQI")
HEADER_BYTES = _HEAD.size
ENTRY_BYTES = 5                   # kind, offset (a value's width aside)
_WIDTHS = {1: "b", 2: "h", 4: "i", 8: "q"}
_INT64 = (-(1 << 63), 1 << 63)
_KEY_TYPES = frozenset((str, bytes, int))


def is_frame(data) -> bool:
    """Whether `data` is a frame of column states (else older msgpack entries)."""
    return bytes(data[:3]) == MAGIC


def encode_frame(kinds: bytes, keys: bytes, offsets, values: array,
                 rest: bytes = b"") -> bytes:
    """A frame of the columns (offsets from 0, K below 2**32) and the rest, msgpack
    [keys, states]."""
    return encode_slice(kinds, keys, offsets, values, 0, len(kinds), rest)


def encode_slice(kinds, keys, offsets, values, start: int, end: int,
                 rest: bytes = b"") -> bytes:
    """A frame of entries start to end of columns (offsets of n + 1 into `keys`),
    packed by the state table's kernel in one pass, and the rest."""
    width, body = pack_frame_columns(kinds, keys, offsets, values, start, end)
    nkeys = len(body) - (ENTRY_BYTES + width) * (end - start) - 4
    return b"".join((_HEAD.pack(MAGIC, VERSION, width, end - start, nkeys, len(rest)),
                     body, rest))


def frame_bytes(n: int, key_bytes: int, rest: int = 0, width: int = 8) -> int:
    return HEADER_BYTES + (ENTRY_BYTES + width) * n + 4 + key_bytes + rest


def key_blob(keys) -> tuple[bytes, bytes, array]:
    """kinds, key bytes and offsets of str, bytes or int keys (ASCII str keys in one
    join, no bytes object per key)."""
    try:
        text = "".join(keys)
    except TypeError:
        text = None
    if text is not None and text.isascii():
        offsets = array("Q", [0])
        offsets.extend(accumulate(map(len, keys)))
        return bytes(len(keys)), text.encode("ascii"), offsets
    return encode_keys(keys)


def encode_pairs(keys: list, states: list) -> bytes:
    """A frame of entries (two lists of equal length): int64 states of str, bytes or
    int keys in the columns, the others in the rest."""
    if set(map(type, keys)) <= _KEY_TYPES and set(map(type, states)) == {int}:
        try:
            values = array("q", states)
        except OverflowError:
            values = None
        if values is not None:
            return encode_frame(*key_blob(keys), values)
    fixed_keys, fixed, rest_keys, rest = [], [], [], []
    for key, state in zip(keys, states):
        if type(state) is int and _INT64[0] <= state < _INT64[1] and type(key) in _KEY_TYPES:
            fixed_keys.append(key)
            fixed.append(state)
        else:
            rest_keys.append(key)
            rest.append(state)
    return encode_frame(*key_blob(fixed_keys), array("q", fixed),
                        pack((rest_keys, rest)) if rest_keys else b"")


# ------------------------------------------------------------------ decoding


def _refuse(why: str) -> InvalidArgument:
    return InvalidArgument(f"column states: {why}")


def decode(data) -> "StateColumns":
    """A frame's entries, checked (InvalidArgument naming what is wrong); the
    columns are copied out of `data` once, the keys decoded only when read."""
    view = memoryview(data).cast("B")
    size = len(view)
    if size < HEADER_BYTES:
        raise _refuse(f"{size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, width, n, nkeys, nrest = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise _refuse("not a frame of column states")
    if version != VERSION:
        raise _refuse(f"frame version {version}: this node reads version {VERSION} only")
    if width not in _WIDTHS:
        raise _refuse(f"value width {width}: 1, 2, 4 or 8 bytes")
    expect = frame_bytes(n, nkeys, nrest, width)
    if expect != size:
        raise _refuse(f"the header says {n} entries, {nkeys} key bytes and {nrest} rest "
                      f"bytes ({expect} bytes): the frame has {size}")
    try:
        kinds, keys, offsets, values = unpack_frame_columns(view, HEADER_BYTES, n, nkeys,
                                                            width)
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    at = size - nrest
    rest_keys, rest = unpack_columns(bytes(view[at:])) if nrest else ((), ())
    try:
        frozenset(rest_keys)
    except TypeError:
        raise _refuse("a key of the rest is a map (not a key)") from None
    return StateColumns(kinds, keys, offsets, values, rest_keys, rest)


class _Materialised(Mapping):
    """A mapping read as one dict, made (and checked) when first read as one."""

    _dict: dict | None = None

    def to_dict(self) -> dict:
        raise NotImplementedError

    def _mapping(self) -> dict:
        if self._dict is None:
            self._dict = self.to_dict()
        return self._dict

    def __getitem__(self, key):
        return self._mapping()[key]

    def __iter__(self):
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())

    def items(self):
        return self._mapping().items()


class StateColumns(_Materialised):
    """A frame's entries: the columns (a table installs them in one call), then the
    rest over them. Read as a mapping, every key is decoded and checked once."""

    def __init__(self, kinds: bytes, key_data: bytes, offsets: array, values: array,
                 rest_keys=(), rest_states=()) -> None:
        # (value_column: `values` is the mapping's method)
        self.kinds, self.key_data, self.offsets = kinds, key_data, offsets
        self.value_column = values
        self.rest_keys, self.rest_states = rest_keys, rest_states

    @property
    def count(self) -> int:
        """Entries in the frame (a key in the columns and the rest counts twice)."""
        return len(self.kinds) + len(self.rest_keys)

    def column_keys(self, start: int = 0, end: int | None = None) -> list:
        """The columns' keys (`start` to `end`), decoded and checked (InvalidArgument
        for a key that is not what its kind encodes)."""
        kinds, data, offsets = self.kinds, self.key_data, self.offsets
        end = len(kinds) if end is None else end
        try:
            keys = keys_of(kinds, data, offsets, start, end)
        except (UnicodeDecodeError, ValueError):
            raise _refuse("a str key is not UTF-8, or an int key not a decimal") from None
        if KIND_INT in kinds[start:end]:
            for i in (i for i in range(start, end) if kinds[i] == KIND_INT):
                if not valid_key(KIND_INT, data[offsets[i]:offsets[i + 1]]):
                    raise _refuse(f"key {i} is not what kind 2 (int) encodes")
        return keys

    def to_dict(self) -> dict:
        out = dict(zip(self.column_keys(), self.value_column.tolist()))
        out.update(zip(self.rest_keys, self.rest_states))
        return out

    def rest(self) -> dict:
        return dict(zip(self.rest_keys, self.rest_states))


class StateRun(_Materialised):
    """A full copy's chunks as they arrived: layers (dicts and StateColumns), each
    over the ones before it."""

    def __init__(self, layers: list) -> None:
        self.layers = layers

    def to_dict(self) -> dict:
        out: dict = {}
        for layer in self.layers:
            out.update(layer.to_dict() if isinstance(layer, StateColumns) else layer)
        return out


def into_dict(out: dict, states, step: int) -> Iterator[None]:
    """Put received states (a StateRun, StateColumns or a dict) into `out` as
    to_dict() makes them, `step` entries at a time, yielding after each: a caller
    lets its event loop run in between (a full copy of a range of millions of keys
    is a second's work). Keys are checked as column_keys checks them; `out` is the
    caller's own until the generator ends."""
    for layer in layers_of(states):
        if isinstance(layer, StateColumns):
            n, values = len(layer.kinds), layer.value_column
            for start in range(0, n, step):
                end = min(n, start + step)
                out.update(zip(layer.column_keys(start, end), values[start:end].tolist()))
                yield
            keys, rest = layer.rest_keys, layer.rest_states
            for start in range(0, len(keys), step):
                out.update(zip(keys[start:start + step], rest[start:start + step]))
                yield
        else:
            pairs = iter(layer.items())
            while part := list(islice(pairs, step)):
                out.update(part)
                yield


def layers_of(states) -> list:
    """The layers of received states, in order (a dict: itself)."""
    if isinstance(states, StateRun):
        return list(states.layers)
    return [states]

# ------------------------------------------------------------ a table's columns


def keys_of(kinds, data: bytes, offsets, start: int = 0, end: int | None = None) -> list:
    """The keys `start` to `end` of exported columns, decoded in bulk: str keys of one
    ASCII buffer as slices of one decoded str, bytes keys as slices."""
    end = len(kinds) if end is None else end
    bounds = offsets[start:end + 1].tolist()
    cuts = zip(bounds, bounds[1:])
    part = kinds[start:end]
    if part.count(0) == len(part):
        lo, hi = bounds[0], bounds[-1]
        if data[lo:hi].isascii():
            text = data[lo:hi].decode("ascii")
            return [text[a - lo:b - lo] for a, b in cuts]
        return [data[a:b].decode("utf-8") for a, b in cuts]
    if part.count(1) == len(part):
        return [data[a:b] for a, b in cuts]
    return [decode_key(kind, data[a:b]) for kind, (a, b) in zip(part, cuts)]


class ExportView:
    """An export's (key, state)s read as a mapping, keys decoded as they are read (an
    encoder reads them in slices); a lookup decodes them all once."""

    def __init__(self, buffers) -> None:
        self.buffers = buffers
        self._dict: dict | None = None

    def __len__(self) -> int:
        return len(self.buffers[0])

    def __iter__(self):
        kinds, data, offsets = self.buffers[:3]
        for start in range(0, len(kinds), 8192):
            yield from keys_of(kinds, data, offsets, start, min(start + 8192, len(kinds)))

    def values(self):
        return iter(self.buffers[4])

    def items(self):
        return zip(self, self.values())

    def _mapping(self) -> dict:
        if self._dict is None:
            self._dict = dict(self.items())
        return self._dict

    def __contains__(self, key) -> bool:
        return key in self._mapping()

    def __getitem__(self, key):
        return self._mapping()[key]

    def keys(self):
        return iter(self)


class Layers(_Materialised):
    """Mappings (an ExportView, dicts) each laid over the ones before it: a table's
    checkpoint delta. The encoder reads the layers as they are; read as a mapping
    it is one dict, made once."""

    def __init__(self, *layers) -> None:
        self.layers = layers

    def to_dict(self) -> dict:
        out: dict = {}
        for layer in self.layers:
            out.update(layer.items() if isinstance(layer, ExportView) else layer)
        return out


# ------------------------------------------------------------------ encoding


@dataclass(frozen=True, slots=True)
class Piece:
    """One frame of a shipment: entries start to end of a segment."""

    segment: ExportSegment | PairSegment
    start: int
    end: int

    def encode(self) -> bytes:
        return self.segment.encode(self.start, self.end)

    @property
    def count(self) -> int:
        return self.end - self.start


class ExportSegment:
    """A table's export (kinds, key_data, offsets, positions, values): cut by its
    offsets, each frame's bytes known without encoding it."""

    def __init__(self, buffers) -> None:
        self.kinds, self.data, self.offsets, _, self.values = buffers

    def __len__(self) -> int:
        return len(self.kinds)

    def nbytes(self, start: int, end: int) -> int:
        """At most the frame's bytes (its values as int64)."""
        return frame_bytes(end - start, self.offsets[end] - self.offsets[start])

    def encode(self, start: int, end: int) -> bytes:
        return encode_slice(self.kinds, self.data, self.offsets, self.values, start, end)

    def pieces(self, max_entries: int, max_bytes: int) -> Iterator[Piece]:
        start, n = 0, len(self)
        while start < n:
            stop = min(n, start + max_entries)
            fits = bisect_right(range(start + 1, stop + 1), max_bytes,
                                key=lambda end: self.nbytes(start, end))
            end = start + max(1, fits)
            yield Piece(self, start, end)
            start = end


class SlicedSegment:
    """An export made a slice at a time as it is read (a table's cut,
    node.core.table_state.CutView): each slice cut by its offsets when the plan
    reaches it."""

    def __init__(self, view) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def pieces(self, max_entries: int, max_bytes: int) -> Iterator[Piece]:
        for buffers in self.view.slices(max_entries):
            yield from ExportSegment(buffers).pieces(max_entries, max_bytes)


class PairSegment:
    """Entries as two lists (a dict's keys and states as the plan was made): a frame
    is encoded to learn its bytes."""

    def __init__(self, keys: list, states: list) -> None:
        self.keys, self.states = keys, states
        self._last = 1                 # entries in the last frame cut by its bytes

    def __len__(self) -> int:
        return len(self.keys)

    def encode(self, start: int, end: int) -> bytes:
        return encode_pairs(self.keys[start:end], self.states[start:end])

    def pieces(self, max_entries: int, max_bytes: int) -> Iterator[Piece]:
        """Cut as a table's export is (the most entries whose frame, values as int64,
        fits) while every entry fits the columns: the same entries in the same frames,
        byte for byte; else halved until the frame fits."""
        start, n = 0, len(self)
        while start < n:
            end = min(n, start + max_entries)
            keys, states = self.keys[start:end], self.states[start:end]
            if set(map(type, keys)) <= _KEY_TYPES and set(map(type, states)) == {int} \
                    and _INT64[0] <= min(states) and max(states) < _INT64[1]:
                offsets = key_blob(keys)[2]
                fits = bisect_right(range(1, end - start + 1), max_bytes,
                                    key=lambda j: frame_bytes(j, offsets[j]))
                end = start + max(1, fits)
            else:
                end = start + self._fitting(start, end, max_bytes)
            yield Piece(self, start, end)
            start = end

    def _fitting(self, start: int, end: int, max_bytes: int) -> int:
        """How many entries from `start` (at most to `end`, at least one) fit
        `max_bytes` when encoded: windows doubling from the last frame's count, then
        narrowed by the bytes an entry took, so the encodes cost about twice the frame's bytes
        (not the whole range's once per halving: a range of a few states of 4 MiB
        held a node's loop 200 ms a piece)."""
        fits, fit_size, k = 0, 0, min(end - start, self._last)   # the last frame's count first
        while True:
            size = len(self.encode(start, start + k))
            if size > max_bytes:
                break
            fits, fit_size = k, size
            if start + k >= end or (k == self._last and 2 * size > max_bytes):
                self._last = k
                return k
            k = min(end - start, 2 * k)
        while k - fits > 1 and fits * 17 < k * 16:    # within a sixteenth: enough
            # fits entries fit, k do not: guess between them by bytes per entry
            guess = fits + (max_bytes - fit_size) * (k - fits) // (size - fit_size)
            guess = max(fits + 1, min(k - 1, guess))
            guess_size = len(self.encode(start, start + guess))
            if guess_size > max_bytes:
                k, size = guess, guess_size
            else:
                fits, fit_size = guess, guess_size
        self._last = max(1, fits)
        return self._last


def segments(states) -> list:
    """The segments of a checkpoint's states: a table's export as it is, each dict
    layer's keys and states as two lists (a copy as of now), anything else by its
    items."""
    layers = states.layers if hasattr(states, "layers") else (states,)
    out: list = []
    for layer in layers:
        if hasattr(layer, "slices"):
            out.append(SlicedSegment(layer))
        elif isinstance(layer, ExportView):
            out.append(ExportSegment(layer.buffers))
        elif isinstance(layer, dict):
            out.append(PairSegment(list(layer), list(layer.values())))
        else:
            pairs = list(layer.items())
            out.append(PairSegment([k for k, _ in pairs], [s for _, s in pairs]))
    return [s for s in out if len(s)]


def plan(states, max_entries: int, max_bytes: int) -> Iterator[Piece]:
    """The frames of a checkpoint's states, in order, each of at most `max_entries`
    entries and `max_bytes` bytes (an entry larger alone in its frame); at least one
    (empty when there are no entries)."""
    any_piece = False
    for segment in segments(states):
        for piece in segment.pieces(max_entries, max_bytes):
            any_piece = True
            yield piece
    if not any_piece:
        yield Piece(PairSegment([], []), 0, 0)
