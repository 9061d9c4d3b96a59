"""The Spark side of the ring path: a foreachBatch function whose partitions are mappers,
and the session settings the driver and the benchmark share."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from spark_driver.partition import PartitionConfig, write_partition

ROOT = Path(__file__).resolve().parent.parent


class RingSink:
    """`writeStream.foreachBatch(RingSink(...))`, then `bind(query.id)` once started.

    Runs on the driver for each micro-batch; ships one task per partition. Only the
    input column travels to the mappers, as read: no shuffle, so a replayed batch has
    the same partitions with the same rows in the same order."""

    def __init__(self, **fields) -> None:
        self.fields = fields
        self._bound = threading.Event()
        self.query_id: str | None = None

    def bind(self, query_id: str) -> None:
        self.query_id = query_id
        self._bound.set()

    def __call__(self, df, batch_id: int) -> None:
        if not self._bound.wait(60):
            raise RuntimeError("RingSink used before bind(query.id)")
        config = PartitionConfig(query_id=self.query_id, **self.fields)
        df.select(df.columns[0]).foreachPartition(_task(config, batch_id))


def _task(config: PartitionConfig, batch_id: int):
    def task(rows) -> None:
        from pyspark import TaskContext
        write_partition(config, batch_id, TaskContext.get().partitionId(), rows)
    return task


def session_builder(app: str, shuffle_partitions: int = 2):
    """A builder whose executors run this Python and, from a checkout, import it."""
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app)
               .config("spark.sql.shuffle.partitions", shuffle_partitions)
               .config("spark.ui.showConsoleProgress", "false"))
    if (ROOT / "proto" / "floering").is_dir():
        path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "proto"),
                                           os.environ.get("PYTHONPATH", "")) if p)
        builder = builder.config("spark.executorEnv.PYTHONPATH", path)
    return builder
