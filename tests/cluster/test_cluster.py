"""Real node processes on loopback ports, fed through the real client."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from floering.floe.cluster import LocalCluster, node_env
from floering.chaos.corpus import kjv_lines
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient, split_words
from floering.wire.codec import unpack_entries
from tests.support.helpers import floe, floe_run, wait_for

pytestmark = pytest.mark.multiprocess

WORDS = [w for line in kjv_lines(6000) for w in split_words(line)]


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster.up(4, 1, workdir=tmp_path) as cluster:
        yield cluster
    assert not any(node.alive() for node in cluster.nodes)


def test_corpus_counts_are_exact_and_resends_are_not_counted(cluster):
    with RingClient(cluster.seeds, source="corpus", batch_size=500,
                    tls=cluster.tls()) as client:
        client.emit_many(WORDS)
        client.flush()
        assert dict(client.scan()) == Counter(WORDS)
    # A second incarnation resending the same (source, seq)s, e.g. a retried task.
    with RingClient(cluster.seeds, source="corpus", batch_size=300,
                    tls=cluster.tls()) as again:
        again.emit_many(WORDS[:20_000])
        again.flush()
        assert dict(again.scan()) == Counter(WORDS)
        assert again.get("god") == Counter(WORDS)["god"]
        top = again.top(5)
    assert [c for _, c in top] == [c for _, c in Counter(WORDS).most_common(5)]
    assert all(Counter(WORDS)[w] == c for w, c in top)


def inspect(cluster, address, token):
    with cluster.channel(address) as channel:
        chunks = list(floe_pb2_grpc.QueryPlaneStub(channel).InspectRange(
            floe_pb2.RangeRequest(token=token), timeout=10))
    return chunks[0].role, {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}


def test_every_replica_holds_a_complete_copy_after_a_checkpoint(cluster):
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        client.emit_many(WORDS)
        client.flush()
        ring = client.ring
        # a checkpoint covers everything once no backed-up tuple is left to evict
        wait_for(lambda: all(s["backup_tuples"] == 0 for s in client.stats()),
                 what="checkpoints to evict every backup")
    for token in ring.tokens:
        role, primary = inspect(cluster, ring.address(ring.owner_of_token(token)), token)
        assert role == "primary"
        for replica in ring.replicas_of_token(token):
            assert inspect(cluster, ring.address(replica), token) == ("replica", primary)


def test_cli_up_feed_query_status_down(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(kjv_lines(2000)))
    expect = Counter(w for line in kjv_lines(2000) for w in split_words(line))
    up = floe_run(tmp_path, "up", "--nodes", "3", "--replicas", "1")
    assert up.returncode == 0, up.stderr
    pids = [n["pid"] for n in json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]]
    try:
        again = floe_run(tmp_path, "up", "--nodes", "3")
        assert again.returncode == 1 and "still running" in again.stderr
        feed = floe_run(tmp_path, "feed", str(corpus))
        assert feed.returncode == 0, feed.stderr
        assert f"fed {sum(expect.values())} words" in feed.stdout
        get = floe_run(tmp_path, "get", "lord")
        assert get.stdout.strip() == str(expect["lord"])
        top = floe_run(tmp_path, "top", "3")
        assert [(int(c), expect[w]) for c, w in (l.split("\t") for l in top.stdout.splitlines())] \
            == [(c, c) for _, c in expect.most_common(3)]
        status = json.loads(floe_run(tmp_path, "status", "--json").stdout)
        assert sorted(n["pid"] for n in status["nodes"]) == sorted(int(p) for p in pids)
        assert sum(int(n["keys"]) for n in status["nodes"]) == len(expect)
        table = floe_run(tmp_path, "status").stdout
        assert table.splitlines()[0].startswith("ring v")
        assert "reducer floering.node.core.reducers:Count()" in table.splitlines()[0]
        assert table.splitlines()[1].split()[:4] == ["node", "state", "address", "pid"]
        assert [line.split()[1] for line in table.splitlines()[2:5]] == ["serving"] * 3
    finally:
        down = floe_run(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not psutil.pid_exists(pid) or \
            psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_linger_sealing_racing_full_batches_keeps_counts_exact(cluster):
    # A tiny linger makes the client's timer seal buffers while emit() seals full ones;
    # seqs of a token must still reach the nodes in order or dedup would drop tuples.
    words = WORDS[:60_000]
    with RingClient(cluster.seeds, batch_size=40, linger=0.001, tls=cluster.tls()) as client:
        for start in range(0, len(words), 500):
            for word in words[start:start + 500]:
                client.emit(word)
            time.sleep(0.001)                   # the linger timer fires in between
        client.flush()
        assert dict(client.scan()) == Counter(words)


def test_sigterm_drains_and_ships_a_final_checkpoint(tmp_path):
    # Periodic checkpoints are far apart, so only the shutdown one can evict backups.
    with LocalCluster.up(4, 1, workdir=tmp_path,
                         extra_args=["--checkpoint-interval", "60"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(WORDS)
            client.flush()
            before = {s["node_id"]: s["backup_tuples"] for s in client.stats()}
            assert all(before.values())
            cluster.kill("n0", signal.SIGTERM)
            wait_for(lambda: not cluster.node("n0").alive(), what="n0 to exit")
            after = {s["node_id"]: s.get("backup_tuples") for s in client.stats()}
        log = Path(cluster.node("n0").log).read_text()
        assert "n0 stopped" in log and "Traceback" not in log
        # n1 backs up n0's ranges: the final checkpoint covered all of them
        assert after["n1"] == 0
        assert after["n2"] == before["n2"] and after["n3"] == before["n3"]


def test_flush_to_a_dead_node_fails_cleanly_instead_of_hanging(tmp_path):
    # With r=0 nobody holds a copy to take over from: the client must give up, not hang.
    from floering.wire.errors import Unavailable
    with LocalCluster.up(2, 0, workdir=tmp_path) as cluster:
        client = RingClient(cluster.seeds, timeout=3.0, rpc_timeout=0.5, tls=cluster.tls())
        client.emit_many(WORDS[:1000])
        client.flush()
        cluster.kill("n1")
        client.emit_many(WORDS[:1000])
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.flush()
        assert time.monotonic() - started < 10
        with pytest.raises(Unavailable):   # close() will not pretend the tuples arrived
            client.close()
        assert client.closed


def test_bad_keys_and_values_are_refused_at_emit(cluster):
    from floering.wire.errors import InvalidArgument, InvalidKey
    with RingClient(cluster.seeds, tls=cluster.tls()) as client:
        for key in (1.5, None, True, ("a",), "\ud800"):
            with pytest.raises(InvalidKey):
                client.emit(key)
        with pytest.raises(InvalidArgument):
            client.emit("k", object())
        client.emit("fine")
        client.flush()
        assert client.get("fine") == 1


def test_base_port_refuses_a_listening_port_but_not_one_a_stopped_cluster_left_in_time_wait():
    import socket

    from floering.floe.cluster import _free_ports
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as gRPC servers do
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    with pytest.raises(OSError, match=f"port {port} .* in use"):
        _free_ports("127.0.0.1", 1, port)
    # the server side closes first, as a stopped node does: its end stays in TIME_WAIT
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()
    listener.close()
    client.recv(1)
    client.close()
    assert _free_ports("127.0.0.1", 1, port) == [port]


# ------------------------------------------------ `floe up`: durable by default

def _scan(tmp_path) -> dict:
    """Every key's count, read through the recorded cluster."""
    cluster = LocalCluster.load(tmp_path / "floe-cluster.json")
    with RingClient(cluster.seeds, tls=cluster.tls(), timeout=60) as client:
        return dict(client.scan())


