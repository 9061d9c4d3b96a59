"""A whole-ring scan (mapper.scanning) among folds (node.core.folding), on cores
alone: every step of every fold (a piece emptied into its outgoing key, a checkpoint
round, the fold's batch taken by each destination, its answer) may run between any two
chunks a node's Scan stream builds, and before the stream opens or the last Stats is
read. The scan must hand on the exact sums of an independent Counter, or refuse with
FoldDuringScan; once every fold settled, a scan must succeed and be exact."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgpack
import grpc
from hypothesis import event, given, settings, strategies as st

from floering.mapper.scanning import FoldDuringScan, RingScan
from floering.node.core.batch import Batch, Limits, encode_payload, encode_seqs
from floering.node.core.folding import pending
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.node.runtime.service import ScanRun
from floering.v1 import floe_pb2
from floering.wire.pieces import is_fold_key, is_piece, piece_key
from floering.wire.ring import Ring

MEMBERS = {"a": "h:1", "b": "h:2", "c": "h:3"}
RING = Ring.initial(MEMBERS, 1, 2, "wchoices")
NODE_OF = {address: name for name, address in RING.addresses}
IDLE = 1.0              # --piece-idle
TICK = 1.1              # a node's clock moves this much per fold review: past IDLE
WORDS = ["zemarite", "sheba", "hagar", "tirzah"]


class Slots:
    def give(self, caller: str) -> None:
        pass


class Service:
    scans = Slots()


class World:
    """Three cores with pieces of WORDS (index 0: the key itself), and the folds they
    send, in flight."""

    def __init__(self, spread: list[tuple[int, int, int]]) -> None:
        self.cores = {n: NodeCore(n, RING, load_reducer("count"), Limits(piece_idle=IDLE))
                      for n in MEMBERS}
        self.now = dict.fromkeys(MEMBERS, 0.0)
        self.flights: list[dict] = []      # a fold sent: its batch, who must still take it
        self.shipping: dict[str, list] = {}  # node -> checkpoints of its round not shipped
        self.expect: Counter = Counter()
        seq = 0
        for word, index, count in spread:
            key = piece_key(WORDS[word], index)
            seq += count
            self._push(key, count, seq)
            self.expect[WORDS[word]] += count
        self.round_all()
        for name in MEMBERS:        # every piece seen once: idle at its next review
            self.review(name)

    def _push(self, key, count: int, last: int) -> None:
        token = RING.token_for_key(key)
        seqs = list(range(last - count + 1, last + 1))
        batch = Batch(RING.stamp, token, "m1", seqs[0], seqs[-1], count,
                      encode_payload([key] * count, [1] * count), encode_seqs(seqs))
        for node in RING.destinations(token):
            self.cores[node].receive_batch(batch)

    # ------------------------------------------------------------------ steps

    def cut(self, name: str) -> None:
        """A checkpoint round of `name` begins: its changed ranges cut, to be shipped."""
        self.shipping[name] = list(self.cores[name].plan_checkpoints())

    def ship(self, name: str) -> None:
        """The next checkpoint of `name`'s round taken by its replica, and acked."""
        core, s = self.cores[name], self.shipping[name].pop(0)
        cp = s.checkpoint
        need_full, seq = self.cores[s.replica].receive_checkpoint(
            name, RING.stamp, cp.token, cp.seq, s.base_seq, cp.full,
            dict(cp.states), dict(cp.watermarks))
        core.checkpoint_acked(cp.token, s.replica, seq, need_full)

    def done(self, name: str) -> None:
        """`name`'s round ends: its cut layers merged back."""
        del self.shipping[name]
        core = self.cores[name]
        for token in list(core.primaries):
            core.checkpoint_done(token)

    def round(self, name: str) -> None:
        if name not in self.shipping:
            self.cut(name)
        while self.shipping[name]:
            self.ship(name)
        self.done(name)

    def round_all(self) -> None:
        for name in MEMBERS:
            self.round(name)

    def review(self, name: str) -> None:
        core = self.cores[name]
        self.now[name] += TICK
        for send in core.folds.review(core, self.now[name]):
            token = RING.token_for_key(send.key)
            batch = Batch(RING.stamp, token, send.source, send.seq, send.seq, 1,
                          encode_payload([send.key], [send.state]))
            self.flights.append(dict(sender=name, send=send, batch=batch,
                                     left=list(RING.destinations(token))))

    def deliver(self, flight: dict, node: str) -> None:
        self.cores[node].receive_batch(flight["batch"])
        flight["left"].remove(node)

    def answer(self, flight: dict, ok: bool) -> None:
        self.flights.remove(flight)
        core, send = self.cores[flight["sender"]], flight["send"]
        core.folds.answered(core, send.out_key, send.seq, ok and not flight["left"])

    def steps(self) -> list:
        """Every step that may run now, as (name, thunk)."""
        out = [(f"review {n}", lambda n=n: self.review(n)) for n in MEMBERS]
        for n in MEMBERS:
            if n not in self.shipping:
                out.append((f"cut {n}", lambda n=n: self.cut(n)))
            elif self.shipping[n]:
                out.append((f"ship {n}", lambda n=n: self.ship(n)))
            else:
                out.append((f"done {n}", lambda n=n: self.done(n)))
        for i, f in enumerate(self.flights):
            out += [(f"deliver {i} to {n}", lambda f=f, n=n: self.deliver(f, n))
                    for n in f["left"]]
            if not f["left"]:
                out.append((f"answer {i}", lambda f=f: self.answer(f, True)))
            # a send that failed (or whose answer came in another epoch): sent again
            out.append((f"fail {i}", lambda f=f: self.answer(f, False)))
        return out

    def settle(self) -> None:
        """Run folds to their end: every piece idle, folded, sent, taken, answered."""
        for _ in range(8):
            for name in MEMBERS:
                self.review(name)
                self.round(name)
            while self.flights:
                f = self.flights[0]
                for node in list(f["left"]):
                    self.deliver(f, node)
                self.answer(f, True)
        held = [(k, v) for c in self.cores.values() for k, v in c.items()]
        assert not any(pending(v) for k, v in held if is_fold_key(k)), "a fold on its way"
        assert not any(v for k, v in held if is_piece(k)), "a piece not folded"


