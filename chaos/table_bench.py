"""Per key state of a count, three ways side by side in one run.

    python -m floering.chaos.table_bench [--tuples 2000000] [--big 5000000]

The compiled state table (floering.node.core.columnar, Cython), the pure-Python table
of the same interface, and the node's dict path (LayeredState + Count.apply_batch) fold
the same batches of 65,536 tuples drawn uniformly from 50 k and from 2 M distinct keys,
after every key has been seen once (the state is warm). Printed per way: apply rate
(tuples/s), a copy of the whole state into a fresh one in its wire form (keys/s: the
tables export column buffers and install them, every key checked and hashed again; the
dict path packs its snapshot as msgpack entries, unpacks them and takes them over, as a
full checkpoint travels), and bytes per key (tracemalloc:
what building the state and one checkpoint leave allocated, the dict path's key
objects included).
--big also builds the compiled table with that many keys for its bytes per key.
Every way's final state is checked against a Counter over the input.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import time
import tracemalloc
from array import array
from collections import Counter

from floering.node.core import columnar
from floering.wire.codec import pack_entries, unpack_entries
from floering.node.core.columnar import pytable
from floering.node.core.reducers import Count
from floering.node.core.state_store import LayeredState

BATCH = 65_536
SIZES = (50_000, 2_000_000)


def key(i: int) -> str:
    return f"key-{i:08x}"


def columns(keys: list[str]) -> tuple:
    """A batch as the node gets it in column form: kinds, key_data, offsets, positions."""
    encoded = [k.encode() for k in keys]
    offsets = array("Q", [0])
    offsets.extend(itertools.accumulate(map(len, encoded)))
    data = b"".join(encoded)
    return bytes(len(keys)), data, offsets, columnar.hash_positions(data, offsets)


def batches(distinct: int, tuples: int, seed: int = 7) -> list[tuple[list[str], list[int]]]:
    rng = random.Random(seed)
    out = []
    for start in range(0, tuples, BATCH):
        n = min(BATCH, tuples - start)
        out.append(([key(rng.randrange(distinct)) for _ in range(n)], [1] * n))
    return out


def seed_batches(distinct: int):
    """Every key once: what makes the state warm before the timed batches."""
    for s in range(0, distinct, BATCH):
        end = min(s + BATCH, distinct)
        yield [key(i) for i in range(s, end)], [1] * (end - s)


class TableWay:
    def __init__(self, name: str, make) -> None:
        self.name, self.make = name, make

    def new(self):
        return self.make("count")

    def prepare(self, batch):
        keys, values = batch
        return (*columns(keys), array("q", values))

    def apply(self, state, prepared) -> None:
        state.apply(*prepared)

    def checkpoint(self, state) -> None:
        state.take_dirty()

    def copy(self, state):
        fresh = self.new()
        fresh.install(state.export())
        return fresh

    def result(self, state) -> dict:
        return dict(state.items())


class DictWay:
    name = "dict path (LayeredState)"

    def new(self):
        return LayeredState(Count())

    def prepare(self, batch):
        return batch

    def apply(self, state, prepared) -> None:
        state.apply(*prepared)

    def checkpoint(self, state) -> None:
        state.swap()
        state.merge_inactive()

    def copy(self, state):
        fresh = self.new()
        fresh.replace(unpack_entries(pack_entries(state.snapshot())))
        return fresh

    def result(self, state) -> dict:
        return state.snapshot()


def measure(way, distinct: int, timed: list, expected: Counter, budget: int) -> dict:
    """Seed (traced for memory), then apply `timed` batches (at most `budget` tuples),
    then export + install; the state is checked against `expected`."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    state = way.new()
    for batch in seed_batches(distinct):       # the batches are freed, the state stays
        way.apply(state, way.prepare(batch))
    del batch
    way.checkpoint(state)                      # as a node's state is between checkpoints
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    use, n = [], 0
    for batch in timed:
        if n >= budget:
            break
        use.append(batch)
        n += len(batch[0])
    prepared = [way.prepare(b) for b in use]
    start = time.process_time()
    for p in prepared:
        way.apply(state, p)
    apply_s = time.process_time() - start
    start = time.process_time()
    copy = way.copy(state)
    copy_s = time.process_time() - start
    want = Counter(expected) if n == sum(len(b[0]) for b in timed) else \
        Counter(itertools.chain.from_iterable(b[0] for b in use))
    want.update({key(i): 1 for i in range(distinct)})
    got = way.result(copy)
    if got != want:
        raise AssertionError(f"{way.name}: state differs from the Counter over the input")
    return {"apply": n / apply_s, "copy": distinct / copy_s, "bytes": held / distinct,
            "tuples": n}


def big_table(n: int) -> tuple[float, float]:
    """Bytes per key of the compiled table holding n keys (tracemalloc, and its own
    count of what it allocated)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    table = columnar.StateTable("count")
    for start in range(0, n, BATCH):
        keys = [key(i) for i in range(start, min(start + BATCH, n))]
        table.apply(*columns(keys), array("q", [1] * len(keys)))
        del keys
    table.take_dirty()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(table) == n
    return traced / n, table.nbytes / n


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tuples", type=int, default=2_000_000,
                        help="timed tuples per key count (the python table gets a tenth)")
    parser.add_argument("--big", type=int, default=0,
                        help="also build a compiled table of this many keys (bytes/key)")
    args = parser.parse_args(argv)
    if columnar.KERNEL != "compiled":
        raise SystemExit("the compiled table is not built here (KERNEL=python)")
    ways = [(TableWay("compiled table", columnar.StateTable), args.tuples),
            (TableWay("python table", pytable.StateTable), max(BATCH, args.tuples // 10)),
            (DictWay(), args.tuples)]
    print(f"{'state':26} {'keys':>9} {'apply tuples/s':>15} {'copy keys/s':>14}"
          f" {'bytes/key':>10}")
    for distinct in SIZES:
        timed = batches(distinct, args.tuples)
        expected = Counter(itertools.chain.from_iterable(b[0] for b in timed))
        for way, budget in ways:
            r = measure(way, distinct, timed, expected, budget)
            print(f"{way.name:26} {distinct:>9,} {r['apply']:>15,.0f} {r['copy']:>14,.0f}"
                  f" {r['bytes']:>10.1f}", flush=True)
    if args.big:
        traced, own = big_table(args.big)
        print(f"compiled table, {args.big:,} keys: {traced:.1f} bytes/key traced, "
              f"{own:.1f} allocated by the table")


if __name__ == "__main__":
    main()
