"""`floe export` / `floe import` on real node processes with mutual TLS: a 3-node ring
fed a text, exported (by the `floe` command), imported into a 2-node ring of other
tokens; counts equal to a Counter over the text, a resend of the same source's batches
dropped, a damaged file and a client's certificate refused with nothing loaded."""

import json
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.floe import snapshot as snapshot_mod
from floering.floe.snapshot import export_ring, import_ring
from floering.mapper import RingClient
from floering.wire.errors import FloeError, ReducerMismatch, Unavailable
from floering.node.core.snapshot_format import SnapshotError
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import corpus_words, floe_run, wait_for
from tests.support.snapshot_live_shared import SOURCE, counts, feed


def held_keys(cluster) -> int:
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        return sum(s["keys"] for s in client.stats())


def refused_for_client(cluster, call) -> None:
    """A client's certificate may not call the Snapshots service."""
    with cluster.channel(cluster.seeds[0], "client") as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(floe_pb2_grpc.SnapshotsStub(channel))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value


@pytest.mark.multiprocess
def test_export_then_import_into_a_ring_of_another_size(tmp_path):
    words = corpus_words()[:30_000]
    more = corpus_words()[30_000:33_000]
    expect = Counter(words)
    snapshot = tmp_path / "ring.snap"
    with LocalCluster.up(3, 1, workdir=tmp_path / "a", tokens_per_node=4) as a:
        feed(a, words)
        assert counts(a) == expect
        out = floe_run(tmp_path, "export", str(snapshot), "--ring", ",".join(a.seeds),
                       "--tls-dir", str(a.tls_dir))
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        from floering.node.core.snapshot_format import verify
        with open(snapshot, "rb") as f:
            assert verify(f)[0].reducer_identity.endswith("Count()")
        assert summary["keys"] == len(expect) and summary["ranges"] == 12
        assert snapshot.stat().st_mode & 0o077 == 0
        # a client's certificate exports nothing
        with pytest.raises(FloeError):
            export_ring(a.seeds, str(tmp_path / "other.snap"), a.tls("client"))
        assert not (tmp_path / "other.snap").exists()
        refused_for_client(a, lambda stub: list(stub.ExportRange(
            floe_pb2.ExportRangeRequest(token=1), timeout=10)))

    data = snapshot.read_bytes()
    truncated, flipped = tmp_path / "cut.snap", tmp_path / "flip.snap"
    truncated.write_bytes(data[:len(data) * 2 // 3])
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(bad))

    with LocalCluster.up(2, 1, workdir=tmp_path / "b", tokens_per_node=5) as b:
        operator = b.tls("operator")
        for damaged, why in ((truncated, "truncated"), (flipped, "corrupt")):
            with pytest.raises(SnapshotError, match=why):
                import_ring(b.seeds, str(damaged), operator)
        refused = floe_run(tmp_path, "import", str(truncated), "--ring", ",".join(b.seeds),
                           "--tls-dir", str(b.tls_dir))
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith("floe import: ") and "truncated" in refused.stderr
        with pytest.raises(FloeError):
            import_ring(b.seeds, str(snapshot), b.tls("client"))
        refused_for_client(b, lambda stub: stub.ImportRange(
            floe_pb2.ImportChunk(token=1, chunk=1, chunks=1), timeout=10))
        assert held_keys(b) == 0                      # nothing was loaded

        loaded = import_ring(b.seeds, str(snapshot), operator)
        assert loaded["keys"] == len(expect) and loaded["ranges"] == 20    # cut at the
        # snapshot's 12 boundaries (2 shared): each range inside one of the snapshot's
        assert counts(b) == expect

        # a second import of the same file: refused (the ring holds state); resumed: no-op
        with pytest.raises(FloeError, match="holds state"):
            import_ring(b.seeds, str(snapshot), operator)
        import_ring(b.seeds, str(snapshot), operator, resume=True)
        assert counts(b) == expect

        # the mapper sends its batches again, then new ones: only the new ones count
        feed(b, words + more)
        assert counts(b) == expect + Counter(more)


def written_snapshot(path, words, tokens=(1 << 62, 1 << 63, 3 << 62),
                     reducer: str = "count", identity: str = "") -> None:
    """A snapshot of a Counter over `words` written by the test itself: the keys dealt
    over `tokens` as ranges, the source's watermark (bound to the client's
    certificate, as a node keeps it) at the last seq the mapper numbered."""
    from floering.wire.codec import pack_entries
    from floering.node.core.dedup import bind_source
    from floering.node.core.snapshot_format import Header, Writer
    expect = Counter(words)
    keys = sorted(expect)
    marks = {bind_source("client:client", SOURCE): len(words)}
    with open(path, "wb") as out:
        w = Writer(out, Header(reducer, "none", 1, 1, ("x0",), tokens, 0.0, identity))
        for i, token in enumerate(tokens):
            mine = {k: expect[k] for k in keys[i::len(tokens)]}
            half = dict(list(mine.items())[:len(mine) // 2])
            rest = {k: v for k, v in mine.items() if k not in half}
            w.add(token, 1, 2, marks, pack_entries(half), len(half))
            w.add(token, 2, 2, {}, pack_entries(rest), len(rest))
        w.close()


def scanned(cluster):
    try:
        return counts(cluster)
    except FloeError:
        return None


class LostAnswer(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the connection dropped before the answer came"


def answer_lost_at(monkeypatch, nth: int) -> None:
    """The importer's `nth` ImportRange call reaches its node, but its answer is lost."""
    real, sent = snapshot_mod._calls, [0]

    def calls(ring, tls):
        stub, open_ = real(ring, tls)

        class Lossy:
            def __init__(self, node):
                self.stub = stub(node)

            def ImportRange(self, request, timeout=None):
                reply = self.stub.ImportRange(request, timeout=timeout)
                sent[0] += 1
                if sent[0] == nth:
                    raise LostAnswer()
                return reply
        return Lossy, open_
    monkeypatch.setattr(snapshot_mod, "_calls", calls)


@pytest.mark.multiprocess
def test_an_import_is_durable_and_replicated(tmp_path, monkeypatch):
    words = corpus_words()[:20_000]
    expect = Counter(words)
    snapshot, other = tmp_path / "made.snap", tmp_path / "max.snap"
    written_snapshot(snapshot, words)
    written_snapshot(other, words, reducer="max")
    data = tmp_path / "data"
    with LocalCluster.up(3, 1, workdir=tmp_path / "c", data_dir=data, tokens_per_node=3) as c:
        operator = c.tls("operator")
        with pytest.raises(ReducerMismatch, match="nothing was loaded"):
            import_ring(c.seeds, str(other), operator)
        # the same reducer name with other arguments
        written_snapshot(other, words, identity="floering.node.core.reducers:Count(k=3)")
        with pytest.raises(ReducerMismatch, match="Count.k=3"):
            import_ring(c.seeds, str(other), operator)
        assert held_keys(c) == 0
        # stopped at the 4th chunk, whose answer was lost: partly loaded, then resumed
        with monkeypatch.context() as m:
            answer_lost_at(m, 4)
            with pytest.raises(Unavailable, match="--resume"):
                import_ring(c.seeds, str(snapshot), operator)
        assert 0 < held_keys(c) < len(expect)
        with pytest.raises(FloeError, match="holds state"):
            import_ring(c.seeds, str(snapshot), operator)
        # a range loaded already moves to another node, its mark with it
        from floering.floe.snapshot import read_ring
        from floering.mapper.admin import move
        ring, _ = read_ring(c.seeds, operator)
        first = sorted(ring.tokens)[0]
        owner = ring.owner_of_token(first)
        taker = next(n for n in ring.nodes if n != owner)
        move(ring, taker, first, tls=operator)
        assert read_ring(c.seeds, operator)[0].owner_of_token(first) == taker
        loaded = import_ring(c.seeds, str(snapshot), operator, resume=True)
        assert loaded["keys"] == len(expect) and loaded["chunks"] >= 9
        assert counts(c) == expect                   # the 4th chunk merged once
    # every node stopped and started again on its data: the states and the watermarks
    with LocalCluster.up(workdir=tmp_path / "c", data_dir=data) as c:
        wait_for(lambda: scanned(c) == expect, 30, "the restarted ring's counts")
        feed(c, words)                               # sent again: dropped
        assert counts(c) == expect
        # its replicas hold it too: a primary's SIGKILL loses nothing
        with RingClient(c.seeds, tls=c.tls("client")) as client:
            wait_for(lambda: all(s["under_replicated"] == 0 for s in client.stats()), 30,
                     "every range on its replica")
        c.kill("n0")
        wait_for(lambda: scanned(c) == expect, 30, "the counts after n0's takeover")


@pytest.mark.multiprocess
def test_an_export_under_a_running_feed_replays_exactly_into_a_ring_of_another_size(
        tmp_path):
    """The export reads one range after another while a mapper feeds, so its ranges
    hold the source up to different points (their watermarks differ). Imported into a
    ring of another size, each range of which is cut to lie inside one range of the
    snapshot and takes that range's watermarks, the mapper sending its whole stream
    again under the same source ends with exactly the stream's counts: what a range
    held is dropped as duplicates, nothing else."""
    import threading
    words = corpus_words()[:40_000]
    sent: list[str] = []
    snapshot = tmp_path / "live.snap"
    with LocalCluster.up(4, 1, workdir=tmp_path / "a", tokens_per_node=4) as a:
        stop = threading.Event()

        def run():
            with RingClient(a.seeds, source="live", combine=False, batch_size=100,
                            tls=a.tls("client")) as client:
                for i in range(0, len(words), 100):
                    if stop.is_set():
                        return
                    client.emit_many(words[i:i + 100])
                    client.flush(timeout=60)
                    sent.extend(words[i:i + 100])

        feeder = threading.Thread(target=run, daemon=True)
        feeder.start()
        wait_for(lambda: len(sent) >= 5_000, timeout=60, what="the feed to start")
        export_ring(a.seeds, str(snapshot), a.tls("operator"))
        wait_for(lambda: len(sent) >= len(snapshot_watermarks(snapshot)) and
                 len(sent) > max(snapshot_watermarks(snapshot).values()) + 2_000,
                 timeout=60, what="the feed to go on past the export")
        stop.set()
        feeder.join(60)
        assert not feeder.is_alive()
        assert counts(a) == Counter(sent)
    marks = snapshot_watermarks(snapshot)
    assert len(set(marks.values())) > 1, f"every range read at one point: {marks}"
    with LocalCluster.up(3, 1, workdir=tmp_path / "b", tokens_per_node=5) as b:
        import_ring(b.seeds, str(snapshot), b.tls("operator"))
        with RingClient(b.seeds, source="live", combine=False, batch_size=100,
                        tls=b.tls("client")) as client:
            client.emit_many(sent)
            client.flush(timeout=60)
        assert counts(b) == Counter(sent)


def snapshot_watermarks(path) -> dict[int, int]:
    """{range token: the source `live`'s watermark} of a snapshot file."""
    _, parts, _ = snapshot_mod.read_snapshot(str(path))
    return {s.token: max((q for src, q in s.watermarks.items() if "live" in src), default=0)
            for s in parts if s.chunk == 1}


def frames_of(path) -> list[bool]:
    """Whether each section of a snapshot file holds a frame of column states."""
    from floering.node.core.snapshot_format import sections
    from floering.node.core.state_wire import is_frame
    with open(path, "rb") as f:
        return [is_frame(s.entries) for s in sections(f)]


@pytest.mark.multiprocess
def test_frames_between_compiled_and_pure_rings_an_old_file_and_a_bad_frame(tmp_path,
                                                                            monkeypatch):
    """A compiled ring's export is frames of column states (format 2); imported into a
    ring of FLOE_PURE=1 nodes (dicts) and exported from it again (msgpack entries, no
    table), then into a compiled ring: counts exact each time. A format 1 file (msgpack
    entries) still imports exactly; a chunk of a corrupt frame is refused with
    INVALID_ARGUMENT, nothing loaded."""
    from floering.node.core import snapshot_format
    words = corpus_words()[:20_000]
    expect = Counter(words)
    compiled, pure, back = (tmp_path / f"{n}.snap" for n in ("compiled", "pure", "back"))
    monkeypatch.delenv("FLOE_PURE", raising=False)
    with LocalCluster.up(2, 1, workdir=tmp_path / "a", tokens_per_node=3) as a:
        feed(a, words)
        export_ring(a.seeds, str(compiled), a.tls("operator"))
    assert frames_of(compiled) and all(frames_of(compiled))
    with open(compiled, "rb") as f:
        assert f.read(10)[8:] == b"\x00\x02"
    monkeypatch.setenv("FLOE_PURE", "1")
    with LocalCluster.up(2, 1, workdir=tmp_path / "b", tokens_per_node=2) as b:
        import_ring(b.seeds, str(compiled), b.tls("operator"))
        assert counts(b) == expect
        export_ring(b.seeds, str(pure), b.tls("operator"))
    monkeypatch.delenv("FLOE_PURE")
    assert not any(frames_of(pure))
    old = tmp_path / "old.snap"
    with monkeypatch.context() as patch:  # (undo() would bring an outer FLOE_PURE back)
        patch.setattr(snapshot_format, "FORMAT_VERSION", 1)
        written_snapshot(old, words)
    with open(old, "rb") as f:
        assert f.read(10)[8:] == b"\x00\x01"
    for path in (pure, old):
        with LocalCluster.up(2, 1, workdir=tmp_path / path.stem, tokens_per_node=3) as c:
            if path is old:
                bad_frame_refused(c)
            import_ring(c.seeds, str(path), c.tls("operator"))
            assert counts(c) == expect
            if path is pure:
                export_ring(c.seeds, str(back), c.tls("operator"))
    assert all(frames_of(back))


def bad_frame_refused(cluster) -> None:
    """ImportRange of a frame cut short, and of one holding a key of another range:
    INVALID_ARGUMENT, and the ring holds nothing."""
    from floering.node.core.state_wire import encode_pairs
    ring, _ = snapshot_mod.read_ring(cluster.seeds, cluster.tls("operator"))
    token = ring.tokens[0]
    owner = ring.owner_of_token(token)
    address = next(n.address for n in cluster.nodes if n.node_id == owner)
    mine = [w for w in set(corpus_words()[:2_000]) if ring.token_for_key(w) == token][:20]
    far = next(w for w in corpus_words()[:2_000] if ring.token_for_key(w) != token)
    good = encode_pairs(mine, [1] * len(mine))
    with cluster.channel(address, "operator") as channel:
        stub = floe_pb2_grpc.SnapshotsStub(channel)
        for entries in (good[:-3], encode_pairs(mine + [far], [1] * (len(mine) + 1))):
            with pytest.raises(grpc.RpcError) as info:
                stub.ImportRange(floe_pb2.ImportChunk(
                    ring_stamp=ring.stamp, token=token, snapshot="ab" * 32,
                    reducer="count", chunk=1, chunks=1, entries=entries), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert held_keys(cluster) == 0
