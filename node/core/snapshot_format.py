"""The snapshot file `floe export` writes and `floe import` reads. Pure: bytes in,
values out, every field checked as hostile input and every size bounded.

    magic "FLOESNAP", format version (u16)
    header:   u32 length, msgpack map, u32 CRC32 of the map
    sections: "S", u32 length, msgpack [token, chunk, chunks, watermarks, entries],
              u32 CRC32 of the body. A range is chunks 1..chunks, in order; its first
              section carries its watermarks ({source: seq}), the others {};
              entries are as the wire carries them: msgpack [keys, states], or
              (format 2) a frame of column states (node.core.state_wire: a table
              reducer's range as its checkpoints carry it).
    trailer:  "E", u32 sections, u64 entries, sha256 of every byte before the trailer

The header names the reducer, the balancer and the ring the snapshot was read from
(version, stamp, members, tokens). A reader checks the whole file (`verify`) before
it uses any of it (`read`, `sections`)."""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import msgpack

from floering.node.core.batch import KEY_TYPES
from floering.wire.errors import InvalidArgument
from floering.wire.pieces import check_pushed_keys
from floering.node.core.state_wire import decode, is_frame

MAGIC = b"FLOESNAP"
FORMAT_VERSION = 2
READABLE = (1, 2)               # format 1: entries are msgpack [keys, states] only
MAX_HEADER = 1 << 20            # bytes of the header map
MAX_SECTION = 64 << 20          # bytes of one section's body (a chunk is ~1 MiB)
MAX_SECTIONS = 1 << 24
MAX_RANGES = 1 << 16            # tokens a ring holds, at most, in a snapshot
MAX_CHUNKS = 1 << 20            # chunks of one range
MAX_WATERMARKS = 1 << 16        # sources of one range
MAX_NAME = 1024                 # characters of a source, a reducer, a node id
SEQ_LIMIT = 1 << 64
IMPORT_SOURCE = "import:"       # a range's mark of the chunks of a snapshot merged in


def is_import_mark(source: str) -> bool:
    """Whether a watermark is a range's mark of a snapshot import
    (node.core.snapshots.import_mark): it never expires, since without it a resumed
    import would merge the chunks it counts again."""
    return source.startswith(IMPORT_SOURCE)

_U32 = struct.Struct(">I")
_TRAILER = struct.Struct(">cIQ32s")


class SnapshotError(InvalidArgument):
    """The file is not a whole, intact snapshot of this format."""


@dataclass(frozen=True)
class Header:
    reducer: str
    balancer: str
    ring_version: int
    ring_stamp: int
    nodes: tuple[str, ...]
    tokens: tuple[int, ...]
    created: float
    # The reducer with its arguments as the ring records it (node.core.reducers.
    # reducer_identity), "" when the ring recorded none.
    reducer_identity: str = ""

    def to_map(self) -> dict:
        return dict(format=FORMAT_VERSION, reducer=self.reducer, balancer=self.balancer,
                    ring_version=self.ring_version, ring_stamp=self.ring_stamp,
                    nodes=list(self.nodes), tokens=list(self.tokens), created=self.created,
                    reducer_identity=self.reducer_identity)


@dataclass(frozen=True)
class Section:
    token: int
    chunk: int
    chunks: int
    watermarks: dict
    entries: bytes


