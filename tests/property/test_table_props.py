"""The compiled state table and the pure-Python one agree with each other and with a
dict model over random sequences of apply, checkpoint (take_dirty), cut and install,
merge, an index grown a share a call; and install refuses malformed buffers with an
error, never a crash."""

from array import array
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from floering.node.core import columnar
from floering.node.core.columnar import pytable
from floering.node.core.columnar.buffers import encode_keys, in_range, key_parts
from floering.wire.hashing import position

pytestmark = pytest.mark.skipif(columnar.KERNEL != "compiled", reason="extension not built")
if columnar.KERNEL == "compiled":
    from floering.node.core.columnar.ctable import StateTable as CTable

POOL = ["a", b"a", "b", 0, -7, 10 ** 30, "\u00e9t\u00e9", b"", "", "\x00i5", 5, b"\xff",
        "L" * 254, "L" * 255, b"L" * 256, "\u00e9" * 200]
LIMIT = 2 ** 63
small = st.integers(-5, 9)
big = st.sampled_from([LIMIT - 1, -LIMIT, LIMIT // 2, -(LIMIT // 2)])
values = st.one_of(small, small, small, big)
batches = st.lists(st.tuples(st.sampled_from(POOL), values), max_size=12)
bounds = st.one_of(st.sampled_from([0, 2 ** 64 - 1, 2 ** 63]), st.integers(0, 2 ** 64 - 1))


def columns_of(pairs):
    kinds, data, offsets = encode_keys([k for k, _ in pairs])
    return (kinds, data, offsets, array("Q", [position(k) for k, _ in pairs]),
            array("q", [v for _, v in pairs]))


def order(key):
    kind, data = key_parts(key)
    return position(key), kind, data


def model_export(model: dict, keys) -> list:
    return [(k, model[k]) for k in sorted(keys, key=order)]


def as_pairs(buffers) -> list:
    from floering.node.core.columnar.buffers import decode_keys
    kinds, data, offsets, positions, values = buffers
    keys = decode_keys(kinds, data, offsets)
    assert list(positions) == [position(k) for k in keys]
    return list(zip(keys, values))


def fold(op, model: dict, pairs, overwrite=False) -> dict | None:
    """The model after folding `pairs`, or None when a sum passes int64 on the way."""
    new = dict(model)
    for key, v in pairs:
        if key not in new or overwrite:
            new[key] = v
        elif op in ("count", "sum"):
            new[key] += v
            if not -LIMIT <= new[key] < LIMIT:
                return None
        else:
            new[key] = min(new[key], v) if op == "min" else max(new[key], v)
    return new


def changed(op, model, pairs) -> set:
    out, state = set(), dict(model)
    for key, v in pairs:
        if key not in state or op in ("count", "sum") or \
                (v < state[key] if op == "min" else v > state[key]):
            out.add(key)
        state = fold(op, state, [(key, v)]) or state
    return out


class TablesAgree(RuleBasedStateMachine):
    @initialize(op=st.sampled_from(columnar.TABLE_OPS))
    def start(self, op):
        self.op = op
        self.c, self.p = CTable(op), pytable.StateTable(op)
        self.model: dict = {}
        self.dirty: set = set()

    def both(self, method, *args):
        outcomes = []
        for table in (self.c, self.p):
            try:
                outcomes.append(("ok", getattr(table, method)(*args)))
            except (ValueError, OverflowError, TypeError) as exc:
                outcomes.append(("error", type(exc)))
        assert outcomes[0][0] == outcomes[1][0], outcomes
        return outcomes[0]

    @rule(pairs=batches, start=st.integers(0, 3))
    def apply(self, pairs, start):
        start = min(start, len(pairs))
        outcome = self.both("apply", *columns_of(pairs), start)
        expected = fold(self.op, self.model, pairs[start:])
        if expected is None:
            assert outcome == ("error", OverflowError)
        else:
            assert outcome[0] == "ok"
            self.dirty |= changed(self.op, self.model, pairs[start:])
            self.model = expected

    @rule()
    def checkpoint(self):
        c, p = self.c.take_dirty(), self.p.take_dirty()
        assert c == p
        assert as_pairs(c) == model_export(self.model, self.dirty)
        self.dirty = set()
        assert self.c.dirty_count == self.p.dirty_count == 0

    @rule()
    def open_cut(self):
        """A cut of both tables: taken later, a slice at a time, as the model is now."""
        if len(getattr(self, "cuts", ())) < 4:
            self.cuts = getattr(self, "cuts", []) + [(self.c.cut(), self.p.cut(), dict(self.model),
                                                      [], [])]

    @rule()
    def checkpoint_cut(self):
        """A checkpoint's changed keys as a cut: taken later, as they are now."""
        if len(getattr(self, "cuts", ())) < 4:
            c, p = self.c.take_dirty_cut(), self.p.take_dirty_cut()
            assert self.c.dirty_count == self.p.dirty_count == 0
            changed = {k: self.model[k] for k in self.dirty}
            self.dirty = set()
            self.cuts = getattr(self, "cuts", []) + [(c, p, changed, [], [])]

    @rule(most=st.integers(1, 5), which=st.integers(0, 3))
    def take_from_cut(self, most, which):
        cuts = getattr(self, "cuts", [])
        if not cuts:
            return
        c, p, model, got_c, got_p = cuts[which % len(cuts)]
        got_c += as_pairs(c.take(most))
        got_p += as_pairs(p.take(most))
        assert len(got_c) == len(got_p) == c.taken == p.taken <= len(model)
        if c.taken == len(model):
            self.finish(cuts[which % len(cuts)])

    def finish(self, cut):
        c, p, model, got_c, got_p = cut
        while c.taken < len(c):
            got_c += as_pairs(c.take(3))
        got_p += as_pairs(p.take(len(model) + 1))
        assert len(got_c) == len(got_p) == len(model)
        assert dict(got_c) == dict(got_p) == model
        assert c.take(1)[0] == p.take(1)[0] == b""
        self.cuts.remove(cut)

    @rule(lo=bounds, hi=bounds)
    def cut_and_merge_back(self, lo, hi):
        """A range cut off to another table (a split), then merged back (a piece)."""
        for cut in list(getattr(self, "cuts", ())):    # no entry goes while a cut is open
            with pytest.raises(RuntimeError):
                self.c.discard(lo, hi)
            self.finish(cut)
        part = self.c.export(lo, hi)
        assert part == self.p.export(lo, hi)
        inside = [k for k in self.model if in_range(position(k), lo, hi)]
        assert as_pairs(part) == model_export(self.model, inside)
        for table in (self.c, self.p):
            table.discard(lo, hi)
        assert len(self.c) == len(self.p) == len(self.model) - len(inside)
        other_c, other_p = CTable(self.op), pytable.StateTable(self.op)
        other_c.install(part)
        other_p.install(part)
        assert other_c.export() == other_p.export() == part
        assert other_c.dirty_count == other_p.dirty_count == 0
        self.both("merge", other_c.export())
        self.dirty |= set(inside)

    @rule(pairs=batches)
    def merge(self, pairs):
        outcome = self.both("merge", columns_of(pairs))
        expected = fold(self.op, self.model, pairs)
        if expected is None:
            assert outcome == ("error", OverflowError)
        else:
            self.dirty |= changed(self.op, self.model, pairs)
            self.model = expected

    @rule(pairs=batches)
    def install(self, pairs):
        assert self.both("install", columns_of(pairs), False)[0] == "ok"
        self.model = fold(self.op, self.model, pairs, overwrite=True)

    @rule(keys=st.integers(-1, 40), most=st.integers(0, 3))
    def grow_index(self, keys, most):
        """A share of an index's growth (over calls in the compiled table, whatever
        changes between them; a dict grows as it goes)."""
        outcome = self.both("grow_index", keys, most)
        if keys < 0 or most < 1:
            assert outcome == ("error", ValueError)
        else:
            assert outcome[0] == "ok" and self.p.grow_index(keys, most) is True

    @rule(key=st.sampled_from(POOL))
    def get(self, key):
        assert self.c.get(key, "none") == self.p.get(key, "none") == self.model.get(key, "none")
        assert (key in self.c) == (key in self.p) == (key in self.model)

    @invariant()
    def same(self):
        if hasattr(self, "c"):
            assert self.c.items() == self.p.items() == model_export(self.model, self.model)
            assert all(self.c.get(k, "none") == v for k, v in self.model.items())
            assert self.c.dirty_count == self.p.dirty_count == len(self.dirty)


TestTablesAgree = TablesAgree.TestCase
TestTablesAgree.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)


buffers = st.tuples(
    st.binary(max_size=6), st.binary(max_size=24),
    st.one_of(st.lists(st.integers(0, 30), max_size=7).map(lambda x: array("Q", x)),
              st.binary(max_size=56), st.lists(st.integers(-3, 2 ** 64 + 3), max_size=7)),
    st.one_of(st.lists(st.integers(0, 2 ** 64 - 1), max_size=6).map(lambda x: array("Q", x)),
              st.binary(max_size=48)),
    st.one_of(st.lists(st.integers(-LIMIT, LIMIT - 1), max_size=6).map(lambda x: array("q", x)),
              st.binary(max_size=48), st.text(max_size=3)))


@settings(max_examples=1500, deadline=None)
@given(raw=buffers, hashed=st.booleans(), op=st.sampled_from(columnar.TABLE_OPS))
def test_install_refuses_malformed_buffers_and_never_crashes(raw, hashed, op):
    kinds, data, offsets, positions, values = raw
    if hashed:      # the right positions, when the offsets allow, so some installs pass
        try:
            positions = pytable.hash_positions(data, offsets)
        except (ValueError, OverflowError, TypeError):
            pass
    results = []
    for table in (CTable(op), pytable.StateTable(op)):
        table.install(columns_of([("seed", 1)]))
        try:
            table.install((kinds, data, offsets, positions, values))
            results.append(("ok", table.items()))
        except (ValueError, OverflowError, TypeError) as exc:
            assert str(exc)
            assert table.items() == [("seed", 1)], "a refused install changed the table"
            results.append(("error", type(exc).__name__))
    assert results[0] == results[1]


@pytest.mark.parametrize("make", [lambda op: CTable(op), pytable.StateTable])
def test_bad_arguments_are_refused(make):
    with pytest.raises(ValueError):
        make("topk")
    table = make("sum")
    with pytest.raises(TypeError):
        table.install((b"",))
    with pytest.raises(ValueError):
        table.apply(*columns_of([("a", 1)]), 2)
    with pytest.raises(OverflowError):
        table.export(-1, 0)
    with pytest.raises(Exception) as info:
        table.get(1.5)
    assert "key must be" in str(info.value)


@pytest.mark.parametrize("make", [lambda op: CTable(op), pytable.StateTable])
def test_a_batch_that_grows_the_table_and_then_overflows_changes_nothing(make):
    table = make("count")
    table.apply(*columns_of([(i, 1) for i in range(100)] + [("max", LIMIT - 2)]))
    table.take_dirty()
    before = table.items()
    pairs = [(f"new-{i}", i) for i in range(20_000)] + [(5, 3), ("max", 1), ("max", 1)]
    with pytest.raises(OverflowError, match="key 20002 goes beyond int64"):
        table.apply(*columns_of(pairs))
    assert table.items() == before and table.dirty_count == 0
    assert table.get("new-7") is None and len(table) == 101
    table.apply(*columns_of(pairs[:-1]))     # the same batch without the last tuple
    expected = Counter({k: v for k, v in before})
    for k, v in pairs[:-1]:
        expected[k] += v
    assert dict(table.items()) == dict(expected) and table.dirty_count == 20_002


def test_large_exports_come_in_the_same_order_from_both_tables():
    """Enough keys for the compiled table's radix sort, with str and bytes twins that
    share a position (ordered by kind), cut at a wrapping range."""
    pairs = [(k, i) for i in range(3000) for k in (f"k{i}", f"k{i}".encode(), i)]
    c, p = CTable("max"), pytable.StateTable("max")
    for table in (c, p):
        table.apply(*columns_of(pairs))
    assert c.take_dirty() == p.take_dirty()
    lo, hi = 3 * 2 ** 62, 2 ** 62
    assert c.export(lo, hi) == p.export(lo, hi)
    assert as_pairs(c.export()) == model_export(dict(pairs), dict(pairs))
    c.discard(lo, hi)
    p.discard(lo, hi)
    assert c.export() == p.export() and 0 < len(c) < len(pairs)


def test_keys_of_every_length_header_keep_their_bytes_through_every_operation():
    """A key's length is one byte below 255 in the arena, else 255 and four bytes:
    keys on both sides of that edge (and one of 70,000 bytes) are found, folded,
    cut, exported and copied exactly, as the pure table keeps them."""
    keys = ["", "a", "L" * 253, "L" * 254, "L" * 255, b"L" * 256, "\u00e9" * 200,
            b"x" * 70_000, 10 ** 300]
    keys += [f"k{i}" * (i % 90) for i in range(600)]
    pairs = [(k, i + 1) for i, k in enumerate(keys)] * 2
    c, p = CTable("sum"), pytable.StateTable("sum")
    for table in (c, p):
        table.apply(*columns_of(pairs))
    expected = Counter()
    for k, v in pairs:
        expected[k] += v
    assert dict(c.items()) == dict(expected) == dict(p.items())
    assert c.take_dirty() == p.take_dirty()
    lo, hi = 2 ** 62, 3 * 2 ** 62
    c.discard(lo, hi)
    p.discard(lo, hi)
    assert c.export() == p.export() and 0 < len(c) < len(expected)
    c.apply(*columns_of(pairs[:5]))
    p.apply(*columns_of(pairs[:5]))
    copies = CTable("sum"), pytable.StateTable("sum")
    parts = [(b[0], b[1], b[2], b[4]) for b in (c.export(), c.export(lo, hi))]
    for copy in copies:
        copy.install_parts(parts)
    assert copies[0].export() == copies[1].export() == p.export()
    assert all(c.get(k) == p.get(k) for k in expected)


def test_key_bytes_past_the_arena_limit_are_refused_and_change_nothing():
    """An entry keeps its key's arena offset in 32 bits, so a table holds less than
    4 GiB of key bytes: a batch or a copy that would pass that is refused whole with an
    OverflowError, and the table goes on. The limit is lowered here to reach the edge
    without allocating 4 GiB."""
    from floering.node.core.columnar import ctable
    old = ctable._set_arena_limit(4096)
    try:
        c = CTable("sum")
        first = [(f"key{i}", 1) for i in range(100)]
        c.apply(*columns_of(first))
        before, dirty = c.export(), c.dirty_count
        more = [(f"key{i}", 1) for i in range(50)] + [("x" * 200 + str(i), 1)
                                                      for i in range(40)]
        with pytest.raises(OverflowError, match="4 GiB"):
            c.apply(*columns_of(more))
        assert c.export() == before and c.dirty_count == dirty
        with pytest.raises(OverflowError, match="4 GiB"):
            CTable("sum").install(columns_of(more))
        copy = CTable("sum")
        with pytest.raises(OverflowError, match="4 GiB"):
            copy.install_parts([(b[0], b[1], b[2], b[4]) for b in (before, before,
                                                                   columns_of(more))])
        assert len(copy) == 0
        c.apply(*columns_of(first))
        assert dict(c.items()) == {k: 2 for k, _ in first}
    finally:
        ctable._set_arena_limit(old)
    assert ctable._set_arena_limit(old) == 0xFFFFFFFF


def test_a_table_folding_in_another_thread_refuses_other_calls():
    """The GIL is released while a batch folds: a second call meanwhile is refused,
    not run over storage that may move. On a busy machine a fold may end before the
    caller's thread runs at all, so folds are tried until one overlaps (at most 20)."""
    import threading
    pairs = [(f"k{i}", 1) for i in range(400_000)]
    batch = columns_of(pairs)
    refused = []
    for _ in range(20):
        table, done = CTable("count"), threading.Event()

        def fold():
            table.apply(*batch)
            done.set()

        worker = threading.Thread(target=fold)
        worker.start()
        while not done.is_set():
            try:
                table.get("k1")
            except RuntimeError as exc:
                refused.append(str(exc))
        worker.join(timeout=60)
        assert len(table) == 400_000 and table.get("k7") == 1
        if refused:
            break
    assert refused and all("in use" in r for r in refused)


@pytest.mark.parametrize("make", ["compiled", "python"])
def test_a_cut_gives_the_table_as_it_was_while_batches_change_it(make):
    """Every state of a cut is the one the table held when it was cut, whatever batches,
    merges and installs changed or added since, slice after slice; a cut let go frees
    its slot (at most four open at once on the compiled table)."""
    table = CTable("sum") if make == "compiled" else pytable.StateTable("sum")
    first = [(f"k{i}", i) for i in range(5000)]
    table.apply(*columns_of(first))
    cut = table.cut()
    assert len(cut) == 5000
    got = as_pairs(cut.take(1000))
    table.apply(*columns_of([(f"k{i}", 1) for i in range(0, 6000, 3)]))
    table.install(columns_of([(f"k{i}", -1) for i in range(1, 5000, 7)]))
    table.merge(columns_of([(f"k{i}", 100) for i in range(2, 5000, 5)]))
    while cut.taken < len(cut):
        got += as_pairs(cut.take(777))
    assert dict(got) == dict(first) and len(got) == 5000
    assert cut.take(5)[0] == b""
    assert table.get("k3") == 4 and table.get("k5997") == 1 and table.get("k1") == -1
    if make == "compiled":
        cuts = [table.cut() for _ in range(4)]
        assert table.cut() is None
        del cuts[0]
        assert table.cut() is not None


def test_a_cut_is_read_exactly_from_another_thread_while_the_loop_folds():
    """A cut read a slice at a time on another thread while this one folds large
    batches (the GIL released, the table's storage grown under the lock): every state
    is the cut's."""
    import threading
    table = CTable("count")
    keys = [(f"key-{i}", 1) for i in range(200_000)]
    table.apply(*columns_of(keys))
    cut, got, failed = table.cut(), [], []

    def read():
        try:
            while cut.taken < len(cut):
                got.append(cut.take(4096))
        except Exception as exc:        # noqa: BLE001 - reported below
            failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for round_ in range(6):
        table.apply(*columns_of(keys[round_::3] + [(f"new-{round_}-{i}", 1)
                                                   for i in range(50_000)]))
    reader.join(timeout=60)
    assert not failed
    states = [v for part in got for v in part[4]]
    assert len(states) == 200_000 and set(states) == {1}
    assert table.get("key-3") == 3 and table.get("key-0") == 2 and len(table) == 500_000
