"""A simulated data directory and the executor of a node's DiskPlan on it, for the
deterministic simulation (tests/support/simulation.py). The plan (`floering.node.core.persistence`)
decides everything, exactly as for the asyncio runtime (node/runtime/durability.py);
this module only carries its effects out on a disk that a crash can catch between
a write and its fsync.

`SimDisk` has the NodeStore's interface: a log of records with a synced mark, the
copies (per-key state, watermarks, completeness), the identity and the ring. What
a crash takes: every record appended after the last fsync (or, seeded, all but a
prefix of them: the OS may have written some) and every copy write not done. A
full disk fails fsyncs and copy writes (and every copy write after a failed one,
as RocksDB does) until a repair finds space again. A slow one (`write_delay`) takes
longer over every copy write, as a node holding millions of keys does over a large
one: fsyncs of the log meanwhile go on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from floering.node.core.batch import Batch
from floering.wire.errors import Overloaded
from floering.node.core.persistence import DiskPlan
from floering.node.core.persistence_io import (AcceptBatches, AckWanted, AppendRecord, BatchKept,
                                      CheckpointMerged, CompactLog, CopiesWritten, CopyWrite,
                                      DiskFailed, DiskRepaired, FailAcks, LogSynced,
                                      RefuseBatches, ReleaseAcks, SaveIdentity, SyncLog,
                                      SyncWanted, WriteCopies)
from floering.node.storage.node_store import Loaded
from floering.node.core.restore import DiskCopy

FSYNC_INTERVAL = 0.002        # the group commit's wait for more records (--fsync-interval)
REPAIR_SECONDS = 1.0          # a failing disk is tried again this often
FSYNC_SECONDS = (0.0005, 0.004)
WRITE_SECONDS = (0.001, 0.008)  # one synced RocksDB write batch


class SimDisk:
    def __init__(self) -> None:
        self.records: deque[tuple[int, Batch]] = deque()   # (record, batch), in order
        self.next_record = 1
        self.synced = 0                 # records up to this survive a crash
        self.identity: tuple[str, int] | None = None
        self.ring_wire: bytes | None = None
        self.copies: dict[int, DiskCopy] = {}
        self.boots = 0                  # a crash makes every write queued before it void
        self.full_until = 0.0           # writes and fsyncs fail until then (a full disk)
        self.refuses_writes = False     # as RocksDB after a failed write, until reopened
        self.write_delay = 0.0          # every copy write takes this much longer (a slow disk)
        self.damaged: set[int] = set()  # copies whose bytes no longer read back (bit rot)
        self.retired: dict[str, tuple] = {}   # member -> its retired ranges (synced at once)

    # ------------------------------------------------------------ the log

    def append_batch(self, b: Batch) -> int:
        record = self.next_record
        self.next_record += 1
        self.records.append((record, b))
        return record

    def drop_log_before(self, record: int) -> None:
        while self.records and self.records[0][0] < record:
            self.records.popleft()

    def reset_log(self) -> None:
        self.records.clear()

    # ---------------------------------------------------------- the copies

    def write(self, copies: tuple[CopyWrite, ...], dropped=(), ring_wire: bytes | None = None,
              replace_all: bool = False) -> None:
        """As NodeStore.write, at once: the caller delays it."""
        if replace_all:
            self.copies = {}
            self.damaged.clear()
        for c in copies:
            if c.full:
                self.damaged.discard(c.token)      # written whole over the damage
            copy = self.copies.get(c.token)
            if copy is None or c.full:
                copy = self.copies[c.token] = DiskCopy(c.token, c.primary, {}, c.complete)
            copy.states.update(c.states)
            copy.primary, copy.watermarks, copy.complete = c.primary, dict(c.watermarks), c.complete
        for token in dropped:
            self.copies.pop(token, None)
            self.damaged.discard(token)
        if ring_wire is not None:
            self.ring_wire = ring_wire

    def save_identity(self, node_id: str, incarnation: int) -> None:
        self.copies, self.ring_wire = {}, None
        self.damaged.clear()
        self.identity = (node_id, incarnation)

    def load(self) -> Loaded | None:
        if self.identity is None:
            return None
        copies = {t: replace(c, states=dict(c.states), watermarks=dict(c.watermarks))
                  for t, c in self.copies.items() if t not in self.damaged}
        return Loaded(self.identity[0], self.identity[1], self.ring_wire, copies,
                      [(b.token, b) for _, b in self.records],
                      corrupt={t: "damaged" for t in self.damaged if t in self.copies})

    def damage(self, rng) -> int | None:
        """One copy's bytes rot while the node is down (its reads fail a checksum):
        returns its token."""
        intact = sorted(set(self.copies) - self.damaged)
        if not intact:
            return None
        token = rng.choice(intact)
        self.damaged.add(token)
        return token

    # ------------------------------------------------------------- a crash

    def crash(self, rng) -> int:
        """The power goes: what was not synced is lost (the OS may have written a
        prefix of it), and so is every write not done. Returns records lost."""
        unsynced = [r for r, _ in self.records if r > self.synced]
        kept = rng.randrange(len(unsynced) + 1) if unsynced and rng.random() < 0.3 else 0
        last = unsynced[kept - 1] if kept else self.synced
        while self.records and self.records[-1][0] > last:
            self.records.pop()
        self.synced, self.next_record = last, last + 1    # everything left is on disk
        self.refuses_writes = False     # the next process opens the store afresh
        self.boots += 1
        return len(unsynced) - kept


class SimDurability:
    """One process's DiskPlan carried out on its SimDisk, with the simulation's
    clock: a group commit FSYNC_INTERVAL after the first record waiting, fsyncs
    and copy writes that take their time, writes done one after another."""

    def __init__(self, sim, proc, disk: SimDisk, plan: DiskPlan) -> None:
        self.sim, self.proc, self.disk, self.plan = sim, proc, disk, plan
        self.refusing: str | None = None
        self.acks: dict[int, tuple] = {}        # ticket -> (on ack, on failure)
        self.tickets = 0
        self.committing = False
        self.again = False
        self.writes_done_at = 0.0               # when the last write queued is done
        self.boot = disk.boots

    def kept(self, b: Batch, kept: int) -> None:
        self.do(self.plan.handle(BatchKept(b, kept)))

    def ack(self, on_ack, on_failure) -> None:
        self.tickets += 1
        self.acks[self.tickets] = (on_ack, on_failure)
        self.do(self.plan.handle(AckWanted(self.tickets)))

    def synced(self, then, on_failure) -> None:
        """`then()` once everything logged so far is synced."""
        self.tickets += 1
        self.acks[self.tickets] = (then, on_failure)
        self.do(self.plan.handle(SyncWanted(self.tickets)))

    def merged(self, token: int, primary: str, states: dict, watermarks: dict, full: bool,
               on_ack, on_failure) -> None:
        """A checkpoint merged: `on_ack()` once the copy is on disk."""
        self.tickets += 1
        self.acks[self.tickets] = (on_ack, on_failure)
        self.do(self.plan.handle(CheckpointMerged(token, primary, states, watermarks, full,
                                                  self.tickets)))

    def after(self, core) -> None:
        self.do(self.plan.after(core))

    def check_writable(self) -> None:
        if self.refusing is not None:
            raise Overloaded(f"the data directory fails ({self.refusing})")

    def do(self, effects) -> None:
        disk = self.disk
        for e in effects:
            match e:
                case AppendRecord():
                    record = disk.append_batch(e.batch)
                    assert record == e.record, f"log record {record}, the plan says {e.record}"
                case SyncLog():
                    self._commit()
                case ReleaseAcks():
                    for ticket in e.tickets:
                        self.acks.pop(ticket)[0]()
                case FailAcks():
                    for ticket in e.tickets:
                        self.acks.pop(ticket)[1](Overloaded(e.why))
                case WriteCopies():
                    copies = tuple(replace(c, states=dict(c.states)) for c in e.copies)
                    self._queue(lambda e=e, copies=copies: disk.write(
                        copies, e.dropped, e.ring_wire, e.replace_all), CopiesWritten(e.write))
                case CompactLog():
                    disk.drop_log_before(e.before)
                case SaveIdentity():
                    disk.reset_log()
                    self._queue(lambda e=e: disk.save_identity(e.node_id, e.incarnation), None)
                case RefuseBatches():
                    self.refusing = e.why
                    self.committing = self.again = False
                    self.sim.on(self.proc, self.sim.now + REPAIR_SECONDS, self._repair)
                    self._note(f"refuses batches: {e.why}")
                case AcceptBatches():
                    self.refusing = None
                    self._note("takes batches again")
                case _:
                    raise TypeError(f"unknown effect {e!r}")

    def _note(self, what: str) -> None:
        self.sim.log.append(f"{self.sim.now:.3f} {self.proc.name} {what}")

    def _queue(self, write, done) -> None:
        """Done after every write queued before it, each taking its time; a crash
        before then voids it."""
        sim = self.sim
        start = max(sim.now, self.writes_done_at)
        self.writes_done_at = start + sim.rng.uniform(*WRITE_SECONDS) + self.disk.write_delay

        def land():
            if self.disk.boots != self.boot:
                return
            if self.disk.full_until > sim.now or self.disk.refuses_writes:
                self.disk.refuses_writes = True
                self.do(self.plan.handle(DiskFailed("no space left on device")))
                return
            write()
            if done is not None:
                self.do(self.plan.handle(done))
        sim.on(self.proc, self.writes_done_at, land)

    def _commit(self) -> None:
        """The group commit: wait for more records, flush, fsync."""
        if self.refusing is not None:
            return                       # the repair syncs everything
        if self.committing:
            self.again = True
            return
        self.committing = True
        sim = self.sim

        def flush():
            if self.refusing is not None:
                return
            if self.disk.full_until > sim.now:
                self.committing = self.again = False
                self.do(self.plan.handle(DiskFailed("no space left on device")))
                return
            last = self.disk.next_record - 1
            sim.on(self.proc, sim.now + sim.rng.uniform(*FSYNC_SECONDS), synced, last)

        def synced(last):
            if self.disk.boots != self.boot or self.refusing is not None:
                return
            self.disk.synced = max(self.disk.synced, last)
            self.committing = False
            self.do(self.plan.handle(LogSynced(last)))
            if self.again:
                self.again = False
                self._commit()
        sim.on(self.proc, sim.now + FSYNC_INTERVAL, flush)

    def _repair(self) -> None:
        """Once the writes queued are through: write the records not synced again
        and sync them, reopen the copies' store; while the disk is still full, try
        again later."""
        sim, disk = self.sim, self.disk
        if disk.boots != self.boot or self.refusing is None:
            return
        if disk.full_until > sim.now or self.writes_done_at > sim.now:
            sim.on(self.proc, max(sim.now + REPAIR_SECONDS, self.writes_done_at), self._repair)
            return
        disk.refuses_writes = False
        disk.synced = disk.next_record - 1
        self.do(self.plan.handle(DiskRepaired(disk.synced)))
