"""The main job: a local ring, the bundled corpus streamed in, a node SIGKILLed
mid-stream, and exact results printed.

    python -m chaos.demo [--nodes 4] [--replicas 1] [--lines N] [--no-kill]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter

from chaos.cluster import LocalCluster
from chaos.corpus import kjv_lines
from mapper import RingClient, split_words


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--lines", type=int, help="only the first N lines of the corpus")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a node")
    args = parser.parse_args(argv)

    lines = kjv_lines(args.lines)
    words = [w for line in lines for w in split_words(line)]
    expected = Counter(words)
    print(f"corpus: King James Bible, {len(lines)} lines, {len(words)} words, "
          f"{len(expected)} distinct")

    with tempfile.TemporaryDirectory(prefix="floe-demo-") as workdir:
        started = time.perf_counter()
        with LocalCluster.up(args.nodes, args.replicas, workdir=workdir) as cluster:
            print(f"ring: {args.nodes} nodes, r={args.replicas}, up in "
                  f"{time.perf_counter() - started:.1f}s "
                  f"({', '.join(n.address for n in cluster.nodes)})")
            victim = cluster.nodes[len(cluster.nodes) // 2] if not args.no_kill else None
            killed_at = None
            with RingClient(cluster.seeds, linger=0.01) as client:
                chunks = [words[i:i + 20_000] for i in range(0, len(words), 20_000)]
                t0 = time.perf_counter()
                for n, chunk in enumerate(chunks):
                    client.emit_many(chunk)
                    if victim is not None and n == len(chunks) // 2:
                        client.flush()
                        killed_at = time.time()
                        cluster.kill(victim.node_id)
                        print(f"SIGKILL {victim.node_id} (pid {victim.pid}) after "
                              f"{sum(map(len, chunks[:n + 1]))} words")
                client.flush()
                elapsed = time.perf_counter() - t0
                print(f"fed {len(words)} tuples in {elapsed:.2f}s "
                      f"({len(words) / elapsed:,.0f}/s), every one acknowledged by r+1 nodes")
                if killed_at is not None:
                    taken = [t - killed_at for t in cluster.takeover_times()]
                    if taken:
                        print(f"recovery: {victim.node_id}'s ranges applied again by their "
                              f"heir {max(taken) * 1e3:.0f} ms after the kill")
                got = dict(client.scan())
                print("top 20 words:")
                for word, count in client.top(20):
                    print(f"  {count:>7}  {word}")
    diff = {w for w in expected.keys() | got.keys() if expected.get(w) != got.get(w)}
    if diff:
        sample = sorted(diff)[:10]
        print(f"MISMATCH: {len(diff)} keys differ from an independent count, e.g. "
              + ", ".join(f"{w}: ring {got.get(w)} != {expected.get(w)}" for w in sample))
        return 1
    print(f"exact: the ring's {len(got)} counts match an independent count of the corpus")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
