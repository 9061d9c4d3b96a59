"""`floe export FILE` and `floe import FILE`: a ring's state and dedup watermarks to
a file and back, into a ring of any size. Operator certificate only.

Export reads every range from its primary (ExportRange: the range's states and the
watermarks covering them, read at one point) into a snapshot file
(node.core.snapshot_format), written beside FILE and renamed into place once whole.

Import checks the whole file first (every checksum and field, the trailer), then the
target: the same reducer, and no keys anywhere unless asked (--into-state; --resume
continues a stopped import of the same file). The target ring is split at every
boundary of the snapshot it lacks, keys are re-cut to its ranges by position, and
each range takes the watermarks of the snapshot range it lies in, so a mapper
resending its stream has dropped exactly what the snapshot holds of each range, even
of an export taken under a running feed (docs/operations.md). Each range
takes its chunks in order and marks how many it holds: a chunk sent twice is merged
once, and a stopped import resumes where each range stopped."""

from __future__ import annotations

import hashlib
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc

from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.batch import KEY_TYPES
from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.wire.codec import pack, unpack, unpack_columns
from floering.wire.errors import (FloeError, InvalidArgument, ReducerMismatch, StaleRing,
                                       Unavailable)
from floering.node.core.columnar import StateTable
from floering.node.core.columnar.buffers import KIND_BYTES, in_range
from floering.wire.hashing import position
from floering.wire.pieces import RESERVED
from floering.node.core.reducers import BUILTINS
from floering.wire.ring import Ring
from floering.node.core.state_wire import (ExportSegment, PairSegment, decode, is_frame,
                                           key_blob)
from floering.node.core.table_state import TABLE_REDUCERS, pairs_of
from floering.node.core.snapshot_format import (IMPORT_SOURCE, Header, Section, SnapshotError,
                                                Writer, check_keys, check_watermarks,
                                                checked_walk, entry_count, parse_section,
                                                read)
from floering.wire.channels import MESSAGE_LIMIT, server_options, size_options
from floering.wire.status import error_from_rpc
from floering.wire.tls import TlsFiles, server_name

CALL_TIMEOUT = 60.0
MAX_MESSAGE = MESSAGE_LIMIT    # what a node sends and takes at the default settings


@contextmanager
def _channel(address: str, tls: TlsFiles | None, node: str | None = None):
    channel = grpc.secure_channel(address, tls.channel_credentials(),
                                  options=server_options(node and server_name(node))) \
        if tls else grpc.insecure_channel(address)
    try:
        yield channel
    finally:
        channel.close()


def read_ring(seeds: list[str], tls: TlsFiles | None) -> tuple[Ring, str]:
    """(ring, reducer spec): the newest view of the seeds that answer, asked at once.
    Not the first seed's: right after a ring change (a move, a takeover) one seed can
    lag behind the node a call then reaches, which refuses the older stamp."""
    last: Exception = Unavailable("no seed given")
    views = []
    with ExitStack() as stack:
        calls = [floe_pb2_grpc.ControlPlaneStub(stack.enter_context(_channel(seed, tls)))
                 .GetRing.future(floe_pb2.GetRingRequest(), timeout=10)
                 for seed in dict.fromkeys(seeds)]
        for call in calls:
            try:
                views.append(call.result())
            except grpc.RpcError as exc:
                last = error_from_rpc(exc)
    if not views:
        raise last
    view = max(views, key=lambda v: v.version)
    return Ring.from_wire(view.ring), view.reducer


def ring_changed(attempt: int) -> None:
    """A pause before reading a ring that changed under an operation again: the
    change takes a moment to reach every member."""
    time.sleep(min(0.1 * 2 ** attempt, 1.0))


