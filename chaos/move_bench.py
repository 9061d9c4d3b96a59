"""State that moves, the msgpack entries against frames of column states, side by side
in one run.

    python -m floering.chaos.move_bench [--keys 1000000] [--delta 100000]

A count's range of --keys keys in the compiled state table is shipped whole (what a
handoff's new holder and a new replica get: a full checkpoint) over real gRPC on
loopback, sender and receiver in one process (the real PeerPool and ControlPlane; the
receiver takes the copy as a replica does, into a table copy), then a delta of
--delta changed keys. Each way runs in a fresh process: "msgpack" plans and packs
[keys, states] chunks as nodes did before (node.core.chunks, the receiver unpacking
them into a dict and the copy installing the dict), "frames" ships frames
(node.core.state_wire: columns packed and checked by the compiled kernel, the copy
installing all of them in one call of the table), "frames-py" the same frames with the
pure-Python codec and one install a frame (as frames moved before the kernel packed
them). --repeat runs the ways in turn that many times. Printed per way: seconds
for the full copy and the delta (end to end, both sides; wall and the process's CPU
seconds), bytes on the wire, and the
peak RSS the move added over the state held (VmHWM reset just before). Then a split
of the range in two, key by key against the table's cut by position. Every copy is
checked key for key against the sender's state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from array import array
from itertools import accumulate

import grpc

from floering.node.core.columnar import KERNEL, hash_positions
from floering.wire.hashing import position
from floering.node.core.ranges import Checkpoint, FullStates, PrimaryRange
from floering.node.core.reducers import Count
from floering.wire.ring import Ring
from floering.node.core.table_state import TableCopy
from floering.node.transport.chunking import chunks_at, planned_counts
from floering.node.transport.peers import PeerPool, channel_options
from floering.node.transport.server import ControlPlane
from floering.v1 import floe_pb2_grpc

BATCH = 65_536
WAYS = ("msgpack", "frames-py", "frames")


def key(i: int) -> str:
    return f"key-{i:08x}"


def build(n: int, token: int = 1) -> PrimaryRange:
    rng = PrimaryRange(token, Count())
    for start in range(0, n, BATCH):
        keys = [key(i) for i in range(start, min(start + BATCH, n))]
        data = "".join(keys).encode()
        offsets = array("Q", [0])
        offsets.extend(accumulate(map(len, keys)))
        rng.state.table.apply(bytes(len(keys)), data, offsets, hash_positions(data, offsets),
                              array("q", range(1, len(keys) + 1)))
    return rng


class LegacyPiece:
    """A msgpack [keys, states] chunk as nodes planned and packed them before frames."""

    def __init__(self, chunks, count: int) -> None:
        self.chunks, self.count = chunks, count

    def encode(self) -> bytes:
        from floering.wire.codec import pack
        return pack(next(self.chunks))


def legacy_plan(states, max_entries: int, max_bytes: int):
    counts = [n for n, _ in planned_counts(states, max_entries, max_bytes)]
    chunks = chunks_at(states, counts)
    return iter([LegacyPiece(chunks, n) for n in counts])


class Receiver:
    """The node facade as ShipCheckpoint uses it: the copy a replica keeps."""

    def __init__(self) -> None:
        self.copy = TableCopy(Count())

    def check_started(self) -> None:
        pass

    async def receive_checkpoint(self, sender, ring_stamp, incarnation, token, seq,
                                 base_seq, full, states, watermarks):
        if full:
            self.copy.replace(states)
        else:
            self.copy.apply_fragment(states)
        return False, seq, ring_stamp


class PeakRss:
    """The highest resident size of this process while the block runs, sampled with
    psutil every 5 ms (the kernel's own high-water mark cannot be reset through psutil)."""

    def __enter__(self) -> "PeakRss":
        import threading

        import psutil
        self._process, self._done = psutil.Process(), threading.Event()
        self.held = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def python_codec() -> None:
    """Frames packed and read by the pure-Python kernel, installed one frame a call."""
    from floering.node.core import state_wire, table_state
    from floering.node.core.columnar import pytable

    def one_by_one(self, parts, mark_dirty):
        for kinds, data, offsets, values in parts:
            self.table.install((kinds, data, offsets, hash_positions(data, offsets), values),
                               mark_dirty=mark_dirty)
    state_wire.pack_frame_columns = pytable.pack_frame_columns
    state_wire.unpack_frame_columns = pytable.unpack_frame_columns
    table_state.TableState._install_parts = one_by_one


async def ship(way: str, keys: int, delta: int) -> dict:
    if way == "frames-py":
        python_codec()
    rng = build(keys)
    receiver = Receiver()
    server = grpc.aio.server(options=channel_options(1 << 26))
    floe_pb2_grpc.add_ControlPlaneServicer_to_server(ControlPlane(receiver), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    peers = PeerPool(timeout=60.0, max_message_bytes=1 << 26)
    if way == "msgpack":
        peers.plan = legacy_plan
    out: dict = {"way": way, "keys": keys}
    try:
        cut = rng.cut_checkpoint()
        full = Checkpoint(1, cut.seq, FullStates(*rng.state.full_layers()), {}, full=True)
        with PeakRss() as rss:
            start, cpu = time.perf_counter(), time.process_time()
            await peers.ship_checkpoint(f"127.0.0.1:{port}", sender="p", ring_stamp=1,
                                        checkpoint=full, base_seq=0)
            out["full_s"] = time.perf_counter() - start
            out["full_cpu"] = time.process_time() - cpu
        out["peak_mib"] = (rss.peak - rss.held) / 2 ** 20
        out["full_bytes"] = peers.moved_bytes
        rng.checkpoint_shipped()
        assert receiver.copy.master == rng.state.snapshot(), "the copy differs"
        rng.state.apply([key(i) for i in range(0, 2 * delta, 2)], [3] * delta)
        part = rng.cut_checkpoint()
        sent = peers.checkpoint_bytes
        start, cpu = time.perf_counter(), time.process_time()
        await peers.ship_checkpoint(f"127.0.0.1:{port}", sender="p", ring_stamp=1,
                                    checkpoint=part, base_seq=cut.seq)
        out["delta_s"] = time.perf_counter() - start
        out["delta_cpu"] = time.process_time() - cpu
        out["delta_bytes"] = peers.checkpoint_bytes - sent
        rng.checkpoint_shipped()
        assert receiver.copy.master == rng.state.snapshot(), "the copy differs"
    finally:
        await peers.close()
        await server.stop(None)
    return out


def split_times(keys: int) -> dict:
    lo, hi, mid = 0, (1 << 64) - 1, 1 << 63

    def part_of(k):
        return mid if Ring.in_range(position(k), (lo, mid)) else hi
    out = {}
    for name, bounds in (("key by key", None), ("by position", {mid: (lo, mid),
                                                                hi: (mid, hi)})):
        rng = build(keys, token=hi)
        start = time.perf_counter()
        parts = rng.split((mid, hi), part_of, bounds)
        out[name] = time.perf_counter() - start
        assert sum(len(p.state) for p in parts.values()) == keys
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--delta", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--one", choices=(*WAYS, "split"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if KERNEL != "compiled":
        raise SystemExit("the compiled table is not built here (KERNEL=python)")
    if args.one == "split":
        print(json.dumps(split_times(args.keys)))
        return
    if args.one:
        print(json.dumps(asyncio.run(ship(args.one, args.keys, args.delta))))
        return
    print(f"{'way':9} {'keys':>9} {'full copy s':>11} {'cpu s':>6} {'wire MB':>8} "
          f"{'B/key':>6} {'peak RSS MiB':>12} {'delta s':>8} {'cpu s':>6} {'delta MB':>9}")
    for way in [w for _ in range(args.repeat) for w in WAYS]:
        r = json.loads(_child(way, args))
        print(f"{way:9} {r['keys']:>9,} {r['full_s']:>11.2f} {r['full_cpu']:>6.2f} "
              f"{r['full_bytes'] / 1e6:>8.1f} {r['full_bytes'] / r['keys']:>6.1f} "
              f"{r['peak_mib']:>12.0f} {r['delta_s']:>8.2f} {r['delta_cpu']:>6.2f} "
              f"{r['delta_bytes'] / 1e6:>9.2f}", flush=True)
    s = json.loads(_child("split", args))
    print(f"split of {args.keys:,} keys in two: key by key {s['key by key']:.2f} s, "
          f"by position in the table {s['by position']:.3f} s")


def _child(way: str, args) -> str:
    cmd = [sys.executable, "-m", "floering.chaos.move_bench", "--one", way,
           "--keys", str(args.keys), "--delta", str(args.delta)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True,
                          timeout=600).stdout


if __name__ == "__main__":
    main()
