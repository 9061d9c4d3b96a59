"""The mapper's data path, before and after the combiner kernel and columns, side by
side in one run.

    python -m floering.chaos.mapper_bench [--tuples 2000000] [--words zipf|corpus]
                                          [--repeat 1] [--memory] [--passes 3]
                                          [--only combined|every]

Prints, on the same words (word count): the feeder's ceilings in one process (route,
fold or buffer, seal, encode; no network; per CPU second of the process, as the cores
are shared), combining and every tuple, the Python way
into format 1 (before) and through the kernels (COMBINE_KERNEL) into format 1 and
format 2; then end
to end from one feeder process to a `floe up`-style cluster (4 nodes, r=1, durable,
mutual TLS), combined and every tuple sent, each the old way (format 1, dict combining)
and the new (format 2, the kernel), a fresh cluster each, the order alternating per
repeat: the first pass over the words meets a fresh ring (every key new), the next
`--passes` - 1 passes a warm one (the same words again), each with the CPU seconds
the feeder process and the four nodes spent on it. Every count is checked against a
Counter after every pass.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
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
from floering.wire.ring import Ring

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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    import psutil
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def end_to_end(words: list[str], combine: bool, new: bool, memory: bool,
               passes: int = 1) -> tuple[list[tuple[float, float, float]], bool]:
    """([(input tuples/s, the feeder's CPU s, the nodes' CPU s) of each pass], exact)
    into a fresh cluster: the first pass meets a ring that has never seen a tuple
    (every key new to its tables, the Push streams opened), the others the same words
    again through the same client, as a long-running stream over a known vocabulary
    does. Exact: after every pass, the ring holds the words' counts times the passes
    so far."""
    runs, exact, expected = [], True, Counter(words)
    with tempfile.TemporaryDirectory(prefix="floe-mapper-bench-") as workdir:
        data_dir = None if memory else f"{workdir}/data"
        with LocalCluster.up(NODES, 1, workdir=workdir, tls=True, data_dir=data_dir) as cluster:
            pids = [node.pid for node in cluster.nodes]
            with RingClient(cluster.seeds, tls=cluster.tls("client"), combine=combine,
                            columnar=None if new else False) as client:
                client._batcher.kernels = new      # False: Python dicts and lists
                assert client._batcher.columns() == new
                for done in range(1, passes + 1):
                    nodes = sum(map(cpu_seconds, pids))
                    feeder = time.process_time()
                    started = time.perf_counter()
                    for i in range(0, len(words), CHUNK):
                        client.emit_many(words[i:i + CHUNK])
                    client.flush()
                    runs.append((len(words) / (time.perf_counter() - started),
                                 time.process_time() - feeder,
                                 sum(map(cpu_seconds, pids)) - nodes))
                    exact = exact and dict(client.scan()) == {
                        k: n * done for k, n in expected.items()}
    return runs, exact


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=2_000_000, help="(default: %(default)s)")
    parser.add_argument("--words", choices=("zipf", "corpus"), default="zipf",
                        help="Zipf(1) over 50,000 words, or the KJV text (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="(default: %(default)s)")
    parser.add_argument("--memory", action="store_true", help="nodes without a data directory")
    parser.add_argument("--only", choices=("combined", "every"),
                        help="end to end, only combined or only every tuple sent")
    parser.add_argument("--passes", type=int, default=3,
                        help="passes over the words into each fresh ring: the first meets "
                             "new keys, the others a warm ring (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.passes < 1:
        parser.error("--passes must be at least 1")
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
        for combine in {None: (True, False), "combined": (True,), "every": (False,)}[args.only]:
            rates = {}
            for new in ((False, True) if i % 2 == 0 else (True, False)):
                runs, ok = end_to_end(words, combine, new, args.memory, args.passes)
                warm = runs[1:] or runs
                rates[new] = runs[0][0], statistics.median(r for r, _, _ in warm)
                exact = exact and ok
                what = "combined" if combine else "every tuple"
                how = "new: kernel, format 2" if new else "old: Python, format 1"
                cpu = "; CPU s a pass, feeder + nodes: " + ", ".join(
                    f"{f:.2f} + {n:.2f}" for _, f, n in runs)
                print(f"end to end, {what:11s}, {how:21s}: {runs[0][0] / 1e6:6.2f} M tuples/s "
                      f"fresh ring" + (f", {rates[new][1] / 1e6:6.2f} M/s warm (median of "
                                       f"{len(runs) - 1} more passes)" if runs[1:] else "")
                      + f" (exact={ok}){cpu}", flush=True)
            print(f"  new / old: {rates[True][0] / rates[False][0]:.2f} fresh, "
                  f"{rates[True][1] / rates[False][1]:.2f} warm", flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
