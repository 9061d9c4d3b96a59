"""Spark's own stateful word count against the same query feeding the ring, side by side.

    python -m floering.chaos.spark_bench [--copies 1] [--files 8] [--latency-files 6] [--rounds 3]
                                [--row-path]

One SparkSession (local[2], 2 shuffle partitions, RocksDB state store with changelog
checkpointing) runs, on the same text files:
  spark    readStream.text -> explode(regexp_extract_all(lower(value))) ->
           groupBy(word).count(), complete mode into the memory sink
  ring     readStream.text -> foreachBatch (the driver's RingSink): the lines to the
           tasks as Arrow batches (mapInArrow), the same word split done there by the
           mapper's compiled kernel (in Spark SQL where it is not built), into a fresh
           4-node ring (r=1): combined per partition first (the driver's default), and
           every tuple sent (--no-combine)
  --row-path adds the same two with the split in Python over the rows (foreachPartition,
           the path of a custom map step).
Throughput: available-now over the whole input (2 files per batch), words / wall time.
Latency: files dropped one at a time into a watched directory; per file, the time from
its arrival to the end of the micro-batch that made its counts visible.
Both results are checked exactly against a Counter over the input. Each throughput run's
CPU seconds are printed too, by kind of process: Spark's JVM, its Python workers, the
ring's nodes, the driver.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import psutil

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.mapper import RingClient, split_words
from floering.spark_driver.launch import LOG_CONFIG
from floering.spark_driver.maps import DEFAULT_TEXT_MAP, WORD_PATTERN
from floering.spark_driver.sink import RingSink, session_builder


def write_files(directory: Path, lines: list[str], files: int, start: int = 0) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(lines) // files)
    paths = []
    for i in range(files):
        path = directory / f"part-{start + i:03d}.txt"
        tmp = directory / f".{path.name}.tmp"
        tmp.write_text("\n".join(lines[i * per:(i + 1) * per]) + "\n")
        tmp.rename(path)
        paths.append(path)
    return paths


class SparkCount:
    name = "spark groupBy(word).count()"

    def __init__(self, spark) -> None:
        self.spark = spark
        self.table = ""

    def start(self, source: Path, checkpoint: Path, available_now: bool, files_per_batch: int):
        from pyspark.sql import functions as F
        self.table = f"counts_{time.monotonic_ns()}"     # one memory table per query
        lines = (self.spark.readStream.option("maxFilesPerTrigger", files_per_batch)
                 .text(str(source)))
        words = lines.select(F.explode(F.regexp_extract_all(
            F.lower("value"), F.lit(WORD_PATTERN), F.lit(0))).alias("word"))
        writer = (words.groupBy("word").count().writeStream.outputMode("complete")
                  .format("memory").queryName(self.table)
                  .option("checkpointLocation", str(checkpoint)))
        if available_now:
            writer = writer.trigger(availableNow=True)
        return writer.start()

    def result(self) -> dict:
        return {r["word"]: r["count"] for r in self.spark.table(self.table).collect()}

    def close(self) -> None:
        pass


class RingCount:
    def __init__(self, spark, workdir: Path, combine: bool, sql: bool = True) -> None:
        self.spark = spark
        self.combine = combine
        self.sql = sql
        self.name = self.label(combine, sql)
        self.cluster = LocalCluster.up(4, 1, workdir=workdir)

    @staticmethod
    def label(combine: bool, sql: bool = True) -> str:
        name = ("ring, combined (default)" if combine else "ring, every tuple (--no-combine)")
        return name if sql else name.split(" (")[0] + ", rows in Python"

    def start(self, source: Path, checkpoint: Path, available_now: bool, files_per_batch: int):
        tls_dir = self.cluster.tls_dir
        # the ring as the driver sees it (driver.check_ring): the tasks' first
        # channels expect each seed's member
        with RingClient(self.cluster.seeds, tls=self.cluster.tls("client")) as client:
            names = tuple((a, n) for n, a in client.ring.addresses)
        sink = RingSink(seeds=tuple(self.cluster.seeds), map_spec=DEFAULT_TEXT_MAP,
                        reducer="count", combine=self.combine, sql_split=self.sql,
                        tls_dir=None if tls_dir is None else str(tls_dir), names=names)
        writer = (self.spark.readStream.option("maxFilesPerTrigger", files_per_batch)
                  .text(str(source)).writeStream.foreachBatch(sink)
                  .option("checkpointLocation", str(checkpoint)))
        if available_now:
            writer = writer.trigger(availableNow=True)
        query = writer.start()
        sink.bind(query.id)
        return query

    def result(self) -> dict:
        with RingClient(self.cluster.seeds, tls=self.cluster.tls("client")) as client:
            return dict(client.scan())

    def query_latency(self, keys: list[str], rounds: int = 200) -> tuple[float, float]:
        """Live state queries while nothing else runs: get(key) p50, top(20) p50 (ms)."""
        with RingClient(self.cluster.seeds, tls=self.cluster.tls("client")) as client:
            gets, tops = [], []
            for i in range(rounds):
                t = time.perf_counter()
                client.get(keys[i % len(keys)])
                gets.append(time.perf_counter() - t)
                if i % 10 == 0:
                    t = time.perf_counter()
                    client.top(20)
                    tops.append(time.perf_counter() - t)
        return statistics.median(gets) * 1e3, statistics.median(tops) * 1e3

    def close(self) -> None:
        self.cluster.down()


def throughput(path, source: Path, workdir: Path, expected: Counter,
               cpu: list | None = None) -> tuple[float, bool]:
    """Words/s over `source`, exactness; with `cpu`, appends the run's CPU seconds
    per kind of process (cpu_seconds)."""
    before = cpu_seconds()
    started = time.perf_counter()
    query = path.start(source, workdir / f"ck-{time.monotonic_ns()}", True, 2)
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if cpu is not None:
        after = cpu_seconds()
        cpu.append({kind: after[kind] - before.get(kind, 0.0) for kind in after})
    if query.exception():
        raise RuntimeError(f"{path.name} failed: {query.exception()}")
    return sum(expected.values()) / elapsed, path.result() == expected


CPU_KINDS = ("jvm", "python workers", "nodes", "driver")


def cpu_seconds() -> Counter:
    """User + system CPU seconds so far of this process (the driver) and its
    descendants by kind: Spark's JVM, its Python workers (with the workers that have
    exited), the ring's node processes."""
    me = psutil.Process()
    totals: Counter = Counter()
    for proc in [me, *me.children(recursive=True)]:
        try:
            cmdline = proc.cmdline()
            times = proc.cpu_times()
        except psutil.Error:
            continue                          # gone meanwhile
        if proc.pid == me.pid:
            # not children_*: they hold the node processes of runs before this one
            totals["driver"] += times.user + times.system
            continue
        kind = ("nodes" if "floering.node" in cmdline else
                "jvm" if cmdline and cmdline[0].endswith("java") else   # pyspark on its classpath
                "python workers" if any("pyspark" in part for part in cmdline[1:3]) else None)
        if kind is not None:
            totals[kind] += times.user + times.system + times.children_user + \
                times.children_system
    return totals