def _calls(ring: Ring, tls: TlsFiles | None):
    """node -> (channel, Snapshots stub), opened as needed; close them after."""
    open_: dict = {}

    def stub(node: str):
        if node not in open_:
            # a chunk is 1 MiB, a lone large entry up to a node's message limit
            sizes = size_options(MAX_MESSAGE)
            ch = (grpc.secure_channel(ring.address(node), tls.channel_credentials(),
                                      options=server_options(server_name(node)) + sizes)
                  if tls else grpc.insecure_channel(ring.address(node), options=sizes))
            open_[node] = (ch, floe_pb2_grpc.SnapshotsStub(ch))
        return open_[node][1]
    return stub, open_


# ------------------------------------------------------------------ export

EXPORT_TRIES = 3          # whole reads of a ring that keeps changing while it is read


def export_ring(seeds: list[str], path: str, tls: TlsFiles | None) -> dict:
    """Write a snapshot of the ring at `seeds` to `path`; returns what it wrote. A ring
    that changed while it was read (a move, a split, a takeover) is read again whole,
    EXPORT_TRIES times at most."""
    for attempt in range(1, EXPORT_TRIES + 1):
        try:
            return _export_once(seeds, path, tls)
        except StaleRing:
            if attempt == EXPORT_TRIES:
                raise
            ring_changed(attempt)
    raise AssertionError("unreachable")


def _export_once(seeds: list[str], path: str, tls: TlsFiles | None) -> dict:
    began = time.monotonic()
    ring, reducer = read_ring(seeds, tls)
    header = Header(reducer, ring.balancer, ring.version, ring.stamp, tuple(ring.nodes),
                    tuple(sorted(ring.tokens)), time.time(), ring.reducer)
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    stub, open_ = _calls(ring, tls)
    keys = 0
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            writer = Writer(out, header)
            for token in header.tokens:
                keys += _export_one(stub(ring.owner_of_token(token)), ring, token, writer)
            snapshot_id = writer.close()
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
        for channel, _ in open_.values():
            channel.close()
    return dict(file=str(target), snapshot=snapshot_id, ranges=len(header.tokens), keys=keys,
                bytes=target.stat().st_size, seconds=round(time.monotonic() - began, 3),
                ring_version=ring.version, reducer=reducer)


MSGPACK, FRAMES = 1, 2    # entry formats an export's chunks come in (floe.proto)
READS = (MSGPACK, FRAMES)


def check_format(token: int, reply) -> None:
    """A chunk's entries are in the format it names (0: a node before formats were
    named, told by the bytes), one this reader asked for."""
    framed = is_frame(reply.entries)
    if reply.format not in (0, *READS) or \
            (reply.format and framed != (reply.format == FRAMES)):
        raise InvalidArgument(f"token {token}: chunk {reply.chunk} names entry format "
                              f"{reply.format}, its entries are "
                              f"{'a frame' if framed else 'not a frame'}")


def _export_one(stub, ring: Ring, token: int, writer: Writer) -> int:
    """One range's chunks, whole (the stream ended well), then written."""
    chunks: list[bytes] = []
    marks: dict[str, int] = {}
    try:
        for reply in stub.ExportRange(floe_pb2.ExportRangeRequest(
                token=token, ring_stamp=ring.stamp, formats=READS), timeout=CALL_TIMEOUT):
            if reply.chunk != len(chunks) + 1:
                raise InvalidArgument(f"token {token}: chunk {reply.chunk} out of order")
            check_format(token, reply)
            if reply.chunk == 1:
                marks = {s: q for s, q in check_watermarks(unpack(reply.watermarks)
                                                           if reply.watermarks else {}).items()
                         if not s.startswith(IMPORT_SOURCE)}
            chunks.append(reply.entries)
    except grpc.RpcError as exc:
        error = error_from_rpc(exc)
        if isinstance(error, StaleRing):
            raise StaleRing(f"the ring changed while it was exported, {EXPORT_TRIES} "
                            f"times ({error})") from None
        raise error from None
    if not chunks:
        raise Unavailable(f"token {token}: the export stream ended with no chunk")
    total = 0
    for n, entries in enumerate(chunks, 1):
        count = entry_count(entries)
        writer.add(token, n, len(chunks), marks if n == 1 else {}, entries, count)
        total += count
    return total