def _members(tmp_path) -> set[str]:
    rows = [r for r in json.loads(floe(tmp_path, "status", "--json"))["nodes"]
            if r["state"] != "removed"]               # a member that left is still listed
    assert all("error" not in r for r in rows), rows
    return {r["node_id"] for r in rows}


def test_floe_up_is_durable_by_default_and_keeps_scaled_nodes_across_restarts(tmp_path):
    lines = kjv_lines(3000)
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(lines[:1500]))
    second.write_text("\n".join(lines[1500:]))
    expect = Counter(w for line in lines for w in split_words(line))
    data = tmp_path / "floe-cluster" / "data"
    try:
        assert f"durable in {data}" in floe(tmp_path, "up", "--nodes", "3")
        floe(tmp_path, "feed", str(first))
        assert "added n3" in floe(tmp_path, "scale", "--add", "1")
        floe(tmp_path, "feed", str(second))
        assert [i for i, _ in json.loads((data / "layout.json").read_text())["nodes"]] == \
            ["n0", "n1", "n2", "n3"]
        assert "killed 4 nodes" in floe(tmp_path, "down", "--kill")
        again = floe(tmp_path, "up")                     # the kept cluster, as it was
        assert again.count("pid") == 4 and f"brought back from {data}" in again
        assert _members(tmp_path) == {"n0", "n1", "n2", "n3"}   # each as itself
        assert _scan(tmp_path) == expect
        floe(tmp_path, "scale", "--remove", "n1")
        assert not (data / "n1").exists()
        assert "stopped 3 nodes" in floe(tmp_path, "down")
        assert floe(tmp_path, "up").count("pid") == 3   # n1 is not started again
        recorded = json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]
        assert sorted(n["node_id"] for n in recorded) == ["n0", "n2", "n3"]
        assert _members(tmp_path) == {"n0", "n2", "n3"}
        assert _scan(tmp_path) == expect
    finally:
        floe_run(tmp_path, "down")


