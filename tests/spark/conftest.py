import os

import pytest

# Spark's JVM on the client compiler only (C1) and the serial collector: a test's JVM
# lives a minute or two on little data, where C2's compiler threads and the parallel
# collector's threads cost more CPU than they give back. A session and one micro-batch:
# 27-28 s of CPU against 45-46 s with the JVM's defaults (2 cores, load 8-12). Only for
# tests: a long-running driver wants C2. spark-submit adds SPARK_SUBMIT_OPTS to the
# driver's JVM (in local mode the executors' too), for pyspark's own launch as well.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(autouse=True)
def quick_jvm(monkeypatch):
    given = os.environ.get("SPARK_SUBMIT_OPTS", "")
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", f"{given} {QUICK_JVM}".strip())