def _name(value, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_NAME:
        raise SnapshotError(f"{what} must be a string of 1 to {MAX_NAME} characters")
    return value


def _u64(value, what: str) -> int:
    if type(value) is not int or not 0 <= value < SEQ_LIMIT:
        raise SnapshotError(f"{what} must be an integer in [0, 2^64)")
    return value


def check_watermarks(marks, limit: int = MAX_WATERMARKS) -> dict[str, int]:
    """{source: seq} with at most `limit` sources, each named 1..MAX_NAME characters,
    each seq in [0, 2^64); SnapshotError (INVALID_ARGUMENT) otherwise."""
    if not isinstance(marks, dict):
        raise SnapshotError("watermarks must be a map {source: seq}")
    if len(marks) > limit:
        raise SnapshotError(f"{len(marks)} watermarks in a range, over the limit of {limit}")
    return {_name(s, "a watermark's source"): _u64(q, "a watermark's seq")
            for s, q in marks.items()}


def check_keys(keys) -> None:
    """Keys as a push may carry them: str, bytes or int, the reserved mark only on a
    well-formed piece of a shared key (an outgoing key of a fold on its way is not
    taken: export once folds are done)."""
    types = set(map(type, keys))
    if types - KEY_TYPES:
        raise SnapshotError(f"keys must be str, bytes or int, got "
                            f"{', '.join(sorted(t.__name__ for t in types - KEY_TYPES))}")
    if bytes in types:
        try:
            check_pushed_keys(keys)
        except InvalidArgument as exc:
            raise SnapshotError(str(exc)) from None


def _unreadable(version) -> str:
    newer = type(version) is int and version > FORMAT_VERSION
    return (f"snapshot format {version!r}; this floe reads formats "
            f"{', '.join(map(str, READABLE))}"
            + ("; the file was written by a newer floe: import it with that" if newer else ""))


def parse_header(raw) -> Header:
    if not isinstance(raw, dict):
        raise SnapshotError("the header is not a map")
    if raw.get("format") not in READABLE:
        raise SnapshotError(_unreadable(raw.get("format")))
    nodes, tokens = raw.get("nodes"), raw.get("tokens")
    if not isinstance(nodes, (list, tuple)) or not isinstance(tokens, (list, tuple)) \
            or not 0 < len(tokens) <= MAX_RANGES or len(nodes) > MAX_RANGES:
        raise SnapshotError(f"the header must list 1 to {MAX_RANGES} tokens and the members")
    tokens = tuple(_u64(t, "a token") for t in tokens)
    if list(tokens) != sorted(set(tokens)):
        raise SnapshotError("the header's tokens must be distinct and in order")
    created, identity = raw.get("created"), raw.get("reducer_identity", "")
    if not isinstance(created, (int, float)) or type(created) is bool:
        raise SnapshotError("the header's creation time must be a number")
    return Header(_name(raw.get("reducer"), "the reducer"),
                  _name(raw.get("balancer"), "the balancer"),
                  _u64(raw.get("ring_version"), "the ring version"),
                  _u64(raw.get("ring_stamp"), "the ring stamp"),
                  tuple(_name(n, "a member") for n in nodes), tokens, float(created),
                  _name(identity, "the reducer's identity") if identity else "")


def parse_section(body: bytes) -> Section:
    try:
        raw = msgpack.unpackb(body, use_list=False, strict_map_key=False)
    except Exception as exc:
        raise SnapshotError(f"a section is not valid msgpack: {exc}") from None
    if type(raw) is not tuple or len(raw) != 5:
        raise SnapshotError("a section must be [token, chunk, chunks, watermarks, entries]")
    token, chunk, chunks, marks, entries = raw
    token = _u64(token, "a section's token")
    if type(chunks) is not int or not 1 <= chunks <= MAX_CHUNKS \
            or type(chunk) is not int or not 1 <= chunk <= chunks:
        raise SnapshotError(f"a section must be chunk 1..chunks of its range "
                            f"(chunks at most {MAX_CHUNKS})")
    marks = check_watermarks(marks)
    if chunk > 1 and marks:
        raise SnapshotError("only a range's first section carries its watermarks")
    if type(entries) is not bytes:
        raise SnapshotError("a section's entries must be bytes")
    return Section(token, chunk, chunks, marks, entries)


# ---------------------------------------------------------------- writing

class Writer:
    """Writes a snapshot to a binary file: the header, then `add` per chunk of each
    range in order, then `close` for the trailer."""

    def __init__(self, out: BinaryIO, header: Header) -> None:
        self.out, self.digest = out, hashlib.sha256()
        self.sections = self.entries = 0
        body = msgpack.packb(header.to_map())
        self._put(MAGIC + struct.pack(">H", FORMAT_VERSION) + _U32.pack(len(body)) + body
                  + _U32.pack(zlib.crc32(body)))

    def _put(self, data: bytes) -> None:
        self.digest.update(data)
        self.out.write(data)

    def add(self, token: int, chunk: int, chunks: int, watermarks: dict, entries: bytes,
            count: int) -> None:
        body = msgpack.packb((token, chunk, chunks, watermarks, entries))
        if len(body) > MAX_SECTION:
            raise SnapshotError(f"a chunk of {len(body)} bytes, over {MAX_SECTION}")
        self._put(b"S" + _U32.pack(len(body)) + body + _U32.pack(zlib.crc32(body)))
        self.sections += 1
        self.entries += count

    def close(self) -> str:
        """Write the trailer; returns the snapshot's id (hex sha256 of the file)."""
        tail = _TRAILER.pack(b"E", self.sections, self.entries, self.digest.digest())
        self.out.write(tail)
        return hashlib.sha256(self.digest.digest() + tail).hexdigest()


# ---------------------------------------------------------------- reading

def _read(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise SnapshotError(f"the file ends inside {what}: truncated")
    return data


def _walk(f: BinaryIO, digest) -> Iterator[tuple[str, Header | bytes | tuple[int, str]]]:
    """("header", Header), ("section", body bytes) ..., ("trailer", (sections, sha))."""
    start = _read(f, len(MAGIC) + 2, "the magic")
    if start[:len(MAGIC)] != MAGIC:
        raise SnapshotError("not a floe snapshot (no FLOESNAP magic)")
    (version,) = struct.unpack(">H", start[len(MAGIC):])
    if version not in READABLE:
        raise SnapshotError(_unreadable(version))
    (size,) = _U32.unpack(_read(f, 4, "the header"))
    if size > MAX_HEADER:
        raise SnapshotError(f"a header of {size} bytes, over {MAX_HEADER}")
    body = _read(f, size, "the header")
    crc = _read(f, 4, "the header")
    if _U32.unpack(crc)[0] != zlib.crc32(body):
        raise SnapshotError("the header's checksum does not match: corrupt")
    digest.update(start + _U32.pack(size) + body + crc)
    try:
        raw = msgpack.unpackb(body, strict_map_key=False)
    except Exception as exc:
        raise SnapshotError(f"the header is not valid msgpack: {exc}") from None
    yield "header", parse_header(raw)
    n = 0
    while True:
        tag = _read(f, 1, "a section")
        if tag == b"E":
            rest = _read(f, _TRAILER.size - 1, "the trailer")
            _, sections, entries, sha = _TRAILER.unpack(tag + rest)
            if f.read(1):
                raise SnapshotError("bytes after the trailer: corrupt")
            if sections != n or sha != digest.digest():
                raise SnapshotError("the trailer's count or sha256 does not match the "
                                    "file: corrupt")
            yield "trailer", (entries, hashlib.sha256(sha + tag + rest).hexdigest())
            return
        if tag != b"S":
            raise SnapshotError("a section does not start with S: corrupt")
        (size,) = _U32.unpack(_read(f, 4, "a section"))
        if size > MAX_SECTION:
            raise SnapshotError(f"a section of {size} bytes, over {MAX_SECTION}")
        n += 1
        if n > MAX_SECTIONS:
            raise SnapshotError(f"more than {MAX_SECTIONS} sections")
        body = _read(f, size, "a section")
        crc = _read(f, 4, "a section")
        if _U32.unpack(crc)[0] != zlib.crc32(body):
            raise SnapshotError(f"section {n}'s checksum does not match: corrupt")
        digest.update(tag + _U32.pack(size) + body + crc)
        yield "section", body


def entry_count(entries: bytes) -> int:
    """How many entries msgpack [keys, states] or a frame of column states holds,
    from its headers (a frame is checked whole: `state_wire.decode`)."""
    if is_frame(entries):
        return decode(entries).count
    try:
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(entries), 1))
        unpacker.feed(entries)
        if unpacker.read_array_header() != 2:
            raise ValueError("not a pair")
        return unpacker.read_array_header()
    except Exception:
        raise SnapshotError("a section's entries are not msgpack [keys, states]") from None


