"""The durable node's embedded store and segment log."""

__may_import__ = ("floering.wire", "floering.node.storage", "floering.node.core",
                  "floering.node.files", "*")
