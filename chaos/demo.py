"""The main job: a local ring, the spark-submit driver watching a directory, the bundled
corpus dropped into it file by file, a ring node SIGKILLed mid-stream, exact results.

    python -m floering.chaos.demo [--nodes 4] [--replicas 1] [--files 8] [--interval 2]
                         [--lines N] [--no-kill] [--combine] [--master local[2]]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from floering.chaos.corpus import kjv_lines
from floering.chaos.timeline import applying_again_times, takeover_times
from floering.floe.cluster import LocalCluster, unwind_on_sigterm
from floering.mapper import RingClient, split_words
from floering.spark_driver.launch import SparkDriver, spark_submit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--files", type=int, default=8, help="the corpus arrives in N files")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between files")
    parser.add_argument("--lines", type=int, help="only the first N lines of the corpus")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a node")
    parser.add_argument("--combine", action="store_true",
                        help="mappers sum counts per partition before sending")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--insecure", action="store_true",
                        help="run the ring without TLS (default: mutual TLS on every call)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="give up waiting for the ring after this many seconds")
    args = parser.parse_args(argv)
    try:
        spark_submit()      # one line naming the extra, before anything starts
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    unwind_on_sigterm()     # the ring (and driver) in use are stopped on the way out
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        print("the main job runs Spark, which needs Java 17 (install a JDK, e.g. "
              "`apt-get install openjdk-17-jre-headless`, or set JAVA_HOME)", file=sys.stderr)
        return 2

    lines = kjv_lines(args.lines)
    expected = Counter(w for line in lines for w in split_words(line))
    total = sum(expected.values())
    print(f"corpus: King James Bible, {len(lines)} lines, {total} words, "
          f"{len(expected)} distinct")

    with tempfile.TemporaryDirectory(prefix="floe-demo-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        with LocalCluster.up(args.nodes, args.replicas, workdir=workdir,
                             tls=not args.insecure) as cluster:
            print(f"ring: {args.nodes} nodes, r={args.replicas}, up in "
                  f"{time.perf_counter() - started:.1f}s "
                  f"({', '.join(n.address for n in cluster.nodes)}), "
                  + ("no TLS" if args.insecure else "mutual TLS on every call"))
            inbox = workdir / "inbox"
            inbox.mkdir()
            driver_args = ["--ring", ",".join(cluster.seeds), "--source", f"dir:{inbox}",
                           "--checkpoint", str(workdir / "checkpoint"), "--progress", "2",
                           "--max-files-per-trigger", "1"]
            if cluster.tls() is not None:
                driver_args += ["--tls-dir", str(cluster.tls().ca.parent)]
            if args.combine:
                driver_args.append("--combine")
            print(f"spark-submit --master {args.master} spark_driver/driver.py "
                  + " ".join(driver_args))
            log = workdir / "driver.log"
            with SparkDriver(driver_args, master=args.master, log=log) as spark:
                echo = _Echo(log)
                echo.start()
                try:
                    got, killed = _run(args, cluster, spark, inbox, lines, total)
                finally:
                    rc = spark.terminate()
                    echo.stop()
                print(f"driver stopped (exit {rc}); its processes are gone")
            if killed is not None:
                victim, killed_at = killed
                taken = [t - killed_at for t in takeover_times(cluster.nodes, victim)
                         if t >= killed_at]
                applying = [t - killed_at for t in applying_again_times(cluster.nodes, victim)
                            if t >= killed_at]
                if taken:
                    # The first tuple applied waits for the stream to send one to
                    # the range: between two micro-batches that can be seconds.
                    print(f"recovery: {victim}'s ranges taken over by their heirs "
                          f"{max(taken) * 1e3:.0f} ms after the SIGKILL"
                          + (f", each applying its next tuple by {max(applying) * 1e3:.0f} ms"
                             if applying else ""))
                else:
                    print(f"recovery: no takeover of {victim}'s ranges was logged")
            print("top 20 words:")
            with RingClient(cluster.seeds, tls=cluster.tls()) as client:
                for word, count in client.top(20):
                    print(f"  {count:>7}  {word}")
    diff = {w for w in expected.keys() | got.keys() if expected.get(w) != got.get(w)}
    if diff:
        sample = sorted(diff)[:10]
        print(f"MISMATCH: {len(diff)} keys differ from an independent count, e.g. "
              + ", ".join(f"{w}: ring {got.get(w)} != {expected.get(w)}" for w in sample))
        return 1
    print(f"exact: the ring's {len(got)} counts match an independent count of the corpus "
          f"({total} words)")
    return 0


def _run(args, cluster, spark, inbox: Path, lines: list[str], total: int):
    """Drop the files in, kill a node half-way, wait until the ring holds everything."""
    per = -(-len(lines) // args.files)
    victim = None if args.no_kill else cluster.nodes[len(cluster.nodes) // 2]
    killed = None
    _wait(lambda: "started, checkpoint" in spark.output(), 120, spark)
    t0 = time.perf_counter()
    for i in range(args.files):
        tmp = inbox / f".part-{i:02d}.tmp"
        tmp.write_text("\n".join(lines[i * per:(i + 1) * per]) + "\n")
        tmp.rename(inbox / f"part-{i:02d}.txt")   # the source never sees half a file
        print(f"+ part-{i:02d}.txt ({min(per, len(lines) - i * per)} lines)")
        if victim is not None and killed is None and i == args.files // 2:
            # mid-stream: once the ring has counted part of the corpus
            _wait(lambda: _ring_total(cluster) > 0, 120, spark)
            counted = _ring_total(cluster)
            killed = (victim.node_id, time.time())
            cluster.kill(victim.node_id)
            print(f"SIGKILL {victim.node_id} (pid {victim.pid}) with {counted} of {total} "
                  f"words counted")
        time.sleep(args.interval)
    got = _wait(lambda: (lambda s: s if sum(s.values()) >= total else None)(_scan(cluster)),
                args.timeout, spark)
    elapsed = time.perf_counter() - t0
    print(f"the ring holds all {total} words {elapsed:.1f}s after the first file "
          f"({total / elapsed:,.0f} words/s including the {args.interval:.0f}s gaps)")
    return got, killed


def _wait(probe, timeout, spark):
    deadline = time.monotonic() + timeout
    while True:
        if spark.proc.poll() is not None:
            raise SystemExit(f"the driver exited ({spark.proc.returncode}):\n"
                             + spark.output()[-3000:])
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s")
        time.sleep(0.25)


def _scan(cluster) -> dict:
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        return dict(client.scan())


def _ring_total(cluster) -> int:
    return sum(_scan(cluster).values())


class _Echo(threading.Thread):
    """Print the driver's lines (Spark's and the ring's progress) as they come."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        while not self.path.exists() and not self.done.is_set():
            time.sleep(0.1)
        with open(self.path, errors="replace") as fh:
            while True:
                line = fh.readline()
                if line:
                    if line.startswith(("spark:", "query", "ring:", "stopping", "error")):
                        print(f"  | {line.rstrip()}", flush=True)
                elif self.done.is_set():
                    return
                else:
                    time.sleep(0.1)

    def stop(self) -> None:
        self.done.set()
        self.join(5)


if __name__ == "__main__":
    raise SystemExit(main())