# ------------------------------------------------------------------ import

def read_snapshot(path: str) -> tuple[Header, list, str]:
    """(header, sections, snapshot id) of the file at `path`, read once from one open
    handle and checked whole: the sections are the very bytes the trailer's sha256
    (and so the id) covers, whatever is written to the file meanwhile."""
    with open(path, "rb") as f:
        header, parts, snapshot_id, _ = read(f)
    return header, parts, snapshot_id


def load_recut(path: str, ring: Ring, snapshot=None) -> tuple[Header, str, dict,
                                                             dict[str, int]]:
    """(header, snapshot id, {target token: its entries}, watermarks) of a file checked
    whole first (`snapshot`: what read_snapshot read of it already); SnapshotError for
    a truncated, corrupt or inconsistent one. A table reducer's frames are re-cut by
    key position (`recut_frames`: each range a ColumnRange); else, and for a format-1
    file, each range is a {key: state}."""
    header, parts, snapshot_id = snapshot or read_snapshot(path)
    marks: dict[str, int] = {}
    for s in parts:
        for source, seq in s.watermarks.items():
            if not source.startswith(IMPORT_SOURCE) and seq > marks.get(source, -1):
                marks[source] = seq
    if header.reducer in FRAMED and parts and all(is_frame(s.entries) for s in parts):
        return header, snapshot_id, recut_frames(parts, ring, header.reducer), marks
    return header, snapshot_id, recut_entries(parts, ring), marks


def recut_entries(parts, ring: Ring) -> dict[int, dict]:
    """{target token: {key: state}}: the sections' entries placed key by key."""
    ranges: dict[int, dict] = {t: {} for t in ring.tokens}
    for s in parts:
        keys, states = entry_columns(s.entries)
        check_keys(keys)
        for key, state in zip(keys, states):
            held = ranges[ring.token_for_key(key)]
            if key in held:
                raise SnapshotError(f"key {key!r:.60} is in two ranges of the snapshot")
            held[key] = state
    return ranges


class ColumnRange:
    """A target range's entries re-cut from frames: a table's export of the keys whose
    positions are in its (lo, hi] (kinds, key_data, offsets, positions, values; no
    Python object per key), and `rest`, the frames' entries outside the columns."""

    def __init__(self, buffers, rest: dict) -> None:
        self.buffers, self.rest = buffers, rest

    def __len__(self) -> int:
        return len(self.buffers[0]) + len(self.rest)

    def to_dict(self) -> dict:
        out = pairs_of(self.buffers)
        out.update(self.rest)
        return out


def recut_frames(parts, ring: Ring, reducer: str) -> dict[int, ColumnRange]:
    """{target token: ColumnRange}: every frame's columns installed into one scratch
    state table (compiled, or the pure-Python one under FLOE_PURE=1: the same entries),
    each target range exported by position as the node's split does; the frames'
    rest entries (a float, None, a big int) placed key by key. A key twice in the
    snapshot, a key that is not what its kind encodes, or a reserved bytes key that
    is not a piece: SnapshotError."""
    table = StateTable(reducer)
    columns, rest = 0, {}
    frames = [decode(s.entries) for s in parts]
    for frame in frames:
        if KIND_BYTES in frame.kinds and RESERVED in frame.key_data:
            check_keys(frame.column_keys())
        check_keys(frame.rest_keys)
        columns += len(frame.kinds)
    try:
        table.install_parts([(f.kinds, f.key_data, f.offsets, f.value_column)
                             for f in frames], mark_dirty=False)
    except (ValueError, InvalidArgument) as exc:
        raise SnapshotError(f"column states: {exc}") from None
    if len(table) != columns:
        raise SnapshotError(f"{columns - len(table)} keys are in two ranges of the snapshot")
    for frame in frames:
        for key, state in zip(frame.rest_keys, frame.rest_states):
            if key in rest or (type(key) in KEY_TYPES and key in table):
                raise SnapshotError(f"key {key!r:.60} is in two ranges of the snapshot")
            rest[key] = state
    by_token: dict[int, dict] = {t: {} for t in ring.tokens}
    for key, state in rest.items():
        by_token[ring.token_for_key(key)][key] = state
    return {t: ColumnRange(table.export(*ring.range_of_token(t)), by_token[t])
            for t in ring.tokens}