def test_floe_up_refuses_flags_unlike_the_kept_cluster_and_down_wipe_starts_fresh(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta alpha")
    data = tmp_path / "floe-cluster" / "data"
    try:
        floe(tmp_path, "up", "--nodes", "2", "--replicas", "1")
        floe(tmp_path, "feed", str(corpus))
        floe(tmp_path, "down")
        refused = floe_run(tmp_path, "up", "--nodes", "3", "--reducer", "count")
        assert refused.returncode == 1
        assert "--nodes 3 (kept: 2)" in refused.stderr and "--reducer" not in \
            refused.stderr.split(";")[1]                 # only what differs is named
        assert "floe down --wipe" in refused.stderr and "--memory" in refused.stderr
        assert not (tmp_path / "floe-cluster.json").exists()    # nothing was started
        # the same settings as kept are fine
        assert floe(tmp_path, "up", "--nodes", "2", "--replicas", "1").count("pid") == 2
        assert floe(tmp_path, "get", "alpha").strip() == "2"
        out = floe(tmp_path, "down", "--wipe")           # stops, then deletes
        assert "stopped 2 nodes" in out and "wiped" in out
        assert not data.exists()
        assert "nothing to wipe" in floe(tmp_path, "down", "--wipe")
        assert floe(tmp_path, "up", "--nodes", "3").count("pid") == 3   # a new cluster
        assert floe_run(tmp_path, "get", "alpha").returncode == 1
        floe(tmp_path, "down")
        floe(tmp_path, "down", "--wipe")                 # a cluster already stopped
        assert not data.exists()
        memory = floe(tmp_path, "up", "--nodes", "2", "--memory")
        assert "in memory only" in memory and not data.exists()
    finally:
        floe_run(tmp_path, "down")


def test_status_after_a_kill_names_the_dead_process_and_down_counts_only_running_ones(tmp_path):
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory")
        healthy = "HEALTHY: 3 of 3 members serving; every range on r+1 nodes"
        wait_for(lambda: floe(tmp_path, "status").splitlines()[-1] == healthy, 20,
                 "a healthy status once every replica has its first checkpoint")
        recorded = json.loads((tmp_path / "floe-cluster.json").read_text())["nodes"]
        victim = next(n for n in recorded if n["node_id"] == "n1")
        os.kill(victim["pid"], signal.SIGKILL)
        wanted = (f"DEGRADED: 2 of 3 members serving; every range on r+1 nodes; dead: n1 "
                  f"(process {victim['pid']} gone)")
        wait_for(lambda: floe(tmp_path, "status").splitlines()[-1] == wanted, 20,
                 "status to show n1 gone and its ranges on r+1 nodes again")
        shown = json.loads(floe(tmp_path, "status", "--json"))
        assert shown["verdict"] == wanted
        assert {n["node_id"]: n["state"] for n in shown["nodes"]} == \
            {"n0": "serving", "n1": "dead", "n2": "serving"}
        assert "n1    dead" in floe(tmp_path, "status")              # the table shows it too
        removed = floe_run(tmp_path, "scale", "--remove", "n1")      # cannot hand anything over
        assert removed.returncode == 1 and len(removed.stderr.splitlines()) == 1
        assert removed.stderr.startswith("floe scale: n1 is not running")
        assert "UNAVAILABLE" not in removed.stderr and "Traceback" not in removed.stderr
    finally:
        down = floe_run(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped 2 nodes (1 recorded were not running)" in down.stdout, down.stdout


def test_feed_checks_every_input_first_and_a_rerun_after_ctrl_c_counts_nothing_twice(tmp_path):
    lines = kjv_lines(30_000)
    big = tmp_path / "big.txt"
    big.write_text("\n".join(lines * 6))
    expect = Counter(w for line in lines * 6 for w in split_words(line))
    try:
        floe(tmp_path, "up", "--nodes", "3", "--memory")
        refused = floe_run(tmp_path, "feed", str(big), str(tmp_path / "missing.txt"))
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.strip() == (f"floe feed: cannot read {tmp_path / 'missing.txt'}: "
                                          "No such file or directory")
        binary = tmp_path / "blob.bin"
        binary.write_bytes(b"some words\0\x01\x02")
        assert "looks binary" in floe_run(tmp_path, "feed", str(binary)).stderr
        assert _scan(tmp_path) == {}                       # nothing was sent
        # interrupted half way, then run again: every word counted once. Small batches
        # keep the first run slow enough to be interrupted before it ends (the seqs are
        # the words' own, so the rerun's batch size does not matter)
        cmd = [sys.executable, "-m", "floering.floe.cli", "feed", "--batch-size", "20", str(big)]
        # SIGINT as a terminal sends it: a shell running us in the background has the
        # child ignore it, and Python then installs no KeyboardInterrupt handler
        first = subprocess.Popen(cmd, cwd=tmp_path, env=node_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        wait_for(lambda: sum(_scan(tmp_path).values()) > 50_000, 60, "the feed to start")
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
        assert 0 < sum(_scan(tmp_path).values()) < sum(expect.values())
        again = floe_run(tmp_path, "feed", "--progress", str(big), timeout=300)
        assert again.returncode == 0, again.stderr
        assert "words," in again.stderr and "left" in again.stderr     # progress shown
        assert _scan(tmp_path) == expect
        quiet = floe_run(tmp_path, "feed", str(big))       # unchanged: nothing more
        assert quiet.returncode == 0 and quiet.stderr == ""  # no progress off a terminal
        assert _scan(tmp_path) == expect
        floe(tmp_path, "feed", "--force", str(binary))
        assert _scan(tmp_path)["some"] == expect["some"] + 1
    finally:
        floe_run(tmp_path, "down")
