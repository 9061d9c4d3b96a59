"""Spark's Python daemon (spark.python.daemon.module), with the ring's client imported
before it forks the workers.

Spark forks every Python worker from one daemon process, and a worker left idle for a
minute is stopped, so a query's tasks keep landing in fresh workers that import gRPC,
the protobuf modules and the mapper first: 0.65 s of CPU at a load of 12, 1.7-3.5 s of
wall time in a task on a busy machine. Imported once here, every worker starts with
them in memory (copy-on-write). Only modules that start no thread are taken: a thread
does not survive fork (pyarrow, which starts some, stays in the workers as before). No
channel, event loop or client is made here: those still begin in each worker.
"""

from __future__ import annotations

from floering.spark_driver.pyspark_path import prefer_installed

# Importing these starts no thread (tests/spark/test_spark_daemon.py counts the process's).
PRELOAD = ("grpc", "floering.mapper.client", "floering.mapper.kernel",
           "floering.spark_driver.partition", "floering.spark_driver.connections")


def preload() -> list[str]:
    """Import PRELOAD, skipping any that fails (a worker imports it again and says
    why); return the names imported."""
    done = []
    for name, load in _LOADERS:
        try:
            load()
        except Exception:
            continue
        done.append(name)
    return done


def _grpc():
    import grpc
    import grpc.aio  # noqa: F401


def _client():
    import floering.mapper.client  # noqa: F401


def _kernel():
    import floering.mapper.kernel  # noqa: F401


def _partition():
    import floering.spark_driver.partition  # noqa: F401


def _connections():
    import floering.spark_driver.connections  # noqa: F401


# each by a constant name, so the import checks see every module this loads
_LOADERS = tuple(zip(PRELOAD, (_grpc, _client, _kernel, _partition, _connections)))


def main() -> None:
    # Spark put its pyspark.zip first on this path; the workers forked from here import
    # pyspark.worker and the rest from the installed copy's bytecode instead.
    prefer_installed()
    preload()
    from pyspark import daemon
    daemon.manager()


if __name__ == "__main__":
    main()
