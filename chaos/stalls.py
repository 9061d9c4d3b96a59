"""Every event-loop step over a bound, on a real ring: what holds a node's loop.

    python -m floering.chaos.stalls [--keys 5000000] [--nodes 4] [--ms 5]
    python -m floering.chaos.stalls --flood 4,6

A default ring (the count reducer in the compiled table, r=1, durable, mutual TLS) is
fed `--keys` distinct keys; then checkpoint rounds run, a node leaves (`floe scale
--remove`), another is SIGKILLed and its ranges are copied again. Every node runs with
a probe (a `sitecustomize` on its PYTHONPATH) that times each step of its event loop
in the CPU time of the loop's thread (a step's wall time on a shared machine counts
the other processes too) and logs every step over `--ms` with its task, the gc passes
inside it, and, for a step over 20 ms, where the loop's thread was (sampled every
20 ms). The report: for each node the steps over the bound and the longest, also
once it served (after its READY line: start-up's steps, RocksDB's open among them,
come before any peer or mapper is served), then by task and the longest.

With `--flood STREAMS,MESSAGES`, instead: a ring of 3 whose first node's range and
that range's replica each get STREAMS Push streams of MESSAGES requests of two
100,000-tuple batches (about 7 MiB a request), as a mapper sends a batch to both;
the two nodes are reported apart.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time
from pathlib import Path

PROBE = "from floering.chaos.stalls import install_probe\ninstall_probe()\n"
STEP = re.compile(r"^SLOWSTEP (\S+) cpu=(\S+) wall=(\S+) gc=(\S+) (.*)$")


def install_probe() -> None:
    """In a node process: log each loop step over FLOE_STALL_MS (CPU time) to stderr."""
    import asyncio.events
    import gc
    import threading
    import traceback
    bound = float(os.environ.get("FLOE_STALL_MS", "5")) / 1000.0
    run, main = asyncio.events.Handle._run, threading.main_thread().ident
    now: dict = {"gc": 0.0, "gc_t0": 0.0, "t0": None, "where": []}

    def timed(handle):
        now.update(gc=0.0, t0=time.perf_counter(), where=[])
        cpu0 = time.thread_time()
        try:
            return run(handle)
        finally:
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - now["t0"]
            now["t0"] = None
            if cpu > bound:
                what = handle._callback
                owner = getattr(what, "__self__", None)
                coro = owner.get_coro() if hasattr(owner, "get_coro") else None
                name = getattr(coro or what, "__qualname__", None) or type(what).__name__
                print(f"SLOWSTEP {time.time():.2f} cpu={cpu * 1e3:.1f} wall={wall * 1e3:.1f} "
                      f"gc={now['gc'] * 1e3:.1f} {name}", file=sys.stderr, flush=True)
                for where, n in collections.Counter(now["where"]).most_common(2):
                    print(f"  AT {n}x {where}", file=sys.stderr, flush=True)

    def collected(phase, info):
        if phase == "start":
            now["gc_t0"] = time.thread_time()
        else:
            now["gc"] += time.thread_time() - now["gc_t0"]

    def sample():
        while True:
            time.sleep(0.02)
            t0 = now["t0"]
            if t0 is None or time.perf_counter() - t0 < 0.02 or len(now["where"]) > 8:
                continue
            frame = sys._current_frames().get(main)
            if frame is not None:
                stack = [f"{Path(f.filename).name}:{f.lineno}:{f.name}"
                         for f in traceback.extract_stack(frame) if "floering" in f.filename]
                now["where"].append(" < ".join(reversed(stack[-6:])))

    asyncio.events.Handle._run = timed
    gc.callbacks.append(collected)
    threading.Thread(target=sample, daemon=True, name="stall-probe").start()


def run_ring(keys: int, nodes: int, workdir: Path, bound_ms: float) -> list[Path]:
    """The scenario; returns the nodes' logs."""
    _probe(workdir, bound_ms)
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    cluster = LocalCluster.up(nodes, 1, workdir=workdir, data_dir=workdir / "data")
    logs = [Path(n.log) for n in cluster.nodes]
    try:
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            for lo in range(0, keys, 250_000):
                client.emit_many([f"key-{i:08x}" for i in range(lo, min(keys, lo + 250_000))])
            client.flush(timeout=300)
        print(f"fed {keys:,} keys", flush=True)
        time.sleep(8)                                  # checkpoint rounds
        ids = [n.node_id for n in cluster.nodes]
        cluster.remove(ids[-1], timeout=120)
        print(f"{ids[-1]} left", flush=True)
        time.sleep(8)
        cluster.kill(ids[-2])
        print(f"{ids[-2]} SIGKILLed", flush=True)
        time.sleep(20)                                 # re-replication
    finally:
        cluster.down(grace=10)
    return logs