def _checked(f: BinaryIO) -> Iterator[tuple[str, Header | Section | tuple[int, str]]]:
    """("header", Header), ("section", Section) ..., then ("trailer", (entries, id))
    once the whole file passed: every checksum and field, each range's chunks whole
    and in order, exactly the header's tokens, the trailer's count and sha256 of
    exactly the bytes read."""
    header: Header | None = None
    seen: set[int] = set()
    expect: tuple[int, int, int] | None = None
    total = 0
    for kind, value in _walk(f, hashlib.sha256()):
        if isinstance(value, Header):
            header = value
            yield kind, value
        elif header is None:                  # _walk yields the header first
            raise SnapshotError("no header before the ranges: corrupt")
        elif isinstance(value, bytes):
            s = parse_section(value)
            total += entry_count(s.entries)
            if expect is None:
                if s.chunk != 1 or s.token in seen or s.token not in header.tokens:
                    raise SnapshotError(f"a range of token {s.token} out of place: corrupt")
                seen.add(s.token)
            elif (s.token, s.chunk, s.chunks) != expect:
                raise SnapshotError(f"range {s.token}'s chunks out of order: corrupt")
            expect = None if s.chunk == s.chunks else (s.token, s.chunk + 1, s.chunks)
            yield kind, s
        else:
            if expect is not None or seen != set(header.tokens):
                raise SnapshotError("the file lacks some ranges or chunks: truncated")
            entries, snapshot_id = value
            if entries != total:
                raise SnapshotError(f"the trailer counts {entries} entries, the sections "
                                    f"hold {total}: corrupt")
            yield kind, (entries, snapshot_id)
            return
    raise SnapshotError("no trailer: truncated")


