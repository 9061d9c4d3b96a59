"""ExportRange's entry formats on real node processes (mutual TLS): a reader naming no format
(one before formats were named) gets msgpack entries it decodes exactly, one naming frames
gets frames, a list of formats the node does not send or an oversized list is refused
INVALID_ARGUMENT; `floe export` then `floe import` into a ring of another size is exact
against a Counter.

The tests here start real node processes; the in-process ones are in
tests/unit/test_export_formats.py.
"""

from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.floe.snapshot import export_ring, import_ring, read_ring
from floering.wire.codec import unpack_columns
from floering.node.core.state_wire import decode, is_frame
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import corpus_words
from tests.support.snapshot_live_shared import counts, feed


def export_all(cluster, **fields) -> tuple[dict, set]:
    """Every range's entries read with ExportRange(**fields) as a dict, and the
    formats the chunks named; a request naming no format is read as a reader of
    format 1 only reads it, msgpack [keys, states] (a frame fails to decode)."""
    ring, _ = read_ring(cluster.seeds, cluster.tls("operator"))
    got: dict = {}
    formats = set()
    for token in ring.tokens:
        address = ring.address(ring.owner_of_token(token))
        with cluster.channel(address, "operator") as channel:
            stub = floe_pb2_grpc.SnapshotsStub(channel)
            for reply in stub.ExportRange(floe_pb2.ExportRangeRequest(
                    token=token, ring_stamp=ring.stamp, **fields), timeout=30):
                formats.add(reply.format)
                if is_frame(reply.entries) and fields.get("formats"):
                    frame = decode(reply.entries)
                    keys = frame.column_keys() + list(frame.rest_keys)
                    states = frame.value_column.tolist() + list(frame.rest_states)
                else:
                    keys, states = unpack_columns(reply.entries)
                for key, state in zip(keys, states):
                    assert key not in got
                    got[key] = state
    return got, formats


def refused(cluster, formats) -> grpc.RpcError:
    ring, _ = read_ring(cluster.seeds, cluster.tls("operator"))
    token = ring.tokens[0]
    with cluster.channel(ring.address(ring.owner_of_token(token)), "operator") as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(floe_pb2_grpc.SnapshotsStub(channel).ExportRange(
                floe_pb2.ExportRangeRequest(token=token, ring_stamp=ring.stamp,
                                            formats=formats), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return info.value


@pytest.mark.multiprocess
def test_export_formats_negotiated_and_a_round_trip(tmp_path):
    words = corpus_words()[:20_000]
    expect = Counter(words)
    snapshot = tmp_path / "ring.snap"
    with LocalCluster.up(2, 1, workdir=tmp_path / "a", tokens_per_node=3) as a:
        feed(a, words)
        assert counts(a) == expect
        # a reader naming no format: msgpack entries only, decoded exactly
        old, formats = export_all(a)
        assert old == expect and formats == {1}
        new, formats = export_all(a, formats=[1, 2])
        assert new == expect and formats == {2}
        frames_only, formats = export_all(a, formats=[2, 99])
        assert frames_only == expect and formats == {2}
        error = refused(a, [7, 99])
        assert "7, 99" in error.details() and "sends 1" in error.details()
        error = refused(a, [1] * 9)
        assert "at most 8" in error.details()
        export_ring(a.seeds, str(snapshot), a.tls("operator"))
    with LocalCluster.up(3, 1, workdir=tmp_path / "b", tokens_per_node=2) as b:
        loaded = import_ring(b.seeds, str(snapshot), b.tls("operator"))
        assert loaded["keys"] == len(expect)
        assert counts(b) == expect
