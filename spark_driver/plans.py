"""The routing plan of each micro-batch, on the driver: decided, recorded, found again.

A ring whose balancer shares keys (dkg, pkg, ...) gets, per batch, a plan of where
each hot key's tuples go (mapper/plans.py): decided before the batch's tasks start
from the keys measured in earlier batches and in a sample of this one, then written
under the checkpoint (`<checkpoint>/floe-plans/<batch id>`, fsynced and renamed
into place) before any task runs. A batch replayed after a retry or a driver restart
reads the plan it was first sent with, so every seq goes to the piece it went to
before: the ring's dedup by (source, seq) holds whatever the plans decided since.
Spark replays no batch its commit log holds: once a batch is planned, the plans of
the committed batches before it are removed (floering.mapper.kept_plans).

Only for tuples sent one by one (--no-combine): a combining task sends one total per
key, which needs no spreading. A checkpoint that is not a local directory records no
plan, and its batches spread their keys evenly over pieces 0 and 1 (no record needed).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from floering.mapper.kept_plans import prune_batches
from floering.mapper.plans import History, shares_keys

SAMPLE = 0.05          # of a batch's rows read to measure its keys before it is sent
KEEP = 256             # hottest keys a sampled partition reports
KEPT_PLANS = 200       # plans of batches this far behind the newest are removed, and
                       # those of committed batches behind it (mapper/kept_plans.py)


class BatchPlans:
    def __init__(self, checkpoint: str, ring_client, map_spec: str,
                 sample: float = SAMPLE) -> None:
        self.directory = Path(checkpoint.removeprefix("file://")) / "floe-plans"
        self.ring_client, self.map_spec, self.sample = ring_client, map_spec, sample
        self.history = History()
        self.planned = self.recorded = 0      # plans decided, plans read back

    @staticmethod
    def usable(checkpoint: str | None) -> bool:
        if not checkpoint:
            return False
        return "://" not in checkpoint or checkpoint.startswith("file://")

    def plan_for(self, df, batch_id: int) -> bytes | None:
        """The batch's plan, encoded: the one recorded for it, or a new one recorded."""
        path = self.directory / str(batch_id)
        try:
            data = path.read_bytes()
            self.recorded += 1
            return data
        except FileNotFoundError:
            pass
        try:
            ring = self.ring_client.refresh_ring()
        except Exception:               # the view held: a plan only weighs the pieces
            ring = self.ring_client.ring
        if not shares_keys(ring):
            return None
        counts, total = sample_counts(df, self.map_spec, batch_id, self.sample)
        self.history.add({k: c / self.sample for k, c in counts.items()}, total / self.sample)
        data = self.history.plan(ring).encode()
        record(path, data)
        self.planned += 1
        prune_batches(self.directory, batch_id, self.directory.parent / "commits", KEPT_PLANS)
        return data


def sample_counts(df, map_spec: str, batch_id: int, fraction: float) -> tuple[Counter, int]:
    """({key: tuples} of the hottest keys, tuples) the map step makes of a sample of
    `fraction` of the batch's rows."""
    rows = (df.select(df.columns[0]).sample(False, fraction, seed=batch_id)
            .rdd.mapPartitions(_count_task(map_spec)).collect())
    counts: Counter = Counter()
    total = 0
    for n, top in rows:
        total += n
        counts.update(dict(top))
    return Counter(dict(counts.most_common(KEEP))), total


def _count_task(map_spec: str):
    def task(rows):
        from floering.spark_driver.maps import load_map
        map_step = load_map(map_spec)
        counts: Counter = Counter()
        for row in rows:
            if row[0] is not None:
                counts.update(k[0] if type(k) is tuple else k for k in map_step(row[0]))
        yield sum(counts.values()), counts.most_common(KEEP)
    return task


def record(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all, durably, before any task uses it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
