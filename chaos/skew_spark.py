"""The skew benchmark's sources that may be replayed: the workload sent as a replayable
source (`--replayable`: as `floe feed` sends a file, a routing plan made from its
first chunk), or through spark-submit (`--spark`: the workload as text files, one
micro-batch per file, `local[2]`, every tuple sent, each batch by the plan the driver
recorded for it). Counts checked exactly against a Counter over the input, loads read
from the nodes' `applied` counters, as for the plain client."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from floering.floe.cluster import LocalCluster

SPARK_FILES = 8
WORDS_PER_LINE = 20
# Workloads whose keys are words (letters only): the driver's word split keeps them whole.
SPARK_WORKLOADS = ("every-other", "hot-half", "corpus", "one-key")


def replayable_plan(client, keys: list, chunk: int = 65_536):
    """The plan `floe feed` makes for a file: from its first chunk, on the ring."""
    from floering.mapper.plans import plan_of_keys
    from floering.wire.balancers import balancer
    policy = balancer(client.ring.balancer)
    return plan_of_keys(policy, client.ring, keys[:chunk]) if policy.pieces > 1 else None


def write_files(directory: Path, keys: list, files: int = SPARK_FILES) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(keys) // files)
    for i in range(files):
        part = keys[i * per:(i + 1) * per]
        lines = (" ".join(part[j:j + WORDS_PER_LINE]) for j in range(0, len(part), WORDS_PER_LINE))
        tmp = directory / f".part-{i}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"part-{i:02d}.txt")


def run_spark(policy: str, name: str, keys: list, nodes: int, tokens: int,
              timeout: float = 900.0) -> dict:
    """One (policy, workload) pair through spark-submit; the measures of `run_one`."""
    from floering.mapper import RingClient
    from floering.spark_driver.launch import SparkDriver
    if name not in SPARK_WORKLOADS:
        raise ValueError(f"--spark runs word workloads only: {', '.join(SPARK_WORKLOADS)}")
    counts = Counter(keys)
    with tempfile.TemporaryDirectory(prefix="floe-skew-spark-") as tmp, \
            LocalCluster.up(nodes, 1, workdir=Path(tmp) / "ring", balancer=policy,
                            tokens_per_node=tokens) as cluster:
        write_files(Path(tmp) / "in", keys)
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            before = {s["node_id"]: s["applied"] for s in client.stats()}
        started = time.perf_counter()
        with SparkDriver(["--ring", ",".join(cluster.seeds), "--tls-dir",
                          str(cluster.tls_dir), "--source", f"dir:{Path(tmp) / 'in'}",
                          "--checkpoint", str(Path(tmp) / "checkpoint"), "--available-now",
                          "--no-combine", "--max-files-per-trigger", "1", "--progress", "0"],
                         log=Path(tmp) / "driver.log") as spark:
            rc = spark.wait(timeout)
            output = spark.output()
        elapsed = time.perf_counter() - started
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            rows = client.stats()
            got = client.scan_all() if rc == 0 else None
    loads = [r["applied"] - before.get(r["node_id"], 0) for r in rows]
    return {"loads": loads, "exact": got == dict(counts), "elapsed": elapsed,
            "sent": len(keys), "rows": rows, "got": got,
            "failure": "" if rc == 0 else f"spark-submit exited {rc}: {output[-400:]}"}