IMPORT_TRIES = 3          # rings read again when the ring changed under an import


def import_ring(seeds: list[str], path: str, tls: TlsFiles | None, *,
                into_state: bool = False, resume: bool = False) -> dict:
    """Load the snapshot at `path` into the ring at `seeds`; returns what it loaded. A
    ring that changed under the import (a node's stamp differs) is read again and the
    import goes on where each range stopped, IMPORT_TRIES times at most."""
    began = time.monotonic()
    with open(path, "rb") as f:
        plan = survey(f)
        if plan is not None:          # frames, each range's keys inside it: streamed
            out = import_streamed(seeds, f, plan, tls, into_state=into_state,
                                  resume=resume)
            return dict(file=path, **out, seconds=round(time.monotonic() - began, 3))
    calls = 0
    snapshot = read_snapshot(path)        # once: every attempt sends those bytes
    for attempt in range(1, IMPORT_TRIES + 1):
        ring, reducer = read_ring(seeds, tls)
        header, snapshot_id, ranges, _ = load_recut(path, ring, snapshot)
        check_reducer(header, reducer, ring)
        check_states(header.reducer, ranges)
        if attempt == 1 and not (into_state or resume):
            _check_empty(ring, tls)
        if cut_at_boundaries(ring, header.tokens, tls):
            ring = _ring_cut(seeds, tls, header.tokens)
            header, snapshot_id, ranges, _ = load_recut(path, ring, snapshot)
        marks = range_marks(snapshot[1], ring)
        loaded = sum(map(len, ranges.values()))
        try:
            calls += _send(ring, tls, header.reducer, snapshot_id, ranges, marks, into_state)
            break
        except StaleRing as exc:
            if _holds_state(exc) or attempt == IMPORT_TRIES:
                raise
            ring_changed(attempt)
    return dict(file=path, snapshot=snapshot_id, keys=loaded, ranges=len(ring.tokens),
                chunks=calls, sources=len({s for m in marks.values() for s in m}), ring_version=ring.version,
                seconds=round(time.monotonic() - began, 3))


def check_reducer(header: Header, reducer: str, ring: Ring) -> None:
    if header.reducer != reducer or (header.reducer_identity and ring.reducer and
                                     header.reducer_identity != ring.reducer):
        raise ReducerMismatch(f"the snapshot's reducer is "
                              f"{header.reducer_identity or header.reducer!r}, the ring "
                              f"runs {ring.reducer or reducer!r}: nothing was loaded")


def cut_at_boundaries(ring: Ring, boundaries, tls: TlsFiles | None) -> int:
    """Split the target ring at every range boundary of the snapshot it lacks, so each
    of its ranges lies inside one range of the snapshot and takes that range's
    watermarks (`range_marks`). Returns the splits made."""
    from floering.mapper.admin import split
    cuts = [b for b in boundaries if not ring.has_token(b)]
    for position in cuts:
        split(ring, position, timeout=CALL_TIMEOUT, tls=tls)
    return len(cuts)


def _ring_cut(seeds: list[str], tls: TlsFiles | None, boundaries) -> Ring:
    """The ring once a seed's view has every boundary of the snapshot."""
    deadline = time.monotonic() + CALL_TIMEOUT
    while True:
        ring, _ = read_ring(seeds, tls)
        if all(ring.has_token(b) for b in boundaries) or time.monotonic() > deadline:
            return ring         # else a stale stamp on a send reads the ring again
        time.sleep(0.05)


