"""What a new RingClient costs before its first tuple is acknowledged, phase by phase,
and how many connections (TLS handshakes) it opens to each node.

    python -m floering.chaos.start_bench [--trials 5] [--python PY ...]

Starts a `floe up`-style ring (4 nodes, r=1, durable, mutual TLS, every node a
seed), then runs each trial in a fresh process, as a Spark Python worker's first
task runs: import, the client's loop thread, construction (channels, handshakes, the
ring fetch, which also carries the nodes' payload formats), the first batch (1,000
distinct words over every node) to its last ack, a second client in the same process
(a task that finds the process's loop and any state it kept), close. Connections
are counted from the process's own TCP sockets to each node's port, each one a TLS
handshake. With several `--python` (another checkout's venv interpreter), trials
alternate between them against the same ring, for an A/B in one sitting. The ring's
counts are checked against every word the trials sent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter

from floering.floe.cluster import LocalCluster, unwind_on_sigterm

NODES = 4
WORDS = [f"start{i}" for i in range(1000)]

# Run with `python -c` so another checkout's interpreter runs its own client code.
CHILD = r"""
import json, sys, time
t = time.perf_counter
began = t()
import psutil
from floering.mapper import RingClient, TlsFiles
from floering.mapper import client as client_module
seeds, tls_dir = sys.argv[1].split(","), sys.argv[2]
ports = {int(a.rsplit(":", 1)[1]) for a in seeds}
words = [f"start{i}" for i in range(1000)]

def connections():
    found = {}
    for c in psutil.Process().net_connections(kind="tcp"):
        if c.raddr and c.raddr.port in ports and c.status == "ESTABLISHED":
            found[c.raddr.port] = found.get(c.raddr.port, 0) + 1
    return sorted(found.values())

out = {}
mark = t(); out["import"] = mark - began
client_module._client_loop(); out["loop"] = t() - mark
tls = TlsFiles.in_dir(tls_dir, "client")
for name in ("first", "second"):
    mark = t()
    client = RingClient(seeds, tls=tls)
    out[name + " construct"] = t() - mark
    out[name + " conns after fetch"] = connections()
    mark = t()
    client.emit_many(words)
    client.flush()
    out[name + " first batch"] = t() - mark
    out[name + " conns after flush"] = connections()
    mark = t()
    client.close()
    out[name + " close"] = t() - mark
print(json.dumps(out))
"""

TIMES = ("import", "loop", "first construct", "first first batch", "first close",
         "second construct", "second first batch", "second close")


def trial(python: str, seeds: list[str], tls_dir: str) -> dict:
    done = subprocess.run([python, "-c", CHILD, ",".join(seeds), tls_dir],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{python}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="per interpreter (default: %(default)s)")
    parser.add_argument("--python", action="append",
                        help="an interpreter to run trials with (default: this one); repeat to alternate")
    args = parser.parse_args(argv)
    unwind_on_sigterm()
    pythons = args.python or [sys.executable]
    results: dict[str, list[dict]] = {p: [] for p in pythons}
    with tempfile.TemporaryDirectory(prefix="floe-start-bench-") as workdir:
        with LocalCluster.up(NODES, 1, workdir=workdir, tls=True,
                             data_dir=f"{workdir}/data") as cluster:
            for _ in range(args.trials):
                for python in pythons:
                    results[python].append(trial(python, cluster.seeds, str(cluster.tls_dir)))
            from floering.mapper import RingClient
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as reader:
                got = dict(reader.scan())
    sent = args.trials * len(pythons) * 2
    exact = got == Counter({w: sent for w in WORDS})
    print(f"{NODES} nodes r=1, durable, mutual TLS, every node a seed; "
          f"{args.trials} trials per interpreter, alternating; counts exact: {exact}")
    for python, runs in results.items():
        print(f"\n{python}")
        for phase in TIMES:
            values = [r[phase] * 1000 for r in runs]
            print(f"  {phase:20} median {statistics.median(values):7.1f} ms  "
                  f"(min {min(values):.1f}, max {max(values):.1f})")
        first = [(r["first construct"] + r["first first batch"]) * 1000 for r in runs]
        second = [(r["second construct"] + r["second first batch"]) * 1000 for r in runs]
        print(f"  construction to first ack: first client median {statistics.median(first):.1f} ms, "
              f"second {statistics.median(second):.1f} ms")
        for phase in ("first conns after fetch", "first conns after flush",
                      "second conns after fetch", "second conns after flush"):
            print(f"  {phase:26} per node {runs[-1][phase]}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
