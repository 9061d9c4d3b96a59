"""The operator's command (`floe`) and what it drives: the local cluster it starts and
records, the ring's status, feeds, moves and scaling, rolling restarts, snapshots
(export and import), the web page and the Grafana dashboard. Deployed nodes need none
of it: they start through `floering.node` (`python -m floering.node`)."""

# The clients, and of the node what an operator's tools read or start: the wire, the
# errors, the ring, the snapshot format, the node's entry point and its settings. The
# chaos harness and the benchmarks build on this package, never the other way round.
__may_import__ = (
    "floering.floe", "floering.mapper", "floering.v1", "floering.wire",
    "floering.node.__main__", "floering.node.app", "floering.node.config",
    "floering.node.files", "floering.node.core.batch",
    "floering.node.core.chunks", "floering.node.core.columnar", "floering.node.core.load",
    "floering.node.core.reducers",
    "floering.node.core.shares", "floering.node.core.snapshot_format",
    "floering.node.core.state_wire", "floering.node.core.table_state",
    "floering.node.transport.tls", "*")
