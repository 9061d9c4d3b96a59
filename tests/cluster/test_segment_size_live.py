"""Log segments sized to their volume: a 32nd of its free space, 1 to 64 MiB. Only whole
segments are deleted, so on a small volume 64 MiB segments would fill it before one could
go; sized to it, checkpoints give space back as a feed goes on.

The tests here start real node processes; the in-process ones are in
tests/unit/test_segment_size.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.durable_faults import SmallDisk, Skipped
from floering.mapper import RingClient
from tests.support.helpers import wait_for
from tests.support.segment_size_shared import MiB


@pytest.fixture
def small_disk(tmp_path):
    """A real 24 MiB filesystem (tmpfs), mounted for the test: needs root."""
    disk = SmallDisk(tmp_path / "disk", 24)
    try:
        disk.__enter__()
    except Skipped as exc:
        pytest.skip(str(exc))
    yield disk.path
    disk.__exit__()


def _segments(node_dir: Path) -> list[tuple[int, int]]:
    """(first record, bytes) of each segment of a node's log, oldest first."""
    return sorted((int(p.stem), p.stat().st_size) for p in (node_dir / "log").glob("*.log"))


@pytest.mark.multiprocess
def test_on_a_small_volume_the_log_rolls_in_small_segments_and_gives_space_back(
        tmp_path, small_disk):
    keys = [f"key{i % 40_000}" for i in range(240_000)]
    with LocalCluster.up(2, 1, workdir=tmp_path, data_dir=small_disk / "data") as cluster:
        for node in cluster.nodes:
            wait_for(lambda: "log segments of" in Path(node.log).read_text(), 10, "the choice")
            chosen = re.search(r"log segments of (\d+) MiB", Path(node.log).read_text())
            assert int(chosen.group(1)) == 1, chosen.group(0)        # 24 MiB / 32, floored
        with RingClient(cluster.seeds, tls=cluster.tls(), combine=False,
                        batch_size=2000) as client:
            for start in range(0, len(keys), 20_000):
                client.emit_many(keys[start:start + 20_000])
                client.flush()
            assert client.scan_all() == Counter(keys)
        dirs = [small_disk / "data" / n.node_id for n in cluster.nodes]

        def compacted() -> bool:
            return all(_segments(d) and _segments(d)[0][0] > 1 for d in dirs)
        wait_for(compacted, 30, "checkpoints to delete the oldest segments")
        for d in dirs:
            segments = _segments(d)
            # each rolled at 1 MiB (plus the batch that crossed it), never 64
            assert all(size <= MiB + (1 << 18) for _, size in segments), segments
            assert sum(size for _, size in segments) < 8 * MiB, segments
