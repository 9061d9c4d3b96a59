"""Durable mode's decisions (`--data-dir`): what a node writes to its data directory,
and when, with no I/O. `DiskPlan.handle(event)` takes what happened and returns the
effects to carry out (both in `floering.node.core.persistence_io`). `floering.node.runtime.durability`
carries them out with files, fsync and RocksDB; the simulation on a simulated disk
that it can crash between a write and its fsync.

- Every batch the core kept (applied as primary, or backed up) is logged as received.
- An acknowledgement waits for the fsync covering everything logged so far: a
  duplicate's too, since the batch it repeats may not be synced yet; and a
  duplicate's also for the copies written so far, since a checkpoint merged into
  a copy in memory may be what holds it.
- A checkpoint round ships once everything logged so far is synced: a replica's
  copy never gets ahead of what we come back with from our disk.
- Every checkpoint round's cuts of our primaries, and every checkpoint merged into a
  copy we keep for another primary, are written to the copies, in order. A merged
  checkpoint is acknowledged once written: its primary takes the acknowledgement
  for a copy that survives us (a handoff commits on it, extras retire on it).
- When the ranges we hold change (a takeover, a split, a handoff, a rejoin) the new
  and changed ones are written whole with the ring, the ones gone dropped; any
  other ring change is written alone. A new member (rejoined as `n#k`) first wipes
  the directory and saves its identity.
- A member back from its directory writes what its restore changed (the keys the
  log's replay changed, the ranges held otherwise than on disk), not every copy
  whole; no record of the old log goes before that write is done.
- A logged record stays until a written copy covers it (its seqs at or below the
  copy's watermark for its source), as a replica evicts a backed-up batch; a record
  of a range no longer held stays until the write dropping that range is done.
- A write or fsync that fails fails every acknowledgement waiting and refuses
  batches until the disk takes writes again; then every copy is written whole.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping
from dataclasses import dataclass

from floering.node.core.batch import Batch
from floering.wire.epochs import effective_mark
from floering.node.core.persistence_io import (AcceptBatches, AckWanted, AppendRecord, Began,
                                      BatchKept, CheckpointMerged, CompactLog, CopiesWritten,
                                      CopyWrite, CoreSettled, DiskFailed, DiskRepaired,
                                      FailAcks, LogSynced, RefuseBatches, ReleaseAcks,
                                      RoundCut, SaveIdentity, SyncLog, SyncWanted,
                                      WriteCopies)
from floering.wire.ring import Ring
from floering.node.core.state_wire import Layers


# --------------------------------------------------------------------- plan


@dataclass
class PendingWrite:
    """A write not done yet. Once done, its copies cover the records logged before
    it was taken at or below their watermarks; until then the records of ranges it
    drops (the oldest is `holds`) stay in the log."""

    covers: dict[int, dict[str, int]]
    taken_before: int
    holds: int | None
    acks: tuple[int, ...] = ()          # checkpoint acknowledgements waiting for it


class DiskPlan:
    """One process's data directory, as decisions: `next_record` is the number the log
    gives its next record, `synced` the last one known on disk."""

    def __init__(self, incarnation: int, next_record: int = 1, synced: int = 0) -> None:
        self.incarnation = incarnation
        self.node_id = ""
        self.next_record = next_record
        self.synced = synced                   # every record up to this is on disk
        # Acknowledgements waiting: (record synced, write done, ticket).
        self.waiting: list[tuple[int, int, int]] = []
        self.duplicates = False                # the request being taken repeats some tuples
        self.written_through = 0               # every write up to this one is done
        # Logged records no written copy covers yet: token -> source -> (record, last
        # seq), in order. The log may be compacted up to the oldest.
        self.uncovered: dict[int, dict[str, deque[tuple[int, int]]]] = {}
        self.next_write = 1
        self.pending: dict[int, PendingWrite] = {}       # writes not done yet
        # Records from `pinned` on stay until `rewrite_write` is done: the write that
        # brings the copies level with memory (a restart's, a rewrite after a repair).
        self.pinned: int | None = None
        self.rewrite_write = 0
        self.relogged_through = 0              # no compaction until these are synced
        self.compacted_before = 0
        self.failed: str | None = None
        self.rewrite = False                   # write every copy whole next
        self.held: frozenset = frozenset()     # (token, start, role) of the last whole write
        self.ring: Ring | None = None          # the ring last written
        self._handlers: dict[type, Callable[[Any, list], None]] = {
            Began: self._began, BatchKept: self._kept, AckWanted: self._ack_wanted,
            SyncWanted: self._sync_wanted,
            LogSynced: self._synced, RoundCut: self._cut, CheckpointMerged: self._merged,
            CoreSettled: self._settled, CopiesWritten: self._written,
            DiskFailed: self._disk_failed, DiskRepaired: self._repaired,
        }

    def handle(self, event) -> list:
        out: list = []
        self._handlers[type(event)](event, out)
        return out

    def after(self, core) -> list:
        """After the machine handled an event: the round it cut, then the ranges held."""
        cuts = core.take_cuts()
        out = self.handle(RoundCut(core.node_id, tuple(cuts))) if cuts else []
        return out + self.handle(CoreSettled(core))

    # ------------------------------------------------------------ the log

    def _began(self, e: Began, out: list) -> None:
        core = e.core
        self.node_id = core.node_id
        if e.disk_member != core.node_id:
            out.append(SaveIdentity(core.node_id, self.incarnation))
            self.ring = core.ring
            self._whole(core, out, everything=True)
            return
        # Log again what we back up (restored from the old log, which goes once
        # these are synced and the copies below written).
        for token in core.replicas.backups.tokens():
            for source, x in core.replicas.backups.entries(token):
                self._log(Batch(0, token, source, x.first_seq, x.last_seq, x.count,
                                x.payload, x.seqs), out)
        self.relogged_through = self.next_record - 1
        out.append(SyncLog())
        # The old log's records past the copies (our primaries' replayed batches) are
        # covered by the write below only once it is done: none goes before.
        self.pinned = 0
        self.rewrite_write = self._restarted(core, e, out)

    def _restarted(self, core, e: Began, out: list) -> int:
        """Back from our directory as the same member: write what the restore changed.
        A range restored from its copy on disk and held as it was (same range, same
        role) gets the keys its replay changed (the restore leaves them in its active
        layer, over the copy as it was read) and its watermarks: a primary's; a
        replica's copy only its meta. Any other range held is written whole (a
        corrupt copy is never held as it was), the copies of ranges no longer held
        dropped, and the ring written."""
        held = held_ranges(core)
        same = held & on_disk(e.disk_ring, core.node_id, e.disk_tokens)
        kept = {t for t, *_ in same}
        copies = [CopyWrite(t, core.node_id, replayed(rng.state), dict(rng.watermarks))
                  for t, rng in core.primaries.items() if t in kept]
        copies += [CopyWrite(t, r.primary, {}, dict(r.watermarks), False, r.complete)
                   for t, r in core.replicas.ranges.items() if t in kept]
        image = disk_image(core, {t for t, *_ in held - same})
        copies += [CopyWrite(t, p, s, w, True, c) for t, p, s, w, c in image]
        gone = sorted((e.disk_tokens | e.corrupt) - {t for t, *_ in held})
        self.held, self.ring = held, core.ring
        return self._write(copies, {c.token: c.watermarks for c in copies}, out,
                           dropped=tuple(gone), ring_wire=core.ring.to_wire())

    def _kept(self, e: BatchKept, out: list) -> None:
        if e.kept:
            self._log(e.batch, out)
        if e.kept < e.batch.count:
            self.duplicates = True

    def _log(self, b: Batch, out: list) -> None:
        record = self.next_record
        self.next_record += 1
        per_token = self.uncovered.setdefault(b.token, {})
        per_token.setdefault(b.source, deque()).append((record, b.last_seq))
        out.append(AppendRecord(record, b))

    def _ack_wanted(self, e: AckWanted, out: list) -> None:
        last = self.next_record - 1
        write = self.next_write - 1 if self.duplicates else 0
        self.duplicates = False
        if self.failed is not None:
            out.append(FailAcks((e.ticket,), self.failed))
        elif last <= self.synced and write <= self.written_through:
            out.append(ReleaseAcks((e.ticket,)))
        else:
            self.waiting.append((last, write, e.ticket))
            if last > self.synced:
                out.append(SyncLog())

    def _sync_wanted(self, e: SyncWanted, out: list) -> None:
        last = self.next_record - 1
        if last <= self.synced:
            out.append(ReleaseAcks((e.ticket,)))
        elif self.failed is not None:
            out.append(FailAcks((e.ticket,), self.failed))
        else:
            self.waiting.append((last, 0, e.ticket))
            out.append(SyncLog())

    def _release(self, out: list) -> None:
        ready = [w for w in self.waiting if w[0] <= self.synced and w[1] <= self.written_through]
        if ready:
            self.waiting = [w for w in self.waiting if w not in ready]
            out.append(ReleaseAcks(tuple(t for *_, t in ready)))

    def _fail_waiting(self, why: str, out: list) -> None:
        if self.waiting:
            out.append(FailAcks(tuple(t for *_, t in self.waiting), why))
            self.waiting = []

    def _synced(self, e: LogSynced, out: list) -> None:
        self.synced = max(self.synced, e.upto)
        self._release(out)
        if self.relogged_through and self.synced >= self.relogged_through:
            self.relogged_through = 0
            self._compact(out)

    def _disk_failed(self, e: DiskFailed, out: list) -> None:
        if self.failed is None:
            out.append(RefuseBatches(e.why))
        self.failed = e.why
        self._fail_waiting(e.why, out)
        # A write after a failed one may have landed on a copy missing the failed
        # one: no write queued so far covers anything, and what the queued writes
        # would drop stays until the whole rewrite after the repair is done.
        for p in self.pending.values():
            if p.holds is not None:
                self.pinned = p.holds if self.pinned is None else min(self.pinned, p.holds)
        self._forget_writes(e.why, out)
        self.rewrite_write = 0

    def _forget_writes(self, why: str, out: list) -> None:
        acks = tuple(t for p in self.pending.values() for t in p.acks)
        if acks:
            out.append(FailAcks(acks, why))
        self.pending.clear()

    def _repaired(self, e: DiskRepaired, out: list) -> None:
        if self.failed is None:
            return
        self.failed = None
        self.rewrite = True
        out.append(AcceptBatches())
        self._synced(LogSynced(e.synced), out)

    # ---------------------------------------------------------- the copies

    def _cut(self, e: RoundCut, out: list) -> None:
        if self.failed is not None:
            return                        # the repair writes everything whole
        self._write([CopyWrite(c.token, e.node_id, c.states, dict(c.watermarks))
                     for c in e.cuts], {c.token: c.watermarks for c in e.cuts}, out)

    def _merged(self, e: CheckpointMerged, out: list) -> None:
        if self.failed is not None:
            if e.ticket:
                out.append(FailAcks((e.ticket,), self.failed))
            return
        write = self._write([CopyWrite(e.token, e.primary, e.states, dict(e.watermarks),
                                       e.full)], {e.token: e.watermarks}, out)
        if e.ticket:
            self.pending[write].acks = (e.ticket,)

    def _settled(self, e: CoreSettled, out: list) -> None:
        core = e.core
        if self.failed is not None:
            return                        # the repair writes everything whole
        if core.node_id != self.node_id:  # fenced, rejoined as a new member
            self.node_id = core.node_id
            out.append(SaveIdentity(core.node_id, self.incarnation))
            # The earlier member's records are gone with its log: nothing waiting
            # for them will be synced.
            why = f"this process now serves as {core.node_id}"
            self._fail_waiting(why, out)
            self.uncovered.clear()
            self._forget_writes(why, out)
            self.pinned = None
            self.relogged_through = 0
            self.rewrite = True
        if self.rewrite:
            self.rewrite = False
            self._whole(core, out, everything=True)
        elif held_ranges(core) != self.held:
            self._whole(core, out)
        elif core.ring is not self.ring:
            # The ring alone: a copy merged later (a handoff's final checkpoint to a
            # new extra) must come back under a ring that gives us its range.
            self.ring = core.ring
            self._write([], {}, out, ring_wire=core.ring.to_wire())

    def _whole(self, core, out: list, everything: bool = False) -> None:
        """Write the new or changed ranges held whole (all of them with `everything`),
        drop the ones gone, with the ring. A logged record counts for every range
        now holding some of its range (a split or a move cut it); one of a range no
        longer held stays until this write is done."""
        held = held_ranges(core)
        fresh = held if everything else held - self.held
        tokens = {t for t, *_ in fresh}
        image = disk_image(core, tokens)
        keep = {t for t, *_ in held}
        gone = sorted({t for t, *_ in self.held} - keep)
        holds = self._rekey(self.ring, core.ring, keep)
        self.held, self.ring = held, core.ring
        write = self._write([CopyWrite(t, p, s, w, True, c) for t, p, s, w, c in image],
                            {t: w for t, _, _, w, _ in image}, out, holds, tuple(gone),
                            core.ring.to_wire(), everything)
        if everything:
            self.rewrite_write = write

    def _rekey(self, old: Ring | None, new: Ring, keep: set) -> int | None:
        """File the uncovered records under the tokens of `new` whose ranges overlap
        the ones they were logged for; forget those no range held overlaps. Returns
        the oldest record forgotten."""
        moved: dict[int, dict[str, set]] = {}
        forgotten: int | None = None
        for token, per_source in self.uncovered.items():
            targets = [t for t in overlapping(old, new, token) if t in keep]
            for source, queue in per_source.items():
                if not targets and queue:
                    oldest = queue[0][0]
                    forgotten = oldest if forgotten is None else min(forgotten, oldest)
                for t in targets:
                    moved.setdefault(t, {}).setdefault(source, set()).update(queue)
        self.uncovered = {t: {s: deque(sorted(q)) for s, q in per.items()}
                          for t, per in moved.items()}
        return forgotten

    def _write(self, copies: list[CopyWrite], covers: dict, out: list,
               holds: int | None = None, dropped: tuple = (), ring_wire: bytes | None = None,
               replace_all: bool = False) -> int:
        write = self.next_write
        self.next_write += 1
        self.pending[write] = PendingWrite({t: dict(w) for t, w in covers.items()},
                                           self.next_record, holds)
        out.append(WriteCopies(write, tuple(copies), dropped, ring_wire, replace_all))
        return write

    def _written(self, e: CopiesWritten, out: list) -> None:
        self.written_through = max(self.written_through, e.write)   # they are done in order
        self._release(out)
        done = self.pending.pop(e.write, None)
        if done is None:
            return              # queued before a failure (or another member): covers nothing
        if e.write == self.rewrite_write:
            self.pinned = None
        if done.acks:
            out.append(ReleaseAcks(done.acks))
        for token, watermarks in done.covers.items():
            per_token = self.uncovered.get(token)
            if not per_token:
                continue
            for source, queue in list(per_token.items()):
                mark = effective_mark(watermarks, source)
                while queue and queue[0][0] < done.taken_before and queue[0][1] <= mark:
                    queue.popleft()
                if not queue:
                    del per_token[source]
            if not per_token:
                del self.uncovered[token]
        self._compact(out)

    def _compact(self, out: list) -> None:
        if self.relogged_through:
            return              # the old log still holds what was logged again
        needed = [self.synced + 1, self.next_record]
        needed += [q[0][0] for per in self.uncovered.values() for q in per.values() if q]
        needed += [p.holds for p in self.pending.values() if p.holds is not None]
        if self.pinned is not None:
            needed.append(self.pinned)
        before = min(needed)
        if before > self.compacted_before:
            self.compacted_before = before
            out.append(CompactLog(before))


def overlapping(old: Ring | None, new: Ring, token: int) -> list[int]:
    """The tokens of `new` whose ranges overlap what `token`'s range was in `old`."""
    if old is None or not old.has_token(token):
        return [token if new.has_token(token) else new.token_for_position(token)]
    lo, hi = old.range_of_token(token)
    inside = [t for t in new.tokens if Ring.in_range(t, (lo, hi))]
    return sorted(set(inside) | {new.token_for_position(hi)})