def run_flood(streams: int, messages: int, workdir: Path, bound_ms: float) -> list[Path]:
    """A flood of large Push requests (chaos.hostile.LargePushes: two batches of 100,000
    tuples a request) into a range's primary and its replica at once, as a mapper sends
    a batch to both, on a ring of 3 in the clear whose replicas may hold the flood
    (--max-backup-bytes 1 GiB); returns the logs of the primary, then the replica."""
    import copy
    import threading
    import grpc
    from floering.chaos.hostile import LargePushes
    from floering.floe.cluster import LocalCluster
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from floering.wire.ring import Ring
    _probe(workdir, bound_ms)
    with LocalCluster.up(3, 1, workdir=workdir, tls=False,
                         node_args=["--max-backup-bytes", str(1 << 30)]) as cluster:
        node = cluster.node(cluster.nodes[0].node_id)
        seen, since = None, time.monotonic()
        while time.monotonic() - since < 5:        # the ring settled: 5 s unchanged
            time.sleep(0.5)
            with grpc.insecure_channel(node.address) as channel:
                ring = Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(channel).GetRing(
                    floe_pb2.GetRingRequest(), timeout=10).ring)
            if ring.version != seen or not ring.tokens_of(node.node_id):
                seen, since = ring.version, time.monotonic()
        primary = LargePushes(node.address, streams, messages)
        backup = ring.replicas_of_token(primary.token)[0]
        replica = copy.copy(primary)
        replica.address = dict(ring.addresses)[backup]
        replica.acked, replica.refused, replica._lock = 0, {}, threading.Lock()
        began = time.monotonic()
        runs = [threading.Thread(target=flood.run) for flood in (primary, replica)]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
        print(f"flood of {streams * messages * 2 * primary.tuples:,} tuples in "
              f"{time.monotonic() - began:.1f} s: primary {node.node_id} acked "
              f"{primary.acked:,} refused {primary.refused}, replica {backup} acked "
              f"{replica.acked:,} (the rest a checkpoint covered first) refused "
              f"{replica.refused}", flush=True)
        return [Path(cluster.node(n).log) for n in (node.node_id, backup)]


def _probe(workdir: Path, bound_ms: float) -> None:
    """Every node started after this runs the probe (a sitecustomize on PYTHONPATH)."""
    probe = workdir / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["FLOE_STALL_MS"] = str(bound_ms)


def report(logs: list[Path], top: int = 12) -> list[str]:
    """Per node the steps over the bound and the longest, then those once it served
    (after its READY line; a log without one: all of them), by task, the longest."""
    out, steps, serving = [], [], []
    for path in logs:
        mine, ready = [], False
        for line in path.read_text(errors="replace").splitlines():
            ready = ready or line.startswith("READY ")
            if (m := STEP.match(line)) is not None:
                mine.append((m, ready))
        if not any(up for _, up in mine) and not ready:
            mine = [(m, True) for m, _ in mine]      # no READY line: every step counts
        worst = max((float(m[2]) for m, _ in mine), default=0.0)
        up = [float(m[2]) for m, served in mine if served]
        out.append(f"{path.stem}: {len(mine)} steps over the bound, longest {worst:.1f} ms CPU; "
                   f"once serving {len(up)}, longest {max(up, default=0.0):.1f} ms")
        serving += up
        steps += [(float(m[2]), float(m[3]), float(m[4]), m[5].strip(), path.stem)
                  for m, _ in mine]
    out.append(f"once serving, every node: {len(serving)} steps over the bound, longest "
               f"{max(serving, default=0.0):.1f} ms CPU")
    by_task: dict = collections.defaultdict(list)
    for cpu, _, _, task, _ in steps:
        by_task[task].append(cpu)
    out.append("by task: steps, longest ms CPU")
    out += [f"  {len(v):5d} {max(v):8.1f}  {k}"
            for k, v in sorted(by_task.items(), key=lambda kv: -max(kv[1]))[:top]]
    out.append("longest steps: ms CPU, ms wall, ms gc, task, node")
    out += [f"  {c:8.1f} {w:8.1f} {g:6.1f}  {t}  {n}" for c, w, g, t, n in sorted(steps)[::-1][:top]]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=5_000_000)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--ms", type=float, default=5.0, help="log steps over this (CPU ms)")
    p.add_argument("--keep", help="keep the ring's folder (logs) here")
    p.add_argument("--flood", metavar="STREAMS,MESSAGES",
                   help="instead: a flood of large Push requests into a range's primary "
                        "and its replica (run_flood), each node reported apart")
    args = p.parse_args(argv)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="floe-stalls-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.flood:
        streams, messages = map(int, args.flood.split(","))
        for log, role in zip(run_flood(streams, messages, workdir, args.ms),
                             ("primary", "replica")):
            print(f"== {log.stem}, the {role}")
            print("\n".join(report([log], top=8)))
    else:
        print("\n".join(report(run_ring(args.keys, args.nodes, workdir, args.ms))))
    if not args.keep:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
