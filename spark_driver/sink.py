"""The Spark side of the ring path: a foreachBatch function whose partitions are mappers,
and the session settings the driver and the benchmark share."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from floering.spark_driver.partition import PartitionConfig, feed_rows

if TYPE_CHECKING:
    from floering.spark_driver.plans import BatchPlans

ROOT = Path(__file__).resolve().parent.parent


class RingSink:
    """`writeStream.foreachBatch(RingSink(...))`, then `bind(query.id)` once started.

    Runs on the driver for each micro-batch; ships one task per partition. Nothing
    between the source and the tasks shuffles, so a replayed batch has the same
    partitions with the same rows in the same order.

    Three plans, chosen once (`choose`):
    - "lines+arrow" (the default word split, pyarrow and pandas installed, the mapper's
      compiled kernel built): `mapInArrow` hands each task its lines as Arrow batches,
      the kernel splits them into words in C (mapper.words.split_words on the UTF-8
      bytes) and the words go on as below; the JVM only reads the lines;
    - "sql+arrow" (the same, without the compiled kernel; `task_split=False`): Spark SQL
      splits each line into its array of words in the JVM (`regexp_extract_all(
      lower(line), WORD_PATTERN)`), `mapInArrow` hands each task its lines' word lists
      as Arrow batches (not exploded: one Arrow row per line costs the JVM far less
      than one per word), the task flattens them into its words in order;
    - "rows" (any other map step): `mapPartitions` over the input column, the map
      step run in Python per row.
    Either Arrow plan runs the job by a `collect()` of one row per partition (its id
    and the tuples it sent)."""

    def __init__(self, *, sql_split: bool | None = None, task_split: bool | None = None,
                 **fields) -> None:
        self.fields = fields
        self.sql_split = sql_split         # an Arrow plan (None: when it applies)
        self.task_split = task_split       # ... splitting in the task (None: compiled)
        self.plan_name: str | None = None
        self._bound = threading.Event()
        self.plans: BatchPlans | None = None   # each batch's routing plan, if kept
        self.query_id: str | None = None
        self.sent: dict[int, int] = {}     # the last batch: partition id -> tuples sent
        # Since this driver started, over batches whose every task returned (so the ring
        # holds all of it on r+1 nodes): tuples sent, and what the map step made of the
        # input before combining (the words, for a word count).
        self.acknowledged = self.inputs = self.batches = 0

    def choose(self, spark) -> str:
        """Decide the plan (once) and name it: "lines+arrow", "sql+arrow" or "rows"."""
        if self.plan_name is None:
            from floering.spark_driver.maps import split_in_sql
            arrow = self.sql_split if self.sql_split is not None else \
                split_in_sql(self.fields["map_spec"])
            in_task = self.task_split if self.task_split is not None else _compiled_split()
            if arrow and in_task:
                self.plan_name = "lines+arrow"
            elif arrow and (self.sql_split or _jvm_lowercases_like_python(spark)):
                self.plan_name = "sql+arrow"
            else:
                self.plan_name = "rows"
        return self.plan_name

    def bind(self, query_id: str) -> None:
        self.query_id = query_id
        self._bound.set()

    def __call__(self, df, batch_id: int) -> None:
        if not self._bound.wait(60) or self.query_id is None:
            raise RuntimeError("RingSink used before bind(query.id)")
        plan = self.plans.plan_for(df, batch_id) if self.plans is not None else None
        config = PartitionConfig(query_id=self.query_id, plan=plan, **self.fields)
        chosen = self.choose(df.sparkSession)
        if chosen == "lines+arrow":
            lines = df.select(df[df.columns[0]].cast("string").alias("line"))
            rows = lines.mapInArrow(_lines_task(config, batch_id), SENT_SCHEMA).collect()
            rows = [(r["partition"], r["tuples"], r["inputs"]) for r in rows]
        elif chosen == "sql+arrow":
            from floering.spark_driver.maps import sql_word_arrays
            words = df.select(sql_word_arrays(df[df.columns[0]]).alias("words"))
            rows = words.mapInArrow(_arrow_task(config, batch_id), SENT_SCHEMA).collect()
            rows = [(r["partition"], r["tuples"], r["inputs"]) for r in rows]
        else:
            rows = df.select(df.columns[0]).rdd.mapPartitions(_task(config, batch_id)).collect()
        self.sent = {partition: tuples for partition, tuples, _ in rows}
        self.acknowledged += sum(tuples for _, tuples, _ in rows)
        self.inputs += sum(inputs for _, _, inputs in rows)
        self.batches += 1


SENT_SCHEMA = "partition int, tuples long, inputs long"


def _arrow_task(config: PartitionConfig, batch_id: int):
    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext
        from floering.spark_driver.partition import feed_words
        partition_id = TaskContext.get().partitionId()
        # one list of words per line; flatten() gives the words in order (offsets
        # respected, a null line gives none)
        sent, inputs = feed_words(config, batch_id, partition_id,
                                  (b.column(0).flatten() for b in batches))
        yield pa.RecordBatch.from_arrays(
            [pa.array([partition_id], pa.int32()), pa.array([sent], pa.int64()),
             pa.array([inputs], pa.int64())],
            names=["partition", "tuples", "inputs"])
    return task


def _lines_task(config: PartitionConfig, batch_id: int):
    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext
        from floering.spark_driver.partition import feed_lines
        partition_id = TaskContext.get().partitionId()
        sent, inputs = feed_lines(config, batch_id, partition_id,
                                  (b.column(0) for b in batches))
        yield pa.RecordBatch.from_arrays(
            [pa.array([partition_id], pa.int32()), pa.array([sent], pa.int64()),
             pa.array([inputs], pa.int64())],
            names=["partition", "tuples", "inputs"])
    return task


def _compiled_split() -> bool:
    """Whether this process has the mapper's compiled kernel (executors are assumed to
    run the same build; one without it splits in pure Python, exactly but slower)."""
    from floering.mapper.kernel import COMBINE_KERNEL
    return COMBINE_KERNEL == "compiled"


def _task(config: PartitionConfig, batch_id: int):
    def task(rows):
        from pyspark import TaskContext
        partition_id = TaskContext.get().partitionId()
        yield (partition_id, *feed_rows(config, batch_id, partition_id, rows))
    return task


def _jvm_lowercases_like_python(spark) -> bool:
    """Java's toLowerCase follows the JVM's default locale: in Turkish, Azeri and
    Lithuanian it lower-cases I (and some accented letters) unlike Python's str.lower.
    Under those the word split stays in Python. Executors are assumed to share the
    driver's locale."""
    try:
        language = spark.sparkContext._jvm.java.util.Locale.getDefault().getLanguage()
    except Exception:
        language = ""
    return language not in ("tr", "az", "lt")


def session_builder(app: str, shuffle_partitions: int = 2):
    """A builder whose executors run this Python and, from a checkout, import it."""
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app)
               .config("spark.sql.shuffle.partitions", shuffle_partitions)
               .config("spark.ui.showConsoleProgress", "false")
               # workers forked with the ring's client imported (spark_driver.daemon)
               .config("spark.python.daemon.module", "floering.spark_driver.daemon"))
    if (ROOT / "proto" / "floering").is_dir():
        path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "proto"),
                                           os.environ.get("PYTHONPATH", "")) if p)
        builder = builder.config("spark.executorEnv.PYTHONPATH", path)
    return builder
