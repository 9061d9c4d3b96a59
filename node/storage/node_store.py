"""A node's data directory: the disk as one more replica of every range it holds.

What the node keeps on disk mirrors what a replica keeps in memory
(node.core.ranges): per range a checkpointed copy (per-key state and the per-source
watermarks it covers), and every batch accepted since, as received. For a range it
backs up the copy is the primary's checkpoints; for a range it owns it is its own
checkpoints, cut in the same rounds. Coming back is then a takeover from its own
disk: the copy plus the batches past its watermarks (`NodeCore.restored`).

- `log/`: a SegmentLog of the raw batches accepted, in order, each a checksummed
  record. A batch is acknowledged only once its record is synced (group commit:
  one fsync for every batch appended meanwhile).
- `state/`: RocksDB. `V` the store's format, `I` the identity (node id,
  incarnation), `G` the ring, and per token `M<token>` (primary, watermarks) and its
  states in segments: `K<token>\\xc1<generation><part>` -> CRC32 and a frame of
  column states (node.core.state_wire), up to 65,536 entries a part. A write of
  a whole range is generation 0; a checkpoint's changed keys are the next
  generation, laid over the ones before it. Once a range's later generations hold
  more entries than its first (or 32 of them), the write folds them into a new
  generation 0 (read back from the store on the disk thread).
  Format 1 (no `V`) kept one `K<token><msgpack key>` -> msgpack state per key: such
  entries are still read, under any segment of their range (0xc1 is a byte msgpack
  never writes, so a reader of format 1 finds a range with segments corrupt,
  never empty).

Log segments are dropped once every batch in them is covered by the watermarks of
a copy written to RocksDB: the backup store's eviction, on disk.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterable

import msgpack

from floering.node.core.batch import Batch
from floering.wire.codec import pack, unpack
from floering.wire.errors import InvalidArgument
from floering.node.core.persistence_io import CopyWrite
from floering.node.core.restore import DiskCopy, batch_from_record, batch_record
from floering.node.core.reducers import Count
from floering.node.core.state_wire import (ExportView, Layers, StateColumns, StateRun,
                                           decode as decode_frame, layers_of,
                                           plan as frame_plan)
from floering.node.core.table_state import TableState
from floering.node.files import private_dir
from floering.node.storage.segment_log import CorruptLog, SegmentLog

TOKEN = struct.Struct(">Q")
IDENTITY, RING, VERSION = b"I", b"G", b"V"
META, KEYS = b"M", b"K"
FORMAT = 2                       # the format this store writes (1: an entry a key)
SEGMENT = b"\xc1"                # after K<token>: a segment, not a key (never msgpack)
_PART = struct.Struct(">QI")     # a segment's generation, its part
_CRC = struct.Struct("<I")
SEGMENT_ENTRIES = 1 << 16        # entries of one part at most
SEGMENT_BYTES = 4 << 20          # bytes of one part's frame at most (a lone entry aside)
FOLD_GENERATIONS = 32            # later generations of a range that fold it
FOLD_ENTRIES = 1 << 16           # ... or their entries past max(this, the first's)
FOLD_BUDGET = 1 << 17            # entries one write folds at most (one range at least)


def _meta_key(token: int) -> bytes:
    return META + TOKEN.pack(token)


def _key_prefix(token: int) -> bytes:
    return KEYS + TOKEN.pack(token)


def _prefix_end(token: int) -> bytes:
    return KEYS + TOKEN.pack(token + 1) if token < (1 << 64) - 1 else b"L"


def segment_key(token: int, generation: int, part: int) -> bytes:
    return _key_prefix(token) + SEGMENT + _PART.pack(generation, part)


def _is_segment(key: bytes) -> bool:
    return key[9:10] == SEGMENT


def _generation(key: bytes) -> int:
    return _PART.unpack_from(key, 10)[0]


def segment_value(frame: bytes) -> bytes:
    return _CRC.pack(zlib.crc32(frame)) + frame


def segment_states(key: bytes, value: bytes, columns: bool = False):
    """A segment's (key, state)s (with `columns`, its frame's StateColumns, the keys
    left undecoded); ValueError naming it when its checksum fails or its frame does
    not decode."""
    generation, part = _PART.unpack_from(key, 10) if len(key) == 22 else (-1, -1)
    where = f"segment {part} of generation {generation}"
    if generation < 0 or len(value) < 4:
        raise ValueError(f"a segment's key or value is cut short ({len(key)}, "
                         f"{len(value)} bytes)")
    if _CRC.unpack_from(value)[0] != zlib.crc32(memoryview(value)[4:]):
        raise ValueError(f"{where}: its checksum does not match")
    try:
        frame = decode_frame(memoryview(value)[4:])
        return frame if columns else frame.to_dict()
    except Exception as exc:
        raise ValueError(f"{where} does not decode: {exc}") from None


@dataclass
class Segments:
    """What the store holds of one range's states: the generation its next write
    takes, the entries of generation 0 (and of format 1), and of the later ones."""

    next_generation: int = 1
    first: int = 0
    later: int = 0
    generations: int = 0

    def folds(self) -> bool:
        return self.generations >= FOLD_GENERATIONS or \
            self.later > max(self.first, FOLD_ENTRIES)


def _frames(states) -> list[tuple[bytes, int]]:
    """The frames (bytes, entries) of a copy's states, each at most SEGMENT_ENTRIES
    entries and SEGMENT_BYTES bytes (a lone larger entry aside); none when empty."""
    return [(piece.encode(), piece.count)
            for piece in frame_plan(states, SEGMENT_ENTRIES, SEGMENT_BYTES) if piece.count]


def _as_dict(states) -> dict:
    return states if isinstance(states, dict) else dict(states.items())


def _any_entry(states) -> bool:
    """Whether a change holds an entry, read from its layers' sizes (no dict made)."""
    return any(layer.count if isinstance(layer, StateColumns) else len(layer)
               for layer in getattr(states, "layers", None) or [states])