class Scheduler:
    """Runs the steps hypothesis picks at each point the scan may be overtaken."""

    def __init__(self, world: World, data, most: int) -> None:
        self.world, self.data, self.most, self.log = world, data, most, []

    def overtake(self, where: str) -> None:
        for _ in range(self.data.draw(st.integers(0, self.most), label=f"steps at {where}")):
            steps = self.world.steps()
            name, step = steps[self.data.draw(st.integers(0, len(steps) - 1))]
            self.log.append(f"{where}: {name}")
            step()


class Stream:
    """A node's Scan stream: opened (fold epoch, marks, first chunk in one go, as the
    server does) at its first read, each later chunk built at its read."""

    def __init__(self, node: "Node", chunk: int) -> None:
        self.node, self.chunk, self.run, self.first = node, chunk, None, True

    async def read(self):
        await asyncio.sleep(0)
        core = self.node.core
        self.node.sched.overtake(f"{core.node_id} read")
        if self.run is None:
            self.run = ScanRun(Service(), core, "client", self.chunk)
        entries = next(self.run.chunks, None)
        if entries is None:
            return grpc.aio.EOF
        out = floe_pb2.ScanChunk(entries=entries[1])
        if self.first:
            self.first = False
            out.fold_epoch = self.run.epoch
            out.fold_marks = msgpack.packb(self.run.marks) if self.run.marks else b""
        return out

    def cancel(self) -> None:
        pass


class Node:
    def __init__(self, core, sched, chunk: int) -> None:
        self.core, self.sched, self.chunk = core, sched, chunk

    def Scan(self, request):
        assert request.ring_stamp == self.core.ring.stamp
        return Stream(self, self.chunk)

    async def Stats(self, request, timeout=None):
        await asyncio.sleep(0)
        self.sched.overtake(f"{self.core.node_id} stats")
        return floe_pb2.NodeStats(fold_epoch=self.core.fold_epoch)


async def scan(world: World, sched: Scheduler, chunk: int) -> dict:
    nodes = {address: Node(world.cores[NODE_OF[address]], sched, chunk)
             for address in NODE_OF}
    ring_scan = RingScan(nodes.__getitem__, RING, merge=lambda a, b: a + b)
    await ring_scan.start()
    out: dict = {}
    while (items := await ring_scan.next_chunk()) is not None:
        for key, state in items:
            assert key not in out, f"{key!r} handed on twice"
            out[key] = state
    return out


SPREAD = st.lists(st.tuples(st.integers(0, len(WORDS) - 1), st.integers(0, 3),
                            st.integers(1, 3)), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(spread=SPREAD, data=st.data(), chunk=st.integers(1, 3))
def test_a_scan_among_folds_is_exact_or_says_scan_again(spread, data, chunk):
    world = World(spread)
    sched = Scheduler(world, data, most=3)
    for _ in range(data.draw(st.integers(0, 16), label="steps before the scan")):
        sched.overtake("before")
    try:
        got = asyncio.run(scan(world, sched, chunk))
    except FoldDuringScan:
        got = None
    during = [s for s in sched.log if not s.startswith("before")]
    event(f"{'refused' if got is None else 'exact'}, steps during the scan: "
          f"{'some' if during else 'none'}")
    if got is not None:
        assert got == dict(world.expect), sched.log
    world.settle()
    assert asyncio.run(scan(world, Scheduler(world, data, most=0), chunk)) == \
        dict(world.expect)
