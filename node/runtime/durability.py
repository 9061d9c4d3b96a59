"""Durable mode (`--data-dir`): the executor of the node's DiskPlan
(`floering.node.core.persistence`, where every decision lives) on its NodeStore. The log is
appended to on the event loop; its fsync (a group commit every `--fsync-interval`)
and the copies' RocksDB writes run on worker threads, the writes one after another
in the order the plan asked for them. A failing disk is tried again every second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from floering.wire.errors import Overloaded
from floering.node.core.node_core import NodeCore
from floering.node.core.persistence import DiskPlan
from floering.node.core.persistence_io import (AcceptBatches, AckWanted, AppendRecord, Began,
                                      BatchKept, CheckpointMerged, CompactLog, CopiesWritten,
                                      DiskFailed, DiskRepaired, FailAcks, LogSynced,
                                      RefuseBatches, ReleaseAcks, SaveIdentity, SyncLog,
                                      SyncWanted, WriteCopies)
from floering.node.core.restore import restored_core
from floering.wire.ring import Ring
from floering.node.storage.node_store import Loaded, NodeStore, open_store

log = logging.getLogger("floe.node")

REPAIR_SECONDS = 1.0


@dataclass
class DataDir:
    """A data directory opened at start: who it says we are and what it holds."""

    store: NodeStore
    loaded: Loaded | None
    former: Loaded | None = None      # a member the ring removed: its copies, not served

    @property
    def ring(self) -> Ring | None:
        wire = self.loaded.ring_wire if self.loaded else None
        return Ring.from_wire(wire) if wire else None


def open_data_dir(path: str) -> DataDir:
    store, loaded, quarantined = open_store(path)
    if quarantined:
        log.error("data directory %s is corrupt (%s): starting as a new member; the "
                  "ring recovers its ranges from their replicas or reports them lost",
                  path, quarantined)
    log.info("data directory %s: log segments of %d MiB (a 32nd of the volume's free "
             "space, 1 to 64 MiB)", path, store.log.segment_bytes >> 20)
    ring, former = DataDir(store, loaded).ring, None
    if loaded is not None and ring is not None and loaded.node_id not in ring.nodes:
        # It left (or learnt it was removed) before it stopped: nothing here is a
        # member's any more (what it held is kept until confirmed: node.core.retired).
        log.info("data directory %s: %s had left the ring; starting as a new member",
                 path, loaded.node_id)
        loaded, former = None, loaded
    if loaded is not None:
        log.info("data directory %s: %s (incarnation %d), %d ranges, %d batches logged%s",
                 path, loaded.node_id, loaded.incarnation, len(loaded.copies),
                 len(loaded.batches), f", {loaded.truncated} bytes of torn tail cut"
                 if loaded.truncated else "")
    return DataDir(store, loaded, former)


def restore(disk: DataDir, template: NodeCore, now: float) -> NodeCore:
    """The core the directory held, as the member `template` names."""
    loaded = disk.loaded
    if loaded is None:
        raise ValueError("the data directory holds no member's state to restore")
    for token, why in sorted(loaded.corrupt.items()):
        log.error("data directory: the copy of the range of token %d is corrupt (%s): "
                  "not served; it comes back from a replica, or is reported lost", token, why)
    return restored_core(template.node_id, disk.ring or template.ring, template.reducer,
                         template.limits, loaded.copies, loaded.batches, now,
                         template.verify_keys, frozenset(loaded.corrupt), type(template))


class Durability:
    @classmethod
    def begin(cls, disk: DataDir, core: NodeCore, incarnation: int,
              fsync_interval: float) -> "Durability":
        """Serving starts as `core`'s member (the directory is wiped for it if it held
        another)."""
        last = disk.store.log.next_seq - 1           # everything opened is on disk
        d = cls(disk.store, DiskPlan(incarnation, last + 1, last), fsync_interval)
        loaded = disk.loaded
        if loaded is None:
            d._do(d.plan.handle(Began(core, None)))
        else:
            d._do(d.plan.handle(Began(core, loaded.node_id, disk.ring,
                                      frozenset(loaded.copies), frozenset(loaded.corrupt))))
            # The copies' states are the core's now, the batches replayed: let them go.
            disk.loaded = replace(loaded, copies={}, batches=[])
        return d

    def __init__(self, store: NodeStore, plan: DiskPlan, fsync_interval: float) -> None:
        self.store = store
        self.plan = plan
        self.interval = fsync_interval
        self.refusing: str | None = None
        self._acks: dict[int, asyncio.Future] = {}
        self._tickets = 0
        self._wakeup = asyncio.Event()
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="floe-disk")
        self._sync = ThreadPoolExecutor(1, thread_name_prefix="floe-fsync")
        self._writes: asyncio.Future | None = None   # the last write queued

    # ------------------------------------------------------------ events

    def kept(self, b, kept: int) -> None:
        """The core took batch `b`, `kept` of its tuples applied or backed up."""
        self._do(self.plan.handle(BatchKept(b, kept)))

    def committed(self) -> asyncio.Future:
        """Resolves once everything logged so far is synced (or fails with the
        disk's error: then nothing is acknowledged)."""
        ticket, future = self._ticket()
        self._do(self.plan.handle(AckWanted(ticket)))
        return future

    def synced(self) -> asyncio.Future:
        """Resolves once everything logged so far is synced (fails while the disk
        fails and some of it is not)."""
        ticket, future = self._ticket()
        self._do(self.plan.handle(SyncWanted(ticket)))
        return future

    def check_writable(self) -> None:
        """Before applying a batch: refuse it while the disk fails (a full disk),
        rather than apply what could not be logged."""
        if self.refusing is not None:
            raise Overloaded(f"the data directory fails ({self.refusing}); batches are "
                             f"refused until it takes writes again")

    def after(self, core: NodeCore) -> None:
        self._do(self.plan.after(core))

    def checkpoint(self, token: int, primary: str, states: Mapping, watermarks: dict,
                   full: bool) -> asyncio.Future:
        """A checkpoint was merged into our copy: resolves once the copy is on disk."""
        ticket, future = self._ticket()
        self._do(self.plan.handle(CheckpointMerged(token, primary, states, watermarks, full,
                                                   ticket)))
        return future

    def _ticket(self) -> tuple[int, asyncio.Future]:
        self._tickets += 1
        future = self._acks[self._tickets] = asyncio.get_running_loop().create_future()
        return self._tickets, future

    # ----------------------------------------------------------- effects

    def _do(self, effects) -> None:
        for e in effects:
            match e:
                case AppendRecord():
                    record = self.store.append_batch(e.batch)
                    assert record == e.record, f"log record {record}, the plan says {e.record}"
                case SyncLog():
                    self._wakeup.set()
                case ReleaseAcks():
                    for ticket in e.tickets:
                        _resolve(self._acks.pop(ticket), None)
                case FailAcks():
                    for ticket in e.tickets:
                        _resolve(self._acks.pop(ticket),
                                 Overloaded(f"the data directory fails: {e.why}"))
                case WriteCopies():
                    self._queue(lambda e=e: self.store.write(e.copies, e.dropped, e.ring_wire,
                                                             e.replace_all),
                                CopiesWritten(e.write))
                case CompactLog():   # the files deleted on the disk's thread
                    self._queue(self.store.detach_log_before(e.before), None)
                case SaveIdentity():
                    self._save_identity(e)
                case RefuseBatches():
                    log.error("data directory %s: %s; refusing batches until it takes "
                              "writes again", self.store.dir, e.why)
                    self.refusing = e.why
                    self._wakeup.set()              # the commit loop turns to repairing
                case AcceptBatches():
                    log.warning("data directory %s takes writes again", self.store.dir)
                    self.refusing = None
                case _:
                    raise TypeError(f"unknown effect {e!r}")

    def _save_identity(self, e: SaveIdentity) -> None:
        try:
            self.store.reset_log()
        except OSError as exc:
            self._do(self.plan.handle(DiskFailed(str(exc))))
            return
        self._queue(lambda: self.store.save_identity(e.node_id, e.incarnation), None)

    def _queue(self, write, done) -> None:
        """Run `write` on the disk thread after every write queued before it; then
        tell the plan `done` (or that the disk failed)."""
        loop = asyncio.get_running_loop()
        before = self._writes

        async def run():
            if before is not None:
                await asyncio.shield(before)
            try:
                await loop.run_in_executor(self._disk, write)
            except Exception as exc:
                self._do(self.plan.handle(DiskFailed(str(exc))))
                return
            if done is not None:
                self._do(self.plan.handle(done))
        self._writes = asyncio.ensure_future(run())

    # ------------------------------------------------------------- loops

    async def run(self) -> None:
        """The group commit loop; while the disk fails, the repair loop."""
        loop = asyncio.get_running_loop()
        while True:
            if self.refusing is not None:
                await self._repair(loop)
                continue
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.refusing is not None:
                continue
            await asyncio.sleep(self.interval)       # let more batches join this fsync
            try:
                last, fd, size, segment = self.store.flush()
                await loop.run_in_executor(self._sync, NodeStore.fsync, fd)
            except OSError as exc:
                self._do(self.plan.handle(DiskFailed(str(exc))))
                continue
            self.store.log.mark_synced(last, size, segment)
            self._do(self.plan.handle(LogSynced(last)))

    async def _repair(self, loop) -> None:
        """Every second, try to write again what the disk refused (the log records
        not synced; RocksDB reopened). Reads are served meanwhile."""
        await asyncio.sleep(REPAIR_SECONDS)
        if self._writes is not None:
            await asyncio.gather(self._writes, return_exceptions=True)
        try:
            await loop.run_in_executor(self._disk, self.store.repair)
        except Exception as exc:
            log.debug("data directory still fails: %s", exc)
            return
        self._do(self.plan.handle(DiskRepaired(self.store.log.next_seq - 1)))

    def sync_now(self) -> None:
        """Sync here and now, on the event loop (at stop, the commit loop gone)."""
        try:
            last = self.store.sync_now()
        except OSError as exc:
            self._do(self.plan.handle(DiskFailed(str(exc))))
            return
        self._do(self.plan.handle(LogSynced(last)))

    async def close(self) -> None:
        if self._writes is not None:
            await asyncio.gather(self._writes, return_exceptions=True)
        try:
            self.store.sync_now()
        except OSError as exc:
            log.error("data directory %s: final sync failed: %s", self.store.dir, exc)
        self._disk.shutdown()
        self._sync.shutdown()
        self.store.close()


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
