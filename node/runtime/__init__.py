"""The node's executor: runs the core's machine on asyncio, behind the `Peers`
interface (gRPC in transport/, in memory for tests)."""

__may_import__ = ("floering.wire", "floering.node.runtime", "floering.node.core",
                  "floering.node.storage", "floering.node.config", "floering.node.files", "*")
