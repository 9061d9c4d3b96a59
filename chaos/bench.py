"""Throughput and latency benchmark, measured side by side in one run.

    python -m chaos.bench [--tuples 2000000] [--nodes 4] [--insecure]

Prints: the in-process ceiling (msgpack decode + reducer apply in one process), the
feeder's own ceiling (route + batch + encode, no network), end-to-end throughput from
one feeder process to N node processes with r=0 and r=1, and emit-to-acknowledged
latency at half the measured r=1 throughput, every call mutual TLS as deployed; with
--insecure (or its old name --tls), r=1 again in the clear, side by side.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter, defaultdict

import psutil

from chaos.cluster import LocalCluster
from chaos.corpus import kjv_lines
from mapper import RingClient, split_words
from mapper.routing import Router
from node.core.batch import decode_payload, encode_payload
from node.core.reducers import Count
from node.core.ring import Ring
from node.core.state_store import LayeredState

CHUNK = 50_000


def corpus_words(n: int) -> list[str]:
    words = [w for line in kjv_lines() for w in split_words(line)]
    return (words * (n // len(words) + 1))[:n]


def ceiling_apply(words: list[str], batch: int = 1000) -> float:
    chunks = [words[i:i + batch] for i in range(0, len(words), batch)]
    payloads = [(encode_payload(c, [1] * len(c)), len(c)) for c in chunks]
    state = LayeredState(Count())
    started = time.perf_counter()
    for payload, count in payloads:
        keys, values = decode_payload(payload, count)
        state.apply(keys, values)
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


def _cluster(workdir: str, nodes: int, replicas: int, tls: bool,
             fsync: float | None) -> LocalCluster:
    """A cluster in memory, or durable (`fsync`: its --fsync-interval) when given."""
    if fsync is None:
        return LocalCluster.up(nodes, replicas, workdir=workdir, tls=tls)
    return LocalCluster.up(nodes, replicas, workdir=workdir, tls=tls,
                           data_dir=f"{workdir}/data",
                           extra_args=["--fsync-interval", str(fsync)])


def end_to_end(words: list[str], nodes: int, replicas: int, tls: bool = True,
               fsync: float | None = None) -> tuple[float, bool, float]:
    """(tuples/s, exact, bytes the nodes wrote to disk per tuple)."""
    with tempfile.TemporaryDirectory(prefix="floe-bench-") as workdir:
        with _cluster(workdir, nodes, replicas, tls, fsync) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                written = _bytes_written(cluster)
                started = time.perf_counter()
                for i in range(0, len(words), CHUNK):
                    client.emit_many(words[i:i + CHUNK])
                client.flush()
                rate = len(words) / (time.perf_counter() - started)
                written = _bytes_written(cluster) - written
                exact = dict(client.scan()) == Counter(words)
    return rate, exact, written / len(words)


def _bytes_written(cluster: LocalCluster) -> int:
    """What the node processes wrote to storage so far (their I/O counters)."""
    return sum(psutil.Process(node.pid).io_counters().write_bytes for node in cluster.nodes)


def latency(words: list[str], nodes: int, replicas: int, rate: float,
            tls: bool = True, fsync: float | None = None) -> tuple[float, float]:
    """Feed at `rate` tuples/s; tuple-weighted p50/p99 of first-emit -> last-ack."""
    with tempfile.TemporaryDirectory(prefix="floe-bench-") as workdir:
        with _cluster(workdir, nodes, replicas, tls, fsync) as cluster:
            with RingClient(cluster.seeds, linger=0.002, tls=cluster.tls("client")) as client:
                tick = 0.005
                per_tick = max(1, int(rate * tick))
                started = time.perf_counter()
                for n, i in enumerate(range(0, len(words), per_tick)):
                    client.emit_many(words[i:i + per_tick])
                    delay = started + (n + 1) * tick - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                client.flush()
                samples = client.delivery_latencies()
    samples.sort()
    total = sum(c for _, c in samples)
    def pct(p):
        seen = 0
        for seconds, count in samples:
            seen += count
            if seen >= p * total:
                return seconds
        return samples[-1][0]
    return pct(0.50), pct(0.99)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=2_000_000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--insecure", "--tls", dest="compare", action="store_true",
                        help="also run r=1 in the clear, side by side with mutual TLS")
    parser.add_argument("--durable", action="store_true",
                        help="also run r=1 durable (--data-dir) at a few --fsync-interval "
                             "settings, side by side with memory mode")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --insecure: this many TLS / plain pairs, taking turns, "
                             "and their median ratio (one pair cannot resolve a cost "
                             "below the machine's run-to-run swing)")
    parser.add_argument("--restart-keys", default="",
                        help="comma-separated key counts (e.g. 100000,5000000): time a "
                             "durable one-node ring holding that many keys from SIGKILL to "
                             "serving again on its data directory")
    args = parser.parse_args(argv)
    if args.restart_keys:
        for keys in map(int, args.restart_keys.split(",")):
            restart, exact = restart_time(keys)
            print(f"durable restart, {keys:,} keys on the node: serving again {restart:.2f} s "
                  f"after the restart began (exact={exact})")
    words = corpus_words(args.tuples)
    print(f"workload: {len(words):,} words of the King James Bible (word count), "
          f"{args.nodes} nodes, batches of 1000, mutual TLS on every call")
    apply_rate = ceiling_apply(words)
    print(f"ceiling, decode + apply in one process : {apply_rate / 1e6:6.2f} M tuples/s")
    feed_rate = ceiling_feeder(words, args.nodes)
    print(f"ceiling, feeder route + batch + encode : {feed_rate / 1e6:6.2f} M tuples/s")
    r0, exact0, _ = end_to_end(words, args.nodes, 0)
    print(f"end to end, r=0                        : {r0 / 1e6:6.2f} M tuples/s "
          f"({r0 / apply_rate:.0%} of ceiling, exact={exact0})")
    r1, exact1, _ = end_to_end(words, args.nodes, 1)
    print(f"end to end, r=1                        : {r1 / 1e6:6.2f} M tuples/s "
          f"(r=1 / r=0 = {r1 / r0:.2f}, exact={exact1})")
    half = r1 / 2
    sample = words[: max(200_000, len(words) // 4)]
    p50, p99 = latency(sample, args.nodes, 1, half)
    print(f"latency at {half / 1e6:.2f} M tuples/s (half load), r=1  : "
          f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms (first emit -> acked by r+1)")
    exact = exact0 and exact1
    if args.compare:
        exact = tls_side_by_side(words, sample, args.nodes, half, args.repeat) and exact
    if args.durable:
        exact = durable_side_by_side(words, sample, args.nodes, r1, p50, p99) and exact
    return 0 if exact else 1


def tls_side_by_side(words, sample, nodes: int, rate: float, repeat: int) -> bool:
    """r=1 with mutual TLS and in the clear, `repeat` pairs taking turns (which goes
    first alternates); each pair's ratio and the median."""
    ratios, exact = [], True
    for i in range(repeat):
        order = (True, False) if i % 2 else (False, True)
        rates, lat = {}, {}
        for tls in order:
            rates[tls], ok, _ = end_to_end(words, nodes, 1, tls=tls)
            lat[tls] = latency(sample, nodes, 1, rate, tls=tls)
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
    from chaos.cluster import spawn_node
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
                         memory_p50: float, memory_p99: float) -> bool:
    """r=1 durable at a few fsync intervals against the memory-mode figures above."""
    exact = True
    for fsync in (0.0, 0.002, 0.01):
        rate, ok, per_tuple = end_to_end(words, nodes, 1, fsync=fsync)
        p50, p99 = latency(sample, nodes, 1, memory_rate / 2, fsync=fsync)
        print(f"durable, fsync every {fsync * 1e3:4.1f} ms, r=1       : {rate / 1e6:6.2f} M "
              f"tuples/s (durable / memory = {rate / memory_rate:.2f}, exact={ok}), "
              f"{per_tuple:.0f} bytes written per tuple; at half the memory load p50 "
              f"{p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms ({(p99 - memory_p99) * 1e3:+.1f} "
              f"against memory)")
        exact = exact and ok
    return exact


if __name__ == "__main__":
    raise SystemExit(main())
