"""Every member of a ring runs the same reducer with the same arguments: the ring
records it when it is founded, and a view or a joining node saying otherwise is
refused."""

from __future__ import annotations

import pytest

from floering.node.config import load_config
from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import reducer_identity
from floering.wire.ring import Ring
from floering.wire.ring_merge import check_compatible
from tests.support.reducer_agreement_shared import COUNT

MEMBERS = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(3)}


def test_an_alias_and_its_class_are_one_reducer_and_arguments_count():
    assert COUNT == reducer_identity("floering.node.core.reducers:Count", {})
    assert reducer_identity("topk", {"k": 5}) != reducer_identity("topk", {"k": 10})
    assert reducer_identity("x.y:Z", {"b": 1, "a": "s"}) == "x.y:Z(a='s', b=1)"
    config = load_config(["--node-id", "n0", "--listen", "127.0.0.1:1", "--peers",
                          "n0=127.0.0.1:1", "--reducer", "topk", "--reducer-arg", "k=5"])
    assert config.reducer_identity == reducer_identity("topk", {"k": 5})


def test_the_ring_carries_its_reducer_and_refuses_a_view_with_another():
    ring = Ring.initial(MEMBERS, 1, 2, reducer=COUNT)
    assert Ring.from_wire(ring.to_wire()).reducer == COUNT
    other = Ring.initial(MEMBERS, 1, 2, reducer=reducer_identity("sum", {}))
    assert other.stamp != ring.stamp
    with pytest.raises(InvalidArgument, match="reducer"):
        check_compatible(ring, other)
    # a view from before rings recorded their reducer is taken, and the merge keeps it
    unrecorded = Ring.initial(MEMBERS, 1, 2)
    check_compatible(ring, unrecorded)
    assert ring.merge(unrecorded.with_version(5)).reducer == COUNT
    with pytest.raises(InvalidArgument):
        Ring.from_wire(Ring.initial(MEMBERS, 1, 2, reducer="x" * 2000).to_wire())
