"""Payload format 2: a batch's tuples as columns, decoded without a Python object per
tuple.

A payload starts with FORMAT_MARK (0xc1, a byte msgpack never uses, so no format 1
payload begins with it) and a format number; format 2 continues with the msgpack array
[kinds, key_data, offsets, positions, values] of five `bin` fields:

- kinds: one byte for the whole batch, or one per tuple: 0 a str key, 1 a bytes key;
- key_data: every key's bytes (a str key's UTF-8) one after the other;
- offsets: count + 1 little-endian uint64, key i being key_data[offsets[i]:offsets[i+1]]
  (8 bytes, not 4: the node hashes and tables them as they come, where converting 4-byte
  offsets cost more than the hashing);
- positions: count little-endian uint64, each its key's ring position (mmh3 of its bytes);
- values: count little-endian int64.

`decode_columns` checks everything a node relies on (sizes that agree, monotone
offsets, positions that are their keys' hashes, UTF-8 str keys, key sizes, the reserved
mark) and refuses the batch whole, naming what is wrong.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Generator, Iterable

import msgpack

from floering.wire.errors import InvalidArgument, InvalidKey
from floering.wire.pieces import RESERVED, check_pushed_keys

from floering.node.core.columnar import hash_positions

FORMAT_MARK = 0xC1
FORMAT_COLUMNS = 2
STR, BYTES = 0, 1
FORMATS_SPOKEN = "1 (msgpack [keys, values]) and 2 (columns: 0xc1 0x02 ...)"
HEADER = bytes((FORMAT_MARK, FORMAT_COLUMNS))
_LITTLE = sys.byteorder == "little"


def _array(raw: bytes, code: str) -> array:
    """`raw` (little-endian) as an array: a copy at memcpy speed, iterated at C speed
    (a memoryview cast to the type is several times slower to read)."""
    arr = array(code)
    arr.frombytes(raw)
    if not _LITTLE:
        arr.byteswap()
    return arr


def _raw(arr: array) -> bytes:
    if not _LITTLE:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


@dataclass(frozen=True, slots=True)
class Columns:
    """A decoded, checked format 2 batch: no Python object per tuple. `kinds` is one
    byte (STR or BYTES) for the batch or one per tuple; the arrays are the node's own
    (copied from the payload), to read, not to change."""

    kinds: bytes
    key_data: bytes
    offsets: array           # "Q", count + 1
    positions: array         # "Q", count
    values: array            # "q", count

    @property
    def count(self) -> int:
        return len(self.values)

    def keys(self) -> tuple:
        data = self.key_data
        bounds = self.offsets.tolist()         # (a list's items are read fastest)
        cuts = zip(bounds, bounds[1:])
        if len(self.kinds) == 1:
            if self.kinds[0] == BYTES:
                return tuple([data[a:b] for a, b in cuts])
            if data.isascii():
                text = data.decode("ascii")
                return tuple([text[a:b] for a, b in cuts])
            return tuple([data[a:b].decode() for a, b in cuts])
        return tuple([data[a:b] if kind == BYTES else data[a:b].decode()
                      for kind, (a, b) in zip(self.kinds, cuts)])

    def table_kinds(self) -> bytes:
        """One kind byte per key (the state table's form)."""
        return self.kinds * self.count if len(self.kinds) == 1 else self.kinds

    def to_tuples(self) -> tuple[tuple, tuple]:
        """(keys, values) as a format 1 payload decodes to."""
        return self.keys(), tuple(self.values)


def key_kind(key) -> int | None:
    kind = type(key)
    return STR if kind is str else BYTES if kind is bytes else None


def positions_of(data: list[bytes]) -> array:
    """The ring position of each key given as its bytes, hashed in one call."""
    offsets = array("Q", [0])
    offsets.extend(accumulate(map(len, data)))
    return hash_positions(b"".join(data), offsets)


def encode_columns(keys, values) -> bytes | None:
    """The format 2 payload of (keys, values), or None when they do not fit it (a key
    neither str nor bytes, a value not an int64, a str key that is not UTF-8)."""
    if not keys or set(map(type, values)) != {int}:
        return None
    try:
        vals = array("q", values)
        key_data, lengths, kind = _key_column(keys)
    except (OverflowError, UnicodeEncodeError, TypeError):
        return None
    offsets = array("Q", [0])
    offsets.extend(accumulate(lengths))
    positions = hash_positions(key_data, offsets)
    return HEADER + msgpack.packb(
        (kind, key_data, _raw(offsets), _raw(_array(memoryview(positions).tobytes(), "Q")),
         _raw(vals)),
        use_bin_type=True)


def _key_column(keys) -> tuple[bytes, Iterable[int], bytes]:
    """(key_data, the keys' byte lengths, kinds); TypeError for a key of another type."""
    try:
        text = "".join(keys)                 # all str: one join, no bytes per key
    except TypeError:
        text = None
    if text is not None:
        if text.isascii():                   # a char is a byte
            return text.encode("ascii"), map(len, keys), bytes((STR,))
        data = list(map(str.encode, keys))
        return b"".join(data), map(len, data), bytes((STR,))
    kinds = set(map(type, keys))
    if kinds == {bytes}:
        return b"".join(keys), map(len, keys), bytes((BYTES,))
    if not kinds <= {str, bytes}:
        raise TypeError("keys neither str nor bytes")
    data = [k.encode() if type(k) is str else k for k in keys]
    return b"".join(data), map(len, data), bytes(STR if type(k) is str else BYTES for k in keys)


def is_versioned(payload) -> bool:
    return len(payload) > 0 and payload[0] == FORMAT_MARK


def decode_columns(payload: bytes, count: int, max_key_bytes: int) -> Columns:
    """Decode and check a versioned payload; raise InvalidArgument (InvalidKey for a bad
    key, TooLarge for a key over `max_key_bytes`) saying what is wrong."""
    fields = _column_fields(payload, count)
    offsets, hashed = _hashed_keys(fields[1], fields[2], max_key_bytes)
    columns = _columns_of(fields, offsets, hashed)
    _check_keys(columns)
    return columns


def decode_columns_steps(payload: bytes, count: int,
                         max_key_bytes: int) -> Generator[None, None, Columns]:
    """decode_columns in four steps (yielding between): the fields read, the keys
    hashed, the hashes compared with the positions, the keys' bytes checked. At 75,000
    tuples each took 2-5 ms, the whole 9-13 ms."""
    fields = _column_fields(payload, count)
    yield
    offsets, hashed = _hashed_keys(fields[1], fields[2], max_key_bytes)
    yield
    columns = _columns_of(fields, offsets, hashed)
    yield
    _check_keys(columns)
    return columns


def _column_fields(payload: bytes, count: int) -> tuple:
    """A versioned payload's five fields, their sizes checked against `count`."""
    if count < 1:
        raise InvalidArgument("batch has no tuples (count must be >= 1)")
    if len(payload) < 2 or payload[1] != FORMAT_COLUMNS:
        got = payload[1] if len(payload) >= 2 else "none"
        raise InvalidArgument(f"payload format {got} is not one this node speaks: it "
                              f"speaks formats {FORMATS_SPOKEN}")
    try:
        fields = msgpack.unpackb(memoryview(payload)[2:], use_list=False, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise InvalidArgument(f"format 2 payload is not valid msgpack: {exc}") from None
    if type(fields) is not tuple or len(fields) != 5 or \
            not all(type(f) is bytes for f in fields):
        raise InvalidArgument("format 2 payload must be a msgpack array of 5 bin fields "
                              "[kinds, key_data, offsets, positions, values]")
    kinds, key_data, raw_offsets, raw_positions, raw_values = fields
    if len(raw_offsets) != 8 * (count + 1) or len(raw_positions) != 8 * count or \
            len(raw_values) != 8 * count:
        raise InvalidArgument(f"format 2 payload has {len(raw_offsets)} bytes of offsets, "
                              f"{len(raw_positions)} of positions and {len(raw_values)} of "
                              f"values; {count} tuples need {8 * (count + 1)}, {8 * count} "
                              f"and {8 * count}")
    if len(kinds) not in (1, count) or kinds.translate(None, b"\x00\x01"):
        raise InvalidArgument(f"format 2 kinds must be 1 or {count} bytes, each 0 (str) or "
                              f"1 (bytes)")
    return fields


def _hashed_keys(key_data: bytes, raw_offsets: bytes, max_key_bytes: int):
    """The offsets (checked: from 0 to the key data's size, in order, no key over
    `max_key_bytes`) and the keys' ring positions."""
    offsets = _array(raw_offsets, "Q")
    if offsets[0] != 0 or offsets[-1] != len(key_data):
        raise InvalidArgument(f"format 2 offsets must run from 0 to {len(key_data)} (the "
                              f"key data's size), not {offsets[0]} to {offsets[-1]}")
    try:
        hashed = hash_positions(key_data, offsets)      # checks the order, in C
    except ValueError:
        raise InvalidArgument("format 2 offsets must not decrease") from None
    if len(key_data) > max_key_bytes:
        _check_key_sizes(offsets, max_key_bytes)
    return offsets, hashed


def _columns_of(fields: tuple, offsets: array, hashed) -> Columns:
    """The Columns, once every position is its key's hash."""
    kinds, key_data, _, raw_positions, raw_values = fields
    positions = _array(raw_positions, "Q")
    if memoryview(hashed).tobytes() != positions.tobytes():
        raise InvalidArgument("a format 2 position is not its key's hash (mmh3 64-bit, x64, "
                              "seed 0, of the key's bytes)")
    return Columns(kinds, key_data, offsets, positions, _array(raw_values, "q"))


def _check_keys(columns: Columns) -> None:
    """Every str key UTF-8, no bytes key a reserved one."""
    kinds, key_data = columns.kinds, columns.key_data
    if not key_data.isascii() and STR in kinds:
        _check_utf8(columns, key_data)
    if RESERVED in key_data and BYTES in kinds:
        check_pushed_keys([k for k in columns.keys() if type(k) is bytes])


def _check_key_sizes(offsets: array, most: int) -> None:
    """No key over `most` bytes, in a bisection per `most` bytes of keys (offsets are in
    order): from key i, every key up to the last offset within `most` of offsets[i]
    fits; a key that does not is the only one left there."""
    i, last = 0, len(offsets) - 1
    while i < last:
        j = bisect_right(offsets, offsets[i] + most, i + 1) - 1
        if j == i:
            raise InvalidKey(f"key {i} of the batch, of {offsets[i + 1] - offsets[i]} bytes, "
                             f"is over the limit of {most} bytes")
        i = j


# Every byte that may begin a UTF-8 sequence (not a continuation byte 0x80-0xbf).
_LEADS = bytes(range(0x80)) + bytes(range(0xC0, 0x100))


def _check_utf8(columns: Columns, key_data: bytes) -> None:
    """Every str key's bytes are UTF-8 (surrogates refused, as a str key's encoding
    would be). One kind for all: the whole buffer is UTF-8 and every key starts on a
    character, so no key cuts one; else key by key."""
    offsets, kinds = columns.offsets, columns.kinds
    if len(kinds) == 1:
        try:
            key_data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidKey(f"a str key of the batch is not valid UTF-8: {exc.reason}") \
                from None
        size = len(key_data)
        starts = bytes(map(key_data.__getitem__, filter(size.__gt__, offsets)))
        if starts.translate(None, _LEADS):
            raise InvalidKey("a str key of the batch is not valid UTF-8: it starts inside "
                             "a character")
        return
    for i in range(columns.count):
        if kinds[i] == STR:
            try:
                key_data[offsets[i]:offsets[i + 1]].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidKey(f"str key {i} of the batch is not valid UTF-8: "
                                 f"{exc.reason}") from None