def held_ranges(core) -> frozenset:
    """What the copies on disk must match: every range held, as (token, where it
    starts, role): a split changes where the cut range starts."""
    start = core.ring.range_of_token
    return frozenset([(t, start(t)[0], "primary") for t in core.primaries] +
                     [(t, start(t)[0], "replica") for t in core.replicas.ranges])


def on_disk(ring: Ring | None, member: str, tokens) -> frozenset:
    """The ranges a directory holds copies of (`tokens`, under `ring`), named as
    `held_ranges` names them: what a restore makes of them."""
    if ring is None:
        return frozenset()
    roles = ((t, ring.role_of(member, t)) for t in tokens if ring.has_token(t))
    return frozenset((t, ring.range_of_token(t)[0], role) for t, role in roles
                     if role is not None)


def replayed(state) -> dict:
    """What a restored primary's replay changed over its copy on disk: its active
    layer (and an inactive one, had a round been cut since). A copy: a write may
    run later."""
    changed = dict(state.inactive or {})
    changed.update(state.active)
    return changed


def disk_image(core, tokens) -> list[tuple[int, str, Mapping, dict[str, int], bool]]:
    """The ranges of `tokens` the core holds, as whole copies: (token, primary,
    states, watermarks, complete). The states are copies: a write may run later."""
    image = [(t, core.node_id, whole_states(rng.state), dict(rng.watermarks), True)
             for t, rng in core.primaries.items() if t in tokens]
    image += [(t, r.primary, whole_states(getattr(r.copy, "state", None), r.copy),
               dict(r.watermarks), r.complete)
              for t, r in core.replicas.ranges.items() if t in tokens]
    return image


def whole_states(state, copy=None) -> Mapping:
    """A range's states as of now, a copy a write may read later: a state table's
    export and spill as layers (the columns copied in C: no dict of every key is
    made on the event loop, a 1 s step at 1.25 M keys), else a dict (a primary's
    snapshot, a replica's `copy.master`)."""
    layers = getattr(state, "full_layers", None)
    if layers is not None:
        return Layers(*layers())
    return state.snapshot() if copy is None else dict(copy.master)
