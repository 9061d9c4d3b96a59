"""Throughput and latency benchmark, measured side by side in one run.

    python -m floering.chaos.bench [--tuples 3000000] [--words zipf|corpus] [--nodes 4]
                          [--seconds 8] [--insecure] [--durable] [--spark]
    python -m floering.chaos.bench --latency-only [--rate 0.8] [--repeat 3] [--memory]
    python -m floering.chaos.bench --spark-rounds 3 [--tuples 3000000] [--memory]

Prints: the in-process ceilings (msgpack decode + reducer apply; the feeder's route +
batch + encode, tuple by tuple and combined); end-to-end throughput in input tuples/s
from one feeder process to N node processes, combined on the mapper (the default for
a reducer with a merge) with r=0 and r=1, and every tuple sent (combine=False) with
r=1; then the highest rate an open-loop feed keeps up with (`sustained_rate`), and
latency at 1/4, 1/2 and 3/4 of that rate, each for --seconds: every 5 ms tick is due
at a fixed time, a batch's
latency counts from the due time of its earliest tuple to its last acknowledgement
by r+1 (so a feeder behind schedule shows, no coordinated omission), p50/p99/p999
weighted by tuples. Every ring runs mutual TLS as deployed; every count is checked
against a Counter. --spark adds Spark Structured Streaming's own stateful count of
the same words (chaos.spark_bench, warm JVM) and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import itertools
import random
import tempfile
import time
from collections import Counter, defaultdict

import psutil

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.mapper import RingClient, split_words
from floering.mapper.combining import CombiningBatcher
from floering.mapper.routing import Router
from floering.node.core.batch import decode_batch, decode_payload, encode_batch, encode_payload
from floering.node.core.reducers import Count, reducer_identity
from floering.wire.ring import Ring
from floering.node.core.state_store import LayeredState
from floering.node.core.table_state import TableState

CHUNK = 50_000
TICK = 0.005               # seconds between two due times of the open-loop feed
LOADS = (0.25, 0.5, 0.75)  # latency points, as shares of the rate the feed sustains
KEPT_UP = 0.25             # seconds: the backlog a feed that keeps up leaves at its end
MAX_STEPS = 8              # open-loop runs to find that rate
DEFAULT_FSYNC = 0.002      # `floe up`'s default: durable, a group commit every 2 ms


def corpus_words(n: int) -> list[str]:
    words = [w for line in kjv_lines() for w in split_words(line)]
    return (words * (n // len(words) + 1))[:n]


def zipf_words(n: int, distinct: int = 50_000, s: float = 1.0, seed: int = 1) -> list[str]:
    """`n` words drawn from `distinct` ones with Zipf(s) frequencies (seeded)."""
    rng = random.Random(seed)
    vocabulary = [_letters(rank) for rank in range(1, distinct + 1)]
    weights = list(itertools.accumulate(1.0 / rank ** s for rank in range(1, distinct + 1)))
    return rng.choices(vocabulary, cum_weights=weights, k=n)


def _letters(n: int) -> str:
    """A word of letters only for `n` (what Spark's and the mapper's word split keep)."""
    word = ""
    while n:
        n, digit = divmod(n, 26)
        word += "abcdefghijklmnopqrstuvwxyz"[digit]
    return "w" + word


def ceiling_apply(words: list[str], batch: int = 1000) -> float:
    chunks = [words[i:i + batch] for i in range(0, len(words), batch)]
    payloads = [(encode_payload(c, [1] * len(c)), len(c)) for c in chunks]
    state = LayeredState(Count())
    started = time.perf_counter()
    for payload, count in payloads:
        keys, values = decode_payload(payload, count)
        state.apply(keys, values)
    return len(words) / (time.perf_counter() - started)


def ceiling_apply_table(words: list[str], batch: int = 1000, columns: bool = True) -> float:
    """Decode + apply into a range's table-backed state: format 2 batches folded in one
    call each (`columns`), or format 1 batches whose keys are packed then folded."""
    chunks = [words[i:i + batch] for i in range(0, len(words), batch)]
    encode = encode_batch if columns else encode_payload
    payloads = [(encode(c, [1] * len(c)), len(c)) for c in chunks]
    state = TableState(Count())
    started = time.perf_counter()
    for payload, count in payloads:
        if columns:
            state.apply_columns(decode_batch(payload, count))
        else:
            state.apply(*decode_payload(payload, count))
    return len(words) / (time.perf_counter() - started)


def ceiling_feeder(words: list[str], nodes: int, batch: int = 1000) -> float:
    ring = Ring.initial({f"n{i}": f"127.0.0.1:{i + 1}" for i in range(nodes)}, 1, 8)
    router = Router(ring)
    started = time.perf_counter()
    buffers: dict = defaultdict(list)
    for word in words:
        buf = buffers[router.token(word)]
        buf.append(word)
        if len(buf) >= batch:
            encode_payload(buf, [1] * len(buf))
            buf.clear()
    return len(words) / (time.perf_counter() - started)


def ceiling_combining(words: list[str], nodes: int, batch: int = 1000) -> float:
    """The combining batcher alone (route, fold, seal, encode), no network."""
    ring = Ring.initial({f"n{i}": f"127.0.0.1:{i + 1}" for i in range(nodes)}, 1, 8,
                        reducer=reducer_identity("count", {}))
    batcher = CombiningBatcher(Router(ring), None, "bench", batch, Count(), 64 * batch)
    started = time.perf_counter()
    for i in range(0, len(words), CHUNK):
        batcher.emit_many(words[i:i + CHUNK], 1)
        batcher.sealed.clear()
    batcher.seal_all()
    return len(words) / (time.perf_counter() - started)


def _cluster(workdir: str, nodes: int, replicas: int, tls: bool,
             fsync: float | None) -> LocalCluster:
    """A cluster in memory, or durable (`fsync`: its --fsync-interval) when given."""
    if fsync is None:
        return LocalCluster.up(nodes, replicas, workdir=workdir, tls=tls)
    return LocalCluster.up(nodes, replicas, workdir=workdir, tls=tls,
                           data_dir=f"{workdir}/data",
                           extra_args=["--fsync-interval", str(fsync)])


def end_to_end(words: list[str], nodes: int, replicas: int, tls: bool = True,
               fsync: float | None = None, combine: bool = True,
               columnar: bool | None = None, dict_nodes: bool = False,
               cpu: list | None = None) -> tuple[float, bool, float]:
    """(input tuples/s, exact, bytes the nodes wrote to disk per tuple). `dict_nodes`:
    the nodes keep their states in dicts (FLOE_PURE=1), as before the state table.
    `cpu` gets the CPU seconds the node processes used during the feed."""
    with tempfile.TemporaryDirectory(prefix="floe-bench-") as workdir:
        with _node_kernel(dict_nodes), _cluster(workdir, nodes, replicas, tls, fsync) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client"),
                            combine=combine, columnar=columnar) as client:
                written, used = _bytes_written(cluster), _node_cpu(cluster)
                started = time.perf_counter()
                for i in range(0, len(words), CHUNK):
                    client.emit_many(words[i:i + CHUNK])
                client.flush()
                rate = len(words) / (time.perf_counter() - started)
                written = _bytes_written(cluster) - written
                if cpu is not None:
                    cpu.append(_node_cpu(cluster) - used)
                exact = dict(client.scan()) == Counter(words)
    return rate, exact, written / len(words)


@contextlib.contextmanager
def _node_kernel(dicts: bool):
    """Node processes started inside run with dict states (FLOE_PURE=1) if `dicts`."""
    before = os.environ.get("FLOE_PURE")
    if dicts:
        os.environ["FLOE_PURE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FLOE_PURE", None)
        else:
            os.environ["FLOE_PURE"] = before


def kernels_side_by_side(words: list[str], nodes: int) -> bool:
    """The node's state before and after the state table, in one run: in-process decode
    + apply, then end to end (4 nodes, r=1, every tuple sent and combined) with dict
    nodes fed format 1 against table nodes fed format 2."""
    # (wall time, as the other ceilings: on a machine shared with other work, compare
    # the three lines of one run, not runs)
    print(f"ceiling, decode + apply, dict path, format 1   : "
          f"{ceiling_apply(words) / 1e6:6.2f} M tuples/s")
    print(f"ceiling, decode + apply, table, format 1       : "
          f"{ceiling_apply_table(words, columns=False) / 1e6:6.2f} M tuples/s")
    print(f"ceiling, decode + apply, table, format 2       : "
          f"{ceiling_apply_table(words) / 1e6:6.2f} M tuples/s", flush=True)
    exact = True
    runs = (("dict nodes, format 1 ", True, False), ("table nodes, format 1", False, False),
            ("table nodes, format 2", False, True))
    for combine in (False, True):
        base = None
        for name, dicts, columnar in runs:
            used: list = []
            rate, ok, _ = end_to_end(words, nodes, 1, combine=combine, columnar=columnar,
                                     dict_nodes=dicts, cpu=used)
            exact, base = exact and ok, base or rate
            print(f"end to end, {'combined   ' if combine else 'every tuple'}, r=1, {name}: "
                  f"{rate / 1e6:6.2f} M tuples/s (x{rate / base:.2f}), nodes' CPU "
                  f"{used[0] / len(words) * 1e9:6.0f} ns a tuple (exact={ok})", flush=True)
    return exact


def _node_cpu(cluster: LocalCluster) -> float:
    """CPU seconds the node processes used so far (user + system)."""
    return sum(sum(psutil.Process(node.pid).cpu_times()[:2]) for node in cluster.nodes)


def _bytes_written(cluster: LocalCluster) -> int:
    """What the node processes wrote to storage so far (their I/O counters)."""
    return sum(psutil.Process(node.pid).io_counters().write_bytes for node in cluster.nodes)


def latency(words: list[str], nodes: int, replicas: int, rate: float, seconds: float = 8.0,
            tls: bool = True, fsync: float | None = None, combine: bool = True,
            stages: list | None = None) -> tuple[float, float, float, bool]:
    """Feed `rate` tuples/s open loop for `seconds`; (p50, p99, p999) seconds from each
    tuple's due time to its batch's last ack, weighted by tuples, and exactness.
    `stages` gets where each delivered batch's time went (mapper Delivery.stages)."""
    return open_loop(words, nodes, replicas, rate, seconds, tls, fsync, combine, stages)[:4]


