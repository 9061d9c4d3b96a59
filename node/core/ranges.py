"""Per token range state: as its primary and as one of its replicas.

A primary range applies batches (deduplicated by watermark) to layered state and
cuts incremental checkpoints. A replica range keeps the primary's last checkpoint,
the watermarks it covers and the backed-up batches past them; from these it can
rebuild exactly what the primary has, which is what a takeover does.
"""

from __future__ import annotations

import weakref
from array import array
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from floering.node.core.backup_store import BackupEntry, BackupStore
from floering.node.core.batch import (DEFAULT_LIMITS, Columns, check_tuples, decode_batch,
                                      decode_seqs, unpack_payload_steps)
from floering.node.core.columns import decode_columns_steps, is_versioned
from floering.node.core.dedup import SHARES, first_new_index, owned_by, owner_of
from floering.wire.epochs import effective_mark, floor_key, raise_floor, replay_order
from floering.wire.errors import FloeError, Overloaded, TooLarge
from floering.wire.pieces import carries_states
from floering.node.core.reducers import Reducer
from floering.node.core.snapshot_format import is_import_mark
from floering.node.core.state_store import LayeredState, ReplicaState
from floering.node.core.table_state import (TableCopy, TableState, delta_size, int64_values,
                                            key_columns, new_copy, new_state)


@dataclass
class Checkpoint:
    """One checkpoint of a primary range, ready to ship."""

    token: int
    seq: int
    states: Mapping       # keys changed since the previous checkpoint (all keys if full:
                          # a FullStates)
    watermarks: dict[str, int]
    full: bool = False


class FullStates(Mapping):
    """A full checkpoint's states: the range's master with the checkpoint's delta laid
    over it, read in place. A copy of a large range would hold the event loop for as
    long as it takes; the encoder (wire.codec) reads the `layers` in slices. Valid
    while master changes only by merging this delta: before it changes otherwise, the
    range freezes (copies) a FullStates still in use."""

    def __init__(self, master: Mapping, delta: Mapping) -> None:
        self.layers: tuple[Mapping, ...] = (master, delta)

    def freeze(self) -> None:
        full = dict(self.layers[0])
        for layer in self.layers[1:]:
            full.update(layer)
        self.layers = (full,)

    def __getitem__(self, key):
        for layer in reversed(self.layers):
            if key in layer:
                return layer[key]
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return any(key in layer for layer in self.layers)

    def __iter__(self):
        master, *over = self.layers
        yield from master
        for layer in over:
            yield from (k for k in layer if k not in master)

    def __len__(self) -> int:
        master, *over = self.layers
        return len(master) + sum(k not in master for layer in over for k in layer)


