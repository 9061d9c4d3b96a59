"""The spark-submit driver with real Spark (local[2]) and real ring processes: the ring's
counts equal an independent count of the input after a task failure, a driver killed
mid-batch and restarted from its checkpoint, and a node SIGKILLed mid-stream; with the
default word split in Spark SQL (Arrow batches to the tasks), combined per partition
by default and with every tuple sent."""

import time
from collections import Counter
from pathlib import Path

import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.mapper import RingClient, split_words
from floering.spark_driver import driver
from floering.spark_driver.launch import SparkDriver

CHECK_SPLIT = Path(driver.__file__).with_name("check_split.py")

pytestmark = [pytest.mark.spark, pytest.mark.multiprocess]

LINES = kjv_lines(6000)
FILES = 6


def write_corpus(directory, files=FILES, lines=LINES):
    """The corpus in `files` text files; returns an independent count of its words."""
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(lines) // files)
    for i in range(files):
        tmp = directory / f".part-{i}.tmp"
        tmp.write_text("\n".join(lines[i * per:(i + 1) * per]) + "\n")
        tmp.rename(directory / f"part-{i:02d}.txt")   # the source never sees half a file
    return Counter(w for line in lines for w in split_words(line))


@pytest.fixture(scope="module")
def shared_ring(tmp_path_factory):
    """One ring for the tests that leave it whole: a ring start is 4 node processes."""
    holder = {"cluster": healthy_ring(tmp_path_factory.mktemp("shared"))}
    try:
        yield holder
    finally:
        holder["cluster"].down()


@pytest.fixture
def ring(shared_ring, tmp_path):
    """The module's ring, checked intact (every node up, one ring version, pristine; a
    new ring if not) and read before the test: `ring_state` and `applied` give what the
    test added, so every test is exact on its own counts."""
    cluster = shared_ring["cluster"]
    if not intact(cluster):
        cluster.down()
        cluster = shared_ring["cluster"] = healthy_ring(tmp_path)
    BEFORE[id(cluster)] = read_ring(cluster)
    try:
        yield cluster
    finally:
        BEFORE.pop(id(cluster), None)


@pytest.fixture
def fresh_ring(tmp_path):
    """A ring of the test's own (for a test that kills one of its nodes)."""
    with healthy_ring(tmp_path) as cluster:
        yield cluster


def intact(cluster):
    if not all(n.alive() for n in cluster.nodes):
        return False
    try:
        return ring_is_pristine(cluster)[0]
    except Exception:
        return False


def ring_is_pristine(cluster):
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        pristine = client.refresh_ring().pristine
        versions = [s.get("ring_version") for s in client.stats()]
    return pristine and len(set(versions)) == 1 and None not in versions, versions


def healthy_ring(tmp_path, attempts=3, balancer=None):
    """A 4-node ring in which nothing has moved a second after start. On a heavily
    loaded machine a node that starts late can be declared dead by a peer that started
    first; these tests are about Spark, so they start from an intact ring."""
    for attempt in range(attempts):
        cluster = LocalCluster.up(4, 1, workdir=tmp_path / f"ring-{attempt}", balancer=balancer)
        time.sleep(1.0)
        whole, versions = ring_is_pristine(cluster)
        if whole:
            return cluster
        cluster.down()
    raise RuntimeError(f"no intact ring after {attempts} starts (ring versions {versions})")


# id(cluster) -> what a shared ring held when the test began (see `ring`)
BEFORE: dict[int, tuple[dict, list[dict]]] = {}
COUNTERS = ("applied", "duplicates")


def ring_state(cluster):
    """The ring's counts and its nodes' Stats; on a shared ring, what the test added:
    every key's count less the count it had (a key that lost counts shows negative),
    each node's applied and duplicates less theirs."""
    counts, stats = read_ring(cluster)
    if id(cluster) not in BEFORE:
        return counts, stats
    counts_before, stats_before = BEFORE[id(cluster)]
    added = {k: counts.get(k, 0) - counts_before.get(k, 0)
             for k in counts.keys() | counts_before.keys()}
    had = {s["node_id"]: s for s in stats_before if "error" not in s}
    stats = [s if "error" in s else
             {**s, **{c: s[c] - had.get(s["node_id"], {}).get(c, 0) for c in COUNTERS}}
             for s in stats]
    return {k: v for k, v in added.items() if v}, stats


def read_ring(cluster):
    try:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            return dict(client.scan()), client.stats()
    except Exception as exc:   # say what the nodes were doing
        tails = "\n".join(f"--- {n.node_id} (alive={n.alive()})\n"
                          + "\n".join(Path(n.log).read_text(errors="replace").splitlines()[-15:])
                          for n in cluster.nodes)
        raise AssertionError(f"ring query failed: {exc!r}\n{tails}") from exc


