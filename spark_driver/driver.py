"""Stream a Structured Streaming source into a floe ring; Spark's executors are the mappers.

    spark-submit --master 'local[2]' spark_driver/driver.py --ring HOST:PORT[,HOST:PORT...] \\
        --source dir:PATH | rate:ROWS_PER_SECOND | socket:HOST:PORT \\
        [--map package.module:function] [--checkpoint DIR] [--available-now] [--no-combine]

Each micro-batch goes through foreachBatch to one task per partition: for the default
word split the tasks get the lines as Arrow batches (mapInArrow) and split them with the
mapper's compiled kernel (without it, Spark SQL splits and the tasks get the words);
another map step runs in Python over the rows (mapPartitions). Every partition is a
RingClient numbering its tuples from (query id, batch id, partition id, position), so a
retried task or a batch replayed after a restart from --checkpoint is deduplicated by
the ring: exactly-once end to end for a replayable source (dir, rate) and a
deterministic map step. With the count and sum reducers each task sums its tuples per
key first (--no-combine: send every tuple). Without --available-now the query runs
until SIGTERM/SIGINT.
"""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit runs this file as a script: make this checkout's packages importable
# (an installed floe-ring needs nothing here).
_ROOT = Path(__file__).resolve().parent.parent
if (_ROOT / "proto" / "floering").is_dir():
    if str(_ROOT / "proto") not in sys.path:      # floering; it finds the rest
        sys.path.insert(0, str(_ROOT / "proto"))

import argparse  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from floering.spark_driver.maps import DEFAULT_RATE_MAP, DEFAULT_TEXT_MAP, load_map  # noqa: E402
from floering.spark_driver.partition import COMBINE_KEYS  # noqa: E402
from floering.spark_driver.sink import RingSink, session_builder  # noqa: E402
from floering.spark_driver.plans import BatchPlans  # noqa: E402
from floering.spark_driver.pyspark_path import prefer_installed  # noqa: E402


class UsageError(Exception):
    pass


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_driver/driver.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ring", required=True, help="seed nodes host:port[,host:port...]")
    p.add_argument("--tls-dir", help="the ring's ca.pem and client.pem/.key, when it runs "
                                     "mutual TLS; default: $FLOE_TLS_DIR, else the "
                                     "cluster's floe-cluster/tls/ (as every client)")
    p.add_argument("--source", required=True,
                   help="dir:PATH (text files, watched), rate:ROWS_PER_SECOND, socket:HOST:PORT")
    p.add_argument("--map", dest="map_spec",
                   help=f"map step package.module:function (default {DEFAULT_TEXT_MAP}; "
                        f"{DEFAULT_RATE_MAP} for rate)")
    p.add_argument("--reducer", default="count",
                   help="the reducer the ring must run; refused if it differs (default count)")
    p.add_argument("--checkpoint", help="Spark checkpoint location; rerun with the same one "
                                        "to resume exactly where a stopped driver left off")
    p.add_argument("--available-now", action="store_true",
                   help="process everything in the source, flush, exit 0")
    p.add_argument("--trigger", type=float, default=0.0,
                   help="seconds between micro-batches (default: as fast as possible)")
    p.add_argument("--max-files-per-trigger", type=int, help="dir source: files per batch")
    p.add_argument("--partitions", type=int, default=2, help="rate source partitions")
    p.add_argument("--combine", action=argparse.BooleanOptionalAction, default=None,
                   help="sum values per key within a partition before sending; the default "
                        "for the count and sum reducers (--no-combine: send every tuple)")
    p.add_argument("--combine-keys", type=int, default=COMBINE_KEYS, metavar="N",
                   help=f"a combining task sends its totals whenever it holds N distinct keys "
                        f"(bounded memory; default {COMBINE_KEYS:,})")
    p.add_argument("--word-split", choices=("auto", "task", "sql"), default="auto",
                   help="the default map step's word split: in the tasks on the mapper's "
                        "compiled kernel (task), in Spark SQL (sql); auto: task where the "
                        "kernel is compiled")
    p.add_argument("--batch-size", type=int, default=2000, help="tuples per ring batch")
    p.add_argument("--progress", type=float, default=5.0,
                   help="seconds between progress lines (0: none)")
    p.add_argument("--shuffle-partitions", type=int, default=2)
    p.add_argument("--inject-task-failure", metavar="MARKER",
                   help="testing: the first task to create MARKER fails half-way")
    p.add_argument("--inject-hang", metavar="MARKER",
                   help="testing: the first task to create MARKER hangs half-way")
    args = p.parse_args(argv)
    kind, _, rest = args.source.partition(":")
    if kind not in ("dir", "rate", "socket") or not rest:
        raise UsageError(f"--source {args.source!r}: expected dir:PATH, rate:ROWS_PER_SECOND "
                         f"or socket:HOST:PORT")
    if args.available_now and kind != "dir":
        raise UsageError(f"--available-now needs a bounded source (dir:PATH); {kind} never ends")
    if args.combine and args.reducer not in ("count", "sum"):
        raise UsageError("--combine only applies to the count and sum reducers")
    if args.combine is None:
        args.combine = args.reducer in ("count", "sum")
    if args.combine_keys < 1:
        raise UsageError("--combine-keys must be at least 1")
    args.map_spec = args.map_spec or (DEFAULT_RATE_MAP if kind == "rate" else DEFAULT_TEXT_MAP)
    load_map(args.map_spec)     # fail here, not in every task
    args.seeds = [s.strip() for s in args.ring.split(",") if s.strip()]
    from floering.mapper.credentials import FIND, find_tls_dir
    found = find_tls_dir(args.tls_dir or FIND)     # --tls-dir, FLOE_TLS_DIR, the cluster's
    args.tls_dir = str(found.resolve()) if found else None  # the executors read it too
    return args