class PrimaryRange:
    def __init__(self, token: int, reducer: Reducer) -> None:
        self.token = token
        self.state = new_state(reducer)
        self.watermarks: dict[str, int] = {}
        self.checkpoint_seq = 0
        self._watermarks_at_checkpoint: dict[str, int] = {}
        # replica node id -> last checkpoint seq it acknowledged (absent: needs a full one)
        self.replica_seq: dict[str, int] = {}
        # Acks at or below these seqs are late answers about a copy that no longer
        # counts: per node that stopped being a replica meanwhile, and for every node
        # after a split (they acked the whole range, not this part).
        self.ack_floor: dict[str, int] = {}
        self.min_ack = 0
        self._forced = False
        # When each source (and epoch group floor) last had a tuple applied here, for
        # expiring idle ones. Not checkpointed: a new primary counts from its takeover.
        self.last_seen: dict[str, float] = {}
        self.cut_at = 0.0                 # when the last checkpoint was cut
        self._full: weakref.ref[FullStates] | None = None   # the last FullStates handed out

    def force_checkpoint(self) -> None:
        """Cut a checkpoint next round even if nothing changed (a handoff's final one)."""
        self._forced = True

    def apply(self, source: str, first_seq: int, last_seq: int, count: int,
              payload: bytes, seqs: bytes, verify=None, now: float = 0.0,
              max_sources: int = 1 << 62) -> tuple[int, int]:
        """Apply a batch; return (applied, duplicates). Raises before changing anything
        when the batch is malformed. `verify(keys)` may refuse keys outside the range."""
        return drain(self.apply_steps(source, first_seq, last_seq, count, payload, seqs,
                                      verify, now, max_sources))

    def apply_steps(self, source: str, first_seq: int, last_seq: int, count: int,
                    payload: bytes, seqs: bytes, verify=None, now: float = 0.0,
                    max_sources: int = 1 << 62) -> Generator[None, None, tuple[int, int]]:
        """apply() a step at a time, yielding between steps; returns (applied,
        duplicates). A batch of more than STEP_TUPLES tuples is decoded, checked, its
        keys verified and (format 1) its key columns built over several steps that
        change nothing; the last step applies it whole, its dedup and room taken
        again then. A caller that runs other work between steps checks the range is
        still this one, under the same ring, before each (NodeCore does)."""
        start = self._new_from(source, first_seq, last_seq, count, seqs)
        if start == count:
            return 0, count
        if source not in self.watermarks:
            self._check_room(source, max_sources)
        merge = carries_states(source)
        decoded: Columns | tuple[tuple, tuple] | Prepared
        if count > STEP_TUPLES:
            if is_versioned(payload):
                decoded = yield from decode_columns_steps(payload, count,
                                                          DEFAULT_LIMITS.max_key_bytes)
                yield
                if verify is not None:
                    verify(decoded)
                yield
            else:
                decoded = yield from self._prepare_steps(payload, count, merge, verify)
            start = self._new_from(source, first_seq, last_seq, count, seqs)
            if start == count:                  # (a watermark may move, or expire)
                return 0, count
            if source not in self.watermarks:
                self._check_room(source, max_sources)
            if isinstance(decoded, Columns) and hasattr(self.state, "apply_columns"):
                self.state.apply_columns(decoded, start)
            elif isinstance(decoded, Prepared):
                decoded.apply(self.state, start, merge)
            else:
                self._apply_tuples(decoded, start, merge, None)
        else:
            decoded = decode_batch(payload, count)
            if isinstance(decoded, Columns) and hasattr(self.state, "apply_columns"):
                if verify is not None:
                    verify(decoded)           # checked by positions, no key decoded
                # int64 values: a state merged in and a value reduced are folded alike
                self.state.apply_columns(decoded, start)
            else:
                self._apply_tuples(decoded, start, merge, verify)
        self.watermarks[source] = last_seq
        raise_floor(self.watermarks, source, first_seq)
        self.last_seen[source] = now
        group = floor_key(source)
        if group is not None:
            self.last_seen[group] = now
        return count - start, start

    def _new_from(self, source: str, first_seq: int, last_seq: int, count: int,
                  seqs: bytes) -> int:
        return first_new_index(effective_mark(self.watermarks, source), first_seq, last_seq,
                               count, lambda: decode_seqs(first_seq, last_seq, count, seqs))

    def _prepare_steps(self, payload: bytes, count: int, merge: bool,
                       verify) -> Generator[None, None, "Prepared"]:
        """A format 1 batch read, checked and verified STEP_TUPLES tuples a step, as
        decode_batch, the reducer's check and `verify` would whole; for a table, its
        key columns and int64 values built along (the work a table's apply does before
        its one call of the table)."""
        check = self.state.reducer.check_states if merge else self.state.reducer.check_values
        table = hasattr(self.state, "apply_prepared")
        prepared = Prepared()

        def each(some_keys, some) -> None:
            if verify is not None:
                verify(some_keys)
            if table:
                prepared.add_columns(key_columns(some_keys), int64_values(some))
        prepared.keys, prepared.values = yield from tuples_steps(payload, count, check, each)
        return prepared

    def _apply_tuples(self, decoded, start: int, merge: bool, verify) -> None:
        keys, values = decoded.to_tuples() if isinstance(decoded, Columns) else decoded
        if verify is not None:
            verify(keys)
        if start:
            keys, values = keys[start:], values[start:]
        if merge:                         # a piece merged back, or a combining mapper's
            self.state.merge_in(keys, values)
        else:
            self.state.apply(keys, values)

    def _check_room(self, source: str, max_sources: int) -> None:
        """Refuse a new source past the range's bound, or past its identity's share
        of it (a quarter): one identity's flood refuses only its own new sources."""
        held = len(self.watermarks)
        if held >= max_sources:
            # Every source costs a watermark here and in every checkpoint of the range.
            raise TooLarge(f"the range of token {self.token} tracks {held} "
                           f"sources, the limit (--max-sources-per-range); idle ones expire "
                           f"(--source-expiry)")
        share = max(1, max_sources // SHARES)
        owner = owner_of(source)
        if owner is not None and held >= share:
            own = owned_by(self.watermarks, owner)
            if own >= share:
                raise TooLarge(f"the range of token {self.token} tracks {own} sources of "
                               f"this caller's identity, its share (a quarter of "
                               f"--max-sources-per-range); idle ones expire "
                               f"(--source-expiry)")

    def expire_idle(self, now: float, idle: float) -> list[str]:
        """Forget the watermarks of sources (and group floors) that had nothing applied
        here for `idle` seconds; return them. A snapshot import's marks are kept: a
        `floe import --resume` after them would merge its chunks again. A resend of theirs after this would be
        applied again: `idle` must exceed how long any sender may resend a batch."""
        seen = self.last_seen
        for gone in seen.keys() - self.watermarks.keys():
            del seen[gone]                          # covered by a floor meanwhile
        expired = []
        for source in list(self.watermarks):
            if is_import_mark(source):      # an import's progress: kept for good
                continue
            if now - seen.setdefault(source, now) > idle:
                del self.watermarks[source], seen[source]
                expired.append(source)
        return expired

    def has_changes(self, now: float | None = None, refresh: float = 0.0) -> bool:
        """Whether a checkpoint is due; also every `refresh` seconds with nothing new,
        so replicas learn what the primary never applied (node.core.backup_store)."""
        return self.state.changed() or self._forced or \
            self.watermarks != self._watermarks_at_checkpoint or \
            (now is not None and refresh > 0 and now - self.cut_at >= refresh)

    def cut_checkpoint(self, now: float = 0.0) -> Checkpoint:
        """Swap active into inactive (processing goes on into a fresh active) and
        return the delta. The caller ships it, then calls `checkpoint_shipped`."""
        self.cut_at = now
        fragment = self.state.swap()
        self._forced = False
        self.checkpoint_seq += 1
        self._watermarks_at_checkpoint = dict(self.watermarks)
        return Checkpoint(self.token, self.checkpoint_seq, fragment,
                          self._watermarks_at_checkpoint)

    def full_checkpoint(self, delta: Checkpoint) -> Checkpoint:
        """The whole range as of `delta` (master + inactive), for a replica out of sync."""
        self._freeze_full()
        if hasattr(self.state, "full_layers"):    # a table: its export, a copy as cut
            return Checkpoint(self.token, delta.seq, FullStates(*self.state.full_layers()),
                              delta.watermarks, full=True)
        states = FullStates(self.state.master, delta.states)
        self._full = weakref.ref(states)
        return Checkpoint(self.token, delta.seq, states, delta.watermarks, full=True)

    def _freeze_full(self, unless_over: dict | None = None) -> None:
        """Master is about to change: a full checkpoint's states still held by someone
        (a call that has not sent them yet) become their own copy, unless the change
        merges the very delta they lay over master (which leaves what they read as is)."""
        full = self._full() if self._full is not None else None
        if full is not None and full.layers[-1] is not unless_over:
            full.freeze()
            self._full = None

    def checkpoint_shipped(self) -> None:
        if self.state.inactive is not None:
            self._freeze_full(unless_over=self.state.inactive)
        self.state.merge_inactive()

    def split(self, parts, part_of, bounds: dict | None = None) -> dict[int, "PrimaryRange"]:
        """The range cut into `parts` (tokens): each key goes to `part_of(key)` (a
        table's keys chosen by their positions in the parts' `bounds`, token ->
        (lo, hi], where it can); every part keeps the whole watermark map (seqs are
        per source, so "everything of s up to w sent to this range was applied" stays
        true of each part). Replicas hold copies of the old range only: every part's
        next checkpoint to them is full."""
        tables = _split_by_position(self.state, bounds)
        if tables is None:
            groups = _split_by_key(self.state.snapshot(), parts, part_of)
        out = {}
        for token in parts:
            rng = PrimaryRange(token, self.state.reducer)
            if tables is not None:
                rng.state = tables[token]
            else:
                rng.state.replace(groups[token])
            rng.watermarks = dict(self.watermarks)
            rng.last_seen = dict(self.last_seen)
            rng.cut_at = self.cut_at
            rng._watermarks_at_checkpoint = dict(self._watermarks_at_checkpoint)
            # Past any checkpoint of the old range still in flight: its late ack must
            # not count as a checkpoint of a part.
            rng.checkpoint_seq = self.checkpoint_seq + 1
            rng.min_ack = self.checkpoint_seq
            out[token] = rng
        return out

    def ack_counts(self, replica: str, seq: int) -> bool:
        return seq > self.min_ack and seq > self.ack_floor.get(replica, 0)

    def check_invariants(self) -> None:
        self.state.check_invariants()
        for source, mark in self._watermarks_at_checkpoint.items():
            if effective_mark(self.watermarks, source) < mark:
                raise AssertionError(f"watermark of {source} went backwards")


class ReplicaRange:
    """A replica's copy of one range: the primary's state as of its last checkpoint
    (`copy`), the watermarks it covers, its seq and whether it is the whole range.

    A large checkpoint delta is installed into a table copy a slice per turn of the
    event loop (`pending`, a PendingDelta). Until its last slice the copy is half
    changed, so reading any of copy, watermarks, checkpoint_seq or complete first
    installs the rest of it: whoever reads (a takeover, an export, a scan, a split,
    the disk) sees the range as of the whole delta, with its seq and watermarks."""

    def __init__(self, token: int, primary: str, copy, watermarks: dict | None = None,
                 checkpoint_seq: int = 0, complete: bool = False) -> None:
        self.token, self.primary = token, primary
        self._copy, self._watermarks = copy, dict(watermarks or {})
        # The copy is the primary's whole range: true from the ring's first version (all
        # empty) or once a full checkpoint arrived. A takeover from an incomplete copy
        # would serve partial state, so it is reported lost instead.
        self._seq, self._complete = checkpoint_seq, complete
        self.pending: PendingDelta | None = None

    def settle(self) -> None:
        """Install what is left of a pending delta, at once."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.finish()

    def drop_pending(self) -> None:
        """A full copy replaces the copy whole: a pending delta's rest is moot."""
        self.pending = None

    @property
    def copy(self):
        self.settle()
        return self._copy

    @copy.setter
    def copy(self, value) -> None:
        self.pending = None
        self._copy = value

    @property
    def watermarks(self) -> dict[str, int]:
        self.settle()
        return self._watermarks

    @watermarks.setter
    def watermarks(self, value: dict[str, int]) -> None:
        self.settle()
        self._watermarks = value

    @property
    def checkpoint_seq(self) -> int:
        self.settle()
        return self._seq

    @checkpoint_seq.setter
    def checkpoint_seq(self, value: int) -> None:
        self.settle()
        self._seq = value

    @property
    def complete(self) -> bool:
        self.settle()
        return self._complete

    @complete.setter
    def complete(self, value: bool) -> None:
        self.settle()
        self._complete = value


T = TypeVar("T")
STEP_TUPLES = 4_096     # tuples of a batch read, or checked and verified, per step (~3 ms)
EACH_TUPLES = 1_024     # tuples a primary verifies per step (new keys: 1.3-4.5 ms at load 6)


def drain(steps: Generator[None, None, T]) -> T:
    """Run a generator of steps to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def tuples_steps(payload: bytes, count: int, check,
                 each=None) -> Generator[None, None, tuple[tuple, tuple]]:
    """A format 1 batch's (keys, values) read, then checked STEP_TUPLES tuples a step
    (the tuple checks and `check(values)`; then `each(keys, values)` of the slice, a
    primary's verify of its keys, EACH_TUPLES a step: a new key's costs some 3 µs):
    the same tuples, or the same refusal, as decode_batch and the checks on the whole."""
    keys, values = yield from unpack_payload_steps(payload, count, STEP_TUPLES)
    for lo in range(0, count, STEP_TUPLES):
        some_keys, some = keys[lo:lo + STEP_TUPLES], values[lo:lo + STEP_TUPLES]
        check_tuples(some_keys, some, len(payload))
        check(some)
        yield
        if each is None:
            continue
        for at in range(0, len(some_keys), EACH_TUPLES):
            each(some_keys[at:at + EACH_TUPLES], some[at:at + EACH_TUPLES])
            yield
    return keys, values


def _checked_steps(payload: bytes, count: int, check) -> Generator[None, None, None]:
    """A batch decoded and its values checked (`check`) over steps, as a replica does
    before it keeps the batch: format 1 STEP_TUPLES tuples a step; format 2's columns
    in four (their keys checked by positions and bytes), its values a slice a step."""
    if not is_versioned(payload):
        yield from tuples_steps(payload, count, check)
        return
    values = (yield from decode_columns_steps(payload, count,
                                              DEFAULT_LIMITS.max_key_bytes)).values
    yield
    for lo in range(0, count, STEP_TUPLES):
        check(values[lo:lo + STEP_TUPLES])
        yield


class Prepared:
    """A format 1 batch checked and verified (PrimaryRange._prepare_steps): its keys
    and values, and for a table their key columns and int64 values (None when one is
    not an int64, or the range holds dicts)."""

    def __init__(self, keys: tuple = (), values: tuple = ()) -> None:
        self.keys, self.values = keys, values
        self.columns: list | None = [bytearray(), bytearray(), array("Q", [0]), array("Q")]
        self.ints: array | None = array("q")

    def add_columns(self, columns, ints) -> None:
        """The next slice's key columns (kinds, key_data, offsets, positions) and its
        values as int64 (or None)."""
        mine, mine_ints = self.columns, self.ints
        if mine is None or mine_ints is None or ints is None:
            self.columns = self.ints = None
            return
        kinds, data, offsets, positions = columns
        end = mine[2][-1]
        mine[0] += kinds
        mine[1] += data
        mine[2].extend([end + o for o in offsets[1:]] if end else offsets[1:])
        mine[3].extend(positions)
        mine_ints.extend(ints)

    def apply(self, state, start: int, merge: bool) -> None:
        """Fold the tuples from `start` on into `state`, its checks already run."""
        if self.columns is not None and hasattr(state, "apply_prepared"):
            state.apply_prepared(self.keys, self.values, merge, start, self.columns,
                                 self.ints)
        elif merge:
            state.merge_in(self.keys[start:], self.values[start:])
        else:
            state.apply(self.keys[start:], self.values[start:])


DELTA_STEP = 4_096      # entries of a delta put into a table copy per turn (2-5 ms at 1.4 M keys)
DICT_DELTA_STEP = 4_096     # entries of a delta put into a dict copy per turn (~2 ms)
SLICED_DELTA = 2 * DELTA_STEP   # a smaller delta is installed in one call, as before


class PendingDelta:
    """A checkpoint delta installed into a replica's table copy a slice at a time
    (step()), its seq, watermarks and the backups it covers taken in with the last
    slice (the copy, its seq and its watermarks change together). A slice the table
    refuses leaves the copy half changed: it is marked incomplete and behind every
    seq, so the primary's next checkpoint is a full copy; `error` says why."""

    def __init__(self, slices, done) -> None:
        self.slices, self.done = slices, done
        self.error: FloeError | None = None
        self.finished = False

    def step(self) -> bool:
        """Install one slice; True while some are left."""
        if self.finished:
            return False
        try:
            next(self.slices)
            return True
        except StopIteration:
            self.finished = True
            self.done(None)
        except FloeError as exc:
            self.finished, self.error = True, exc
            self.done(exc)
        return False

    def finish(self) -> None:
        while self.step():
            pass


class ReplicaSide:
    """All ranges this node backs up, with their checkpoints and backup tuples."""

    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self.ranges: dict[int, ReplicaRange] = {}
        self.backups = BackupStore()
        self.expired = 0          # backed-up tuples dropped as never applied by the primary

    def _range(self, token: int, primary: str) -> ReplicaRange:
        rng = self.ranges.get(token)
        if rng is None:
            rng = self.ranges[token] = ReplicaRange(token, primary, new_copy(self.reducer))
        elif rng.primary != primary:
            # The range was taken over: the new primary's state is the old one's plus
            # the same backed-up tuples, so the copy, the backups and the watermarks
            # stay valid. Only its checkpoint numbering starts afresh.
            rng.primary = primary
            rng.checkpoint_seq = 0
        return rng

    def range_of(self, token: int, primary: str) -> ReplicaRange:
        """Our copy of `primary`'s range of `token` (a new, empty one if none)."""
        return self._range(token, primary)

    def store(self, token: int, primary: str, source: str, entry: BackupEntry,
              max_bytes: int = 1 << 62) -> tuple[int, int]:
        """Keep a batch until a checkpoint covers it. It is decoded and its values
        checked as the primary would: a replica acknowledges only what a takeover can
        replay. (Whether its keys belong to the range is checked at that replay.)"""
        return drain(self.store_steps(self._range(token, primary), source, entry, max_bytes))

    def store_steps(self, rng: ReplicaRange, source: str, entry: BackupEntry,
                    max_bytes: int = 1 << 62) -> Generator[None, None, tuple[int, int]]:
        """store() a step at a time; returns (stored, duplicates). A batch of more than
        STEP_TUPLES tuples is decoded and checked over several steps that keep nothing;
        the last step stores it, whether a checkpoint covers it and the room taken
        again then. A caller that runs other work between steps checks `rng` is still
        the range's copy, under the same ring, before each (NodeCore does)."""
        if self._covers(rng, source, entry):
            return 0, entry.count
        self._check_room(entry, max_bytes)
        check = self.reducer.check_states if carries_states(source) else \
            self.reducer.check_values
        if entry.count > STEP_TUPLES:
            yield from _checked_steps(entry.payload, entry.count, check)
            if self._covers(rng, source, entry):    # a checkpoint came meanwhile
                return 0, entry.count
            self._check_room(entry, max_bytes)
        else:
            # format 2: the columns checked (keys by their positions and bytes) without
            # a Python object per key; the values are checked as the reducer takes them
            decoded = decode_batch(entry.payload, entry.count)
            check(decoded.values if isinstance(decoded, Columns) else decoded[1])
        self.backups.add(rng.token, source, entry)
        return entry.count, 0

    @staticmethod
    def _covers(rng: ReplicaRange, source: str, entry: BackupEntry) -> bool:
        return entry.last_seq <= effective_mark(rng.watermarks, source)

    def _check_room(self, entry: BackupEntry, max_bytes: int) -> None:
        if self.backups.bytes + entry.nbytes > max_bytes:
            # The primary's checkpoints are not reaching us (or not fast enough): hold
            # the sender back rather than grow without bound; nothing is acknowledged.
            raise Overloaded(f"the backup store holds {self.backups.bytes} bytes, the limit "
                             f"is {max_bytes} (--max-backup-bytes)")

    def apply_checkpoint(self, token: int, primary: str, seq: int, base_seq: int, full: bool,
                         states: Mapping, watermarks: dict[str, int], now: float = 0.0,
                         backup_expiry: float = float("inf"),
                         sliced: bool = False) -> tuple[bool, int]:
        """Merge a checkpoint; return (need_full, latest seq held). Batches received
        `backup_expiry` seconds before it that it still does not cover are dropped.
        `sliced`: a large delta is left pending on the copy (ReplicaRange), for
        the caller to install a slice per turn with step_delta."""
        rng = self._range(token, primary)
        if full:
            rng.drop_pending()
            rng.copy.replace(states)
            rng.complete = True
        elif base_seq != rng.checkpoint_seq:          # a pending delta installed first
            return True, rng.checkpoint_seq
        elif sliced and delta_size(states) >= SLICED_DELTA:
            rng.pending = PendingDelta(
                rng.copy.fragment_in_steps(states, DELTA_STEP if isinstance(
                    rng.copy, TableCopy) else DICT_DELTA_STEP),
                lambda error: self._delta_done(rng, seq, watermarks, now - backup_expiry,
                                               error))
            return False, seq
        else:
            rng.copy.apply_fragment(states)
        self._covered(rng, seq, watermarks, now - backup_expiry)
        return False, seq

    def _covered(self, rng: ReplicaRange, seq: int, watermarks: dict[str, int],
                 expire_before: float) -> None:
        rng.checkpoint_seq = seq
        rng.watermarks = dict(watermarks)
        self.backups.evict(rng.token, rng.watermarks)
        self.expired += self.backups.expire(rng.token, rng.watermarks, expire_before)

    def _delta_done(self, rng: ReplicaRange, seq: int, watermarks: dict[str, int],
                    expire_before: float, error) -> None:
        """A sliced delta's last slice: the copy is as of it. Or a slice refused: the
        copy is half changed, so incomplete (a takeover reports the range lost rather
        than serve it) and behind any seq (the next checkpoint is a full copy); the
        batches kept for it stay."""
        rng.pending = None
        if self.ranges.get(rng.token) is not rng:
            return                              # dropped or split meanwhile
        if error is not None:
            rng.complete, rng.checkpoint_seq = False, -1
            return
        self._covered(rng, seq, watermarks, expire_before)

    def pending_delta(self, token: int) -> PendingDelta | None:
        rng = self.ranges.get(token)
        return rng.pending if rng is not None else None

    def step_delta(self, token: int, pending: PendingDelta) -> bool:
        """One more slice of `pending`: True while it is still `token`'s pending
        delta with slices left (a reader of the copy may have installed the rest, a
        full copy or a drop made it moot)."""
        rng = self.ranges.get(token)
        if rng is None or rng.pending is not pending:
            return False
        if pending.step():
            return True
        rng.pending = None
        return False

    def rebuild(self, token: int, verify=None,
                into: LayeredState | TableState | None = None) -> tuple[dict, dict[str, int]]:
        """The range's state as the primary has it: checkpoint + backups past it.
        Backed-up batches the primary would have refused (`verify(keys)` raises for
        a key outside the range) are skipped: no mapper counted them delivered.
        With `into` (a primary's state; the caller drops the range next) nothing is
        copied: the checkpoint becomes its master as it is, the replay goes to its
        active layer, and what is returned is that layer, the keys it changed."""
        rng = self.ranges.get(token)
        own = LayeredState(self.reducer)                 # a copy: dicts, unless `into`
        state = into if into is not None else own
        if into is not None and rng is not None and isinstance(rng.copy, TableCopy):
            if not isinstance(into, TableState):
                raise TypeError(f"range {token}: a table's copy goes into a table")
            into.adopt(rng.copy.state)            # the copy's table, as it is
        else:
            master = rng.copy.master if rng is not None else {}
            state.replace(master if into is not None else dict(master))
        replay = PrimaryRange(token, self.reducer)
        replay.state = state
        replay.watermarks = dict(rng.watermarks) if rng is not None else {}
        for source, entry in replay_order(self.backups.entries(token)):
            try:
                replay.apply(source, entry.first_seq, entry.last_seq, entry.count,
                             entry.payload, entry.seqs, verify)
            except FloeError:
                continue
        if into is not None:
            return state.active, replay.watermarks
        own.master.update(own.active)            # our own copy: merged in place
        return own.master, replay.watermarks

    def split(self, token: int, parts, part_of, bounds: dict | None = None) -> None:
        """The range was cut into `parts`: split our copy and its backups by key. Each
        part keeps the watermarks and completeness; its checkpoint numbering is left
        behind the primary's, so the next checkpoint it takes is a full one."""
        self.backups.split_token(token, part_of)
        rng = self.ranges.pop(token, None)
        if rng is None:
            return
        copies = _split_by_position(rng.copy, bounds)
        if copies is None:
            groups = _split_by_key(rng.copy.master, parts, part_of)
        for part in parts:
            if copies is not None:
                copy = copies[part]
            else:
                copy = new_copy(self.reducer)
                copy.master = groups[part]
            self.ranges[part] = ReplicaRange(part, rng.primary, copy, dict(rng.watermarks),
                                             checkpoint_seq=-1, complete=rng.complete)

    def adopt_copy(self, token: int, primary: str, state, watermarks: dict[str, int]) -> None:
        """We handed the range to `primary` and stay its replica: our last state (a
        dict, or the range's state, which a table copy takes over as it is) is a
        complete copy as of `watermarks`."""
        self.drop(token)
        rng = self._range(token, primary)
        table = isinstance(rng.copy, TableCopy)
        rng.copy.replace(state if table or isinstance(state, dict) else state.snapshot())
        rng.watermarks = dict(watermarks)
        rng.complete = True

    def start_complete(self, token: int, primary: str) -> None:
        """In the ring's first version every range is empty: any copy is complete."""
        self._range(token, primary).complete = True

    def is_complete(self, token: int) -> bool:
        rng = self.ranges.get(token)
        return rng is not None and rng.complete

    def drop(self, token: int) -> None:
        self.ranges.pop(token, None)
        self.backups.drop_token(token)


def _split_by_position(state, bounds: dict | None):
    """A table-backed range (or copy) cut by the table over its positions: token ->
    its part, or None (no bounds, not a table, or not every key in a part)."""
    if bounds is None or not hasattr(state, "split_ranges"):
        return None
    return state.split_ranges(bounds)


def _split_by_key(states: dict, parts, part_of) -> dict[int, dict]:
    groups: dict[int, dict] = {t: {} for t in parts}
    for key, state in states.items():
        groups[part_of(key)][key] = state
    return groups
