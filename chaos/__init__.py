"""The chaos harness (scenarios, faults, the oracle, timelines, plots), the main job
and the benchmarks: they drive every other package, the local cluster of the `floe`
command (floering.floe) included."""

__may_import__ = ("floering", "*")
