"""How far replicas run ahead of their primary's checkpoints, and what bounding it costs.

    python -m floering.chaos.backlog --limits 1073741824,8388608,4194304

For each `--max-backup-bytes` setting, side by side in one run: a fresh 4-node ring
(r=1), one mapper feeding a single key as fast as it can for `--seconds`, every node's
`backup_bytes` polled every 0.2 s. Prints the input rate, its ratio to the first
setting's, and the peak backup store: what a takeover would replay in one go
(docs/fault-tolerance.md, "A takeover's replay is bounded"). The count is checked."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from floering.floe.cluster import LocalCluster
from floering.mapper.client import RingClient


def peak_backups(cluster: LocalCluster, stop: threading.Event, peak: dict) -> None:
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        while not stop.is_set():
            for row in client.stats():
                peak[row["node_id"]] = max(peak.get(row["node_id"], 0), row["backup_bytes"])
            stop.wait(0.2)


def run_one(limit: int, seconds: float) -> tuple[float, int, bool]:
    """(tuples/s, peak backup bytes on any node, count exact) for one setting."""
    peak: dict = {}
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="floe-backlog-") as tmp, \
            LocalCluster.up(4, 1, workdir=tmp,
                            extra_args=["--max-backup-bytes", str(limit)]) as cluster:
        poller = threading.Thread(target=peak_backups, args=(cluster, stop, peak))
        poller.start()
        try:
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                chunk, sent = ["the"] * 10_000, 0
                start = time.perf_counter()
                while time.perf_counter() - start < seconds:
                    client.emit_many(chunk)
                    sent += len(chunk)
                client.flush()
                rate = sent / (time.perf_counter() - start)
                exact = client.get("the") == sent
        finally:
            stop.set()
            poller.join()
    return rate, max(peak.values(), default=0), exact


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default=f"{1 << 30},{8 << 20},{4 << 20}",
                        help="comma-separated --max-backup-bytes settings (bytes)")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    limits = [int(x) for x in args.limits.split(",") if x.strip()]
    rows = [(limit, *run_one(limit, args.seconds)) for limit in limits]
    print(f"{'max-backup-bytes':>17} {'tuples/s':>10} {'ratio':>6} {'peak backups MB':>16} exact")
    for limit, rate, peak, exact in rows:
        print(f"{limit:>17} {rate:>10.0f} {rate / rows[0][1]:>6.2f} {peak / 1e6:>16.1f} {exact}")
    return 0 if all(row[3] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