def check_ring(seeds: list[str], reducer: str, tls_dir: str | None = None):
    """Refuse to start against a ring that is down or runs another reducer."""
    from floering.mapper import FloeError, RingClient, TlsFiles
    try:
        tls = TlsFiles.in_dir(tls_dir, "client") if tls_dir else None
    except FileNotFoundError as exc:
        raise UsageError(f"--tls-dir: {exc}") from None
    try:
        client = RingClient(seeds, expect_reducer=reducer, timeout=15, rpc_timeout=3, tls=tls)
    except FloeError as exc:
        raise UsageError(f"cannot use the ring at {','.join(seeds)}: {exc}") from None
    return client


def read_stream(spark, args):
    kind, _, rest = args.source.partition(":")
    reader = spark.readStream
    if kind == "dir":
        if "://" not in rest:
            Path(rest).mkdir(parents=True, exist_ok=True)   # a local inbox may start empty
        if args.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
        return reader.format("text").load(rest)
    if kind == "rate":
        return (reader.format("rate").option("rowsPerSecond", int(rest))
                .option("numPartitions", args.partitions).load().select("value"))
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--source socket:{rest}: expected socket:HOST:PORT")
    return reader.format("socket").option("host", host).option("port", int(port)).load()


def build_session(args):
    spark = session_builder("floe-ring driver", args.shuffle_partitions).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(args) -> int:
    ring = check_ring(args.seeds, args.reducer, args.tls_dir)
    print(f"ring: {len(ring.ring.nodes)} nodes, reducer {ring.reducer}, version "
          f"{ring.ring.version}", flush=True)
    spark = build_session(args)
    checkpoint = args.checkpoint
    if not checkpoint:
        checkpoint = tempfile.mkdtemp(prefix="floe-spark-checkpoint-")
        print(f"no --checkpoint: using {checkpoint}; a restarted driver would start over",
              file=sys.stderr, flush=True)
    sink = RingSink(seeds=tuple(args.seeds), map_spec=args.map_spec, reducer=args.reducer,
                    combine=args.combine, combine_keys=args.combine_keys,
                    batch_size=args.batch_size, tls_dir=args.tls_dir,
                    names=tuple((a, n) for n, a in ring.ring.addresses),
                    task_split={"task": True, "sql": False}.get(args.word_split),
                    fail_once=args.inject_task_failure, hang_once=args.inject_hang)
    if not args.combine and BatchPlans.usable(checkpoint):
        sink.plans = BatchPlans(checkpoint, ring, args.map_spec)
    plan = sink.choose(spark)
    print(f"map: {args.map_spec}, "
          + ({"lines+arrow": "lines to the tasks as Arrow batches, split by the mapper's "
                              "compiled kernel",
              "sql+arrow": "split by Spark SQL, words to the tasks as Arrow batches"}
             .get(plan, "in Python over the rows"))
          + (f"; combined per partition (totals sent every {args.combine_keys:,} keys)"
             if args.combine else "; every tuple sent"), flush=True)
    writer = (read_stream(spark, args).writeStream.foreachBatch(sink)
              .option("checkpointLocation", checkpoint).queryName("floe_ring"))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    elif args.trigger:
        writer = writer.trigger(processingTime=f"{args.trigger} seconds")
    query = writer.start()
    sink.bind(query.id)          # persisted in the checkpoint: the same after a restart
    print(f"query {query.id} (run {query.runId}) started, checkpoint {checkpoint}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    reporter = ProgressReporter(query, ring, sink, args.progress)
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(0.5)
            reporter.maybe_report()
        if stop.is_set():
            print("stopping the query (signal)", flush=True)
            stop_between_batches(query)
        error = query.exception()
        if error is not None:
            print(f"query failed: {error}", file=sys.stderr, flush=True)
            return 1
        reporter.report(final=True)
        return 0
    finally:
        ring.close()
        spark.stop()


def stop_between_batches(query, grace: float = 30.0) -> None:
    """Let a running micro-batch finish (up to `grace` seconds), then stop. Stopping
    mid-batch would also be safe (the batch is uncommitted and a restart replays it),
    but it interrupts tasks half-way for nothing."""
    deadline = time.monotonic() + grace
    while query.isActive and query.status.get("isTriggerActive") \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


class ProgressReporter:
    """Spark's progress (rows/s, batch duration) next to the ring's: what the ring has
    acknowledged (on r+1 nodes) of this driver's finished batches, which only grows,
    whatever node dies, and how many nodes answer."""

    def __init__(self, query, ring, sink, interval: float) -> None:
        self.query = query
        self.ring = ring
        self.sink = sink
        self.interval = interval
        self.last = time.monotonic()
        self.printed = ""                  # the last line: one that says nothing new is not

    def maybe_report(self) -> None:
        if self.interval and time.monotonic() - self.last >= self.interval:
            self.report()

    def report(self, final: bool = False) -> None:
        self.last = time.monotonic()
        progress = self.query.lastProgress
        spark = "spark: waiting for the first batch"
        if progress:
            duration = progress.get("durationMs", {}).get("triggerExecution", 0)
            spark = (f"spark: batch {progress['batchId']}, {progress['numInputRows']} rows in "
                     f"{duration} ms, {progress.get('processedRowsPerSecond', 0.0):,.0f} rows/s")
        sink = self.sink
        held = (f"{sink.inputs:,} tuples from {sink.batches} batches held by the ring"
                + (f" (sent as {sink.acknowledged:,} combined)"
                   if sink.acknowledged != sink.inputs else ""))
        try:
            stats = self.ring.stats()
            up = f"{sum('error' not in s for s in stats)}/{len(stats)} nodes up"
        except Exception as exc:   # progress must never stop the query
            up = f"nodes unknown ({exc})"
        line = f"{spark} | ring: {held}, {up}"
        if line != self.printed or final:
            print(line, flush=True)
            self.printed = line


SPARK_EXTRA = "the Spark driver needs pyspark: pip install 'floe-ring[spark]'"


def main(argv=None) -> int:
    how = prefer_installed()      # before pyspark's first import (pyspark_path)
    try:
        import pyspark
    except ImportError:
        print(f"error: {SPARK_EXTRA}", file=sys.stderr, flush=True)
        return 2
    try:
        args = parse_args(argv)
        print(f"pyspark {pyspark.__version__}: {Path(pyspark.__file__).parent} ({how})",
              flush=True)
        return run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