def open_loop(words: list[str], nodes: int, replicas: int, rate: float, seconds: float,
              tls: bool = True, fsync: float | None = None, combine: bool = True,
              stages: list | None = None) -> tuple[float, float, float, bool, float]:
    """latency(), and how long after the last due time the last tuple was acknowledged
    (a ring that keeps up with `rate` has its backlog gone within a round trip)."""
    per_tick = max(1, int(rate * TICK))
    ticks = max(1, int(seconds / TICK))
    fed: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix="floe-bench-") as workdir:
        with _cluster(workdir, nodes, replicas, tls, fsync) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client"),
                            combine=combine) as client:
                started = time.monotonic()
                at = 0
                for n in range(ticks):
                    due = started + n * TICK
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    chunk = words[at:at + per_tick]
                    if len(chunk) < per_tick:
                        at = 0
                        chunk = words[:per_tick]
                    at += per_tick
                    fed.update(chunk)
                    client.emit_many(chunk, due=due)
                client.flush()
                behind = time.monotonic() - (started + (ticks - 1) * TICK)
                samples = client.delivery_latencies()
                if stages is not None:
                    stages.extend(client.delivery_stages())
                exact = dict(client.scan()) == fed
    return (*percentiles(samples, (0.50, 0.99, 0.999)), exact, behind)


