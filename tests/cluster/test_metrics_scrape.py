"""`floe up --metrics-port BASE` on real processes: node i serves on BASE+i (listed by
`floe status --json` and in the Prometheus file_sd target file), with process and GC
collectors and histograms of batch apply, checkpoint, takeover and event-loop lag
time; the counters agree exactly with what was sent."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter

import pytest

from tests.support.helpers import floe, floe_run, wait_for
from tests.support.metrics_scrape_shared import _free_base, scrape

pytestmark = pytest.mark.multiprocess


def _total(addresses, name: str) -> float:
    return sum(scrape(a).get(name, 0.0) for a in addresses)


def test_metrics_ports_collectors_and_histograms_on_a_real_cluster(tmp_path):
    base = _free_base(3)
    try:
        up = floe(tmp_path, "up", "--nodes", "3", "--memory", "--metrics-port", str(base))
        wanted = [f"127.0.0.1:{base + i}" for i in range(3)]
        assert [f"metrics http://{a}/metrics" in up for a in wanted] == [True] * 3
        targets = json.loads((tmp_path / "floe-cluster" / "prometheus-targets.json")
                             .read_text())
        assert [(g["targets"], g["labels"]["floe_node"]) for g in targets] == \
            [([a], f"n{i}") for i, a in enumerate(wanted)]
        shown = json.loads(floe(tmp_path, "status", "--json"))
        assert {n["node_id"]: n["metrics"] for n in shown["nodes"]} == \
            {f"n{i}": a for i, a in enumerate(wanted)}

        first = scrape(wanted[0])
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "python_gc_objects_collected_total{generation=0}",
                     "floe_event_loop_lag_seconds_count", "floe_batch_apply_seconds_count",
                     "floe_checkpoint_seconds_count", "floe_takeover_seconds_count"):
            assert name in first, name
        for gone in ("floe_apply_rate_tuples_per_second", "floe_cpu_ratio",
                     "floe_applier_busy_ratio"):
            assert gone not in first

        from floering.mapper import RingClient
        words = [f"w{i % 97}" for i in range(20_000)]
        seeds = [n["address"] for n in shown["nodes"]]
        tls = str(tmp_path / "floe-cluster" / "tls")
        with RingClient(seeds, tls=tls, combine=False) as client:
            client.emit_many(words)
            client.flush()
            assert dict(client.scan()) == dict(Counter(words))
        assert _total(wanted, "floe_tuples_applied_total") == len(words)
        # every node applied messages of batches (several batches a message)
        assert all(scrape(a)["floe_batch_apply_seconds_count"] >= 1 for a in wanted)
        assert _total(wanted, "floe_batch_apply_seconds_sum") > 0
        wait_for(lambda: all(scrape(a)["floe_checkpoint_seconds_count"] >= 1 and
                             scrape(a)["floe_event_loop_lag_seconds_count"] >= 2
                             for a in wanted), 20, "checkpoints and lag samples")

        floe(tmp_path, "restart", "n2")          # the same port, from the cluster file
        info = [k for k in scrape(wanted[2]) if k.startswith("floe_node_info")]
        assert len(info) == 1 and "node_id=n2#1" in info[0], info
        wait_for(lambda: json.loads(floe(tmp_path, "status", "--json"))["verdict"]
                 .startswith("HEALTHY: 3 of 3"), 30, "healthy after the restart")

        added = floe(tmp_path, "scale", "--add", "1")
        assert "added n3" in added
        targets_file = tmp_path / "floe-cluster" / "prometheus-targets.json"
        fourth = json.loads(targets_file.read_text())[-1]
        assert fourth["labels"]["floe_node"] == "n3"
        assert int(fourth["targets"][0].rpartition(":")[2]) > base + 2
        assert "floe_batch_apply_seconds_count" in scrape(fourth["targets"][0])
        floe(tmp_path, "scale", "--remove", "n3")
        assert [g["labels"]["floe_node"] for g in json.loads(targets_file.read_text())] == \
            ["n0", "n1", "n2"]

        victim = next(n for n in shown["nodes"] if n["node_id"] == "n1")
        os.kill(victim["pid"], signal.SIGKILL)
        survivors = [wanted[0], wanted[2]]
        wait_for(lambda: _total(survivors, "floe_takeovers_total") >= 1, 20, "a takeover")
        more = [f"w{i % 97}" for i in range(5_000)]
        with RingClient(seeds[::2], tls=tls, combine=False) as client:
            client.emit_many(more)
            client.flush()
            assert dict(client.scan()) == dict(Counter(words + more))
        wait_for(lambda: _total(survivors, "floe_takeover_seconds_count") >= 1, 20,
                 "a taken-over range applying again")
        took = _total(survivors, "floe_takeover_seconds_count")
        assert took <= _total(survivors, "floe_takeovers_total")
        assert 0 <= _total(survivors, "floe_takeover_seconds_sum") < 30 * took
    finally:
        floe_run(tmp_path, "down", "--kill")


def test_a_busy_metrics_port_is_named_before_any_node_starts(tmp_path):
    base = _free_base(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 1))
        held.listen()
        result = floe_run(tmp_path, "up", "--nodes", "3", "--memory", "--metrics-port",
                          str(base))
    assert result.returncode == 1
    assert result.stderr == (f"floe up: metrics port {base + 1} on 127.0.0.1 is in use; pick "
                             f"another --metrics-port (node i gets BASE+i)\n")
    assert not (tmp_path / "floe-cluster.json").exists()
    shared = floe_run(tmp_path, "up", "--nodes", "2", "--", "--metrics-port", str(base))
    assert shared.returncode == 1 and "would give every node the same port" in shared.stderr
