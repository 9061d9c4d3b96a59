"""The spark-submit driver: a Structured Streaming query whose executors act as mappers."""