def diff(got, expect):
    keys = [k for k in expect.keys() | got.keys() if got.get(k) != expect.get(k)]
    return f"{len(keys)} keys differ, e.g. " + ", ".join(
        f"{k}: ring {got.get(k)} != {expect.get(k)}" for k in sorted(keys)[:5])


def ring_args(cluster):
    """The driver's flags to reach the ring, with the client's certificate."""
    return ["--ring", ",".join(cluster.seeds), "--tls-dir", str(cluster.tls_dir)]


def run_driver(tmp_path, cluster, *extra, master="local[2]", name="driver"):
    return SparkDriver([*ring_args(cluster), "--source", f"dir:{tmp_path / 'in'}",
                        "--checkpoint", str(tmp_path / "checkpoint"), "--progress", "1",
                        "--max-files-per-trigger", "2", *extra],
                       master=master, log=tmp_path / f"{name}.log")


def finish(spark, timeout=400):
    try:
        rc = spark.wait(timeout)
    finally:
        if spark.proc.poll() is None:
            spark.kill()
    assert not spark.descendants(), "spark-submit left processes behind"
    return rc


def wait_for(condition, timeout, what, spark=None):
    """Deadlines are generous (a loaded 2-core machine starts Spark slowly); a driver
    that exits meanwhile fails the wait at once, with its output."""
    deadline = time.monotonic() + timeout
    while not condition():
        if spark is not None and spark.proc.poll() is not None:
            raise AssertionError(f"the driver exited ({spark.proc.returncode}) while "
                                 f"waiting for {what}:\n{spark.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}"
                                 + (f":\n{spark.output()[-3000:]}" if spark else ""))
        time.sleep(0.05)


def applied(cluster):
    """Tuples the ring applied (on a shared ring, since the test began)."""
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        now = sum(s.get("applied", 0) for s in client.stats())
    before = BEFORE.get(id(cluster))
    return now - (sum(s.get("applied", 0) for s in before[1]) if before else 0)


# Apostrophes, unicode letters and case, digits, ligatures, combining marks, the two
# characters that lower-case into ASCII (U+0130, the Kelvin sign), emoji, odd spaces.
TRICKY = [
    "Don't STOP: it's rock'n'roll, o''clock, 'quoted', trailing' 'leading x'y'z'",
    "curly \u2019quotes\u2019 don\u2019t, \u2018single\u2019 and `back`ticks",
    "caf\u00e9 na\u00efve Stra\u00dfe STRASSE \u1e9e \u00c0\u00c9\u00ce \u01c5 e\u0301te",
    "\u0130stanbul \u0130I \u212aelvin \u212b \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u0399",
    "abc123def 4x4 x\u00b2 \u0661\u0662 mp3 3rd 1st",
    "\ufb01ne \ufb00 \uff26\uff55\uff4c\uff4c \uff21",
    "emoji\U0001f600word \U0001d400bold tab\tsep nbsp\u00a0sep zero\u200bwidth",
    "", "   ", "''''", "a'b'c'd'e'f MixedCase ALLCAPS",
]


def test_the_sql_word_split_equals_split_words_on_a_tricky_corpus(tmp_path):
    """The driver splits words in Spark SQL instead of mapper.words.split_words: the
    two must give the same words in the same order, line by line."""
    corpus = tmp_path / "tricky.txt"
    corpus.write_text("\n".join(TRICKY + LINES[:200]) + "\n", encoding="utf-8")
    check = SparkDriver([str(corpus)], script=CHECK_SPLIT, log=tmp_path / "check.log")
    assert finish(check, timeout=300) == 0, check.output()
    assert f"agree: {len(TRICKY) + 200} lines" in check.output()


@pytest.mark.parametrize("combine,split", [("default", "auto"), ("--no-combine", "auto"),
                                           ("default", "sql"), ("--no-combine", "sql")])
