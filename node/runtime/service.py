"""What a node answers to the outside, in plain values: the one facade the gRPC
servicers (node.transport.server) and the in-memory transport (node.runtime.peers)
call. Each method raises a FloeError the transports turn into a status code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

from floering.node.core.batch import Batch
from floering.node.core.requests import (CHECKPOINT, COPY_CHUNK, EXCHANGE_RING, GET, GET_RING,
                                         HEARTBEAT, SCAN, SHED, STARTED, TIMEOUT, TOP)
from floering.wire.errors import InvalidArgument, inert
from floering.node.core.handoff import Handoff
from floering.wire.balancers import balancer
from floering.node.core.chunks import (CHUNK_BYTES, ScanSlots, column_slices, packed_chunks,
                                       pair_slices, scan_pairs)
from floering.wire.ring import Ring
from floering.node.core.state_wire import StateColumns, StateRun, into_dict
from floering.node.core.table_state import copies_in_tables, copy_in_steps
from floering.node.core.shed_round import ShedOutcome
from floering.node.runtime.inbound import StreamState
from floering.node.runtime.node import NodeRuntime
from floering.node.runtime.probing import probe_for


MAX_SCAN_CHUNK = 5000     # entries per chunk of an inspected range, at most


class NodeService:
    def __init__(self, runtime: NodeRuntime) -> None:
        self.runtime = runtime
        self.scans = ScanSlots()

    @property
    def node_id(self) -> str:
        return self.runtime.core.node_id

    @property
    def reducer(self) -> str:
        return self.runtime.reducer.name

    @property
    def stream_window(self) -> int:
        return self.runtime.config.stream_window

    @property
    def ring(self) -> Ring:
        return self.runtime.core.ring

    def check_started(self) -> None:
        """For a transport taking a call in parts (chunks)."""
        self.runtime.ask(STARTED)

    def check_copy_chunk(self, sender: str, ring_stamp: int, token: int) -> None:
        self.runtime.ask(COPY_CHUNK, sender=sender, ring_stamp=ring_stamp, token=token)

    # ------------------------------------------------------------ data path

    async def submit(self, batches: list[Batch], stream: StreamState):
        return await self.runtime.submit(batches, stream)

    # ------------------------------------------------------------ the ring

    def ring_view(self, starting_ok: bool = False, expect_reducer: str = "") -> tuple[Ring, bool]:
        return self.runtime.ask(GET_RING, starting_ok=starting_ok, expect_reducer=expect_reducer)

    def exchange_ring(self, sender: str, ring: Ring, caller: str = "") -> Ring:
        return self.runtime.ask(EXCHANGE_RING, sender=sender, ring=ring, caller=caller)

    def heartbeat(self, sender: str, ring_stamp: int, incarnation: int) -> tuple[int, int]:
        return self.runtime.ask(HEARTBEAT, sender=sender, ring_stamp=ring_stamp,
                                incarnation=incarnation)

    async def probe(self, target: str, timeout: float) -> bool:
        return await probe_for(self.runtime, target, timeout)

    async def receive_checkpoint(self, sender: str, ring_stamp: int, incarnation: int,
                                 token: int, seq: int, base_seq: int, full: bool, states: Mapping,
                                 watermarks) -> tuple[bool, int, int]:
        """(whether we need a full copy, the seq we hold, our ring stamp); a durable
        node answers once the merged copy is on its disk."""
        self.runtime.ask(CHECKPOINT, sender=sender, ring_stamp=ring_stamp,
                         incarnation=incarnation, watermarks=watermarks)
        core, copy = self.runtime.core, states
        if isinstance(states, (StateRun, StateColumns)) and \
                not copies_in_tables(core.reducer):
            states = copy = await dict_in_steps(states)
        elif full and isinstance(states, StateRun):      # a table copy built in steps
            # a frame per turn of the event loop: in one turn, 1.25 M keys held it for 48 ms
            copy = await last_step(copy_in_steps(core.reducer, states))
        need_full, held = core.receive_checkpoint(sender, ring_stamp, token, seq, base_seq,
                                                  full, copy, watermarks,
                                                  self.runtime.clock(), sliced=True)
        await install_pending(core.replicas, token)
        durable = self.runtime.durable
        if durable is not None and not need_full:         # acknowledged once on disk too
            await durable.checkpoint(token, sender, states, watermarks, full)
        return need_full, held, core.ring.stamp

    # ------------------------------------------------------------ operations

    async def hand_off(self, moves: dict[int, str], timeout: float = 0.0) -> Handoff:
        wait = self.runtime.ask(TIMEOUT, asked=timeout)
        try:
            return await self.runtime.hand_off(moves, wait)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    async def split(self, at: int) -> tuple[int, int]:
        return await self.runtime.split_range(at)

    async def leave(self, timeout: float = 0.0) -> None:
        await self.runtime.leave(self.runtime.ask(TIMEOUT, asked=timeout))

    async def shed(self, sender: str, depth: int, identity: str = "") -> ShedOutcome:
        member, share = self.runtime.ask(SHED, sender=sender, identity=identity)
        return await self.runtime.shed_load(f"asked by {inert(sender)}", depth, share, member)

    # ------------------------------------------------------------ queries

    def get(self, key) -> tuple[bool, object, int]:
        return self.runtime.ask(GET, key=key)

    async def top(self, k: int) -> list:
        """The best `k` (0: the default), ranked off the event loop: a large state must not keep heartbeats waiting."""
        k = self.runtime.ask(TOP, k=k)
        # One range copied at a time (the event loop runs in between) and its best k
        # kept: never a copy of the whole state.
        core = self.runtime.core
        best: list = []
        for snapshot in core.range_snapshots():
            ranked = await asyncio.to_thread(core.rank, k, snapshot.items())
            best.extend((key, state) for key, state, _ in ranked)
            del snapshot, ranked
        return core.rank(k, best)

    def scan_chunk(self, asked: int) -> int:
        return self.runtime.ask(SCAN, asked=asked)

    def open_scan(self, ring_stamp: int, caller: str, chunk: int) -> "ScanRun":
        """A scan of what this node owns, taken a range at a time as it is read; one
        of at most MAX_SCANS at once (MAX_SCANS_PER_CALLER by `caller`), refused
        (Overloaded) beyond. The caller closes it."""
        self.runtime.ask(SCAN, ring_stamp=ring_stamp)
        self.scans.take(caller)
        return ScanRun(self, self.runtime.core, caller, chunk)

    def stats(self) -> dict:
        return self.runtime.stats()

    async def inspect_range(self, token: int, caller: str) -> tuple[str, ScanRun]:
        """A range as this node holds it (its role, "" if none), in chunks of at most
        CHUNK_BYTES: counted as a scan, which the caller closes. A primary's range of
        dicts is copied COPY_STEP keys per turn of the event loop (as of the call)."""
        self.scans.take(caller)         # before the copy: the slots bound the copies
        try:
            role, states = await last_step(self.runtime.core.inspect_steps(token, COPY_STEP))
        except BaseException:
            self.scans.give(caller)
            raise
        return role, ScanRun(self, None, caller, MAX_SCAN_CHUNK, states)


class ScanRun:
    """One open scan: the node's fold epoch and marks as it began, then its entries
    in chunks of at most `chunk` keys and CHUNK_BYTES bytes (a larger entry alone),
    each encoded as it is asked for. Pieces of shared keys come first."""

    def __init__(self, service: NodeService, core, caller: str, chunk: int,
                 states: dict | Iterator | None = None) -> None:
        self.service, self.caller = service, caller
        if states is not None:          # one range, copied already
            self.epoch, self.marks = 0, {}
            take = column_slices(states) if isinstance(states, dict) else pair_slices(states)
            self.chunks = packed_chunks(take, CHUNK_BYTES, chunk)
        else:
            # Taken before the first range is copied: a fold step after it changes
            # the epoch a reader compares at the end (mapper.scanning).
            self.epoch, self.marks = core.fold_epoch, core.fold_marks()
            pairs = scan_pairs(core, balancer(core.ring.balancer).pieces > 1)
            self.chunks = packed_chunks(pair_slices(pairs), CHUNK_BYTES, chunk)
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.chunks.close()
            self.service.scans.give(self.caller)


COPY_STEP = 8192    # keys of a range's master copied per turn for InspectRange (~1 ms)
DICT_STEP = 2048    # entries of a received full copy put into its dict per turn (~2 ms)


async def dict_in_steps(states: StateRun | StateColumns) -> dict:
    """A full copy or a delta that arrived as frames, made the dict a replica's copy
    of a range takes, DICT_STEP entries per turn of the event loop: in one turn, a
    range of a million user-defined states held the loop for a second."""
    out: dict = {}
    for _ in into_dict(out, states, DICT_STEP):
        await asyncio.sleep(0)
    return out


async def install_pending(replicas, token: int) -> None:
    """A large delta left pending in `token`'s copy, installed a slice per turn of
    the event loop (a delta of 300 k keys into a copy of 1.25 M held the loop for
    6-19 ms in one call); the sender is answered once it is in, or refused as the
    one call would have been."""
    pending = replicas.pending_delta(token)
    if pending is None:
        return
    while replicas.step_delta(token, pending):
        await asyncio.sleep(0)
    if pending.error is not None:
        raise pending.error


async def last_step(steps: Iterator):
    """What a generator of steps yields last (None before it: a step done), the event
    loop running between two steps."""
    last = None
    for last in steps:
        if last is None:
            await asyncio.sleep(0)
    return last
