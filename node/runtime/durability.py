"""Durable mode (`--data-dir`): what the runtime writes to its NodeStore, and when.

- Every batch accepted is logged as received; its acknowledgement waits for the
  group commit that syncs it (one fsync every `--fsync-interval` for every batch
  logged meanwhile). A duplicate's acknowledgement waits too: the batch it repeats
  may not be synced yet.
- Every checkpoint round's cuts (our primaries) and every checkpoint received (ranges
  we back up) are written to the copies on disk, in order, on a worker thread.
- When the ranges we hold change (a takeover, a split, a handoff, a rejoin), every
  copy is written whole with the ring, and the log restarts from there.
- A log segment goes once the copies written cover every batch in it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from node.core.batch import Batch
from node.core.epochs import effective_mark
from node.core.errors import Overloaded
from node.core.node_core import NodeCore
from node.core.restore import disk_image, restored_core
from node.core.ring import Ring
from node.storage.node_store import CopyWrite, Loaded, NodeStore, open_store

log = logging.getLogger("floe.node")

REPAIR_SECONDS = 1.0


@dataclass
class DataDir:
    """A data directory opened at start: who it says we are and what it holds."""

    store: NodeStore
    loaded: Loaded | None

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
    if loaded is not None:
        log.info("data directory %s: %s (incarnation %d), %d ranges, %d batches logged%s",
                 path, loaded.node_id, loaded.incarnation, len(loaded.copies),
                 len(loaded.batches), f", {loaded.truncated} bytes of torn tail cut"
                 if loaded.truncated else "")
    return DataDir(store, loaded)


def restore(disk: DataDir, template: NodeCore, now: float) -> NodeCore:
    """The core the directory held, as the member `template` names."""
    loaded = disk.loaded
    return restored_core(template.node_id, disk.ring or template.ring, template.reducer,
                         template.limits, loaded.copies, loaded.batches, now,
                         template.verify_keys)


class Durability:
    @classmethod
    def begin(cls, disk: DataDir, core: NodeCore, incarnation: int,
              fsync_interval: float) -> "Durability":
        """Serving starts as `core`'s member: if the directory held another, it is
        wiped and now holds this one."""
        d = cls(disk.store, fsync_interval, incarnation)
        if disk.loaded is None or disk.loaded.node_id != core.node_id:
            disk.store.save_identity(core.node_id, incarnation)
        d.node_id = core.node_id
        d.start(core)
        return d

    def __init__(self, store: NodeStore, fsync_interval: float, incarnation: int) -> None:
        self.store = store
        self.incarnation = incarnation
        self.node_id = ""
        self.interval = fsync_interval
        self.synced = store.log.next_seq - 1        # every record up to this is on disk
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()
        self._wakeup = asyncio.Event()
        # Logged batches no copy on disk covers yet, per token and source: the log is
        # compacted past the oldest of them.
        self._uncovered: dict[int, dict[str, deque[tuple[int, int]]]] = {}
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="floe-disk")
        self._sync = ThreadPoolExecutor(1, thread_name_prefix="floe-fsync")
        self._writes: asyncio.Future | None = None   # the last write queued
        self.failed: BaseException | None = None
        self.rewrite = False                         # write every copy whole next
        self.held: frozenset = frozenset()           # (token, role) of the last whole write

    # ------------------------------------------------------------ the log

    def logged(self, b: Batch) -> int:
        record = self.store.append_batch(b)
        per_token = self._uncovered.setdefault(b.token, {})
        per_token.setdefault(b.source, deque()).append((record, b.last_seq))
        self._wakeup.set()
        return record

    def committed(self) -> asyncio.Future:
        """Resolves once everything logged so far is synced (or fails with the
        disk's error: then nothing is acknowledged)."""
        future = asyncio.get_running_loop().create_future()
        last = self.store.log.next_seq - 1
        if self.failed is not None:
            future.set_exception(Overloaded(f"the data directory fails: {self.failed}"))
        elif last <= self.synced:
            future.set_result(None)
        else:
            self._waiting.append((last, future))
            self._wakeup.set()
        return future

    def check_writable(self) -> None:
        """Before applying a batch: refuse it while the disk fails (a full disk),
        rather than apply what could not be logged."""
        if self.failed is not None:
            raise Overloaded(f"the data directory fails ({self.failed}); batches are "
                             f"refused until it takes writes again")

    async def run(self) -> None:
        """The group commit loop; while the disk fails, the repair loop."""
        loop = asyncio.get_running_loop()
        while True:
            if self.failed is not None:
                await self._repair(loop)
                continue
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(self.interval)       # let more batches join this fsync
            try:
                last, fd, size, segment = self.store.flush()
                await loop.run_in_executor(self._sync, NodeStore.fsync, fd)
            except OSError as exc:
                self._fail(exc)
                continue
            self.store.log.mark_synced(last, size, segment)
            self._synced_to(last)

    def _synced_to(self, last: int) -> None:
        self.synced = max(self.synced, last)
        while self._waiting and self._waiting[0][0] <= self.synced:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)

    async def _repair(self, loop) -> None:
        """Every second, try to write again what the disk refused: the log records
        not synced, then every copy whole. Reads are served meanwhile."""
        await asyncio.sleep(REPAIR_SECONDS)
        if self._writes is not None:
            await asyncio.gather(self._writes, return_exceptions=True)
        try:
            await loop.run_in_executor(self._disk, self.store.repair)
        except Exception as exc:
            log.debug("data directory still fails: %s", exc)
            return
        log.warning("data directory %s takes writes again", self.store.dir)
        self.failed = None
        self.rewrite = True                       # a copy write may have failed too
        self._synced_to(self.store.log.next_seq - 1)

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            log.error("data directory %s: %s; refusing batches until it takes writes "
                      "again", self.store.dir, exc)
        self.failed = exc
        self._wakeup.set()                 # the commit loop turns to repairing
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(Overloaded(f"the data directory fails: {exc}"))

    # ---------------------------------------------------------- the copies

    def after(self, core: NodeCore) -> None:
        """After the machine handled an event: write what its checkpoint round cut,
        and everything whole if the ranges we hold changed."""
        if core.cuts:
            if self.failed is None:
                self.cuts(core.node_id, core.cuts)
            core.cuts = []
        if self.failed is not None:
            return                                # the repair rewrites everything
        if core.node_id != self.node_id:          # fenced, rejoined as a new member
            try:
                self.store.save_identity(core.node_id, self.incarnation)
            except Exception as exc:
                self._fail(exc)
                return
            self.node_id = core.node_id
            self._uncovered.clear()
            self.rewrite = True
        if self.rewrite:
            self.rewrite = False
            self.whole(core, everything=True)
        elif held_ranges(core) != self.held:
            self.whole(core)

    def _queue(self, write, covers: dict[int, dict[str, int]] | None) -> None:
        """Run `write` on the disk thread after every write queued before it; then
        forget the logged batches the written copies cover and compact the log."""
        loop = asyncio.get_running_loop()
        before = self._writes

        async def run():
            if before is not None:
                await asyncio.shield(before)
            try:
                await loop.run_in_executor(self._disk, write)
            except Exception as exc:
                self._fail(exc)
                return
            if covers is not None:
                self._covered(covers)
        self._writes = asyncio.ensure_future(run())

    def cuts(self, node_id: str, cuts) -> None:
        """A checkpoint round of our primaries cut these deltas."""
        if not cuts:
            return
        writes = [CopyWrite(c.token, node_id, c.states, dict(c.watermarks)) for c in cuts]
        self._queue(lambda: self.store.write(writes),
                    {c.token: c.watermarks for c in cuts})

    def checkpoint(self, token: int, primary: str, states: dict, watermarks: dict,
                   full: bool) -> None:
        """A checkpoint of a range we back up was merged into our copy."""
        write = CopyWrite(token, primary, states, dict(watermarks), full)
        self._queue(lambda: self.store.write([write]), {token: watermarks})

    def whole(self, core, everything: bool = False) -> None:
        """The ranges we hold changed: write the new or changed ones whole (all of
        them with `everything`), drop the ones gone, with the ring. Logged batches of
        a range cut or moved since count for the range now holding them."""
        held = held_ranges(core)
        fresh = held if everything else held - self.held
        tokens = {t for t, *_ in fresh}
        image = disk_image(core, tokens)
        gone = {t for t, *_ in self.held} - {t for t, *_ in held}
        ring = core.ring
        writes = [CopyWrite(t, p, s, w, True, c) for t, p, s, w, c in image]
        keep = {t for t, *_ in held}
        rekeyed: dict[int, dict[str, list]] = {}
        for token, per_source in self._uncovered.items():
            now_in = token if ring.has_token(token) else ring.token_for_position(token)
            if now_in in keep:
                for source, queue in per_source.items():
                    rekeyed.setdefault(now_in, {}).setdefault(source, []).extend(queue)
        self._uncovered = {t: {src: deque(sorted(q)) for src, q in per.items()}
                           for t, per in rekeyed.items()}
        self.held = held
        ring_wire = ring.to_wire()
        self._queue(lambda: self.store.write(writes, gone, ring_wire, replace_all=everything),
                    {t: w for t, _, _, w, _ in image})

    def start(self, core) -> None:
        """Serving begins: log again what we back up (the batches restored from the
        old log, which goes), then write every copy whole."""
        for token in core.replicas.backups.tokens():
            for source, e in core.replicas.backups.entries(token):
                self.logged(Batch(0, token, source, e.first_seq, e.last_seq, e.count,
                                  e.payload, e.seqs))
        # Synced before the copies' write lets the old log go.
        self.synced = self.store.sync_now()
        self.whole(core, everything=True)

    def _covered(self, covers: dict[int, dict[str, int]]) -> None:
        for token, watermarks in covers.items():
            per_token = self._uncovered.get(token)
            if not per_token:
                continue
            for source, queue in list(per_token.items()):
                mark = effective_mark(watermarks, source)
                while queue and queue[0][1] <= mark:
                    queue.popleft()
                if not queue:
                    del per_token[source]
            if not per_token:
                del self._uncovered[token]
        oldest = min((q[0][0] for per in self._uncovered.values() for q in per.values()),
                     default=self.store.log.next_seq)
        self.store.drop_log_before(min(oldest, self.synced + 1))

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


def held_ranges(core) -> frozenset:
    """What the copies on disk must match: every range held, as (token, where it
    starts, role): a split changes where the cut range starts."""
    start = core.ring.range_of_token
    return frozenset([(t, start(t)[0], "primary") for t in core.primaries] +
                     [(t, start(t)[0], "replica") for t in core.replicas.ranges])
