"""The node's gRPC shell: server, peer calls, TLS, metrics."""

__may_import__ = ("floering.wire", "floering.node.transport", "floering.node.core",
                  "floering.node.runtime", "floering.v1", "*")