def sustained_rate(words: list[str], nodes: int, replicas: int, start: float,
                   seconds: float = 4.0, log=print,
                   fsync: float | None = None) -> tuple[float, bool]:
    """The highest rate the open-loop feed keeps up with (its last tuple acknowledged
    within KEPT_UP seconds of its last due time: a ring that falls behind ends the run
    with a backlog that grows with the run), found by stepping up from `start` by half
    again until it does not, then halving the gap twice; and exactness throughout.
    The latency points are shares of this rate, of the same feed, not of a
    closed-loop throughput whose batches combine far more."""
    low, high, rate, exact = 0.0, None, start, True
    for _ in range(MAX_STEPS):
        *_, ok, behind = open_loop(words, nodes, replicas, rate, seconds, True, fsync)
        exact = exact and ok
        kept = behind <= KEPT_UP
        log(f"  open-loop feed at {rate / 1e6:.3f} M tuples/s: last ack {behind:.3f} s "
            f"after the last due time ({'kept up' if kept else 'fell behind'}, exact={ok})")
        if kept:
            low = rate
        else:
            high = rate
        if high is None:
            rate *= 1.5
        elif low == 0.0:
            rate /= 2
        elif high / low < 1.15:
            break
        else:
            rate = (low + high) / 2
    return low, exact


