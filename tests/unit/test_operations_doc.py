"""docs/operations.md names every metric a node exports and every field of
`floe status --json`."""

from pathlib import Path

from floering.v1 import floe_pb2
from floering.node.transport.metrics import COUNTERS, GAUGES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def test_every_metric_is_documented():
    names = [f"{name}_total" for name, _, _ in COUNTERS] + [name for name, _, _ in GAUGES]
    names += ["floe_node_info", "floe_checkpoint_round_duration_seconds",
              "floe_rpc_duration_seconds"]
    missing = [name for name in names if f"`{name}" not in DOC]
    assert not missing, missing


def test_every_status_field_is_documented():
    fields = [f.name for f in floe_pb2.NodeStats.DESCRIPTOR.fields if f.name != "load"]
    fields += ["ring_version", "replication", "reducer", "balancer", "verdict", "nodes",
               "state", "error"]
    missing = [name for name in fields if f"| `{name}` |" not in DOC]
    assert not missing, missing


def test_every_member_state_is_documented():
    from floering.floe import ringview
    states = [ringview.SERVING, ringview.JOINING, ringview.LEAVING, ringview.SUSPECT,
              ringview.DEAD, ringview.FENCED, ringview.REMOVED]
    row = next(line for line in DOC.splitlines() if line.startswith("| `state` |"))
    assert all(f"`{state}`" in row for state in states), row