def _table_layers(states) -> list | None:
    """A change's layers as a state table installs them (a table's export as a frame's
    columns, dicts as they are), or None when none of them is a table's columns."""
    out: list = []
    for layer in getattr(states, "layers", None) or [states]:
        if isinstance(layer, ExportView):
            kinds, data, offsets, _, values = layer.buffers
            out.append(StateColumns(kinds, data, offsets, values))
        elif isinstance(layer, (StateColumns, dict)):
            out.append(layer)
        else:
            return None
    return out if any(isinstance(layer, StateColumns) for layer in out) else None


_VERSION_PUT = (VERSION, FORMAT.to_bytes(1, "big"))
RUN = 1 << 15                    # entries read from RocksDB at a time at load


def _take_states(run: list, copies: dict[int, DiskCopy], corrupt: dict[int, str],
                 segments: dict[int, list]) -> bool:
    """Decode a run of `K` entries (sorted, so each token's are together) into their
    copies, keeping each token's segments (in order) in `segments` for later; False
    once past the last `K` entry. A token whose format-1 values do not decode leaves
    `copies` for `corrupt`."""
    i = 0
    while i < len(run):
        first = run[i][0]
        if not first.startswith(KEYS):
            return False
        token = TOKEN.unpack_from(first, 1)[0]
        end = bisect_left(run, (_prefix_end(token),), i)
        copy = copies.get(token)
        if copy is not None:
            part = run[i:end]
            kept = [kv for kv in part if _is_segment(kv[0])]
            if kept:
                segments.setdefault(token, []).extend(kept)
                part = [kv for kv in part if not _is_segment(kv[0])]
            try:
                copy.states.update(_decoded(part))
            except Exception as exc:
                corrupt[token] = f"a value does not decode: {exc}"
                del copies[token]
        i = end
    return True


def _lay_segments(copies: dict[int, DiskCopy], corrupt: dict[int, str],
                  segments: dict[int, list], columns: bool = False) -> dict[int, Segments]:
    """Lay each copy's segments over its format-1 entries, generation by generation;
    a token one of whose segments fails leaves `copies` for `corrupt`. Returns what
    the store holds of each copy's states. With `columns` a copy's states become a
    StateRun of its segments' frames as read (a table installs them in one call)."""
    held = {t: Segments(first=len(c.states)) for t, c in copies.items()}
    for token, entries in segments.items():
        copy = copies.get(token)
        if copy is None:
            continue
        count, generations = held[token], set()
        layers: list = [copy.states] if copy.states else []
        try:
            for key, value in entries:
                part = segment_states(key, value, columns)
                generation = _generation(key)
                size = part.count if columns else len(part)
                if generation:
                    count.later += size
                    generations.add(generation)
                else:
                    count.first += size
                if columns:
                    layers.append(part)
                elif copy.states:
                    copy.states.update(part)
                else:
                    copy.states = part
        except ValueError as exc:
            corrupt[token] = f"{exc}"
            del copies[token], held[token]
            continue
        if columns:
            copy.states = StateRun(layers)
        count.generations = len(generations)
        count.next_generation = _generation(entries[-1][0]) + 1
    return held


