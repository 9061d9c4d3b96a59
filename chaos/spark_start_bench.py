"""What one `--available-now` run of the Spark driver costs, start-up included: wall time
from spark-submit to the first progress line naming a batch and to exit, and the CPU of
its whole process tree (the JVM, the Python driver, Spark's Python daemon, its workers),
each process's share too.

    python -m floering.chaos.spark_start_bench [--rounds 2] [--checkout DIR ...]

The run is the one tests/spark/test_spark_driver.py::test_available_now_counts_exactly
makes (6 files of the bundled corpus, 2 a batch, `local[2]`, the tests' quick JVM
unless --jvm-defaults), into one 4-node ring started here; each run's words are checked
against a Counter. CPU: this process is a child subreaper, so every process of the tree
is reaped here or by its parent and counted in RUSAGE_CHILDREN, except Spark's Python
workers (their daemon ignores SIGCHLD, so the kernel reaps them uncounted): theirs is
added from psutil samples every 0.1 s, as is each process's share. With several
`--checkout` (another source checkout, its packages found through its proto/ folder;
this venv's Spark), runs alternate between them, and the machine's load is printed
with each.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from floering.chaos.corpus import kjv_lines
from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient, split_words
from floering.spark_driver.launch import command, environment

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"   # as tests/spark/conftest.py
PR_SET_CHILD_SUBREAPER = 36


def write_corpus(directory: Path, files: int, lines: list[str]) -> Counter:
    directory.mkdir(parents=True)
    per = -(-len(lines) // files)
    for i in range(files):
        (directory / f"part-{i:02d}.txt").write_text("\n".join(lines[i * per:(i + 1) * per]) + "\n")
    return Counter(w for line in lines for w in split_words(line))


def kind(proc: psutil.Process) -> str:
    """jvm, driver (the Python driver), daemon, worker (forked by the daemon), other."""
    try:
        cmd = " ".join(proc.cmdline())
        if not cmd:
            return ""
        if "java" in proc.cmdline()[0]:
            return "jvm"
        if ".daemon" in cmd:
            parent = proc.parent()
            return "worker" if parent is not None and ".daemon" in " ".join(parent.cmdline()) \
                else "daemon"
        if cmd.endswith("driver.py") or "driver.py --" in cmd:
            return "other" if "spark-submit" in cmd else "driver"
    except psutil.Error:
        return ""
    return "other"


def one_run(cluster: LocalCluster, checkout: Path, workdir: Path, quick_jvm: bool) -> dict:
    expected = write_corpus(workdir / "in", 6, kjv_lines(6000))
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        before = dict(client.scan())
    cmd = command(["--ring", ",".join(cluster.seeds), "--tls-dir", str(cluster.tls_dir),
                   "--source", f"dir:{workdir / 'in'}", "--checkpoint", str(workdir / "ckpt"),
                   "--progress", "1", "--max-files-per-trigger", "2", "--available-now"],
                  script=checkout / "spark_driver" / "driver.py")
    env = dict(environment(), PYTHONPATH=str(checkout / "proto"))
    if quick_jvm:
        env["SPARK_SUBMIT_OPTS"] = f"{env.get('SPARK_SUBMIT_OPTS', '')} {QUICK_JVM}".strip()
    log_path = workdir / "driver.log"
    reaped_before = _children_cpu()
    began = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=checkout,
                                start_new_session=True)
    first_batch, seen = None, {}
    while proc.poll() is None:
        if first_batch is None and b"spark: batch" in log_path.read_bytes():
            first_batch = time.monotonic() - began
        _sample(proc.pid, seen)
        time.sleep(0.1)
    wall = time.monotonic() - began
    _reap_orphans({n.pid for n in cluster.nodes})
    shares = Counter()
    for what, cpu in seen.values():
        shares[what or "other"] += cpu
    tree = _children_cpu() - reaped_before + shares["worker"]
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        after = dict(client.scan())
    added = {k: after.get(k, 0) - before.get(k, 0) for k in after.keys() | before.keys()}
    out = log_path.read_text(errors="replace")
    return {"rc": proc.returncode, "exact": {k: v for k, v in added.items() if v} == expected,
            "wall": wall, "first_batch": first_batch, "cpu": tree,
            "shares": {k: round(v, 2) for k, v in sorted(shares.items())},
            "pyspark": next((line for line in out.splitlines() if line.startswith("pyspark ")),
                            "(no pyspark line)")}


def _sample(root: int, seen: dict) -> None:
    """Each process's CPU so far, by (pid, start time); a process's kind as last seen
    alive (spark-submit's shell becomes the JVM)."""
    try:
        tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return
    for proc in tree:
        try:
            key, times = (proc.pid, proc.create_time()), proc.cpu_times()
        except psutil.Error:
            continue
        what = kind(proc) or seen.get(key, ("", 0.0))[0]
        seen[key] = (what, times.user + times.system)


def _reap_orphans(keep: set[int], timeout: float = 30.0) -> None:
    """Wait for every child but the ring's nodes (Spark's processes re-parented here),
    each by its own PID; SIGKILL what is left after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = [c.pid for c in psutil.Process().children() if c.pid not in keep]
        if not left:
            return
        for pid in left:
            try:
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                os.waitpid(pid, os.WNOHANG)
            except (ChildProcessError, ProcessLookupError):
                pass
        time.sleep(0.1)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    here = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs per checkout (default: %(default)s)")
    parser.add_argument("--checkout", action="append", type=Path,
                        help="a source checkout to run (default: this one); repeat to alternate")
    parser.add_argument("--jvm-defaults", action="store_true",
                        help="the JVM's own compiler and collector, not the tests' quick JVM")
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout] if args.checkout else [here]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cannot become a child subreaper (Linux only)", file=sys.stderr)
        return 2
    runs: dict[Path, list[dict]] = {c: [] for c in checkouts}
    with tempfile.TemporaryDirectory(prefix="floe-spark-start-") as tmp, \
            LocalCluster.up(4, 1, workdir=Path(tmp) / "ring") as cluster:
        for n in range(args.rounds):
            for i, checkout in enumerate(checkouts):
                run = one_run(cluster, checkout, Path(tmp) / f"run-{n}-{i}", not args.jvm_defaults)
                run["load"] = os.getloadavg()[0]
                runs[checkout].append(run)
                print(f"round {n + 1} {checkout}: {json.dumps(run)}", flush=True)
                if run["rc"] != 0 or not run["exact"]:
                    print(f"run failed (exit {run['rc']}, exact {run['exact']}): see "
                          f"{checkout}", file=sys.stderr)
                    return 1
    for checkout, done in runs.items():
        med = {k: statistics.median(r[k] for r in done) for k in ("wall", "cpu")}
        print(f"{checkout}: median wall {med['wall']:.1f} s, tree CPU {med['cpu']:.1f} s; "
              f"{done[0]['pyspark']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
