"""What a removed member held, kept until the ring holds it on r+1 others
(node.core.retired has the rules): the questions to the members, the file that keeps
it across a restart, the log lines and events.

When this process learns that its member was removed (fenced), it rejoins as a new
member (`n2#1`) and its node core drops every range; the ranges are kept here
instead, in memory and, with a data directory, in `retired/` beside the store (written
and synced before the store is wiped for the new member). A data directory whose
member the ring removed while the process was down is kept the same way. Every
RETIRED_CHECK seconds each retired range is asked about: each current range it
overlaps, of each member the ring places it on (its primary and its r replicas).
Once all of them hold it whole at or past its watermarks it is deleted, memory and
file. A current range whose primary answers that it holds it as lost is handed the
retired copy's part of it (RestoreRange, in chunks of at most CHUNK_BYTES: frames
of column states for a built-in reducer's, msgpack entries for a user-defined one's).
The set is bounded by what the member held when it was removed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.wire.errors import FloeError
from floering.node.core.retired import (Held, RetainingCore, RetiredSet, decode, encode, held,
                                        retire_directory)
from floering.wire.ring import Ring
from floering.node.core.state_wire import plan
from floering.node.core.table_state import table_op
from floering.node.files import open_private, private_dir

log = logging.getLogger("floe.node")

RETIRED_CHECK = 1.0      # seconds between two rounds of questions
REPORT_EVERY = 30.0      # seconds between two reports of what is still kept
DIRECTORY = "retired"
SUFFIX = ".retired"


class Retiring:
    def __init__(self, runtime, calls, directory: Path | None) -> None:
        self.runtime = runtime
        self.calls = calls               # node.transport.snapshots.RetiredCalls
        self.dir = directory
        self.kept = RetiredSet()
        self.former = None               # a data directory's member, until we know who we are
        self.handed_over = 0             # parts of retired ranges merged into lost ones
        self._reported = 0.0
        self._refusals: dict[tuple, float] = {}    # last time each refusal was logged
        self._task: asyncio.Task | None = None

    @classmethod
    def attach(cls, runtime, calls) -> "Retiring":
        """Keep what the members `runtime` serves as hold when they are removed: its
        cores from now on keep their ranges when fenced (RetainingCore). Before the
        runtime confirms its membership."""
        config = runtime.config
        directory = Path(config.data_dir) / DIRECTORY if config.data_dir else None
        self = cls(runtime, calls, directory)
        machine = runtime.machine
        first = machine.core
        machine.core = self._new_core(first.node_id, first.ring)
        machine.core.starting = first.starting
        machine.make_core = self._make_core
        disk = runtime.disk
        if disk is not None:
            self.former = disk.former or disk.loaded
        self._load()
        return self

    def _new_core(self, node_id: str, ring: Ring) -> RetainingCore:
        runtime = self.runtime
        return RetainingCore(node_id, ring, runtime.reducer, runtime.config.limits(),
                             verify_keys=runtime.config.verify_keys)

    def _make_core(self, node_id: str, ring: Ring) -> RetainingCore:
        """The machine's core for a member: a rejoin's, after the member before it was
        fenced, takes what that one kept."""
        old = self.runtime.machine.core
        retired = getattr(old, "retired", None)
        if retired:
            old.retired = []
            self.keep(retired, f"{old.node_id} was removed from the ring")
        return self._new_core(node_id, ring)

    def began(self) -> None:
        """The runtime knows who it is: a data directory's member it does not serve as
        (removed while we were down) has its copies kept."""
        former, self.former = self.former, None
        if former is None or former.node_id == self.runtime.core.node_id:
            return
        ring = Ring.from_wire(former.ring_wire) if former.ring_wire else None
        runtime = self.runtime
        self.keep(retire_directory(former.node_id, ring, runtime.reducer,
                                   runtime.config.limits(), former.copies, former.batches,
                                   runtime.clock(), frozenset(former.corrupt)),
                  f"the data directory held {former.node_id}, which the ring removed")

    # ------------------------------------------------------------- keeping

    def keep(self, ranges, why: str) -> None:
        fresh = [r for r in ranges if r.key not in self.kept.ranges]
        if not fresh:
            return
        self.kept.add(fresh)
        for member in sorted({r.member for r in fresh}):
            self._write(member)
        keys = sum(len(r.states) for r in fresh)
        member = fresh[0].member
        log.warning("%s: keeping its %d ranges (%d keys) until the ring holds each on r+1 "
                    "members at or past their watermarks", why, len(fresh), keys)
        self.runtime.events.record("retired", self.runtime.core.node_id, member=member,
                                   ranges=len(fresh), keys=keys,
                                   tokens=sorted(r.token for r in fresh))

    def _path(self, directory: Path, member: str) -> Path:
        return directory / (member.encode().hex() + SUFFIX)

    def _write(self, member: str) -> None:
        """The file of `member`'s retired ranges now, synced (gone once none is left)."""
        if self.dir is None:
            return
        ranges, path = self.kept.of(member), self._path(self.dir, member)
        if not ranges:
            if path.exists():
                path.unlink()
                _sync_dir(self.dir)
            return
        private_dir(self.dir)
        tmp = path.with_suffix(".tmp")
        with open_private(tmp, "wb") as fh:
            fh.write(encode(ranges))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _sync_dir(self.dir)

    def _load(self) -> None:
        if self.dir is None or not self.dir.is_dir():
            return
        for path in sorted(self.dir.glob("*" + SUFFIX)):
            try:
                ranges = decode(path.read_bytes())
            except (OSError, FloeError, ValueError, TypeError) as exc:
                log.error("retired ranges in %s cannot be read (%s): set aside as %s.corrupt",
                          path, exc, path.name)
                os.replace(path, path.with_name(path.name + ".corrupt"))
                continue
            self.kept.add(ranges)
            log.warning("keeping %d ranges (%d keys) of %s, removed from the ring before "
                        "this process started, until the ring holds each on r+1 members",
                        len(ranges), sum(len(r.states) for r in ranges),
                        ranges[0].member if ranges else "?")

    # ------------------------------------------------------------- confirming

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="retired")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RETIRED_CHECK)
            if not self.kept.ranges:
                continue
            try:
                await self.check()
            except Exception:            # asked again next round
                log.exception("asking about retired ranges failed")

    async def check(self) -> int:
        """One round: ask, and delete what r+1 members hold. Returns how many."""
        core = self.runtime.core
        if core.starting or core.fenced:
            return 0
        ring = core.ring
        asks = self.kept.asks(ring)
        answers = await asyncio.gather(*(self._answer(core, ring, a) for a in asks))
        for ask, answer in zip(asks, answers):
            r = self.kept.ranges.get(ask.key)
            if ask.role == "primary" and answer.lost and r is not None and r.role != "partial":
                await self._hand_over(ring, r, ask.token, ask.node)
        done = self.kept.confirmed_by(ring, {(a.key, a.token, a.node): h
                                              for a, h in zip(asks, answers)})
        for member in sorted({r.member for r in done}):
            self._write(member)
        for r in done:
            log.info("the retired range of token %d of %s is held on r+1 members at or "
                     "past its watermarks (ring v%d): deleted", r.token, r.member, ring.version)
            self.runtime.events.record("retired_deleted", core.node_id, member=r.member,
                                       token=r.token, keys=len(r.states),
                                       ring_version=ring.version)
        self._report(ring)
        return len(done)

    async def _answer(self, core, ring: Ring, ask) -> Held:
        try:
            if ask.node == core.node_id:
                return held(core, ask.token, ask.want)
            return await self.calls.held(ring.address(ask.node), ask.token, ring.stamp,
                                         ask.want)
        except (FloeError, ValueError):
            return Held("", False)

    async def _hand_over(self, ring: Ring, r, token: int, node: str) -> None:
        """Merge the part of retired range `r` that falls in the range of `token` into
        it at `node`, its primary, which holds it as lost."""
        part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == token}
        chunks = restore_chunks(part, table_op(self.runtime.reducer) is not None)
        try:
            for n, entries in enumerate(chunks, 1):
                await self.calls.restore(
                    ring.address(node), ring_stamp=ring.stamp, token=token, member=r.member,
                    retired=r.token, chunk=n, chunks=len(chunks), entries=entries,
                    watermarks=r.watermarks if n == 1 else {})
        except (FloeError, ValueError) as exc:
            now = self.runtime.clock()
            if now - self._refusals.get((r.key, token), -REPORT_EVERY) >= REPORT_EVERY:
                self._refusals[(r.key, token)] = now
                log.error("the range of token %d is lost on %s, and it refused the retired "
                          "copy of %s's range of token %d: %s", token, node, r.member,
                          r.token, exc)
            return
        self.handed_over += 1
        log.warning("the range of token %d was lost on %s: %d keys of %s's retired range of "
                    "token %d merged into it, in %d chunks", token, node, len(part), r.member,
                    r.token, len(chunks))
        self.runtime.events.record("retired_handed_over", self.runtime.core.node_id,
                                   member=r.member, token=r.token, into=token, owner=node,
                                   keys=len(part))

    def _report(self, ring: Ring) -> None:
        now = self.runtime.clock()
        if not self.kept.ranges or now - self._reported < REPORT_EVERY:
            return
        self._reported = now
        log.warning("still keeping %d retired ranges (%d keys) of %s: not yet held on r+1 "
                    "members at or past their watermarks in ring v%d", len(self.kept.ranges),
                    self.kept.keys, ",".join(sorted(self.kept.members())), ring.version)

    def stats(self) -> dict:
        return dict(retired_ranges=len(self.kept.ranges), retired_keys=self.kept.keys,
                    retired_deleted=self.kept.confirmed, retired_handed_over=self.handed_over)


def restore_chunks(part: dict, frames: bool) -> list[bytes]:
    """A retired copy's part of a range as RestoreRange chunks of at most CHUNK_BYTES
    (an entry larger alone in its chunk): frames of column states for a built-in
    reducer's states (state_wire: a table's int64 states in columns, any other entry
    in a frame's rest; one empty frame for none), else msgpack [keys, states] entries
    (a user-defined reducer's states)."""
    if frames:
        return [piece.encode() for piece in plan(part, 1 << 30, CHUNK_BYTES)]
    return [entries for _, entries in packed_chunks(column_slices(part), CHUNK_BYTES)]


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
