"""Every event-loop step over a bound, on a real ring: what holds a node's loop.

    python -m floering.chaos.stalls [--keys 5000000] [--nodes 4] [--ms 5]

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
    probe = workdir / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["FLOE_STALL_MS"] = str(bound_ms)
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
    args = p.parse_args(argv)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="floe-stalls-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = run_ring(args.keys, args.nodes, workdir, args.ms)
    print("\n".join(report(logs)))
    if not args.keep:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