def _decoded(entries: list) -> zip:
    """(key, state) of every entry, decoded as two streams (one call per run, not
    two per key); a stream that does not split into one value per entry raises."""
    keys = b"".join(map(_AFTER_PREFIX, map(_KEY, entries)))
    states = b"".join(map(_VALUE, entries))
    out = []
    for data in (keys, states):
        stream = msgpack.Unpacker(None, use_list=False, strict_map_key=False,
                                  ext_hook=_ext, max_buffer_size=0)
        stream.feed(data)
        out.append(list(stream))
        if len(out[-1]) != len(entries) or stream.tell() != len(data):
            raise ValueError(f"{len(entries)} entries decode as {len(out[-1])} values")
    return zip(*out)


def _ext(code: int, data: bytes):
    """An extension (a state past 64 bits, rare): decoded by the codec's rule."""
    return unpack(msgpack.packb(msgpack.ExtType(code, data)))


_KEY, _VALUE, _AFTER_PREFIX = itemgetter(0), itemgetter(1), itemgetter(slice(9, None))


@dataclass
class Loaded:
    """Everything a data directory held, for `NodeCore.restored`."""

    node_id: str
    incarnation: int
    ring_wire: bytes | None
    copies: dict[int, DiskCopy]
    batches: list[tuple[int, Batch]]             # (token, batch), in the order accepted
    truncated: int = 0                           # bytes of torn log tail dropped
    corrupt: dict[int, str] = field(default_factory=dict)   # token -> why its copy is not


class CorruptState(Exception):
    """A data directory that cannot be trusted (a damaged log record mid-log, a copy
    that fails RocksDB's checksums or does not decode): what and where."""


def write_per_key(store: "NodeStore", copies: Iterable[CopyWrite]) -> None:
    """Copies written as format 1 did, one entry a key (no `V`): how a directory of
    an earlier floe looks, for its tests and the storage benchmark."""
    puts: list[tuple[bytes, bytes]] = []
    ranges: list[tuple[bytes, bytes]] = []
    for c in copies:
        if c.full:
            ranges.append((_key_prefix(c.token), _prefix_end(c.token)))
        prefix = _key_prefix(c.token)
        puts.extend((prefix + pack(k), pack(v)) for k, v in c.states.items())
        puts.append((_meta_key(c.token), pack((c.primary, c.watermarks, c.complete))))
    store._write(puts, ranges, sync=True)
    store.db.delete(VERSION)
    store.segments = {}


class NewerFormat(InvalidArgument):
    """A data directory written in a store format this floe does not read: not
    damaged, so never moved aside; the node refuses to start on it."""


def open_store(data_dir: str | os.PathLike) -> tuple["NodeStore", Loaded | None, str]:
    """Open a data directory and read it back. A corrupt one is never served, in
    part or whole: it is moved aside (kept for inspection) and an empty one takes
    its place, so the node starts as a new member and the ring recovers its ranges
    from their replicas, or reports them lost. Returns (store, what it held, why it
    was moved aside or "")."""
    path = Path(data_dir)
    try:
        store = NodeStore(path)
    except (CorruptLog, CorruptState) as exc:
        return _quarantine(path, str(exc))
    try:
        return store, store.load(), ""
    except (CorruptLog, CorruptState) as exc:
        store.close()
        return _quarantine(path, str(exc))


def _quarantine(path: Path, why: str) -> tuple["NodeStore", None, str]:
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(path, aside)
    return NodeStore(path), None, f"{why}; moved to {aside}"


