"""floe-ring: a peer-ring elastic reducer cluster for streaming MapReduce.

Everything lives under this one namespace: `floering.node` (the reducer nodes),
`floering.wire` (what node and client share: errors, codec, the ring's policy names,
TLS files, channels), `floering.mapper` (the clients and the public API),
`floering.floe` (the operator's `floe` command and the local cluster it starts),
`floering.chaos` (chaos runs and benchmarks), `floering.spark_driver` (the
spark-submit driver) and `floering.v1` (the generated gRPC modules)."""

from pathlib import Path as _Path

# Installed, the packages are folders of this one. In a source checkout they are the
# top-level folders beside proto/, where this file is proto/floering/__init__.py.
_checkout = _Path(__file__).resolve().parent.parent.parent
if (_checkout / "node" / "__init__.py").is_file() \
        and (_checkout / "proto" / "floering" / "__init__.py").is_file():
    __path__.append(str(_checkout))     # noqa: F821 (a package's own __path__)
