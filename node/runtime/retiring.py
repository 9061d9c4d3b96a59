"""The executor of node.core.retiring (what a removed member held, kept until the ring
holds it on r+1 others; node.core.retired has the rules): its questions and hand-overs
become calls, its rounds a timer, and its ranges a file that keeps them across a
restart.

When this process learns that its member was removed (fenced), it rejoins as a new
member (`n2#1`) and its node core drops every range; the ranges are kept instead, in
memory and, with a data directory, in `retired/` beside the store (written and synced
before the store is wiped for the new member). A data directory whose member the ring
removed while the process was down is kept the same way.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from floering.node.core.machine_io import Note, Record
from floering.node.core.retired import Held, RetainingCore, decode, encode
from floering.node.core.retiring import (RETIRED_CHECK, AskHeld, HeldAnswers, RestoreRefused,
                                         Restored, RestoreRetired, Retiring as RetiringMachine,
                                         WriteRetired)
from floering.node.files import open_private, private_dir
from floering.wire.errors import FloeError
from floering.wire.ring import Ring

log = logging.getLogger("floe.node")

DIRECTORY = "retired"
SUFFIX = ".retired"


class Retiring:
    def __init__(self, runtime, calls, directory: Path | None) -> None:
        self.runtime = runtime
        self.calls = calls               # node.transport.snapshots.RetiredCalls
        self.dir = directory
        self.machine = RetiringMachine()
        self.former = None               # a data directory's member, until we know who we are
        self._task: asyncio.Task | None = None

    @property
    def kept(self):
        return self.machine.kept

    @classmethod
    def attach(cls, runtime, calls) -> "Retiring":
        """Keep what the members `runtime` serves as hold when they are removed: its
        cores from now on keep their ranges when fenced (RetainingCore), and its
        machine hands them here. Before the runtime confirms its membership."""
        config = runtime.config
        directory = Path(config.data_dir) / DIRECTORY if config.data_dir else None
        self = cls(runtime, calls, directory)
        machine = runtime.machine
        first = machine.core
        machine.core = self._new_core(first.node_id, first.ring)
        machine.core.starting = first.starting
        machine.make_core = self._new_core
        machine.retiring = self.machine
        runtime.retiring = self
        if runtime.disk is not None:
            self.former = runtime.disk.former or runtime.disk.loaded
        self._load()
        return self

    def _new_core(self, node_id: str, ring: Ring) -> RetainingCore:
        runtime = self.runtime
        return RetainingCore(node_id, ring, runtime.reducer, runtime.config.limits(),
                             verify_keys=runtime.config.verify_keys)

    def began(self) -> None:
        """The runtime knows who it is: a data directory's member it does not serve as
        (removed while we were down) has its copies kept."""
        former, self.former = self.former, None
        runtime = self.runtime
        if former is not None and former.node_id != runtime.core.node_id:
            self.run(self.machine.keep_directory(former, runtime.reducer,
                                                 runtime.config.limits(), runtime.clock(),
                                                 runtime.core.node_id))

    def keep(self, ranges, why: str) -> None:
        self.run(self.machine.keep(ranges, why, self.runtime.core.node_id))

    def run(self, effects) -> None:
        """Carry out the effects that need no call (the runtime's _run takes these)."""
        for effect in effects:
            match effect:
                case WriteRetired():
                    self._write(effect.member, effect.ranges)
                case Record():
                    self.runtime.events.record(effect.kind, effect.node, **dict(effect.fields))
                    log.log(effect.level, effect.text)
                case Note():
                    log.log(effect.level, effect.text)
                case _:
                    raise TypeError(f"unknown effect {effect!r}")

    def _path(self, directory: Path, member: str) -> Path:
        return directory / (member.encode().hex() + SUFFIX)

    def _write(self, member: str, ranges=None) -> None:
        """The file of `member`'s retired ranges now, synced (gone once none is left)."""
        if self.dir is None:
            return
        ranges = self.kept.of(member) if ranges is None else list(ranges)
        path = self._path(self.dir, member)
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
            self.run(self.machine.loaded(ranges))

    # ------------------------------------------------------------- rounds

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="retired")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RETIRED_CHECK)
            try:
                await self.check()
            except Exception:            # asked again next round
                log.exception("asking about retired ranges failed")
                self.machine.abandon()

    async def check(self) -> int:
        """One round: ask, hand over, delete what r+1 members hold. Returns how many."""
        machine = self.machine
        effects = machine.start(self.runtime.core, self.runtime.clock())
        while effects:
            later = []
            for effect in effects:
                match effect:
                    case AskHeld():
                        answers = await asyncio.gather(*(
                            self._held(address, ask, effect.ring_stamp)
                            for ask, address in zip(effect.asks, effect.addresses)))
                        later += machine.handle(HeldAnswers(tuple(answers)),
                                                self.runtime.clock())
                    case RestoreRetired():
                        later += machine.handle(await self._restore(effect),
                                                self.runtime.clock())
                    case _:
                        self.run([effect])
            effects = later
        return machine.deleted_last

    async def _held(self, address: str, ask, ring_stamp: int) -> Held:
        try:
            return await self.calls.held(address, ask.token, ring_stamp, ask.want)
        except (FloeError, ValueError):
            return Held("", False)

    async def _restore(self, e: RestoreRetired):
        try:
            for n, entries in enumerate(e.chunks, 1):
                await self.calls.restore(
                    e.address, ring_stamp=e.ring_stamp, token=e.token, member=e.member,
                    retired=e.retired, chunk=n, chunks=len(e.chunks), entries=entries,
                    watermarks=e.watermarks if n == 1 else {})
        except (FloeError, ValueError) as exc:
            return RestoreRefused(str(exc))
        return Restored()

    def stats(self) -> dict:
        return self.machine.stats()


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