class NodeStore:
    columns = True     # a load keeps segments as frames (False: dicts, as before)

    def __init__(self, data_dir: str | os.PathLike, segment_bytes: int | None = None) -> None:
        self.dir = Path(data_dir)
        private_dir(self.dir)
        self.log = SegmentLog(self.dir / "log", segment_bytes)   # CorruptLog: nothing open
        self.segments: dict[int, Segments] = {}   # per token; one missing is looked up
        try:
            self.db = self._open_db()
            self._check_format()
        except BaseException:
            self.log.close()
            if getattr(self, "db", None) is not None:
                self.db.close()
            raise

    def _check_format(self) -> None:
        try:
            raw = self.db.get(VERSION)
        except Exception as exc:          # RocksDB's checksums
            raise CorruptState(f"{self.dir / 'state'}: the format: {exc}") from None
        version = 1 if raw is None else int.from_bytes(raw, "big")
        if not 1 <= version <= FORMAT:
            raise NewerFormat(
                f"data directory {self.dir} is in store format {version}; this floe reads "
                f"formats 1 to {FORMAT}. Start a floe that reads it, or let this one start "
                f"the member afresh on an empty directory (floe down --wipe, or delete "
                f"{self.dir}): the ring recovers its ranges from their replicas")

    def _open_db(self):
        from rocksdict import DBRecoveryMode, Options, Rdict   # only durable nodes need it
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # As our own log's rule: a torn tail (a write never synced, so never counted
        # done) is cut, a damaged record before it refuses the whole store. RocksDB's
        # default would open silently at the last write before the damage.
        options.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
        try:
            return Rdict(str(private_dir(self.dir / "state")), options)
        except Exception as exc:
            if "Corruption" in str(exc):
                raise CorruptState(f"{self.dir / 'state'}: {exc}") from None
            raise                          # e.g. another process holds it: not a damage

    def repair(self) -> None:
        """After the disk refused a write (it was full): write the log's unsynced
        records again, and reopen RocksDB, which refuses every write after a failed
        one until reopened. Raises while the disk still fails."""
        self.log.repair()
        try:
            self.db.close()
        except Exception:      # it reports the earlier failure, and is closed all the same
            pass
        self.db = self._open_db()

    # ---------------------------------------------------------- identity

    def identity(self) -> tuple[str, int] | None:
        try:
            raw = self.db.get(IDENTITY)
        except Exception as exc:          # RocksDB's checksums
            raise CorruptState(f"{self.dir / 'state'}: the identity: {exc}") from None
        if raw is None:
            return None
        node_id, incarnation = unpack(raw)
        return node_id, incarnation

    def save_identity(self, node_id: str, incarnation: int) -> None:
        """A new member in this directory: the copies and the ring belonged to another
        and go, in the same synced write that names the new one (`reset_log` empties
        the log)."""
        self._write([(IDENTITY, pack((node_id, incarnation))), _VERSION_PUT],
                    [(b"\x00", b"\xff")], sync=True)
        self.segments = {}

    def reset_log(self) -> None:
        """Empty the log (the records belonged to another member); record numbers go
        on from where they were, so nothing logged later passes for synced."""
        first = self.log.next_seq
        self.log.drop_before(first)
        self.log.close()
        for _, path in self.log.segments:
            path.unlink()
        self.log = SegmentLog(self.log.directory, self.log.segment_bytes, first)

    # --------------------------------------------------------------- log

    def append_batch(self, b: Batch) -> int:
        """Log an accepted batch (not yet synced); returns its record number."""
        return self.log.append(pack((b.token, batch_record(b))))

    def flush(self) -> tuple[int, int, int, int]:
        """Hand what was appended to the OS (`SegmentLog.flushed`); raises OSError if
        the disk failed."""
        return self.log.flushed()

    @staticmethod
    def fsync(fd: int) -> None:
        """On a worker thread: make a flushed log durable."""
        if fd >= 0:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def sync_now(self) -> int:
        """Flush and fsync here and now; returns the last record synced."""
        self.log.sync()
        return self.log.next_seq - 1

    def drop_log_before(self, record: int) -> int:
        return self.log.drop_before(record)

    def detach_log_before(self, record: int) -> Callable[[], None]:
        """The log's segments before `record` let go now; what deletes their files
        (run on the disk's thread)."""
        paths, log = self.log.detach_before(record), self.log
        return lambda: log.remove(paths)

    # -------------------------------------------------------------- copies

    def write(self, copies: Iterable[CopyWrite], dropped: Iterable[int] = (),
              ring_wire: bytes | None = None, replace_all: bool = False) -> None:
        """One atomic, synced write: copies changed (with `replace_all`, the only
        copies left), copies gone, and the ring. A copy's states go as segments: a
        whole one as generation 0, changed keys as the range's next generation (or,
        past the fold's bound, with the range read back, as a new generation 0). Run
        on a worker thread: `states` must not change meanwhile (checkpoint fragments
        and copies taken on the event loop never do)."""
        puts: list[tuple[bytes, bytes]] = [_VERSION_PUT]
        ranges = [(KEYS, b"N")] if replace_all else []   # every K and M key
        held = {} if replace_all else dict(self.segments)
        budget = FOLD_BUDGET                 # ranges' folds spread over writes
        for c in copies:
            states, whole = c.states, c.full or replace_all
            count = Segments(next_generation=0) if whole else \
                (held.get(c.token) or self._segments_of(c.token))
            if not whole and count.folds() and budget > 0 and _any_entry(states):
                folded, entries = self._fold(c.token, states)
                if folded is not None:
                    states, whole = folded, True
                    budget -= entries
            if whole:
                if not replace_all:
                    ranges.append((_key_prefix(c.token), _prefix_end(c.token)))
                count = Segments(next_generation=0)
            frames = _frames(states)
            generation = count.next_generation
            puts.extend((segment_key(c.token, generation, n), segment_value(frame))
                        for n, (frame, _) in enumerate(frames))
            entries = sum(n for _, n in frames)
            if frames:
                held[c.token] = Segments(generation + 1,
                                         count.first + entries * (not generation),
                                         count.later + entries * (generation > 0),
                                         count.generations + (generation > 0))
            else:
                held[c.token] = Segments() if whole else count
            puts.append((_meta_key(c.token), pack((c.primary, c.watermarks, c.complete))))
        for token in dropped:
            ranges.append((_key_prefix(token), _prefix_end(token)))
            ranges.append((_meta_key(token), _meta_key(token) + b"\x00"))
            held.pop(token, None)
        if ring_wire is not None:
            puts.append((RING, ring_wire))
        try:
            self._write(puts, ranges, sync=True)
        except BaseException:
            self.segments = {}        # whether it landed is not known: looked up again
            raise
        self.segments = held

    def _segments_of(self, token: int) -> Segments:
        """What the store holds of a range not read or written by this process yet:
        its last generation, looked up (its entries are not counted)."""
        it = self.db.iter()
        it.seek_for_prev(segment_key(token, (1 << 64) - 1, (1 << 32) - 1))
        if it.valid() and it.key().startswith(_key_prefix(token) + SEGMENT):
            last = _generation(it.key())
            return Segments(last + 1, generations=last)
        return Segments(next_generation=1)

    def _fold(self, token: int, states) -> tuple:
        """(states, entries): a range's states as the store holds them with `states` over them, to write
        as one generation; (None, 0) when they do not read back whole. A table's changed
        keys (column layers) are folded as frames: the segments and the change
        installed in a scratch state table in one call each, whose export is written
        (no key decoded, no dict); other states as a dict."""
        layers = _table_layers(states)
        if layers is None:
            folded = self._read_range(token)
            if folded is None:
                return None, 0
            folded.update(_as_dict(states))
            return folded, len(folded)
        held = self._read_range(token, columns=True)
        if held is None:
            return None, 0
        scratch = TableState(Count())       # install sets states: the op is not used
        try:
            scratch.install(StateRun(layers_of(held) + layers), mark_dirty=False)
        except InvalidArgument:
            return None, 0
        view, spill = scratch.full_layers()
        return (Layers(view, spill) if spill else view), len(view) + len(spill)

    def _read_range(self, token: int, columns: bool = False):
        """A range's states as the store holds them, to fold (with `columns`, a
        StateRun of its segments' frames); None when they do not read back whole
        (then the write adds a generation, and the load names what fails)."""
        prefix, entries = _key_prefix(token), []
        copies = {token: DiskCopy(token, "", {})}
        corrupt: dict[int, str] = {}
        try:
            for k, v in self.db.items(from_key=prefix):
                if not k.startswith(prefix):
                    break
                entries.append((k, v))
            else:      # the iteration ends at a damaged block too: only its status says
                if self._stopped_by(prefix, entries[-1][0] if entries else None):
                    return None
            segments: dict[int, list] = {}
            _take_states(entries, copies, corrupt, segments)
            _lay_segments(copies, corrupt, segments, columns)
        except Exception:
            return None
        return None if corrupt else copies[token].states

    def _write(self, puts, ranges, sync: bool) -> None:
        from rocksdict import WriteBatch, WriteOptions
        batch = WriteBatch(raw_mode=True)
        for begin, end in ranges:
            batch.delete_range(begin, end)
        for k, v in puts:
            batch.put(k, v)
        options = WriteOptions()
        options.sync = sync
        self.db.write(batch, options)

    # --------------------------------------------------------------- load

    def load(self) -> Loaded | None:
        """What the directory holds, or None if it never held a member. A corrupt
        log raises CorruptLog (naming the file and byte), and a corrupt identity,
        ring or list of copies CorruptState: nothing is served partially. A copy
        whose entries fail RocksDB's checksums or do not decode is left out and
        named in `corrupt`: the range is then recovered as if we had died."""
        ident = self.identity()
        if ident is None:
            return None
        try:
            ring_wire = self.db.get(RING)
            copies, corrupt = self._copies()
        except Exception as exc:       # RocksDB's checksums, or a meta that does not decode
            raise CorruptState(f"{self.dir / 'state'}: {exc}") from None
        batches = []
        for number, raw in self.log:
            try:
                token, record = unpack(raw)
                batches.append((token, batch_from_record(token, record)))
            except Exception as exc:      # a record its checksum passed yet unreadable
                raise CorruptState(f"{self.dir / 'log'}: record {number}: {exc}") from None
        return Loaded(ident[0], ident[1], ring_wire, copies, batches, self.log.truncated,
                      corrupt)

    def _copies(self) -> tuple[dict[int, DiskCopy], dict[int, str]]:
        """Every copy, and the tokens whose copies are corrupt (with why)."""
        copies: dict[int, DiskCopy] = {}
        last = None
        for k, v in self.db.items(from_key=META):
            if not k.startswith(META):
                break
            last = k
            token = TOKEN.unpack_from(k, 1)[0]
            primary, watermarks, complete = unpack(v)
            copies[token] = DiskCopy(token, primary, dict(watermarks), complete)
        if why := self._stopped_by(META, last):
            raise CorruptState(f"the list of copies: {why}")
        corrupt: dict[int, str] = {}
        segments: dict[int, list] = {}
        self._read_states(copies, corrupt, segments)
        self.segments = _lay_segments(copies, corrupt, segments, self.columns)
        return copies, corrupt

    def _read_states(self, copies: dict[int, DiskCopy], corrupt: dict[int, str],
                     segments: dict[int, list]) -> None:
        """Every `K` entry into `copies` (format 1) or `segments`; a token whose
        entries RocksDB's checksums fail leaves `copies` for `corrupt`."""
        unread = sorted(copies)            # tokens whose entries are not all read yet
        start = KEYS
        while True:
            # Millions of keys: read in runs, each token's part of a run decoded at once.
            entries, last = self.db.items(from_key=start), None
            while run := list(islice(entries, RUN)):
                last = run[-1][0]
                if not _take_states(run, copies, corrupt, segments):
                    return                          # past the last K entry
            why = self._stopped_by(start, last)
            if why is None:
                return
            # A damaged block: the token being read goes, and reading goes on past it.
            if last is not None:
                at = TOKEN.unpack_from(last, 1)[0]
                unread = [t for t in unread if t >= at]
            if not unread:
                return
            token = unread.pop(0)
            copies.pop(token, None)
            corrupt[token] = f"{self.dir / 'state'}: {why}"
            start = _prefix_end(token)

    def _stopped_by(self, start: bytes, last: bytes | None) -> str | None:
        """Why reading from `start` ended after `last`: RocksDB's iteration just ends
        at a block failing its checksum, which only the iterator's status tells."""
        it = self.db.iter()
        it.seek(start if last is None else last)
        if last is not None and it.valid():
            it.next()
        if it.valid():
            return None
        try:
            it.status()
        except Exception as exc:
            return str(exc)
        return None

    def close(self) -> None:
        self.log.close()
        try:
            self.db.close()
        except Exception:        # it reports a write that failed earlier; closed all the same
            pass
