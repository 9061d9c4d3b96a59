"""The spark-submit driver: a Structured Streaming query whose executors act as mappers."""

# Only the mapper's client, as any user program (tests/unit/test_layering.py).
__may_import__ = ("floering.spark_driver", "floering.mapper", "*")