def test_available_now_counts_exactly(tmp_path, ring, combine, split):
    from floering.mapper.kernel import COMBINE_KERNEL
    expected = write_corpus(tmp_path / "in")
    spark = run_driver(tmp_path, ring, "--available-now", "--word-split", split,
                       *([combine] if combine != "default" else []))
    assert finish(spark) == 0, spark.output()
    got, stats = ring_state(ring)
    assert got == expected, diff(got, expected)
    out = spark.output()
    assert "spark: batch 2," in out                                # 6 files, 2 per batch
    # the last progress line: every word of the finished batches, held by the ring
    last = [line for line in out.splitlines() if "| ring: " in line][-1]
    assert f"ring: {sum(expected.values()):,} tuples from 3 batches held by the ring" in last
    assert ("sent as" in last) == (combine == "default"), last
    if split == "sql" or COMBINE_KERNEL != "compiled":
        assert "split by Spark SQL, words to the tasks as Arrow batches" in out
    else:
        assert "lines to the tasks as Arrow batches, split by the mapper's compiled " \
               "kernel" in out
    assert ("every tuple sent" if combine == "--no-combine" else "combined per partition") in out
    assert_installed_pyspark(out)
    applied_tuples = sum(s["applied"] for s in stats)
    if combine == "--no-combine":
        assert applied_tuples >= sum(expected.values())
    else:       # one tuple per word per partition and batch: far fewer than the words
        assert applied_tuples < sum(expected.values()) // 2


def assert_installed_pyspark(out):
    """spark-submit puts Spark's pyspark.zip first on the driver's path; this venv's
    pyspark is the same version, so the driver imports it instead (its bytecode)."""
    import pyspark
    installed = Path(pyspark.__file__).parent
    said = [line for line in out.splitlines() if line.startswith("pyspark ")]
    assert said and said[0].startswith(f"pyspark {pyspark.__version__}: {installed} ("), said


def test_a_task_failing_half_way_is_retried_and_counted_once(tmp_path, ring):
    expected = write_corpus(tmp_path / "in")
    marker = tmp_path / "failed-once"
    # local[2,2]: two cores, a task may fail once (plain local[N] never retries).
    spark = run_driver(tmp_path, ring, "--available-now", "--inject-task-failure",
                       str(marker), master="local[2,2]")
    assert finish(spark) == 0, spark.output()
    assert marker.exists(), "the fault was never injected"
    got, stats = ring_state(ring)
    assert got == expected, diff(got, expected)
    # the retry resent the tuples the failed attempt had delivered; the ring dropped them
    assert sum(s["duplicates"] for s in stats) > 0


def test_on_a_ring_sharing_keys_a_retried_task_is_counted_once_and_read_merged(tmp_path):
    from floering.chaos.skew import raw_holders
    expected = write_corpus(tmp_path / "in")
    marker = tmp_path / "failed-once"
    with healthy_ring(tmp_path, balancer="pkg") as ring:
        # every tuple sent, so the hottest word has many seqs to spread by
        spark = run_driver(tmp_path, ring, "--available-now", "--inject-task-failure",
                           str(marker), "--no-combine", master="local[2,2]")
        assert finish(spark) == 0, spark.output()
        assert marker.exists(), "the fault was never injected"
        got, stats = ring_state(ring)
        assert got == expected, diff(got, expected)        # the pieces merged
        assert sum(s["duplicates"] for s in stats) > 0     # the retry's resends dropped
        spread = [k for k, nodes in raw_holders(ring).items() if len(nodes) > 1]
        assert "the" in spread, "the hottest word was not spread over two nodes"


def test_driver_killed_mid_batch_resumes_from_its_checkpoint(tmp_path, ring):
    expected = write_corpus(tmp_path / "in")
    marker = tmp_path / "hung"
    # Combining (the default), a task hangs where it sends its totals: every 1,000 keys
    # here, so mid-partition. The rerun must use the same setting (docs/spark.md).
    first = run_driver(tmp_path, ring, "--inject-hang", str(marker), "--combine-keys", "1000",
                       name="first")
    try:
        wait_for(marker.exists, 300, "a task to reach the middle of its partition", first)
        tree = first.descendants()
        assert tree, "no process started by spark-submit"
        partial = applied(ring)
    finally:
        first.kill()                     # SIGKILL: spark-submit, JVM, Python workers
    assert not first.descendants()
    assert 0 < partial < sum(expected.values())
    second = run_driver(tmp_path, ring, "--available-now", "--combine-keys", "1000",
                        name="second")
    assert finish(second) == 0, second.output()
    got, stats = ring_state(ring)
    assert got == expected, diff(got, expected)
    assert sum(s["duplicates"] for s in stats) > 0   # the replayed batch was resent


