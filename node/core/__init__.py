"""The protocol: pure, driven with an explicit `now` by the runtime and the
simulation alike, so it does no I/O and keeps no clock."""

# Nothing that touches the clock, randomness, threads, processes or the network.
# importlib: a user's reducer is loaded by the name an operator gives (module:Class);
# os: FLOE_PURE selects the pure-Python state table.
# floering.wire: its pure modules only (status, tls and channels speak gRPC).
__may_import__ = (
    "floering.node.core", "floering.wire.errors", "floering.wire.hashing", "floering.wire.codec",
    "floering.wire.balancers", "floering.wire.pieces", "floering.wire.epochs", "floering.wire.ring",
    "floering.wire.ring_wire", "floering.wire.ring_merge",
    "__future__", "array", "ast", "bisect", "collections", "dataclasses", "enum", "hashlib",
    "heapq", "importlib", "io", "itertools", "logging", "math", "mmh3", "msgpack",
    "operator", "os", "re", "struct", "sys", "types", "typing", "weakref", "zlib")