def range_marks(parts, ring: Ring) -> dict[int, dict[str, int]]:
    """{target token: watermarks}: each target range, inside one range of the snapshot
    (`cut_at_boundaries`), takes that range's per-source watermarks, so a mapper
    sending again what it sent before the export has exactly what the snapshot holds
    of each range dropped, and nothing else. The export reads one range after
    another, not every range at one instant: a range read later may hold more of a
    source than one read earlier, and one watermark for the whole ring would drop
    what the earlier range never held."""
    snapshot_tokens = sorted({s.token for s in parts})
    by_range = {s.token: {src: q for src, q in s.watermarks.items()
                          if not src.startswith(IMPORT_SOURCE)}
                for s in parts if s.chunk == 1}
    marks = {}
    for token in ring.tokens:
        index = bisect_left(snapshot_tokens, token) % len(snapshot_tokens)
        marks[token] = by_range.get(snapshot_tokens[index], {})
    return marks


FRAMED = frozenset(TABLE_REDUCERS.values())     # reducers whose states move as frames


def entry_columns(entries: bytes) -> tuple[list, list]:
    """A section's keys and states: msgpack [keys, states], or a frame of column
    states checked whole (state_wire.decode) and its keys decoded in bulk."""
    if not is_frame(entries):
        keys, states = unpack_columns(entries)
        return list(keys), list(states)
    frame = decode(entries)
    return (frame.column_keys() + list(frame.rest_keys),
            frame.value_column.tolist() + list(frame.rest_states))


MOST_IN_FRAME = CHUNK_BYTES // 7   # entries a frame of CHUNK_BYTES can hold (7 bytes
#                                   at least: kind, offset, a key byte, a value byte)


def column_pieces(states: "ColumnRange") -> list:
    """A ColumnRange's chunks as pieces (state_wire.Piece), each encoded when sent:
    its columns cut by their offsets, its rest after them."""
    parts: list[ExportSegment | PairSegment] = [ExportSegment(states.buffers)]
    if states.rest:
        parts.append(PairSegment(list(states.rest), list(states.rest.values())))
    return [piece for part in parts for piece in part.pieces(MOST_IN_FRAME, CHUNK_BYTES)]


class Encoded:
    """A chunk encoded already, as a piece: `encode()` gives it."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def encode(self) -> bytes:
        return self.data


def import_chunks(reducer: str, states):
    """(entries, bytes) per chunk of a range to import: frames of column states for a
    table reducer (count, sum, min, max), msgpack [keys, states] for any other. A
    ColumnRange's columns are cut by their offsets, its rest after them."""
    most = MOST_IN_FRAME
    if isinstance(states, ColumnRange):
        for piece in column_pieces(states):
            yield piece.count, piece.encode()
        return
    if reducer not in FRAMED or not states:
        yield from packed_chunks(column_slices(states), CHUNK_BYTES)
        return
    keys, values = list(states), list(states.values())
    segment: ExportSegment | PairSegment = PairSegment(keys, values)
    if set(map(type, keys)) <= {str, bytes, int} and set(map(type, values)) == {int}:
        try:                      # every entry in the columns: cut by their offsets
            column = array("q", values)
            segment = ExportSegment((*key_blob(keys), None, column))
        except OverflowError:
            pass
    for piece in segment.pieces(most, CHUNK_BYTES):
        yield piece.count, piece.encode()


def _holds_state(error: FloeError) -> bool:
    return "HoldsState" in str(error)


def _send(ring: Ring, tls, reducer: str, snapshot_id: str, ranges: dict,
          marks: dict, into_state: bool) -> int:
    """Every range's chunks to its primary, in order; a range holding some of them
    already (an import resumed) skips to the first it lacks. Returns the calls made."""
    stub, open_ = _calls(ring, tls)
    calls = 0
    try:
        for token in sorted(ranges):
            chunks = [Encoded(e) for _, e in import_chunks(reducer, ranges.pop(token))]
            calls += send_range(stub(ring.owner_of_token(token)), ring, token,
                                (reducer, snapshot_id, into_state), chunks,
                                marks.get(token, {}))
    finally:
        for channel, _ in open_.values():
            channel.close()
    return calls


