"""What a node costs before it serves and while it idles: the CPU of importing its entry
module, a local ring's start (`LocalCluster.up`: wall time, the caller's CPU, each
node's CPU when the ring serves) and each node's CPU over an idle spell.

    python -m floering.chaos.node_start_bench [--trials 3] [--nodes 4] [--idle 10]
                                              [--checkout DIR ...]

Every figure comes from a fresh process, as every multi-process test and `floe up`
pays it: the ring's nodes run in memory with mutual TLS and receive nothing. CPU is
user + system time (psutil's for the nodes). With several `--checkout` (another
source checkout, its packages found through its proto/ folder), trials alternate
between them, for an A/B in one sitting; the machine's load is printed with each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

IMPORT = r"""
import time
began = time.process_time()
import floering.node.__main__
print(time.process_time() - began)
"""

RING = r"""
import json, resource, sys, tempfile, time
import psutil
from floering.floe.cluster import LocalCluster
nodes, idle = int(sys.argv[1]), float(sys.argv[2])

def cpu(pid):
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system

def own():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

with tempfile.TemporaryDirectory() as workdir:
    began, before = time.monotonic(), own()
    with LocalCluster.up(nodes, workdir=workdir) as cluster:
        out = {"up": time.monotonic() - began, "caller": own() - before,
               "ready": [cpu(n.pid) for n in cluster.nodes]}
        time.sleep(idle)
        out["idle"] = [cpu(n.pid) - r for n, r in zip(cluster.nodes, out["ready"])]
print(json.dumps(out))
"""


def child(checkout: Path, script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(checkout / "proto"))
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def spread(values: list[float], scale: float = 1.0, unit: str = "s") -> str:
    scaled = [v * scale for v in values]
    return (f"median {statistics.median(scaled):.3f} {unit} "
            f"({min(scaled):.3f}-{max(scaled):.3f})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="per checkout (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="default: %(default)s")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds of idling measured (default: %(default)s)")
    parser.add_argument("--checkout", action="append", type=Path,
                        help="a source checkout to run (default: this one); repeat to alternate")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    checkouts = [c.resolve() for c in args.checkout] if args.checkout else [here]
    runs: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for trial in range(args.trials):
        for checkout in checkouts:
            load = os.getloadavg()[0]
            run = json.loads(child(checkout, RING, str(args.nodes), str(args.idle)))
            run["import"] = float(child(checkout, IMPORT))
            run["load"] = (load, os.getloadavg()[0])
            runs[checkout].append(run)
            print(f"trial {trial + 1} {checkout}: import {run['import']:.3f} s CPU, up "
                  f"{run['up']:.3f} s, idle CPU per node {[round(x, 2) for x in run['idle']]} "
                  f"(load {run['load'][0]:.1f}-{run['load'][1]:.1f})", flush=True)
    print(f"\n{args.nodes} nodes in memory, mutual TLS; {args.trials} trials per checkout, "
          f"alternating")
    for checkout, done in runs.items():
        print(f"\n{checkout}")
        print(f"  import of the node's entry module, CPU  {spread([r['import'] for r in done])}")
        print(f"  LocalCluster.up, wall                   {spread([r['up'] for r in done])}")
        print(f"  LocalCluster.up, the caller's CPU       {spread([r['caller'] for r in done])}")
        print(f"  a node's CPU when the ring serves       "
              f"{spread([x for r in done for x in r['ready']])}")
        print(f"  a node's CPU idling, share of a core    "
              f"{spread([x / args.idle for r in done for x in r['idle']], 100, '%')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
