"""The operator's command (`floe`), the local cluster harness, chaos runs and
benchmarks: they drive every other package."""

__may_import__ = ("floering", "*")