def send_range(call, ring: Ring, token: int, what: tuple, chunks: list, marks: dict) -> int:
    """One range's chunks (pieces, each encoded as it is sent) to its primary `call`,
    in order, from the first it lacks; `what` is (reducer, snapshot id, into_state).
    Returns the calls made."""
    reducer, snapshot_id, into_state = what
    calls, n = 0, 1
    while n <= len(chunks):
        request = floe_pb2.ImportChunk(
            ring_stamp=ring.stamp, token=token, snapshot=snapshot_id,
            reducer=reducer, chunk=n, chunks=len(chunks), entries=chunks[n - 1].encode(),
            watermarks=pack(marks) if n == 1 else b"", into_state=into_state)
        try:
            held = call.ImportRange(request, timeout=CALL_TIMEOUT).chunks_held
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            if isinstance(error, StaleRing) and not _holds_state(error):
                raise error from None
            raise _stopped(error, token, n) from None
        del request
        calls += 1
        n = max(n, held) + 1
    return calls


def check_states(spec: str, ranges: dict) -> None:
    """A built-in reducer's checks on every state, before the first write (a custom
    reducer's states are checked by the nodes, chunk by chunk, as they merge them)."""
    cls = BUILTINS.get(spec)
    try:
        reducer = cls() if cls is not None else None
    except TypeError:                 # one that needs its arguments
        reducer = None
    if reducer is None or reducer.merge is None:
        return
    for states in ranges.values():
        try:                          # a ColumnRange's columns hold int64 states only
            reducer.check_states(list(states.rest.values()) if isinstance(states, ColumnRange)
                                 else list(states.values()))
        except InvalidArgument as exc:
            raise SnapshotError(f"{exc}: nothing was loaded") from None


def _stopped(error: FloeError, token: int, chunk: int) -> FloeError:
    return type(error)(f"import stopped at chunk {chunk} of token {token}: {error} "
                       f"(what is loaded stays; `floe import --resume` continues)")


def _check_empty(ring: Ring, tls: TlsFiles | None) -> None:
    """Refuse (before any write) a ring whose members hold keys."""
    held = {}
    for node in ring.nodes:
        with _channel(ring.address(node), tls, node) as channel:
            try:
                stats = floe_pb2_grpc.QueryPlaneStub(channel).Stats(
                    floe_pb2.StatsRequest(), timeout=10)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
        if stats.keys:
            held[node] = stats.keys
    if held:
        raise StaleRing(f"the ring holds state ({', '.join(f'{n}: {k} keys' for n, k in sorted(held.items()))}): "
                        f"nothing was loaded; --into-state adds the snapshot to it, "
                        f"--resume continues a stopped import of this file")


# ------------------------------------------------------------------ import, streamed
#
# A table reducer's file of frames (what a node's export writes) is imported one
# snapshot range at a time, never whole: a first pass checks the file (every checksum
# and field, the trailer) and each range's frames in a scratch state table (every key
# once, inside its range, states as the reducer takes them), keeping of each section
# only where it lies and the sha256 of its entries; after the cut (each target range
# inside one of the snapshot's), a second pass reads each range's sections back
# (their bytes must be those checked, else the import stops), installs them in a
# scratch table and sends each target range inside it, a chunk encoded at a time.
# Held at once: one snapshot range's states and one chunk, whatever the file's size.


class Survey:
    """The first pass over a file: its header and id, its entries, and per section
    (in order) its span in the file, its fields without the entries (`parts`) and
    the sha256 of its entries."""

    def __init__(self, header: Header) -> None:
        self.header, self.snapshot_id, self.keys = header, "", 0
        self.spans: list[tuple[int, int, bytes]] = []
        self.parts: list[Section] = []


