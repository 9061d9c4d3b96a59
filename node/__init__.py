"""The reducer node: its pure protocol core (core/), the asyncio runtime that
executes it (runtime/), the gRPC shell around both (transport/) and its store
(storage/); app.py puts them together."""

# The node may use only itself (tests/unit/test_layering.py checks every import).
__may_import__ = ("floering.wire", "floering.node", "floering.v1", "*")