def percentiles(samples: list[tuple[float, int]], points) -> tuple[float, ...]:
    """Tuple-weighted percentiles of (seconds, tuples) samples."""
    samples = sorted(samples)
    total = sum(c for _, c in samples)
    out = []
    for p in points:
        seen = 0
        for seconds, count in samples:
            seen += count
            if seen >= p * total:
                out.append(seconds)
                break
        else:
            out.append(samples[-1][0])
    return tuple(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=3_000_000,
                        help="words fed in each throughput run (default: %(default)s)")
    parser.add_argument("--words", choices=("zipf", "corpus"), default="zipf",
                        help="zipf: Zipf(1.0) over 50,000 distinct words; corpus: the "
                             "King James Bible's words, repeated (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="open-loop feed per latency point (default: %(default)s)")
    parser.add_argument("--insecure", "--tls", dest="compare", action="store_true",
                        help="also run r=1 in the clear, side by side with mutual TLS")
    parser.add_argument("--durable", action="store_true",
                        help="also run r=1 durable (--data-dir) at a few --fsync-interval "
                             "settings, side by side with memory mode")
    parser.add_argument("--spark", action="store_true",
                        help="also run Spark Structured Streaming's own count of the same "
                             "words (warm JVM) and print the ratio")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --insecure: this many TLS / plain pairs, taking turns, "
                             "and their median ratio (one pair cannot resolve a cost "
                             "below the machine's run-to-run swing)")
    parser.add_argument("--restart-keys", default="",
                        help="comma-separated key counts (e.g. 100000,5000000): time a "
                             "durable one-node ring holding that many keys from SIGKILL to "
                             "serving again on its data directory")
    parser.add_argument("--latency-only", action="store_true",
                        help="only open-loop latency, in the default `floe up` mode "
                             "(durable, 2 ms group commit; --memory: in memory): the "
                             "sustained rate (or --rate), then --repeat rounds of the "
                             "25%% and 50%% points, the machine's load printed with each")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="with --latency-only: the sustained open-loop rate in M "
                             "tuples/s, rather than finding it")
    parser.add_argument("--memory", action="store_true",
                        help="with --latency-only or --spark-rounds: the nodes in memory, not durable")
    parser.add_argument("--spark-rounds", type=int, default=0, metavar="N",
                        help="only Spark's warm count against the ring end to end, every "
                             "tuple sent and combined, in the default `floe up` mode "
                             "(durable, 2 ms group commit; --memory: in memory), N rounds "
                             "taking turns, the machine's load printed with each")
    parser.add_argument("--kernels", action="store_true",
                        help="only the node state before and after the state table, side "
                             "by side (dict nodes fed format 1, table nodes format 2)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.restart_keys:
        for keys in map(int, args.restart_keys.split(",")):
            restart, exact = restart_time(keys)
            print(f"durable restart, {keys:,} keys on the node: serving again {restart:.2f} s "
                  f"after the restart began (exact={exact})")
    words = zipf_words(args.tuples) if args.words == "zipf" else corpus_words(args.tuples)
    if args.kernels:
        gc.freeze()
        return 0 if kernels_side_by_side(words, args.nodes) else 1
    if args.spark_rounds:
        gc.freeze()
        return 0 if spark_side_by_side(words, args.nodes, args.spark_rounds,
                                       None if args.memory else DEFAULT_FSYNC) else 1
    if args.latency_only:
        gc.freeze()
        return 0 if latency_only(words, args.nodes, args.rate * 1e6, args.seconds,
                                 None if args.memory else DEFAULT_FSYNC, args.repeat) else 1
    # The feeder's input is this benchmark's own list of millions of words: left in
    # the collector, every full collection walks it, a 70-80 ms pause of the feeder
    # that doubled p99 at light load. A feeder reading a stream holds no such list.
    gc.freeze()
    spark = None
    if args.spark:
        # First, while this process runs no gRPC thread: PySpark starts its JVM with a
        # Python preexec_fn, which is not safe to fork with threads running, and once
        # (of three runs) the JVM died before giving its port.
        from floering.chaos.spark_bench import spark_count_rate
        spark = spark_count_rate(words)
    print(f"workload: {len(words):,} words ({args.words}, {len(set(words)):,} distinct; "
          f"word count), {args.nodes} nodes, batches of 1000, mutual TLS on every call",
          flush=True)
    apply_rate = ceiling_apply(words)
    print(f"ceiling, decode + apply in one process    : {apply_rate / 1e6:6.2f} M tuples/s")
    feed_rate = ceiling_feeder(words, args.nodes)
    print(f"ceiling, feeder route + batch + encode    : {feed_rate / 1e6:6.2f} M tuples/s")
    comb_rate = ceiling_combining(words, args.nodes)
    print(f"ceiling, feeder combining                 : {comb_rate / 1e6:6.2f} M tuples/s",
          flush=True)
    r0, exact0, _ = end_to_end(words, args.nodes, 0)
    print(f"end to end, combined, r=0                 : {r0 / 1e6:6.2f} M tuples/s "
          f"(exact={exact0})", flush=True)
    r1, exact1, _ = end_to_end(words, args.nodes, 1)
    print(f"end to end, combined, r=1                 : {r1 / 1e6:6.2f} M tuples/s "
          f"(r=0 / r=1 = {r0 / r1:.2f}, exact={exact1})", flush=True)
    u1, exactu, _ = end_to_end(words, args.nodes, 1, combine=False)
    print(f"end to end, every tuple sent, r=1         : {u1 / 1e6:6.2f} M tuples/s "
          f"(combined / every tuple = {r1 / u1:.2f}, exact={exactu})", flush=True)
    exact = exact0 and exact1 and exactu
    print("open-loop feed, r=1, 5 ms ticks, combined: the highest rate it keeps up with",
          flush=True)
    sustained, ok = sustained_rate(words, args.nodes, 1, start=u1 / 4,
                                   log=lambda line: print(line, flush=True))
    exact = exact and ok
    print(f"sustained open-loop rate, r=1               : {sustained / 1e6:6.3f} M tuples/s "
          f"({sustained / r1:.0%} of the closed-loop combined r=1)", flush=True)
    p99_half = None
    for share in LOADS:
        p50, p99, p999, ok = latency(words, args.nodes, 1, sustained * share, args.seconds)
        exact = exact and ok
        p99_half = p99 if share == 0.5 else p99_half
        print(f"latency at {share:.0%} load ({sustained * share / 1e6:.3f} M tuples/s, r=1, "
              f"{args.seconds:g} s): p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, p999 "
              f"{p999 * 1e3:.1f} ms (due -> acked by r+1, exact={ok})", flush=True)
    if spark is not None:
        rate, ok = spark
        exact = exact and ok
        print(f"Spark Structured Streaming's count, warm : {rate / 1e6:6.2f} M tuples/s "
              f"(ring combined r=1 / Spark = {r1 / rate:.2f}, exact={ok})", flush=True)
    if args.compare:
        exact = tls_side_by_side(words, words, args.nodes, r1 / 2, args.repeat) and exact
    if args.durable:
        exact = durable_side_by_side(words, words, args.nodes, r1, p99_half) and exact
    return 0 if exact else 1


def latency_only(words: list[str], nodes: int, sustained: float, seconds: float,
                 fsync: float | None, repeat: int) -> bool:
    """Open-loop latency at LOADS[:2] of the sustained rate (found first when not
    given), `repeat` rounds; r=1, mutual TLS, durable at `fsync` (None: in memory)."""
    mode = "in memory" if fsync is None else f"durable, fsync every {fsync * 1e3:g} ms"
    exact = True
    if not sustained:
        sustained, exact = sustained_rate(words, nodes, 1, start=200_000, fsync=fsync,
                                          log=lambda line: print(line, flush=True))
    print(f"sustained open-loop rate, r=1, {mode}: {sustained / 1e6:.3f} M tuples/s",
          flush=True)
    for i in range(repeat):
        for share in LOADS[:2]:
            load, stages = _loadavg(), []
            p50, p99, p999, ok = latency(words, nodes, 1, sustained * share, seconds,
                                         fsync=fsync, stages=stages)
            exact = exact and ok
            print(f"round {i + 1}, {share:.0%} load ({sustained * share / 1e6:.3f} M "
                  f"tuples/s, {seconds:g} s, {mode}): p50 {p50 * 1e3:.1f} ms, p99 "
                  f"{p99 * 1e3:.1f} ms, p999 {p999 * 1e3:.1f} ms (exact={ok}; machine "
                  f"load {load} before, {_loadavg()} after)", flush=True)
            print("  " + stage_summary(stages), flush=True)
    return exact


def spark_side_by_side(words: list[str], nodes: int, rounds: int,
                       fsync: float | None) -> bool:
    """Spark Structured Streaming's warm count of `words` (chaos.spark_bench), the ring
    with every tuple sent (`RingClient(combine=False)`) and combined, r=1, mutual TLS,
    durable at `fsync` (None: in memory); `rounds` rounds taking turns, each round's
    ratios and the medians."""
    from floering.chaos.spark_bench import WarmSparkCount
    mode = "in memory" if fsync is None else f"durable, fsync every {fsync * 1e3:g} ms"
    print(f"workload: {len(words):,} words ({len(set(words)):,} distinct), {nodes} nodes, "
          f"r=1, mutual TLS, {mode}; Spark: local[2], RocksDB changelog state store, warm "
          f"JVM, 1,000 words a line in 8 files, 2 a micro-batch", flush=True)
    rates: dict[str, list[float]] = {"spark": [], "every tuple": [], "combined": []}
    exact = True
    # The JVM starts first, while this process runs no gRPC thread (spark_count_rate).
    with WarmSparkCount(words) as spark:
        for i in range(rounds):
            load = _loadavg()
            spark_rate, ok = spark.run()
            rates["spark"].append(spark_rate)
            exact = exact and ok
            for name, combine in (("every tuple", False), ("combined", True)):
                rate, ok, _ = end_to_end(words, nodes, 1, fsync=fsync, combine=combine)
                rates[name].append(rate)
                exact = exact and ok
            print(f"round {i + 1}: Spark {spark_rate / 1e6:.3f} M/s; every tuple "
                  f"{rates['every tuple'][-1] / 1e6:.3f} M/s (x{rates['every tuple'][-1] / spark_rate:.2f}); "
                  f"combined {rates['combined'][-1] / 1e6:.3f} M/s "
                  f"(x{rates['combined'][-1] / spark_rate:.2f}); exact={exact}; machine load "
                  f"{load} before, {_loadavg()} after", flush=True)
    for name in ("every tuple", "combined"):
        ratios = sorted(r / s for r, s in zip(rates[name], rates["spark"]))
        print(f"{name} / Spark: median x{ratios[len(ratios) // 2]:.2f} "
              f"(x{ratios[0]:.2f}-x{ratios[-1]:.2f} over {rounds} rounds)", flush=True)
    return exact


def stage_summary(stages: list) -> str:
    """p50 / p99 of each stage of the batches' way (mapper delivery.STAGES), per batch."""
    from floering.mapper.delivery import STAGES
    if not stages:
        return "no batch timed"
    parts = []
    for i, name in enumerate(STAGES):
        times = sorted(s[i] for s in stages)
        parts.append(f"{name} {times[len(times) // 2] * 1e3:.1f} / "
                     f"{times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3:.1f}")
    return f"stages, ms p50 / p99 over {len(stages):,} batches: " + ", ".join(parts)


def _loadavg() -> str:
    """The machine's 1-minute load average (other work on a shared machine)."""
    return f"{os.getloadavg()[0]:.2f}"


def tls_side_by_side(words, sample, nodes: int, rate: float, repeat: int) -> bool:
    """r=1 with mutual TLS and in the clear, `repeat` pairs taking turns (which goes
    first alternates); each pair's ratio and the median."""
    ratios, exact = [], True
    for i in range(repeat):
        order = (True, False) if i % 2 else (False, True)
        rates, lat = {}, {}
        for tls in order:
            rates[tls], ok, _ = end_to_end(words, nodes, 1, tls=tls)
            lat[tls] = latency(sample, nodes, 1, rate, tls=tls)[:2]
            exact = exact and ok
        ratios.append(rates[True] / rates[False])
        print(f"pair {i + 1}: r=1 TLS {rates[True] / 1e6:.2f} M/s, plain "
              f"{rates[False] / 1e6:.2f} M/s, TLS / plain = {ratios[-1]:.2f}; p50 / p99 TLS "
              f"{lat[True][0] * 1e3:.1f} / {lat[True][1] * 1e3:.1f} ms, plain "
              f"{lat[False][0] * 1e3:.1f} / {lat[False][1] * 1e3:.1f} ms")
    ratios.sort()
    print(f"TLS / plain throughput, median of {repeat}: {ratios[len(ratios) // 2]:.2f} "
          f"(range {ratios[0]:.2f} to {ratios[-1]:.2f})")
    return exact


def restart_time(keys: int) -> tuple[float, bool]:
    """Seconds from starting a SIGKILLed durable node again to its serving, with
    `keys` distinct keys in its state; and whether every count came back."""
    import signal
    from floering.floe.cluster import spawn_node
    with tempfile.TemporaryDirectory(prefix="floe-bench-") as workdir:
        with _cluster(workdir, 1, 0, True, 0.002) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                for start in range(0, keys, CHUNK):
                    client.emit_many([f"k{i}" for i in range(start, min(keys, start + CHUNK))])
                client.flush()
            node = cluster.nodes[0]
            cluster.kill(node.node_id, signal.SIGKILL)
            started = time.perf_counter()
            cluster.nodes[0] = spawn_node(node.node_id, node.address, node.cmd, node.log)
            cluster.save()
            cluster.wait_ready(600)
            elapsed = time.perf_counter() - started
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                got = dict(client.scan())
    return elapsed, len(got) == keys and set(got.values()) == {1}


def durable_side_by_side(words, sample, nodes: int, memory_rate: float,
                         memory_p99: float) -> bool:
    """r=1 durable at a few fsync intervals against the memory-mode figures above."""
    exact = True
    for fsync in (0.0, 0.002, 0.01):
        rate, ok, per_tuple = end_to_end(words, nodes, 1, fsync=fsync)
        p50, p99, _, ok2 = latency(sample, nodes, 1, memory_rate / 2, fsync=fsync)
        print(f"durable, fsync every {fsync * 1e3:4.1f} ms, r=1       : {rate / 1e6:6.2f} M "
              f"tuples/s (durable / memory = {rate / memory_rate:.2f}, exact={ok}), "
              f"{per_tuple:.0f} bytes written per tuple; at half the memory load p50 "
              f"{p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms ({(p99 - memory_p99) * 1e3:+.1f} "
              f"against memory)")
        exact = exact and ok and ok2
    return exact


if __name__ == "__main__":
    raise SystemExit(main())
