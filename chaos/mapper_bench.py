"""The mapper's data path, before and after the combiner kernel and columns, side by
side in one run.

    python -m floering.chaos.mapper_bench [--tuples 2000000] [--words zipf|corpus]
                                          [--repeat 1] [--memory]

Prints, on the same words (word count): the feeder's ceilings in one process (route,
fold or buffer, seal, encode; no network; per CPU second of the process, as the cores
are shared), combining and every tuple, the Python way
into format 1 (before) and through the kernels (COMBINE_KERNEL) into format 1 and
format 2; then end
to end from one feeder process to a `floe up`-style cluster (4 nodes, r=1, durable,
mutual TLS), combined and every tuple sent, each the old way (format 1, dict combining)
and the new (format 2, the kernel), a fresh cluster each, the order alternating per
repeat. Every count is checked against a Counter.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections import Counter

from floering.chaos.bench import CHUNK, corpus_words, zipf_words
from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper.batching import Batcher
from floering.mapper.combining import COMBINE_KERNEL, CombiningBatcher
from floering.mapper.routing import Router
from floering.node.core.reducers import Count, reducer_identity
from floering.node.core.ring import Ring

NODES = 4


def ceiling(words: list[str], combine: bool, kernel: bool, columns: bool,
            batch: int = 1000) -> float:
    """The batcher alone, tuples per CPU second of this process (shared cores)."""
    ring = Ring.initial({f"n{i}": f"127.0.0.1:{i + 1}" for i in range(NODES)}, 1, 8,
                        reducer=reducer_identity("count", {}))
    if combine:
        batcher = CombiningBatcher(Router(ring), None, "bench", batch, Count(), 64 * batch,
                                   columnar=columns)
    else:
        batcher = Batcher(Router(ring), None, "bench", batch, columnar=columns)
    batcher.kernels = kernel                  # False: Python dicts and lists, as before
    started = time.process_time()
    for i in range(0, len(words), CHUNK):
        batcher.emit_many(words[i:i + CHUNK], 1)
        batcher.sealed.clear()
    batcher.seal_all()
    return len(words) / (time.process_time() - started)


def end_to_end(words: list[str], combine: bool, new: bool, memory: bool) -> tuple[float, bool]:
    """(input tuples/s, exact) into a fresh cluster."""
    with tempfile.TemporaryDirectory(prefix="floe-mapper-bench-") as workdir:
        data_dir = None if memory else f"{workdir}/data"
        with LocalCluster.up(NODES, 1, workdir=workdir, tls=True, data_dir=data_dir) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client"), combine=combine,
                            columnar=None if new else False) as client:
                client._batcher.kernels = new      # False: Python dicts and lists
                assert client._batcher.columns() == new
                started = time.perf_counter()
                for i in range(0, len(words), CHUNK):
                    client.emit_many(words[i:i + CHUNK])
                client.flush()
                rate = len(words) / (time.perf_counter() - started)
                exact = dict(client.scan()) == Counter(words)
    return rate, exact


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=2_000_000, help="(default: %(default)s)")
    parser.add_argument("--words", choices=("zipf", "corpus"), default="zipf",
                        help="Zipf(1) over 50,000 words, or the KJV text (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="(default: %(default)s)")
    parser.add_argument("--memory", action="store_true", help="nodes without a data directory")
    args = parser.parse_args(argv)
    words = zipf_words(args.tuples) if args.words == "zipf" else corpus_words(args.tuples)
    gc.freeze()
    print(f"workload: {len(words):,} words ({args.words}, {len(set(words)):,} distinct), "
          f"{NODES} nodes r=1, {'in memory' if args.memory else 'durable'}, mutual TLS; "
          f"combiner kernel: {COMBINE_KERNEL}", flush=True)
    exact = True
    for i in range(args.repeat):
        for combine in (True, False):
            for label, kernel, columns in (("Python, format 1 (before)", False, False),
                                           ("kernel, format 1", True, False),
                                           ("kernel, format 2", True, True)):
                rate = ceiling(words, combine, kernel, columns)
                what = "combining" if combine else "every tuple"
                print(f"ceiling, feeder {what:11s}, {label:25s}: {rate / 1e6:6.2f} M tuples"
                      f"/CPU s", flush=True)
        for combine in (True, False):
            rates = {}
            for new in ((False, True) if i % 2 == 0 else (True, False)):
                rates[new], ok = end_to_end(words, combine, new, args.memory)
                exact = exact and ok
                what = "combined" if combine else "every tuple"
                how = "new: kernel, format 2" if new else "old: Python, format 1"
                print(f"end to end, {what:11s}, {how:21s}: {rates[new] / 1e6:6.2f} M tuples/s "
                      f"(exact={ok})", flush=True)
            print(f"  new / old: {rates[True] / rates[False]:.2f}", flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
