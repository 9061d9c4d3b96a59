"""Spark's Python daemon with the ring's client imported before it forks the workers
(spark_driver.daemon): the import starts no thread, a forked child still connects and
counts exactly, and the driver's session forks its workers from it, which import the
installed pyspark (with its bytecode) rather than Spark's pyspark.zip."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from floering.spark_driver.daemon import PRELOAD

pytestmark = pytest.mark.multiprocess

# A daemon's preload, then a fork whose child feeds the ring and says what it found.
FORKED = r"""
import json, os, sys
from floering.spark_driver.daemon import preload
done = preload()
threads = len(os.listdir("/proc/self/task"))
seeds, tls_dir = json.loads(sys.argv[1])
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    had = "floering.mapper.client" in sys.modules
    from floering.mapper import RingClient, TlsFiles
    with RingClient(seeds, source="forked", tls=TlsFiles.in_dir(tls_dir, "client")) as c:
        c.emit_many(["a", "b", "a"] * 1000)
        c.emit("c", 5)
    os.write(w, json.dumps({"had": had}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 4096) or b"{}")
_, status = os.waitpid(pid, 0)
print(json.dumps({"done": done, "threads": threads, "child": child, "status": status}))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_preloading_starts_no_thread_and_a_forked_child_counts_exactly(tmp_path):
    from floering.floe.cluster import LocalCluster
    from floering.mapper import RingClient
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        out = subprocess.run([sys.executable, "-c", FORKED,
                              json.dumps([list(cluster.seeds), str(cluster.tls_dir)])],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        said = json.loads(out.stdout.strip().splitlines()[-1])
        assert said["done"] == list(PRELOAD)
        assert said["threads"] == 1          # fork keeps no thread: none may exist yet
        assert said["child"] == {"had": True} and said["status"] == 0
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            assert dict(client.scan()) == Counter({"a": 2000, "b": 1000, "c": 5})


WORKER_SEES = r"""
import json, os
from floering.spark_driver.sink import session_builder
spark = session_builder("daemon check", 1).master("local[1]").getOrCreate()
def task(_):
    import os, sys
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().split(b"\0")
    yield ("floering.mapper.client" in sys.modules, [p.decode() for p in parent if p],
           sys.modules["pyspark"].__file__, sys.modules["pyspark.worker"].__file__)
print(json.dumps(spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_the_sessions_workers_are_forked_from_the_preloading_daemon():
    pyspark = pytest.importorskip("pyspark")
    installed = Path(pyspark.__file__).parent       # this Python's, with its bytecode
    assert installed.is_dir()
    out = subprocess.run([sys.executable, "-c", WORKER_SEES], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    [(preloaded, parent, worker_pyspark, worker_module)] = json.loads(
        out.stdout.strip().splitlines()[-1])
    assert "floering.spark_driver.daemon" in parent
    assert preloaded
    # Spark put its pyspark.zip first on the workers' path; they import this copy
    assert Path(worker_pyspark) == installed / "__init__.py", worker_pyspark
    assert Path(worker_module) == installed / "worker.py", worker_module
