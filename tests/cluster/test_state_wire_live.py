"""State moving as frames of column states between real node processes: a split's
tail handed over, a node SIGKILLed and its ranges re-replicated from frames, then a
second node killed so that ranges are taken over from those re-replicated copies;
the ring's counts equal an independent count of what flush() confirmed. And a real
node refuses hostile frames naming what is wrong, and goes on serving."""

import struct

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.node.core.state_wire import MAGIC, encode_pairs
from tests.support.helpers import (Feeder, finish_exact, floe, middle, status,
                                   wait_checkpoint_rounds, wait_for)

pytestmark = pytest.mark.multiprocess


def hostile_frames() -> dict[str, bytes]:
    good = encode_pairs(["a", "b"], [1, 2])
    return {
        "shorter than the 21-byte header": good[:12],
        "the header says": good[:-1],
        "version 9": good[:3] + b"\x09" + good[4:],
        "the header says 4294967295": struct.pack("<3sBBIQI", MAGIC, 1, 8, 2 ** 32 - 1, 0, 0),
        "without decreasing": good[:21 + 2] + struct.pack("<3I", 0, 9, 2) + good[21 + 2 + 12:],
    }


def refuse_hostile_frames(cluster, address: str) -> None:
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(address, name="n1") as channel:    # a member's certificate
        control = floe_pb2_grpc.ControlPlaneStub(channel)
        for says, frame in hostile_frames().items():
            for chunked in ((0, 0), (1, 2)):
                with pytest.raises(grpc.RpcError) as refused:
                    control.ShipCheckpoint(floe_pb2.CheckpointFragment(
                        sender="n1", ring_stamp=1, token=1, checkpoint_seq=1, full=True,
                        states=frame, chunk=chunked[0], chunks=chunked[1]), timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "column states" in refused.value.details(), refused.value.details()
                assert says.split()[-1] in refused.value.details(), refused.value.details()


def replicated(tmp_path, gone: set) -> bool:
    """The ring removed the `gone` members, and every range is on r+1 of the others."""
    rows = status(tmp_path)
    if any(rows[k]["state"] not in ("dead", "removed") for k in gone if k in rows):
        return False
    nodes = {k: v for k, v in rows.items() if k not in gone}
    return all(n["state"] == "serving" and n["under_replicated"] == 0 and
               n["lost_ranges"] == 0 for n in nodes.values())


def test_state_moves_as_frames_through_a_split_and_two_kills_with_exact_counts(tmp_path):
    with LocalCluster.up(4, 1, workdir=tmp_path, tokens_per_node=2) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        refuse_hostile_frames(cluster, cluster.node("n0").address)
        ring = feeder.client.refresh_ring()
        token = ring.tokens_of("n0")[0]
        moved = status(tmp_path)["n0"]["moved_bytes"]
        assert "handed the tail" in floe(tmp_path, "split", hex(middle(ring, token)), "--to",
                                         ring.heir(token))
        # the split's ranges are on r+1 nodes before a node dies
        wait_for(lambda: replicated(tmp_path, set()), timeout=60, what="the split replicated")
        cluster.kill("n1")
        # the dead node's ranges get their second copies: full copies, as frames
        wait_for(lambda: replicated(tmp_path, {"n1"}), timeout=60, what="re-replicated")
        feeder.wait_rounds(2)       # the stream goes on into the copies just made
        cluster.kill("n2")          # its ranges come back from the copies just made
        wait_for(lambda: replicated(tmp_path, {"n1", "n2"}), timeout=60,
                 what="re-replicated twice")
        ring = finish_exact(feeder)
        nodes = status(tmp_path)
        assert set(ring.nodes) >= {"n0", "n3"}
        assert nodes["n0"]["moved_bytes"] > moved
        assert sum(n["takeovers"] for k, n in nodes.items() if k in ("n0", "n3")) >= 2
        assert all(nodes[k]["lost_ranges"] == 0 for k in ("n0", "n3"))


def test_a_pure_node_among_compiled_ones_takes_and_gives_state_as_frames(tmp_path,
                                                                         monkeypatch):
    """A node with FLOE_PURE=1 (dicts, no table) joins compiled nodes: it pulls its
    share (full copies as frames from tables, read into dicts), checkpoints to its
    compiled replicas (frames from dicts, installed into tables), then is killed and
    its ranges come back from those copies. Counts exact throughout."""
    from pathlib import Path
    from floering.mapper import RingClient
    monkeypatch.delenv("FLOE_PURE", raising=False)
    with LocalCluster.up(3, 1, workdir=tmp_path, tokens_per_node=2) as cluster:
        feeder = Feeder(cluster.seeds, tls=cluster.tls())
        feeder.start()
        feeder.wait_rounds(3)
        monkeypatch.setenv("FLOE_PURE", "1")
        (pure,) = cluster.add_nodes(1, tokens_per_node=2)
        monkeypatch.delenv("FLOE_PURE")
        assert b"FLOE_PURE=1" in Path(f"/proc/{pure.pid}/environ").read_bytes()

        def ring():
            with RingClient([n.address for n in cluster.nodes if n.alive()], timeout=10,
                            rpc_timeout=2.0, tls=cluster.tls()) as client:
                return client.refresh_ring()
        wait_for(lambda: ring().share_of(pure.node_id) > 0 and not ring().extras,
                 timeout=60, what="the pure node's share")
        wait_for(lambda: replicated(tmp_path, set()), timeout=60, what="replicated")
        rows = status(tmp_path)
        assert rows[pure.node_id]["keys"] > 0
        # floe status says what holds each node's states
        assert {n: r["state_kernel"] for n, r in rows.items()} == {
            n: "dict" if n == pure.node_id else "compiled" for n in rows}
        assert all(0 <= r["loop_lag_ms"] < 10_000 for r in rows.values())
        table = floe(tmp_path, "status")
        assert "kernel" in table and " dict " in table and " compiled " in table
        wait_checkpoint_rounds(cluster, 3, [pure.node_id])   # its replicas hold its copies
        cluster.kill(pure.node_id)
        wait_for(lambda: replicated(tmp_path, {pure.node_id}), timeout=60,
                 what="re-replicated")
        final = finish_exact(feeder)
        assert pure.node_id not in final.nodes or not final.tokens_of(pure.node_id)
