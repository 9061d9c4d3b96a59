"""Which embedded store keeps a node's per-key state on disk best? Measured side by side.

    python -m floering.chaos.storage_bench [--keys 5000000] [--delta 50000] [--dir /var/tmp]
    python -m floering.chaos.storage_bench --node [--keys 1000000] [--delta 100000] [--rounds 5]

`--node` measures the node's own store (node.storage.node_store) instead: a full
write of every range, a checkpoint round's write of `--delta` changed keys (the
median and the worst of `--rounds`), and a restart's load after them, in the
store's format and, for comparison, in the earlier format of one RocksDB entry
per key.

For each engine (SQLite in WAL mode, LMDB, RocksDB through rocksdict), on the same keys
and states as a word-count node holds (msgpack-encoded, as checkpoints carry them):

- full snapshot: write every key, then sync (what a node does for a new range);
- checkpoint delta: overwrite `--delta` keys (half of them new) and sync, five times,
  the median (what every checkpoint round does in durable mode);
- cold load: drop the OS page cache (as root), open, read every key into a dict (what
  a restart does);
- size on disk after the deltas.

Needs the optional packages: `pip install -e '.[storage-bench]'`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import msgpack


def dataset(keys: int) -> list[tuple[bytes, bytes]]:
    """Word-count state: key `w<i>` -> a count, both as msgpack (as on the wire)."""
    pack = msgpack.packb
    return [(pack(f"w{i}"), pack(i % 1000 + 1)) for i in range(keys)]


def delta(keys: int, size: int, round_: int) -> list[tuple[bytes, bytes]]:
    """A checkpoint fragment: half of the keys existing ones, half new."""
    pack = msgpack.packb
    old = [(pack(f"w{(round_ * 7919 + i * 104729) % keys}"), pack(round_ + i)) for i in range(size // 2)]
    new = [(pack(f"n{round_}-{i}"), pack(1)) for i in range(size - size // 2)]
    return old + new


def drop_caches() -> bool:
    """Forget cached file pages so a load reads the disk (root only)."""
    if os.geteuid() != 0:
        return False
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    return True


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Sqlite:
    name = "SQLite (WAL, synchronous=FULL)"

    def __init__(self, path: Path) -> None:
        self.path = path / "state.db"

    def open(self):
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
        return db

    def write(self, db, items) -> None:
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", items)
        db.execute("COMMIT")                  # synced: WAL with synchronous=FULL

    def load(self, db) -> dict:
        return dict(db.execute("SELECT k, v FROM kv"))

    def close(self, db) -> None:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()


class Lmdb:
    name = "LMDB (sync on commit)"

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self):
        import lmdb
        return lmdb.open(str(self.path), map_size=16 << 30, sync=True, metasync=True,
                         readahead=False)

    def write(self, env, items) -> None:
        with env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def load(self, env) -> dict:
        with env.begin() as txn:
            return dict(txn.cursor().iternext())

    def close(self, env) -> None:
        env.close()


class Rocks:
    name = "RocksDB (rocksdict, synced write batch)"

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self):
        from rocksdict import Options, Rdict
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        return Rdict(str(self.path), options)

    def write(self, db, items) -> None:
        from rocksdict import WriteBatch, WriteOptions
        batch = WriteBatch(raw_mode=True)
        for k, v in items:
            batch.put(k, v)
        options = WriteOptions()
        options.sync = True
        db.write(batch, options)

    def load(self, db) -> dict:
        return dict(db.items())

    def close(self, db) -> None:
        db.close()


ENGINES = (Sqlite, Lmdb, Rocks)


def measure(engine_class, root: Path, data, delta_size: int) -> dict:
    path = root / engine_class.__name__.lower()
    path.mkdir()
    engine = engine_class(path)
    store = engine.open()
    started = time.perf_counter()
    engine.write(store, data)
    snapshot = time.perf_counter() - started
    deltas = []
    for round_ in range(5):
        fragment = delta(len(data), delta_size, round_)
        started = time.perf_counter()
        engine.write(store, fragment)
        deltas.append(time.perf_counter() - started)
    engine.close(store)
    cold = drop_caches()
    started = time.perf_counter()
    store = engine.open()
    loaded = engine.load(store)
    load = time.perf_counter() - started
    engine.close(store)
    expected = len(data) + 5 * (delta_size - delta_size // 2)
    if len(loaded) != expected:
        raise AssertionError(f"{engine.name} loaded {len(loaded)} keys, wrote {expected}")
    size = disk_bytes(path)
    shutil.rmtree(path)
    return dict(engine=engine.name, snapshot=snapshot, delta=statistics.median(deltas),
                load=load, cold=cold, size=size, keys=len(loaded))


RANGES = 16                         # a node's ranges the keys are spread over


def node_states(keys: int) -> dict[int, dict]:
    """Word-count states of `keys` keys spread over RANGES ranges, as a node holds them."""
    step = (1 << 64) // RANGES
    tokens = [step * (i + 1) - 1 for i in range(RANGES)]
    out: dict[int, dict] = {t: {} for t in tokens}
    for i in range(keys):
        out[tokens[i % RANGES]][f"w{i}"] = i % 1000 + 1
    return out


def measure_node(root: Path, states: dict[int, dict], delta_size: int, per_key: bool,
                 rounds: int = 5, dicts: bool = False, tables: bool = False) -> dict:
    """The node store's full write, checkpoint delta and load of `states`; with
    `tables` each round's changes are a table range's checkpoint (a state table's
    swap: its export's columns), as a compiled node writes them."""
    from floering.node.storage import node_store
    from floering.node.storage.node_store import CopyWrite, NodeStore
    path = root / ("per-key" if per_key else "segments")
    store = NodeStore(path)
    store.save_identity("n0", 1)
    write = (lambda copies: node_store.write_per_key(store, copies)) if per_key else store.write
    started = time.perf_counter()
    write([CopyWrite(t, "n0", s, {"s": 1}, True) for t, s in states.items()])
    full = time.perf_counter() - started
    deltas, folds = [], []
    tokens = list(states)
    for round_ in range(rounds):
        changed: dict[int, dict] = {t: {} for t in tokens}
        for i, (k, v) in enumerate(delta(sum(map(len, states.values())), delta_size, round_)):
            changed[tokens[i % len(tokens)]][msgpack.unpackb(k)] = msgpack.unpackb(v)
        for t, c in changed.items():
            states[t].update(c)
        if tables:
            changed = _table_changes(changed)
        started = time.perf_counter()
        write([CopyWrite(t, "n0", c, {"s": round_ + 2}) for t, c in changed.items()])
        deltas.append(time.perf_counter() - started)
        if not per_key and any(s.next_generation == 1 for s in store.segments.values()):
            folds.append(deltas[-1])        # a range folded back into generation 0
    store.close()
    if dicts:
        read_as_dicts(path, rounds=2)
    cold = drop_caches()
    started = time.perf_counter()
    store = NodeStore(path)
    loaded = store.load()
    load = time.perf_counter() - started
    store.close()
    started = time.perf_counter()
    tables = {t: _table_copy(c.states) for t, c in loaded.copies.items()}
    install = time.perf_counter() - started
    if {t: c.state.snapshot() for t, c in tables.items()} != states or loaded.corrupt:
        raise AssertionError("the store read back other states than it was given")
    size = disk_bytes(path / "state")
    shutil.rmtree(path)
    return dict(full=full, delta=statistics.median(deltas), worst=max(deltas), folds=folds,
                load=load,
                install=install, cold=cold, size=size)


def read_as_dicts(path: Path, rounds: int) -> None:
    """The load and table install of the store at `path` with segments read as dicts
    (as restarts read them before frames), printed, for comparison."""
    from floering.node.storage.node_store import NodeStore
    for _ in range(rounds):
        started = time.perf_counter()
        store = NodeStore(path)
        store.columns = False
        loaded = store.load()
        store.close()
        read = time.perf_counter()
        tables = [_table_copy(c.states) for c in loaded.copies.values()]
        print(f"{'  segments read as dicts':28s} load {read - started:6.2f} s + table install "
              f"{time.perf_counter() - read:5.2f} s ({len(tables)} ranges)", flush=True)
        del loaded, tables


def _table_changes(changed: dict[int, dict]) -> dict:
    """Each range's changed states as a table range's checkpoint gives them."""
    from floering.node.core.reducers import Count
    from floering.node.core.table_state import TableState
    out = {}
    for t, c in changed.items():
        state = TableState(Count())
        state.install(c, mark_dirty=True)
        out[t] = state.swap()
    return out


def _table_copy(states):
    """A count's table copy of a range read back, as a restart installs it."""
    from floering.node.core.reducers import Count
    from floering.node.core.table_state import TableCopy
    copy = TableCopy(Count())
    copy.master = states
    return copy


def node_main(args) -> int:
    states = node_states(args.keys)
    print(f"node store: {args.keys:,} keys in {RANGES} ranges, checkpoint deltas of "
          f"{args.delta:,} keys (half new); under {args.dir}")
    formats = [("one entry a key (format 1)", True), ("segments (format 2)", False)]
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for name, per_key in formats:
            if per_key and not args.format1:
                continue
            row = measure_node(Path(root), {t: dict(s) for t, s in states.items()},
                               args.delta, per_key, args.rounds, args.dicts and not per_key,
                               args.tables and not per_key)
            print(f"{name:28s} full write {row['full']:6.2f} s  checkpoint "
                  f"{1000 * row['delta']:7.1f} ms (worst {1000 * row['worst']:.1f}; rounds "
                  f"that folded: {', '.join(f'{1000 * f:.1f}' for f in row['folds'])})  "
                  f"load {row['load']:6.2f} s"
                  f"{' (cold)' if row['cold'] else ' (warm)'} + table install "
                  f"{row['install']:5.2f} s  "
                  f"{row['size'] / 1e6:7.1f} MB on disk", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--delta", type=int, default=50_000)
    parser.add_argument("--dir", default="/var/tmp", help="where the stores are written")
    parser.add_argument("--rounds", type=int, default=5,
                        help="checkpoint rounds written (--node; the median is shown)")
    parser.add_argument("--no-format1", dest="format1", action="store_false",
                        help="--node: the segments only")
    parser.add_argument("--dicts", action="store_true",
                        help="--node: also load the segments as dicts (as before frames)")
    parser.add_argument("--tables", action="store_true",
                        help="--node: checkpoint changes as a table range's (its columns)")
    parser.add_argument("--node", action="store_true",
                        help="the node's own store: its format against one entry a key")
    args = parser.parse_args(argv)
    if args.node:
        return node_main(args)
    data = dataset(args.keys)
    print(f"{args.keys:,} keys (word count, msgpack), deltas of {args.delta:,} keys; "
          f"stores under {args.dir}")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for engine_class in ENGINES:
            row = measure(engine_class, Path(root), data, args.delta)
            rows.append(row)
            print(f"{row['engine']:40s} snapshot {row['snapshot']:6.2f} s "
                  f"({args.keys / row['snapshot'] / 1e6:.2f} M keys/s)  delta "
                  f"{1000 * row['delta']:7.1f} ms  load {row['load']:6.2f} s"
                  f"{' (cold)' if row['cold'] else ' (warm)'}  "
                  f"{row['size'] / 1e6:7.1f} MB on disk", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
