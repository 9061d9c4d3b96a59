"""Tuple batches: how a mapper encodes them and how a node checks and decodes them.

A batch holds the tuples of one source for one token range. The payload is in one of
two formats, told apart by its first byte: format 1, msgpack `[keys, values]`, and
format 2, columns (`node/core/columns.py`: str or bytes keys, int64 values, decoded
without a Python object per tuple). Replicas keep payloads as they came and decode them
on a takeover, so every format ever accepted stays decodable. The seqs travel separately and are decoded only when dedup needs
them, because a batch that is entirely new (the common case) is applied without
looking at individual seqs.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator
from dataclasses import dataclass
from io import BytesIO
from itertools import islice

import msgpack

from floering.node.core.columns import (FORMATS_SPOKEN, Columns, decode_columns, encode_columns,
                                       is_versioned, positions_of)
from floering.wire.errors import FloeError, InvalidArgument, InvalidKey, TooLarge, inert
from floering.wire.hashing import key_bytes
from floering.wire.pieces import check_pushed_keys

KEY_TYPES = frozenset((str, bytes, int))
# The payload formats a node decodes, told to a mapper in the initial metadata of its
# GetRing answer ("1,2"); a node that says nothing (before format 2) decodes format 1.
PAYLOAD_FORMATS = (1, 2)
FORMATS_METADATA = "floe-payload-formats"


def formats_said(metadata) -> frozenset[int]:
    """The payload formats a GetRing answer's initial metadata says its node decodes."""
    for key, value in metadata or ():
        if key == FORMATS_METADATA:
            try:
                return frozenset(int(f) for f in str(value).split(",") if f.strip())
            except ValueError:
                break
    return frozenset((1,))


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch as it travels from a mapper to a node: the tuples (`count` of them,
    msgpack `payload`) of one `source` for the range of `token`, with seqs `first_seq`
    to `last_seq` (`seqs` lists them when not contiguous), routed with the ring of
    `ring_stamp` on the sender's stream number `stream`. `id` is the sender's, echoed
    in the ack."""

    ring_stamp: int
    token: int
    source: str
    first_seq: int
    last_seq: int
    count: int
    payload: bytes
    seqs: bytes = b""
    stream: int = 0
    id: int = 0


@dataclass(frozen=True)
class Limits:
    max_batch_bytes: int = 4 << 20
    max_batch_tuples: int = 100_000
    max_source_bytes: int = 256
    max_backup_bytes: int = 8 << 20     # batches a replica holds until checkpoints cover them
    max_sources_per_range: int = 4096   # dedup watermarks a range keeps
    source_expiry: float = 7 * 86400.0  # a source idle this long loses its watermark
    backup_expiry: float = 300.0        # a backed-up batch its primary never applied goes
    max_stream_ahead: float = 3600.0    # seconds a stream number may run ahead of our clock
    max_sources_per_node: int = 65536   # sources whose current stream a node tracks
    piece_idle: float = 10.0            # a shared key's piece unchanged this long is folded
    max_key_bytes: int = 64 << 10       # a key's bytes (a str key's UTF-8)
    max_value_bytes: int = 1 << 20      # a format 1 value's (or state's) msgpack bytes


DEFAULT_LIMITS = Limits()
SCALARS = frozenset((int, float, bool, type(None)))


def encode_payload(keys: list, values: list) -> bytes:
    """Format 1, which every batch fits."""
    return msgpack.packb((keys, values))


def encode_batch(keys: list, values: list) -> bytes:
    """Format 2 when the tuples fit it (str or bytes keys, int64 values), else format 1."""
    columns = encode_columns(keys, values)
    if columns is None or len(columns) > DEFAULT_LIMITS.max_batch_bytes:
        return msgpack.packb((keys, values))     # (20 bytes a tuple more may not fit)
    return columns


def encode_seqs(seqs: list[int]) -> bytes:
    """Empty when contiguous: the receiver then derives them from first/last."""
    if seqs[-1] - seqs[0] + 1 == len(seqs):
        return b""
    return msgpack.packb(seqs)


def check_header(count: int, first_seq: int, last_seq: int, seqs: bytes, payload: bytes,
                 limits: Limits) -> None:
    """Cheap checks a replica runs too (it stores the payload without decoding it)."""
    if count <= 0:
        raise InvalidArgument("batch has no tuples (count must be >= 1)")
    if count > limits.max_batch_tuples:
        raise TooLarge(f"batch of {count} tuples is over the limit of {limits.max_batch_tuples}")
    if len(payload) + len(seqs) > limits.max_batch_bytes:
        raise TooLarge(f"batch of {len(payload) + len(seqs)} bytes is over the limit of "
                       f"{limits.max_batch_bytes} bytes")
    if first_seq < 1 or last_seq < first_seq:
        raise InvalidArgument(f"bad seq bounds first_seq={first_seq} last_seq={last_seq}")
    if not seqs and last_seq - first_seq + 1 != count:
        raise InvalidArgument(f"{count} tuples cannot have contiguous seqs "
                              f"{first_seq}..{last_seq} (send the seqs explicitly)")
    if seqs and last_seq - first_seq + 1 < count:
        raise InvalidArgument(f"{count} distinct seqs do not fit in {first_seq}..{last_seq}")
    if seqs:
        # Always, not only when dedup needs them: a replica replays them after a
        # failover, and a batch it could not decode then would be lost.
        decode_seqs(first_seq, last_seq, count, seqs)


def decode_batch(payload: bytes, count: int,
                 limits: Limits = DEFAULT_LIMITS) -> Columns | tuple[tuple, tuple]:
    """A format 2 payload's checked Columns, or a format 1 payload's (keys, values);
    raise InvalidArgument/InvalidKey saying what is wrong."""
    if is_versioned(payload):
        return decode_columns(payload, count, limits.max_key_bytes)
    return decode_payload(payload, count, limits)


def decode_payload(payload: bytes, count: int,
                   limits: Limits = DEFAULT_LIMITS) -> tuple[tuple, tuple]:
    """Return (keys, values) of a payload in any format, or raise InvalidArgument/
    InvalidKey saying what is wrong."""
    if is_versioned(payload):
        return decode_columns(payload, count, limits.max_key_bytes).to_tuples()
    keys, values = unpack_payload(payload, count)
    check_tuples(keys, values, len(payload), limits)
    return keys, values


def unpack_payload(payload: bytes, count: int) -> tuple[tuple, tuple]:
    """A format 1 payload's (keys, values), two arrays of `count`, not yet checked
    tuple by tuple (check_tuples does, on the whole or on consecutive slices)."""
    try:
        # use_list=False: tuples are ~3x cheaper to build than lists (the GC is the cost).
        decoded = msgpack.unpackb(payload, use_list=False, raw=False)
    except UnicodeDecodeError as exc:
        raise InvalidKey(f"payload holds a string that is not valid UTF-8: {exc}") from None
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise InvalidArgument(f"payload is not valid msgpack ({exc}); this node speaks "
                              f"payload formats {FORMATS_SPOKEN}") from None
    if type(decoded) is not tuple or len(decoded) != 2:
        raise InvalidArgument("payload must be a msgpack array [keys, values]")
    keys, values = decoded
    if type(keys) is not tuple or type(values) is not tuple:
        raise InvalidArgument("payload must be a msgpack array [keys, values] of two arrays")
    if len(keys) != count or len(values) != count:
        raise InvalidArgument(f"payload has {len(keys)} keys and {len(values)} values, "
                              f"header says {count}")
    return keys, values


def unpack_payload_steps(payload: bytes, count: int,
                         size: int) -> Generator[None, None, tuple[tuple, tuple]]:
    """unpack_payload, read `size` tuples' keys or values a step (yielding between):
    the same tuples, or the same refusal (in its own words where a step finds it)."""
    unpacker = msgpack.Unpacker(BytesIO(payload), read_size=min(len(payload), 1 << 20),
                                use_list=False, raw=False, max_buffer_size=len(payload))
    try:
        if unpacker.read_array_header() != 2:
            raise InvalidArgument("payload must be a msgpack array [keys, values]")
        columns = []
        for _ in range(2):
            n = unpacker.read_array_header()
            if n != count:
                raise InvalidArgument(f"payload has {n} keys or values, header says {count}")
            column: list = []
            while len(column) < n:
                got = list(islice(unpacker, min(size, n - len(column))))
                if not got:
                    raise InvalidArgument("payload is cut short")
                column += got
                yield
            columns.append(tuple(column))
        if unpacker.tell() != len(payload):
            raise InvalidArgument("payload has bytes past its [keys, values]")
    except UnicodeDecodeError as exc:
        raise InvalidKey(f"payload holds a string that is not valid UTF-8: {exc}") from None
    except FloeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise InvalidArgument(f"payload is not valid msgpack ({exc}); this node speaks "
                              f"payload formats {FORMATS_SPOKEN}") from None
    return columns[0], columns[1]


def check_tuples(keys, values, payload_bytes: int, limits: Limits = DEFAULT_LIMITS) -> None:
    """The checks of decoded format 1 tuples (key types, reserved keys, key and value
    sizes), per tuple: a batch passes them whole exactly when each of its slices does."""
    types = set(map(type, keys))
    bad = types - KEY_TYPES
    if bad:
        names = ", ".join(sorted(t.__name__ for t in bad))
        raise InvalidKey(f"keys must be str, bytes or int, got {names}")
    if bytes in types:
        check_pushed_keys(keys)
    # No key or value can be larger than the payload: most batches skip these checks.
    if payload_bytes > limits.max_key_bytes:
        check_key_sizes(keys, types, limits.max_key_bytes)
    if payload_bytes > limits.max_value_bytes:
        check_value_sizes(values, limits.max_value_bytes)


def check_key_sizes(keys, types, most: int) -> None:
    sized = keys if int not in types else [k for k in keys if type(k) is not int]
    if not sized or max(map(len, sized)) <= most // 4:   # a str's UTF-8: <= 4 bytes a char
        return
    for key in sized:
        if len(key) > most // 4 and len(key_bytes(key)) > most:
            raise InvalidKey(f"key {inert(key)} of {len(key_bytes(key))} bytes is over the "
                             f"limit of {most} bytes")


def check_value_sizes(values, most: int) -> None:
    if set(map(type, values)) <= SCALARS:
        return
    for value in values:
        if type(value) not in SCALARS and len(msgpack.packb(value)) > most:
            raise InvalidArgument(f"a value of {len(msgpack.packb(value))} bytes is over the "
                                  f"limit of {most} bytes")


def decode_seqs(first_seq: int, last_seq: int, count: int, seqs: bytes):
    """The seqs of a batch: a range when contiguous, else the decoded, checked array."""
    if not seqs:
        return range(first_seq, last_seq + 1)
    try:
        decoded = msgpack.unpackb(seqs, use_list=False)
    except Exception as exc:
        raise InvalidArgument(f"seqs are not valid msgpack: {exc}") from None
    if type(decoded) is not tuple or len(decoded) != count:
        raise InvalidArgument(f"seqs must be an array of {count} integers")
    if decoded[0] != first_seq or decoded[-1] != last_seq:
        raise InvalidArgument("seqs do not start at first_seq and end at last_seq")
    # Every batch's seqs are checked, so this runs at C speed (about 60 us for 1000
    # seqs): unsigned 64-bit integers, sorted, no two equal.
    try:
        array("Q", decoded)
        increasing = sorted(decoded) == list(decoded) and len(set(decoded)) == count
    except (TypeError, OverflowError):
        increasing = False
    if not increasing:
        raise InvalidArgument("seqs must be strictly increasing integers")
    return decoded


def group_by_part(parts, keys, values, seqs) -> dict:
    """Cut a batch's tuples by the part each belongs to (after a token split), keeping
    their order and seqs: part -> (keys, values, seqs)."""
    grouped: dict = {}
    for part, key, value, seq in zip(parts, keys, values, seqs):
        k, v, s = grouped.setdefault(part, ([], [], []))
        k.append(key)
        v.append(value)
        s.append(seq)
    return grouped