def checked_walk(f: BinaryIO) -> Iterator[tuple[str, Header | Section | tuple[int, str]]]:
    """("header", Header), ("section", Section) ..., ("trailer", (entries, id)) of a
    file read once, each given as soon as it is read (`f` then stands just past it) and
    checked as far as it goes: the file is whole and intact only once the trailer
    comes (a reader acting on a section before then drops what it did on an error)."""
    return _checked(f)


def verify(f: BinaryIO) -> tuple[Header, str, int]:
    """Read the whole file and check it (`_checked`). Returns (header, snapshot id,
    entries)."""
    header, _, snapshot_id, entries = read(f, keep=False)
    return header, snapshot_id, entries


def read(f: BinaryIO, keep: bool = True) -> tuple[Header, list[Section], str, int]:
    """(header, sections, snapshot id, entries) of a file read once, from where `f`
    stands, and checked whole (`_checked`) before any of it is returned: the sections
    are exactly the bytes the trailer's sha256 and the id cover, whatever happens to
    the file after (`keep=False`: the sections are not kept)."""
    header: Header | None = None
    parts: list[Section] = []
    for _, value in _checked(f):
        if isinstance(value, Header):
            header = value
        elif isinstance(value, Section):
            if keep:
                parts.append(value)
        elif header is not None:
            entries, snapshot_id = value
            return header, parts, snapshot_id, entries
    raise AssertionError("unreachable: _checked ends with the trailer after the header")


def sections(f: BinaryIO) -> list[Section]:
    """The sections of a file, read once and checked whole (trailer included) before
    the first is returned."""
    return read(f)[1]
