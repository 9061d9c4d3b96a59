"""Snapshots of a table reducer's range, format 1 (msgpack [keys, states] entries)
against format 2 (frames of column states), side by side in one run.

    python -m floering.chaos.snapshot_bench [--keys 1000000 5000000]

A count's range of --keys keys in the compiled state table (as chaos.move_bench
builds it) goes through every step of `floe export` and `floe import` but the gRPC
calls, in one process: the node's export cut into chunks (ExportRange), the file
written (chaos.snapshot's Writer) and read back checked whole, the importer's recut
into per-range chunks (chaos.snapshot.load_recut, import_chunks), and the node's import of
each chunk into an empty range (ImportRange: decoded, checked, merged). Printed per
way and size: seconds for the export (node and file) and the import (file, importer
and node; the node's part apart), the file's MiB; the imported range is checked against the exported one
key for key.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from floering.chaos.move_bench import build
from floering.chaos.snapshot import entry_columns, import_chunks
from floering.node.core import snapshot_format
from floering.node.core.batch import Limits
from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.node.core.codec import unpack_columns
from floering.node.core.ranges import PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.ring import Ring
from floering.node.core.snapshot_format import Header, Writer, read
from floering.node.core.snapshots import export_columns, import_chunk
from floering.node.core.state_wire import decode, is_frame
from floering.node.transport.snapshots import frame_chunks

TOKEN = 1 << 63
SNAP = "ab" * 32


class _Core:
    """What export_columns and import_chunk read of a node's core: one range, primary."""

    def __init__(self, rng: PrimaryRange) -> None:
        self.fenced, self.limits, self.node_id = False, Limits(), "n0"
        self.reducer = load_reducer("count")
        self.ring = Ring(1, 1, (TOKEN,), ("n0",), (("n0", "127.0.0.1:1"),))
        self.primaries = {TOKEN: rng}

    def check_readable(self) -> None:
        return None


def _export(core: _Core, way: str) -> list[tuple[int, bytes]]:
    if way == "frames":
        columns, _ = export_columns(core, core.ring.stamp, TOKEN)
        return list(frame_chunks(columns))
    states = core.primaries[TOKEN].state.snapshot()
    return list(packed_chunks(column_slices(states), CHUNK_BYTES))


def _write(path: str, chunks: list[tuple[int, bytes]], way: str) -> None:
    old = snapshot_format.FORMAT_VERSION
    snapshot_format.FORMAT_VERSION = 2 if way == "frames" else 1
    try:
        with open(path, "wb") as out:
            w = Writer(out, Header("count", "none", 1, 1, ("n0",), (TOKEN,), 0.0))
            for n, (_, entries) in enumerate(chunks, 1):
                count = (snapshot_format.entry_count(entries) if is_frame(entries)
                         else len(unpack_columns(entries)[0]))
                w.add(TOKEN, n, len(chunks), {"src": 1} if n == 1 else {}, entries, count)
            w.close()
    finally:
        snapshot_format.FORMAT_VERSION = old


def _import(path: str, way: str) -> tuple[PrimaryRange, float]:
    """The range imported, and the seconds the node took (the rest: the importer's)."""
    with open(path, "rb") as f:
        _, parts, _, _ = read(f)
    states: dict = {}
    for s in parts:                      # the importer's recut (one range here)
        keys, values = entry_columns(s.entries)
        states.update(zip(keys, values))
    reducer = "count" if way == "frames" else "user"      # "user": msgpack chunks
    chunks = list(import_chunks(reducer, states))
    del states
    rng = PrimaryRange(TOKEN, load_reducer("count"))
    core = _Core(rng)
    began = time.perf_counter()
    for n, (_, entries) in enumerate(chunks, 1):
        if is_frame(entries):
            keys, values = decode(entries), None
        else:
            keys, values = unpack_columns(entries)
        import_chunk(core, "count", core.ring.stamp, TOKEN, SNAP, n, len(chunks), keys,
                     values, {"src": 1} if n == 1 else {}, False, 0.0)
    return rng, time.perf_counter() - began


def run(n: int, way: str, workdir: str) -> dict:
    rng = build(n, TOKEN)
    core = _Core(rng)
    path = os.path.join(workdir, f"{way}-{n}.snap")
    began = time.perf_counter()
    chunks = _export(core, way)
    _write(path, chunks, way)
    exported = time.perf_counter() - began
    del chunks
    began = time.perf_counter()
    got, node = _import(path, way)
    imported = time.perf_counter() - began
    assert got.state.snapshot() == rng.state.snapshot(), "the import differs"
    size = os.path.getsize(path)
    os.unlink(path)
    return dict(keys=n, way=way, export_s=round(exported, 2), import_s=round(imported, 2),
                import_node_s=round(node, 2),
                file_mib=round(size / 2**20, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for n in args.keys:
            for way in ("msgpack", "frames"):
                print(json.dumps(run(n, way, workdir)), flush=True)


if __name__ == "__main__":
    main()