def latency(path, lines: list[str], files: int, interval: float,
            workdir: Path) -> tuple[list[float], bool]:
    """Drop `files` files one by one; arrival -> end of the batch that counted it."""
    inbox = workdir / f"inbox-{time.monotonic_ns()}"
    inbox.mkdir()
    query = path.start(inbox, workdir / f"ck-{time.monotonic_ns()}", False, 1)
    try:
        time.sleep(2.0)                        # the query is polling the directory
        arrivals = []
        per = -(-len(lines) // files)
        for i in range(files):
            arrivals.append(time.time())
            write_files(inbox, lines[i * per:(i + 1) * per], 1, start=i)
            time.sleep(interval)
        deadline = time.monotonic() + 120
        while _batches_with_rows(query) < files and time.monotonic() < deadline:
            time.sleep(0.1)
        ends = [_batch_end(p) for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()
    expected = Counter(w for line in lines for w in split_words(line))
    exact = path.result() == expected
    return [end - arrived for end, arrived in zip(ends, arrivals)], exact


def _batches_with_rows(query) -> int:
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def _batch_end(progress: dict) -> float:
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + progress["durationMs"]["triggerExecution"] / 1e3


def bench_session():
    """local[2], 2 shuffle partitions, RocksDB state store with changelog checkpoints:
    Spark's stateful count tuned as its documentation advises."""
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options "
                          f"-Dlog4j2.configurationFile=file:{LOG_CONFIG} pyspark-shell")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (session_builder("floe-ring benchmark", 2)
             .master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                     "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_count_rate(words: list[str], files: int = 8, rounds: int = 2) -> tuple[float, bool]:
    """Spark's own streaming count of `words` (written 1,000 to a line in `files`
    files, two files per micro-batch), on a JVM warmed by a first small run: the best
    of `rounds` runs in words/s, and whether every run counted exactly."""
    with WarmSparkCount(words, files) as count:
        runs = [count.run() for _ in range(rounds)]
    return max(rate for rate, _ in runs), all(ok for _, ok in runs)


class WarmSparkCount:
    """A SparkSession kept open with `words` written 1,000 to a line in `files` files
    and the JVM warmed by a first small run; each run() is Spark's own streaming count
    of them (two files per micro-batch): (words/s, exact). Start it before any gRPC
    thread runs in this process (PySpark forks its JVM with a preexec_fn)."""

    def __init__(self, words: list[str], files: int = 8) -> None:
        self.lines = [" ".join(words[i:i + 1000]) for i in range(0, len(words), 1000)]
        self.expected = Counter(words)
        self.files = files
        self.spark = bench_session()
        self.tmp = tempfile.TemporaryDirectory(prefix="floe-spark-count-")
        try:
            self.workdir = Path(self.tmp.name)
            warm = self.workdir / "warm"
            write_files(warm, self.lines[:200], 2)
            throughput(SparkCount(self.spark), warm, self.workdir,
                       Counter(w for line in self.lines[:200] for w in line.split()))
            self.source = self.workdir / "input"
            write_files(self.source, self.lines, files)
        except BaseException:
            self.close()
            raise

    def run(self) -> tuple[float, bool]:
        return throughput(SparkCount(self.spark), self.source, self.workdir, self.expected)

    def close(self) -> None:
        try:
            self.spark.stop()
        finally:
            self.tmp.cleanup()

    def __enter__(self) -> "WarmSparkCount":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1, help="the corpus N times over")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--latency-files", type=int, default=6)
    parser.add_argument("--latency-lines", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per path")
    parser.add_argument("--row-path", action="store_true",
                        help="also the ring paths splitting words in Python over the rows")
    args = parser.parse_args(argv)

    lines = kjv_lines() * args.copies
    expected = Counter(w for line in lines for w in split_words(line))
    spark = bench_session()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"input: King James Bible x{args.copies}, {len(lines)} lines, "
          f"{sum(expected.values()):,} words in {args.files} files; local[2], 2 shuffle "
          f"partitions, RocksDB changelog state store; ring: 4 nodes, r=1")
    with tempfile.TemporaryDirectory(prefix="floe-spark-bench-") as tmp:
        workdir = Path(tmp)
        source = workdir / "input"
        write_files(source, lines, args.files)
        warm = workdir / "warm"
        warm_lines = lines[:2000]
        write_files(warm, warm_lines, 2)
        warm_expected = Counter(w for line in warm_lines for w in split_words(line))
        makers = {SparkCount.name: lambda: SparkCount(spark)}
        for sql in ((True, False) if args.row_path else (True,)):
            for combine in (False, True):
                makers[RingCount.label(combine, sql)] = (
                    lambda c=combine, q=sql: RingCount(
                        spark, workdir / f"ring-{time.monotonic_ns()}", c, q))
        rates = {name: [] for name in makers}
        cpu = {name: [] for name in makers}
        exact = {name: True for name in makers}
        for name, make in makers.items():      # JIT, Python workers, first-query costs
            path = make()
            try:
                throughput(path, warm, workdir, warm_expected)
            finally:
                path.close()
        # Throughput: the paths take turns, so the machine's noise hits them alike.
        for _ in range(args.rounds):
            for name, make in makers.items():
                path = make()
                try:
                    rate, ok = throughput(path, source, workdir, expected, cpu[name])
                finally:
                    path.close()
                rates[name].append(rate)
                exact[name] &= ok
        latencies, queries = {}, {}
        for name, make in makers.items():
            path = make()
            try:
                latencies[name], ok = latency(path, lines[:args.latency_lines],
                                              args.latency_files, args.interval, workdir)
                exact[name] &= ok
                if isinstance(path, RingCount):
                    queries[name] = path.query_latency(list(expected)[:500])
            finally:
                path.close()
    spark.stop()
    print(f"throughput: median of {args.rounds} runs (min-max); latency: file arrival -> end "
          f"of its micro-batch, {args.latency_files} files of {args.latency_lines} lines")
    for name in makers:
        r, lat = rates[name], latencies[name]
        q = queries.get(name)
        print(f"{name:36}: {statistics.median(r):>9,.0f} words/s ({min(r):,.0f}-{max(r):,.0f}), "
              f"latency p50 {statistics.median(lat) * 1e3:,.0f} ms, max {max(lat) * 1e3:,.0f} ms, "
              f"exact={exact[name]}"
              + (f"; live get p50 {q[0]:.1f} ms, top(20) p50 {q[1]:.1f} ms" if q else ""))
    print("CPU seconds per throughput run, median (user + system, by process):")
    for name in makers:
        per_kind = {k: statistics.median(run.get(k, 0.0) for run in cpu[name])
                    for k in CPU_KINDS}
        total = statistics.median(sum(run.values()) for run in cpu[name])
        print(f"{name:36}: {total:5.1f} s = " + ", ".join(
            f"{k} {v:.1f}" for k, v in per_kind.items() if v >= 0.05))
    base_rate = statistics.median(rates[SparkCount.name])
    base_lat = statistics.median(latencies[SparkCount.name])
    for name in makers:
        if name != SparkCount.name:
            print(f"{name} / spark: throughput x{statistics.median(rates[name]) / base_rate:.2f}, "
                  f"latency p50 x{statistics.median(latencies[name]) / base_lat:.2f}")
    return 0 if all(exact.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