class RangeTable:
    """One snapshot range's frames installed in a scratch state table, checked as
    recut_frames checks a whole file's; `rest` the entries outside the columns."""

    def __init__(self, reducer: str) -> None:
        self.table, self.columns = StateTable(reducer), 0
        self.rest: dict = {}

    def add(self, entries: bytes) -> None:
        frame = decode(entries)
        if KIND_BYTES in frame.kinds and RESERVED in frame.key_data:
            check_keys(frame.column_keys())
        check_keys(frame.rest_keys)
        try:
            self.table.install_parts([(frame.kinds, frame.key_data, frame.offsets,
                                       frame.value_column)], mark_dirty=False)
        except (ValueError, InvalidArgument) as exc:
            raise SnapshotError(f"column states: {exc}") from None
        self.columns += len(frame.kinds)
        if len(self.table) != self.columns:
            raise SnapshotError(f"{self.columns - len(self.table)} keys are in two ranges "
                                f"of the snapshot")
        for key, state in zip(frame.rest_keys, frame.rest_states):
            if key in self.rest:
                raise SnapshotError(f"key {key!r:.60} is in two ranges of the snapshot")
            self.rest[key] = state

    def __len__(self) -> int:
        return self.columns + len(self.rest)

    def check(self, reducer: str) -> None:
        for key in self.rest:
            if type(key) in KEY_TYPES and key in self.table:
                raise SnapshotError(f"key {key!r:.60} is in two ranges of the snapshot")
        check_states(reducer, {0: self.rest})

    def inside(self, lo: int, hi: int) -> bool:
        """Whether every key's position is in (lo, hi] (the table is emptied)."""
        self.table.discard(lo, hi)
        return not len(self.table) and all(in_range(position(k), lo, hi) for k in self.rest)


def _lower(tokens, token: int) -> int:
    return tokens[tokens.index(token) - 1]


def survey(f) -> Survey | None:
    """The first pass over the open file `f` (SnapshotError for a damaged one, or a
    range's frames failing a check), or None for a file to import whole (load_recut):
    not a table reducer's, entries not frames, or a key outside its range's bounds."""
    plan: Survey | None = None
    current: RangeTable | None = None
    start = f.tell()
    for _, value in checked_walk(f):
        end = f.tell()
        if isinstance(value, Header):
            if value.reducer not in FRAMED:
                return None
            plan = Survey(value)
        elif isinstance(value, Section) and plan is not None:
            if not is_frame(value.entries):
                return None
            if value.chunk == 1:
                current = RangeTable(plan.header.reducer)
            assert current is not None            # checked_walk: chunks 1.. in order
            current.add(value.entries)
            plan.spans.append((start, end, hashlib.sha256(value.entries).digest()))
            plan.parts.append(Section(value.token, value.chunk, value.chunks,
                                      value.watermarks, b""))
            if value.chunk == value.chunks:
                current.check(plan.header.reducer)
                plan.keys += len(current)
                if not current.inside(_lower(plan.header.tokens, value.token), value.token):
                    return None
                current = None
        elif plan is not None and isinstance(value, tuple):
            plan.snapshot_id = value[1]
            return plan
        start = end
    return None


def section_back(f, span: tuple[int, int, bytes], part: Section) -> bytes:
    """The entries of a section read again where the first pass found it, exactly
    those it checked (SnapshotError, the import stopped, if the file changed)."""
    start, end, sha = span
    f.seek(start)
    raw = f.read(end - start)
    try:
        again = parse_section(raw[5:-4]) if raw[:1] == b"S" else None
    except SnapshotError:
        again = None
    if again is None or (again.token, again.chunk, again.chunks, again.watermarks) != \
            (part.token, part.chunk, part.chunks, part.watermarks) or \
            hashlib.sha256(again.entries).digest() != sha:
        raise SnapshotError(f"the file changed since it was checked (range {part.token}, "
                            f"chunk {part.chunk}): the import stopped; what is loaded stays")
    return again.entries