def test_a_durable_ring_killed_whole_mid_stream_comes_back_and_the_rerun_is_exact(tmp_path):
    """Every node SIGKILLed while a batch is half delivered (and the driver with
    them); the ring started again on its data directories holds exactly what it had
    acknowledged, and the driver rerun from its checkpoint finishes exactly once."""
    expected = write_corpus(tmp_path / "in")
    data, work = tmp_path / "data", tmp_path / "ring"
    cluster = LocalCluster.up(4, 1, workdir=work, data_dir=data)
    marker = tmp_path / "hung"
    first = run_driver(tmp_path, cluster, "--inject-hang", str(marker), name="first")
    try:
        wait_for(marker.exists, 300, "a task to reach the middle of its partition", first)
        partial = applied(cluster)
        cluster.down(kill=True)
    finally:
        first.kill()
        cluster.down(kill=True)
    assert 0 < partial < sum(expected.values())
    with LocalCluster.up(4, 1, workdir=work, data_dir=data) as cluster:
        second = run_driver(tmp_path, cluster, "--available-now", name="second")
        assert finish(second) == 0, second.output()
        got, stats = ring_state(cluster)
        assert got == expected, diff(got, expected)
        assert all(s["rejoined"] == 0 for s in stats)       # the same members came back


def test_a_node_killed_mid_stream_loses_and_doubles_nothing(tmp_path, fresh_ring):
    ring = fresh_ring
    expected = write_corpus(tmp_path / "in", files=12)
    total = sum(expected.values())
    # every tuple sent: the ring's applied count follows the words
    spark = run_driver(tmp_path, ring, "--available-now", "--max-files-per-trigger", "1",
                       "--no-combine")
    try:
        wait_for(lambda: applied(ring) > total // 4, 300, "a quarter of the corpus applied",
                 spark)
        victim = ring.nodes[1]
        ring.kill(victim.node_id)
        killed_at = applied(ring)
    finally:
        rc = finish(spark)
    assert rc == 0, spark.output()
    assert killed_at < total, "the stream was over before the kill"
    got, stats = ring_state(ring)
    assert got == expected, diff(got, expected)
    assert sorted(s["node_id"] for s in stats) == sorted(
        n.node_id for n in ring.nodes if n is not victim)    # the ring dropped it


def skewed_lines(lines=LINES, hot="floe", seed=5):
    """The corpus with the hot word inserted at random places, as many times as each
    line has words: half of all words."""
    import random
    pick = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        for _ in range(len(split_words(line))):
            words.insert(pick.randrange(len(words) + 1), hot)
        out.append(" ".join(words))
    return out


def applied_by_node(cluster):
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        return {s["node_id"]: s["applied"] for s in client.stats() if "error" not in s}


@pytest.mark.parametrize("policy", ["dkg"])
def test_a_skewed_stream_on_a_sharing_ring_is_even_and_exact_through_a_kill_and_a_retry(
        tmp_path, policy):
    """Half the words are one word. Every batch is sent by a routing plan the driver
    recorded under its checkpoint before the batch's first task: the driver SIGKILLed
    mid-batch and a task failing half-way both replay their batch with the plan it
    first had, so the counts are exact, and the hot word spreads over the nodes."""
    lines = skewed_lines()
    expected = write_corpus(tmp_path / "in", lines=lines)
    assert expected["floe"] * 2 == sum(expected.values())
    hung, failed = tmp_path / "hung", tmp_path / "failed"
    with healthy_ring(tmp_path, balancer=policy) as ring:
        first = run_driver(tmp_path, ring, "--inject-hang", str(hung), "--no-combine",
                           "--max-files-per-trigger", "1", name="first")
        try:
            wait_for(hung.exists, 300, "a task to reach the middle of its partition", first)
            partial = applied(ring)
        finally:
            first.kill()
        assert 0 < partial < sum(expected.values())
        second = run_driver(tmp_path, ring, "--available-now", "--no-combine",
                            "--max-files-per-trigger", "1", "--inject-task-failure",
                            str(failed), master="local[2,2]", name="second")
        assert finish(second) == 0, second.output()
        assert failed.exists(), "the fault was never injected"
        got, stats = ring_state(ring)
        assert got == expected, diff(got, expected)
        assert sum(s["duplicates"] for s in stats) > 0     # the replays' resends dropped
        loads = applied_by_node(ring)
    plans = sorted(int(p.name) for p in (tmp_path / "checkpoint" / "floe-plans").iterdir())
    # one plan per batch, recorded; those of committed batches behind the last removed
    assert plans == [FILES - 1], plans
    assert sum(loads.values()) >= sum(expected.values())
    ratio = max(loads.values()) / (sum(loads.values()) / len(loads))
    assert ratio <= 1.1, f"max/mean applied {ratio:.3f}: {loads}"


