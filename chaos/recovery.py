"""Measure recovery latency on a real local cluster under a steady feed.

    python -m chaos.recovery [--nodes 4] [--replicas 1] [--trials 10] [--kill 1]

For each trial: start a cluster, feed it, SIGKILL `--kill` non-adjacent nodes at once,
and measure (1) takeover: kill -> the heir logs it applies the range (its own clock
on this machine, same as ours), and (2) stall: the longest time the feeding client
saw no acknowledgement at all around the kill, i.e. until tuples flow to the new
owners again. Counts are checked exactly against what flush() acknowledged.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter

from chaos.cluster import LocalCluster
from chaos.corpus import kjv_lines
from mapper import RingClient, split_words


def one_trial(nodes: int, replicas: int, kill: int, words: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="floe-recovery-") as workdir:
        with LocalCluster.up(nodes, replicas, workdir=workdir) as cluster:
            client = RingClient(cluster.seeds, linger=0.005, timeout=30)
            acked, stop, gaps = Counter(), threading.Event(), []

            def feed():
                last, i = time.time(), 0
                while not stop.is_set():
                    chunk = words[(i * 500) % len(words):][:500]
                    client.emit_many(chunk)
                    client.flush()
                    acked.update(chunk)
                    now = time.time()
                    gaps.append((last, now))
                    last, i = now, i + 1

            thread = threading.Thread(target=feed, daemon=True)
            thread.start()
            time.sleep(0.5)
            victims = [f"n{i}" for i in range(1, nodes, nodes // kill)][:kill]
            killed_at = time.time()
            for victim in victims:
                cluster.kill(victim)
            time.sleep(1.5)
            stop.set()
            thread.join(60)
            exact = dict(client.scan()) == acked
            client.close()
            takeovers = [t - killed_at for t in cluster.takeover_times()]
            stall = max((end - start for start, end in gaps if end >= killed_at), default=0.0)
    return {"killed": victims, "takeover_s": max(takeovers) if takeovers else None,
            "stall_s": stall, "exact": exact}


def false_positives(nodes: int, replicas: int, seconds: float, words: list[str]) -> tuple[int, int]:
    """Run a healthy cluster busy (full-speed feed) then idle; return how many nodes
    were wrongly declared dead in each phase."""
    with tempfile.TemporaryDirectory(prefix="floe-fp-") as workdir:
        with LocalCluster.up(nodes, replicas, workdir=workdir) as cluster:
            with RingClient(cluster.seeds) as client:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    client.emit_many(words[:50_000])
                client.flush()
                busy = len(client.refresh_ring().removed)
                time.sleep(seconds)
                idle = len(client.refresh_ring().removed) - busy
    return busy, idle


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kill", type=int, default=1, help="non-adjacent nodes killed at once")
    parser.add_argument("--false-positives", type=float, metavar="SECONDS",
                        help="instead: run a healthy cluster busy, then idle, this long each, "
                             "and count wrong declarations")
    args = parser.parse_args(argv)
    words = [w for line in kjv_lines(5000) for w in split_words(line)]
    if args.false_positives:
        busy, idle = false_positives(args.nodes, args.replicas, args.false_positives, words)
        print(f"false declarations: {busy} in {args.false_positives:.0f}s at full load, "
              f"{idle} in {args.false_positives:.0f}s idle")
        return 0 if busy == idle == 0 else 1
    results = []
    for trial in range(args.trials):
        r = one_trial(args.nodes, args.replicas, args.kill, words)
        results.append(r)
        print(f"trial {trial}: killed {','.join(r['killed'])}  takeover "
              f"{r['takeover_s'] * 1e3:.0f} ms  client stall {r['stall_s'] * 1e3:.0f} ms  "
              f"exact={r['exact']}", flush=True)
    take = [r["takeover_s"] for r in results]
    stall = [r["stall_s"] for r in results]
    print(f"n={args.nodes} r={args.replicas} kill={args.kill}: takeover p50 "
          f"{statistics.median(take) * 1e3:.0f} ms max {max(take) * 1e3:.0f} ms; client stall "
          f"p50 {statistics.median(stall) * 1e3:.0f} ms max {max(stall) * 1e3:.0f} ms; "
          f"all exact: {all(r['exact'] for r in results)}")
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