def import_streamed(seeds: list[str], f, plan: Survey, tls: TlsFiles | None, *,
                    into_state: bool, resume: bool) -> dict:
    """import_ring of a surveyed file, a snapshot range at a time."""
    header, calls = plan.header, 0
    for attempt in range(1, IMPORT_TRIES + 1):
        ring, reducer = read_ring(seeds, tls)
        check_reducer(header, reducer, ring)
        if attempt == 1 and not (into_state or resume):
            _check_empty(ring, tls)
        if cut_at_boundaries(ring, header.tokens, tls):
            ring = _ring_cut(seeds, tls, header.tokens)
        marks = range_marks(plan.parts, ring)
        try:
            if not all(ring.has_token(b) for b in header.tokens):
                raise StaleRing("the ring lacks some of the snapshot's boundaries")
            calls += _send_streamed(f, plan, ring, tls, marks, into_state)
            break
        except StaleRing as exc:
            if _holds_state(exc) or attempt == IMPORT_TRIES:
                raise
            ring_changed(attempt)
    return dict(snapshot=plan.snapshot_id, keys=plan.keys, ranges=len(ring.tokens),
                chunks=calls, sources=len({s for m in marks.values() for s in m}),
                ring_version=ring.version)


def targets_in(ring: Ring, lo: int, hi: int) -> list[int]:
    """The ring's tokens in (lo, hi], wrapping (lo == hi: all)."""
    tokens = sorted(ring.tokens)
    a, b = bisect_right(tokens, lo), bisect_right(tokens, hi)
    if lo < hi:
        return tokens[a:b]
    return tokens[a:] + tokens[:b] if lo > hi else tokens


def _send_streamed(f, plan: Survey, ring: Ring, tls, marks: dict, into_state: bool) -> int:
    header = plan.header
    what = (header.reducer, plan.snapshot_id, into_state)
    stub, open_ = _calls(ring, tls)
    calls, at = 0, 0
    try:
        for token in header.tokens:
            held = RangeTable(header.reducer)
            while at < len(plan.parts) and plan.parts[at].token == token:
                held.add(section_back(f, plan.spans[at], plan.parts[at]))
                at += 1
            lo = _lower(header.tokens, token)
            rest: dict[int, dict] = {}
            for key, state in held.rest.items():
                rest.setdefault(ring.token_for_key(key), {})[key] = state
            sent = 0
            for target in targets_in(ring, lo, token):
                states = ColumnRange(held.table.export(*ring.range_of_token(target)),
                                     rest.pop(target, {}))
                sent += len(states)
                calls += send_range(stub(ring.owner_of_token(target)), ring, target, what,
                                    column_pieces(states), marks.get(target, {}))
                del states
            if sent != len(held) or rest:
                raise SnapshotError(f"range {token}: keys outside the ranges it was cut to")
    finally:
        for channel, _ in open_.values():
            channel.close()
    return calls


# ------------------------------------------------------------------ the CLI

def add_snapshot_commands(sub, seeds, tls) -> None:
    """`floe export` and `floe import`; `seeds(args)` and `tls(args, name)` as the
    other commands find the ring and credentials."""
    import json

    def cmd_export(args) -> int:
        print(json.dumps(export_ring(seeds(args), args.file, tls(args, "operator"))))
        return 0

    def cmd_import(args) -> int:
        print(json.dumps(import_ring(seeds(args), args.file, tls(args, "operator"),
                                     into_state=args.into_state, resume=args.resume)))
        return 0

    ex = sub.add_parser("export", help="write every range's state and dedup watermarks to "
                                       "FILE, a checksummed snapshot (operator)")
    ex.add_argument("file", metavar="FILE")
    ex.set_defaults(func=cmd_export)
    im = sub.add_parser("import", help="load a snapshot FILE into this ring, of any size "
                                       "(operator); nothing is loaded from a damaged file")
    im.add_argument("file", metavar="FILE")
    im.add_argument("--into-state", action="store_true",
                    help="merge into a ring that holds state already (adds the two)")
    im.add_argument("--resume", action="store_true",
                    help="continue a stopped import of this FILE")
    im.set_defaults(func=cmd_import)