def test_main_job_kills_a_node_and_stays_exact(tmp_path):
    import signal
    import subprocess
    import sys
    demo = subprocess.Popen([sys.executable, "-m", "floering.chaos.demo", "--lines", "6000", "--files",
                             "4", "--interval", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = demo.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGTERM)     # it stops its ring and driver on the way out
        out, _ = demo.communicate(timeout=60)
        raise AssertionError("the main job timed out:\n" + out)
    assert demo.returncode == 0, out
    assert "SIGKILL n2" in out and "recovery:" in out and "top 20 words:" in out
    assert "mutual TLS on every call" in out and "--tls-dir" in out   # secured by default
    assert "exact: the ring's" in out


def test_refuses_an_unreachable_ring_or_another_reducer(tmp_path, ring, capsys):
    assert driver.main([*ring_args(ring), "--source", "dir:/nonexistent",
                        "--reducer", "sum"]) == 2
    assert "reducer" in capsys.readouterr().err
    # through spark-submit, against a port nobody listens on
    dead = SparkDriver(["--ring", "127.0.0.1:1", "--source", f"dir:{tmp_path / 'in'}"],
                       log=tmp_path / "dead.log")
    assert finish(dead, timeout=120) == 2
    assert "cannot use the ring at 127.0.0.1:1" in dead.output()


def test_bad_arguments_are_refused_before_spark_starts(capsys):
    assert driver.main(["--ring", "x:1", "--source", "kafka:topic"]) == 2
    assert "expected dir:PATH" in capsys.readouterr().err
    assert driver.main(["--ring", "x:1", "--source", "rate:10", "--available-now"]) == 2
    assert "bounded source" in capsys.readouterr().err
    assert driver.main(["--ring", "x:1", "--source", "dir:/tmp", "--map", "nope:fn"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert driver.main(["--ring", "x:1", "--source", "dir:/tmp", "--reducer", "topk",
                        "--combine"]) == 2
    assert "count and sum" in capsys.readouterr().err
    assert driver.main(["--ring", "x:1", "--source", "dir:/tmp", "--combine-keys", "0"]) == 2
    assert "--combine-keys" in capsys.readouterr().err


def test_combining_is_the_default_for_count_and_sum_only():
    def combine(*flags):
        return driver.parse_args(["--ring", "x:1", "--source", "dir:/tmp", *flags]).combine
    assert combine() and combine("--reducer", "sum")
    assert not combine("--no-combine") and not combine("--reducer", "topk")


def test_socket_source_then_sigterm_stops_gracefully(tmp_path, ring):
    """A socket stream is counted exactly; SIGTERM stops the query and exits 0."""
    import socket
    import threading

    lines = LINES[:1500]
    expected = Counter(w for line in lines for w in split_words(line))
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    sent = threading.Event()

    def serve():
        conn, _ = server.accept()        # Spark's socket source connects once
        with conn:
            conn.sendall(("\n".join(lines) + "\n").encode())
            sent.set()
            while conn.recv(1024):       # hold the connection until Spark closes it
                pass

    feeder = threading.Thread(target=serve, daemon=True)
    feeder.start()
    spark = SparkDriver([*ring_args(ring), "--source", f"socket:127.0.0.1:{port}",
                         "--checkpoint", str(tmp_path / "checkpoint"), "--progress", "1"],
                        log=tmp_path / "socket.log")
    try:
        wait_for(sent.is_set, 300, "Spark to connect to the socket", spark)
        total = sum(expected.values())
        wait_for(lambda: sum(ring_state(ring)[0].values()) >= total, 300,
                 "the ring to count it", spark)
        assert spark.terminate() == 0, spark.output()
    finally:
        if spark.proc.poll() is None:
            spark.kill()
        server.close()
    assert not spark.descendants()
    assert "stopping the query (signal)" in spark.output()
    got, _ = ring_state(ring)
    assert got == expected, diff(got, expected)


@pytest.mark.slow
def test_rate_source_counts_a_prefix_of_its_numbers_exactly(tmp_path, ring):
    """The rate source emits 0, 1, 2, ...; the default rate map counts them by value % 100.
    After a SIGTERM (which lets the running batch finish) the ring must hold exactly the
    buckets of 0..N-1 for the N rows Spark committed."""
    spark = SparkDriver([*ring_args(ring), "--source", "rate:1000",
                         "--checkpoint", str(tmp_path / "checkpoint"), "--progress", "1",
                         "--trigger", "1"], log=tmp_path / "rate.log")
    try:
        # combined per partition by default: count what the ring holds, not tuples
        wait_for(lambda: sum(ring_state(ring)[0].values()) >= 5000, 300, "5000 rows counted",
                 spark)
        assert spark.terminate() == 0, spark.output()
    finally:
        if spark.proc.poll() is None:
            spark.kill()
    got, _ = ring_state(ring)
    n = sum(got.values())
    assert n >= 5000
    assert got == Counter(v % 100 for v in range(n))
