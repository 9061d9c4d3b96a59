"""Snapshots of a table reducer's range, format 1 (msgpack [keys, states] entries)
against format 2 (frames of column states), side by side in one run.

    python -m floering.chaos.snapshot_bench [--keys 1000000 5000000]

A count's range of --keys keys in the compiled state table (as chaos.move_bench
builds it) goes through every step of `floe export` and `floe import` but the gRPC
calls, in one process: the node's export cut into chunks (ExportRange), the file
written (floe.snapshot's Writer) and read back checked whole, the importer's recut
into chunks per range of a target ring of RANGES ranges (floe.snapshot), and the
node's import of each chunk into an empty range (ImportRange: decoded, checked,
merged). Three ways: "msgpack" (format 1, re-cut key by key into dicts), "frames-dict"
(format 2 re-cut key by key into dicts, as the importer did before) and "frames"
(format 2 re-cut by key position in a scratch state table, recut_frames). Printed
per way and size: seconds for the export (node and file) and the import (file,
importer and node; the importer's recut and the node's part apart), the file's MiB;
the imported ranges are checked against the exported one key for key.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from floering.chaos.move_bench import build
from floering.floe.snapshot import import_chunks, recut_entries, recut_frames
from floering.node.core import snapshot_format
from floering.node.core.batch import Limits
from floering.node.core.columnar import KERNEL
from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.wire.codec import unpack_columns
from floering.node.core.ranges import PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring
from floering.node.core.snapshot_format import Header, Writer, read
from floering.node.core.snapshots import export_columns, import_chunk
from floering.node.core.state_wire import decode, is_frame
from floering.node.transport.snapshots import frame_chunks

TOKEN = 1 << 63
SNAP = "ab" * 32


# The target ring: RANGES ranges of equal width (the exported ring has one), so the
# importer's recut places every key in one of them.
RANGES = 8
TARGET = tuple(((i << 64) // RANGES) - 1 for i in range(1, RANGES + 1))


class _Core:
    """What export_columns and import_chunk read of a node's core: primary of every
    range of `tokens`."""

    def __init__(self, tokens: tuple[int, ...], rngs: dict[int, PrimaryRange]) -> None:
        self.fenced, self.limits, self.node_id = False, Limits(), "n0"
        self.reducer = load_reducer("count")
        self.ring = Ring(1, 1, tokens, ("n0",) * len(tokens), (("n0", "127.0.0.1:1"),))
        self.primaries = rngs

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
    snapshot_format.FORMAT_VERSION = 1 if way == "msgpack" else 2
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


def _import(path: str, way: str) -> tuple[dict[int, PrimaryRange], float, float]:
    """The target ranges imported, the seconds the importer took to re-cut the file's
    entries into chunks per target range, and the seconds the node took."""
    began = time.perf_counter()
    with open(path, "rb") as f:
        _, parts, _, _ = read(f)
    ring = Ring(1, 1, TARGET, ("n0",) * RANGES, (("n0", "127.0.0.1:1"),))
    if way == "frames":                   # by key position: no Python object per key
        ranges: dict = recut_frames(parts, ring, "count")
    else:                                 # key by key into dicts
        ranges = recut_entries(parts, ring)
    reducer = "user" if way == "msgpack" else "count"     # "user": msgpack chunks
    chunks = {t: list(import_chunks(reducer, ranges.pop(t))) for t in TARGET}
    recut = time.perf_counter() - began
    rngs = {t: PrimaryRange(t, load_reducer("count")) for t in TARGET}
    core = _Core(TARGET, rngs)
    began = time.perf_counter()
    for token, mine in chunks.items():
        for n, (_, entries) in enumerate(mine, 1):
            if is_frame(entries):
                keys, values = decode(entries), None
            else:
                keys, values = unpack_columns(entries)
            import_chunk(core, "count", core.ring.stamp, token, SNAP, n, len(mine), keys,
                         values, {"src": 1} if n == 1 else {}, False, 0.0)
    return rngs, recut, time.perf_counter() - began


def run(n: int, way: str, workdir: str) -> dict:
    rng = build(n, TOKEN)
    core = _Core((TOKEN,), {TOKEN: rng})
    path = os.path.join(workdir, f"{way}-{n}.snap")
    began = time.perf_counter()
    chunks = _export(core, "msgpack" if way == "msgpack" else "frames")
    _write(path, chunks, way)
    exported = time.perf_counter() - began
    del chunks
    began = time.perf_counter()
    got, recut, node = _import(path, way)
    imported = time.perf_counter() - began
    whole: dict = {}
    for part in got.values():
        whole.update(part.state.snapshot())
    assert whole == rng.state.snapshot(), "the import differs"
    size = os.path.getsize(path)
    os.unlink(path)
    return dict(keys=n, way=way, kernel=KERNEL, export_s=round(exported, 2),
                import_s=round(imported, 2), import_recut_s=round(recut, 2),
                import_node_s=round(node, 2), file_mib=round(size / 2**20, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for n in args.keys:
            for way in ("msgpack", "frames-dict", "frames"):
                print(json.dumps(run(n, way, workdir)), flush=True)


if __name__ == "__main__":
    main()
