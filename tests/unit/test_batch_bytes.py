"""A mapper seals a token's buffer by bytes as well as by tuples: large keys (or
values) make more, smaller batches, each under a node's --max-batch-bytes, instead
of one batch a node refuses. Every kind of buffer: the append kernel, Python lists,
the combiner kernel and the dict of states; the compiled and the pure kernels."""

from __future__ import annotations

from collections import Counter

import pytest

from floering.mapper import kernel as kernel_mod
from floering.mapper import pycombine
from floering.mapper.batching import SEAL_BYTES, Batcher
from floering.mapper.combining import CombiningBatcher
from floering.mapper.routing import Router
from floering.mapper.sharing import chooser_for
from floering.node.core.batch import DEFAULT_LIMITS, decode_payload, decode_seqs
from floering.node.core.reducers import load_reducer, reducer_identity
from floering.wire.balancers import balancer
from floering.wire.ring import Ring

MEMBERS = {"a": "h:1", "b": "h:2", "c": "h:3"}
KEY_BYTES = 64 << 10
LIMIT = DEFAULT_LIMITS.max_batch_bytes


def ring_of(spec: str = "count") -> Ring:
    """A token a member: a few hundred keys fill a token's buffer past SEAL_BYTES."""
    return Ring.initial(MEMBERS, 1, 1, balancer="none", reducer=reducer_identity(spec, {}))


def big_keys(n: int, salt: str = "") -> list[str]:
    return [f"{salt}{i:06d}".ljust(KEY_BYTES, "x") for i in range(n)]


def drained(batcher: Batcher) -> list:
    batcher.seal_all()
    out = list(batcher.sealed)
    batcher.sealed.clear()
    return out


def totals(batches, combined: bool) -> Counter:
    got: Counter = Counter()
    for b in batches:
        assert len(b.payload) + len(b.seqs) <= LIMIT, len(b.payload)
        keys, values = decode_payload(b.payload, b.count)
        assert len(keys) == b.count
        if not combined:
            assert len(decode_seqs(b.first_seq, b.last_seq, b.count, b.seqs)) == b.count
        for k, v in zip(keys, values):
            got[k] += v
    return got


@pytest.fixture(params=["compiled", "python"])
def kernel(request, monkeypatch):
    if request.param == "compiled":
        if kernel_mod.COMBINE_KERNEL != "compiled":
            pytest.skip("the compiled kernel is not built")
        return kernel_mod.kernel
    for module in ("floering.mapper.batching", "floering.mapper.combining"):
        monkeypatch.setattr(f"{module}.kernel", pycombine)
        monkeypatch.setattr(f"{module}.new_combiner",
                            lambda op, tokens, most: pycombine.Combiner(op, tokens, most))
    return pycombine


def test_the_kernels_fold_stops_at_a_byte_bound(kernel):
    keys = big_keys(200)
    for op in ("append", "count"):
        combiner = kernel.Combiner(op, ring_of().tokens, KEY_BYTES)
        i, t, status = combiner.fold(keys, 0, 1, None, 1000, 1 << 40, 0, SEAL_BYTES)
        assert status == kernel.FULL
        keys_held, _ = combiner.count(t)
        # sealed at the tuple that reached the bound, not before, not after
        assert (keys_held - 1) * (KEY_BYTES + 24) < SEAL_BYTES <= keys_held * (KEY_BYTES + 24)
        # without a bound, the same keys all fold in
        again = kernel.Combiner(op, ring_of().tokens, KEY_BYTES)
        assert again.fold(keys, 0, 1, None, 1000, 1 << 40, 0)[2] == kernel.DONE


@pytest.mark.parametrize("combine", [False, True])
def test_keys_of_64_kib_make_batches_a_node_takes(kernel, combine):
    ring = ring_of()
    keys = big_keys(300)        # about 100 a token: 6.5 MiB, over a node's 4 MiB
    if combine:
        batcher = CombiningBatcher(Router(ring), None, "m", 4096, load_reducer("count"),
                                   max_inputs=1 << 20)
    else:
        batcher = Batcher(Router(ring), None, "m", 1000)
    batcher.emit_many(keys, 1)
    batcher.emit_many(keys[:100], 1)
    batches = drained(batcher)
    want = Counter(keys) + Counter(keys[:100])
    assert totals(batches, combine) == want
    assert max(len(b.payload) for b in batches) <= SEAL_BYTES + KEY_BYTES + 4096
    assert len(batches) >= sum(len(k) for k in want) // SEAL_BYTES


@pytest.mark.parametrize("combine", [False, True])
def test_python_buffers_seal_by_bytes_too(combine):
    """bytes keys and non-int values do not go through a kernel."""
    ring = ring_of("count" if combine else "max")
    keys = [k.encode() for k in big_keys(200)]
    if combine:
        batcher = CombiningBatcher(Router(ring), None, "m", 4096, load_reducer("count"),
                                   max_inputs=1 << 20)
        batcher.emit_many(keys, 1)
        for k in keys[:50]:
            batcher.emit(k, 2)
        want = Counter(keys) + Counter({k: 2 for k in keys[:50]})
    else:
        batcher = Batcher(Router(ring), chooser_for(balancer("none"), replayable=False),
                          "m", 1000)
        batcher.emit_many(keys, 1.5)
        for k in keys[:50]:
            batcher.emit(k, "v" * 1000)
        want = None
    batches = drained(batcher)
    if want is not None:
        assert totals(batches, True) == want
    else:
        got = Counter()
        for b in batches:
            assert len(b.payload) <= SEAL_BYTES + KEY_BYTES + 4096
            got.update(decode_payload(b.payload, b.count)[0])
        assert got == Counter(keys) + Counter(keys[:50])
    assert len(batches) > 10


def test_large_values_seal_a_buffer_early():
    batcher = Batcher(Router(ring_of("max")), None, "m", 1000)
    value = "v" * (256 << 10)
    for i in range(20):
        batcher.emit(f"k{i}", value)
    batches = drained(batcher)
    assert sum(b.count for b in batches) == 20
    assert all(len(b.payload) <= SEAL_BYTES + len(value) + 4096 for b in batches)
