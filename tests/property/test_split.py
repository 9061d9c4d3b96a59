"""Token splits: a range (a, b] cut at p into (a, p] and (p, b], on the ring value and on
every holder of the range's state, then the tail handed to the neighbour; exact counts
whoever dies along the way."""

from collections import Counter

import pytest
from hypothesis import assume, given, settings, strategies as st

from floering.node.core.backup_store import BackupEntry, BackupStore, split_entry
from floering.node.core.batch import decode_payload, decode_seqs, encode_payload, encode_seqs
from floering.node.core.handoff import Handoff
from floering.wire.hashing import HASH_SPACE, position
from floering.node.core.node_core import cut_ranges
from floering.wire.ring import Ring
from tests.support.helpers import CoreCluster, Feed, fail, middle, run, spread

WORDS = [f"w{i % 97}" for i in range(3000)]


# ------------------------------------------------------------------ the ring


def test_split_adds_a_token_with_the_same_owner_and_destinations():
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)
    token = ring.tokens_of("a")[1]
    p = middle(ring, token)
    split = ring.split_token(token, p)
    assert split.version == ring.version + 1
    assert split.owner_of_token(p) == "a" and split.owner_of_token(token) == "a"
    assert split.destinations(p) == split.destinations(token) == ring.destinations(token)
    assert split.range_of_token(p) == (ring.range_of_token(token)[0], p)
    assert split.range_of_token(token) == (p, token)
    assert split.generation_of(p) == ring.generation_of(token)
    assert Ring.from_wire(split.to_wire()) == split


def test_split_refuses_positions_outside_the_range_and_a_token_being_handed_off():
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    token = ring.tokens[1]
    with pytest.raises(ValueError):
        ring.split_token(token, ring.tokens[0])              # an existing token
    with pytest.raises(ValueError):
        ring.split_token(token, ring.tokens[2] - 5)          # another range
    with pytest.raises(ValueError):
        ring.split_token(12345, 5)                           # no such token
    pinned = ring.with_extras({token: ["a"]})
    with pytest.raises(ValueError):
        pinned.split_token(token, middle(ring, token))


def test_a_lost_range_stays_lost_in_both_halves():
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 0, 1)
    ring = ring.without(["a"])
    lost = next(iter(ring.lost))
    p = middle(ring, lost)
    assert {lost, p} <= ring.split_token(lost, p).lost


@st.composite
def rings(draw):
    n = draw(st.integers(2, 6))
    members = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(n)}
    return Ring.initial(members, draw(st.integers(0, 2)), draw(st.integers(1, 4)))


@settings(max_examples=150)
@given(rings(), st.data())
def test_concurrent_splits_handoffs_and_removals_merge_the_same_everywhere(ring, data):
    """Two views change the same ring concurrently (a split on one, a split, handoff or
    removal on the other); merging either way gives the same ring, which keeps every
    split and whose destinations agree with each side's for unchanged tokens."""
    def split_somewhere(r):
        token = data.draw(st.sampled_from(r.tokens))
        lo, hi = r.range_of_token(token)
        size = Ring.range_size((lo, hi))
        assume(size > 2)
        return token, r.split_token(token, (lo + data.draw(st.integers(1, size - 1))) % HASH_SPACE)

    cut, a = split_somewhere(ring)
    kind = data.draw(st.sampled_from(["split", "handoff", "remove"]))
    if kind == "split":
        b = split_somewhere(ring)[1]
    elif kind == "handoff":
        # only the owner splits or hands off a token, one at a time: a concurrent
        # handoff is of another token
        assume(len(ring.tokens) > 1)
        token = data.draw(st.sampled_from([t for t in ring.tokens if t != cut]))
        target = data.draw(st.sampled_from([n for n in ring.nodes
                                            if n != ring.owner_of_token(token)]))
        b = ring.with_token_owner(token, target)
    else:
        assume(len(ring.nodes) > 2)
        b = ring.without([data.draw(st.sampled_from(ring.nodes))])
    merged = a.merge(b)
    assert merged == b.merge(a)
    merged.check_invariants()
    assert set(a.tokens) | set(b.tokens) == set(merged.tokens)
    # a token new in `a` has the owner of the token it was cut from, as merged
    for token in set(a.tokens) - set(ring.tokens):
        whole = ring.token_for_position(token)
        assert merged.owner_of_token(token) == merged.owner_of_token(whole)
    # a later split of the merged ring merges back idempotently
    assert merged.merge(a) == merged.merge(b) == merged


def test_cut_ranges_names_each_cut_range_and_its_parts():
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    t = ring.tokens[2]
    p1 = middle(ring, t)
    once = ring.split_token(t, p1)
    p2 = middle(once, p1)
    twice = once.split_token(p1, p2)
    assert cut_ranges(ring, once) == {t: tuple(sorted((p1, t)))}
    assert cut_ranges(ring, twice) == {t: tuple(sorted((p1, p2, t)))}
    assert cut_ranges(once, twice) == {p1: tuple(sorted((p1, p2)))}
    assert cut_ranges(twice, ring) == {}


# --------------------------------------------------------------- node state


def test_backup_entries_split_by_key_keeping_seqs_and_order():
    keys = [f"k{i}" for i in range(40)]
    seqs = [3 * i + 1 for i in range(40)]
    entry = BackupEntry(seqs[0], seqs[-1], 40, encode_payload(keys, list(range(40))),
                        encode_seqs(seqs))
    part_of = lambda key: 1 if position(key) % 2 else 2   # noqa: E731
    parts = split_entry(entry, part_of, 9)
    assert set(parts) == {1, 2}
    seen = []
    for part, piece in parts.items():
        k, v = decode_payload(piece.payload, piece.count)
        s = list(decode_seqs(piece.first_seq, piece.last_seq, piece.count, piece.seqs))
        assert all(part_of(key) == part for key in k)
        assert s == sorted(s) and s[0] == piece.first_seq and s[-1] == piece.last_seq
        seen += [(seqs[keys.index(key)], key, val) for key, val, seq in zip(k, v, s)
                 if seq == seqs[keys.index(key)]]
    assert sorted(seen) == [(seqs[i], keys[i], i) for i in range(40)]
    store = BackupStore()
    store.add(9, "s", entry)
    store.split_token(9, part_of)
    store.check_invariants()
    assert store.tuples == 40 and sorted(store.tokens()) == [1, 2]


def test_split_divides_primary_replica_and_backup_state_exactly():
    c = CoreCluster(nodes=3, replication=2, tokens_per_node=2)
    c.push("s1", WORDS[:1000])
    c.checkpoint()
    c.push("s1", WORDS[1000:2000], first_seq=1001)        # only in backups
    token = c.ring.tokens_of("n0")[0]
    before = {n: core.inspect_range(token) for n, core in c.cores.items()}
    split = c.ring.split_token(token, middle(c.ring, token))
    p = middle(c.ring, token)
    owner = c.cores["n0"]
    watermarks = dict(owner.primaries[token].watermarks)
    copied = {n: dict(core.replicas.ranges[token].watermarks) for n, core in c.cores.items()
              if token in core.replicas.ranges}
    assert len(copied) == 2
    spread(c, split)
    for name, core in c.cores.items():
        core.check_invariants()
        role, whole = before[name]
        assert role in ("primary", "replica")
        head = core.inspect_range(p)
        tail = core.inspect_range(token)
        assert head[0] == tail[0] == role
        assert {**head[1], **tail[1]} == whole
        assert all(split.token_for_key(k) == p for k in head[1])
        assert all(split.token_for_key(k) == token for k in tail[1])
    for part in (p, token):
        assert owner.primaries[part].watermarks == watermarks
        for name in c.ring.replicas_of_token(part):
            assert c.cores[name].replicas.is_complete(part)
            assert c.cores[name].replicas.ranges[part].watermarks == copied[name]
    # resending everything applies nothing twice, and the next checkpoints are full
    assert c.push("s1", WORDS[:2000]) == 0
    assert set(owner.under_replicated()) >= {p, token}
    c.checkpoint()
    assert not owner.under_replicated()
    assert c.state() == Counter(WORDS[:2000])


def test_the_owner_dying_right_after_a_split_loses_nothing():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    c.checkpoint()
    feed()                                                  # past the checkpoint
    token = c.ring.tokens_of("n0")[1]
    split = c.ring.split_token(token, middle(c.ring, token))
    c.cores["n0"].adopt_ring(split)
    c.ring = split
    # the replica never heard of the split: the merge with the removal brings it
    for name in ("n1", "n2"):
        c.cores[name].adopt_ring(split)
    fail(c, "n0")
    feed()
    assert c.state() == feed.sent
    for core in c.cores.values():
        core.check_invariants()


def test_a_split_the_replica_learns_only_through_the_heirs_merge_loses_nothing():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    c.checkpoint()
    feed()
    token = c.ring.tokens_of("n0")[1]
    split = c.ring.split_token(token, middle(c.ring, token))
    c.cores["n0"].adopt_ring(split)
    removed = c.ring.without(["n0"])         # the others declared n0 dead meanwhile
    del c.cores["n0"]
    for core in c.cores.values():
        core.adopt_ring(removed)
        core.adopt_ring(split)               # n0's split view arrives late
    c.ring = next(iter(c.cores.values())).ring
    assert c.ring.has_token(middle(removed, token)) and "n0" not in c.ring.nodes
    feed()
    assert c.state() == feed.sent


def test_split_then_hand_the_tail_to_the_neighbour_under_load():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    token = c.ring.tokens_of("n0")[0]
    p = middle(c.ring, token)
    spread(c, c.ring.split_token(token, p))
    feed()
    heir = c.ring.heir(token)
    h = Handoff("n0", {token: heir}, deadline=100)
    run(c, h, "n0", feed)
    assert h.state == "committed"
    assert c.ring.owner_of_token(token) == heir and c.ring.owner_of_token(p) == "n0"
    feed()
    c.checkpoint()
    assert c.state() == feed.sent
    for core in c.cores.values():
        core.check_invariants()


# ------------------------------------------------------------------- mapper


def test_mapper_cuts_a_batch_sealed_before_a_split_into_one_batch_per_token():
    from floering.mapper.outbox import Outbox, PendingBatch
    from floering.mapper.routing import Router
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    keys = [f"k{i}" for i in range(200)]
    token = ring.token_for_key(keys[0])
    keys = [k for k in keys if ring.token_for_key(k) == token]
    seqs = [2 * i + 7 for i in range(len(keys))]
    batch = PendingBatch(5, token, "src", seqs[0], seqs[-1], len(keys),
                         encode_payload(keys, [1] * len(keys)), encode_seqs(seqs),
                         tokens=ring.tokens)
    split = ring.split_token(token, middle(ring, token))
    d = Outbox()
    d.undelivered[batch.id] = batch
    parts = d.resplit(batch, split)
    assert parts is not None and len(parts) == 2
    assert set(d.undelivered) == {p.id for p in parts} and batch.id not in d.undelivered
    got = []
    for part in parts:
        k, _ = decode_payload(part.payload, part.count)
        s = list(decode_seqs(part.first_seq, part.last_seq, part.count, part.seqs))
        assert {split.token_for_key(x) for x in k} == {part.token}
        assert part.tokens == split.tokens and part.sort_key()[:1] == (5,)
        got += zip(s, k)
    assert sorted(got) == list(zip(seqs, keys))
    # parts keep the batch's place among older and newer batches
    older = PendingBatch(4, token, "src", 1, 1, 1, b"", b"")
    newer = PendingBatch(6, token, "src", 1, 1, 1, b"", b"")
    order = sorted([newer, *parts, older], key=PendingBatch.sort_key)
    assert order[0] is older and order[-1] is newer
    # a batch whose keys all stay in one token is kept whole
    head = [k for k in keys if split.token_for_key(k) != token]
    whole = PendingBatch(7, token, "src", 1, len(head), len(head),
                         encode_payload(head, [1] * len(head)), b"", tokens=ring.tokens)
    assert d.resplit(whole, split) is None and whole.token == split.token_for_key(head[0])
    # the router drops its cache when a split adds a token, not otherwise
    router = Router(ring)
    router.token(keys[0])
    router.update(ring.with_version(9))
    assert router.cache
    router.update(split)
    assert not router.cache and router.token(head[0]) == split.token_for_key(head[0])


# ------------------------------------------------------- measured split point


def test_split_point_puts_the_wanted_load_in_the_tail_and_never_cuts_a_key():
    from floering.node.core.split_point import choose_split_point
    rng = (1000, 2000)
    samples = {1100: 10.0, 1300: 50.0, 1500: 30.0, 1900: 10.0}
    at, fraction = choose_split_point(rng, samples, want=0.4)
    assert 1300 <= at < 1500 and fraction == pytest.approx(0.4)   # tail: 30 + 10
    at, fraction = choose_split_point(rng, samples, want=0.05)
    assert 1500 <= at < 1900 and fraction == pytest.approx(0.1)
    # only the fraction counts, not the sampled weights' scale
    assert choose_split_point(rng, {p: w * 1000 for p, w in samples.items()}, 0.4)[0] == \
        choose_split_point(rng, samples, 0.4)[0]
    assert choose_split_point(rng, {1500: 99.0}, want=0.1) is None  # one hot key: atomic
    # a range that wraps past zero
    wrap = (HASH_SPACE - 100, 100)
    at, fraction = choose_split_point(wrap, {HASH_SPACE - 50: 1.0, 50: 3.0}, want=0.75)
    assert Ring.in_range(at, wrap) and fraction == pytest.approx(0.75)
    assert (HASH_SPACE - 50 <= at or at < 50)


def test_positions_are_sampled_bounded_and_follow_a_split():
    from floering.node.core.split_point import PositionLoad
    load = PositionLoad(per_range=8)
    hot = ["hot"] * 900
    for i in range(50):
        load.record(7, hot + [f"cold{i}-{j}" for j in range(100)])
    table = load.samples(7)
    assert len(table) <= 8
    assert max(table, key=table.get) == position("hot")
    assert table[position("hot")] > 0.8 * sum(table.values())
    load.decay(0.5, keep={7})
    assert load.samples(7)[position("hot")] == pytest.approx(table[position("hot")] / 2)
    load.split(7, lambda pos: 3 if pos <= position("hot") else 7)
    assert position("hot") in load.samples(3) and position("hot") not in load.samples(7)
    load.decay(1.0, keep={7})
    assert load.samples(3) == {}


def test_plan_split_cuts_a_range_holding_two_hot_keys_between_them():
    """One range holds two hot keys: no whole-range move evens the pair, a cut between
    the keys does."""
    from floering.node.core.load import choose_shed
    from floering.node.core.split_point import plan_split
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)
    token = ring.tokens_of("a")[0]
    lo, _ = ring.range_of_token(token)
    size = Ring.range_size(ring.range_of_token(token))
    k1, k2 = (lo + size // 4) % HASH_SPACE, (lo + 3 * size // 4) % HASH_SPACE
    rates = {token: 1000.0, ring.tokens_of("a")[1]: 10.0}
    heir_rates = {"b": 20.0}
    moves = choose_shed(ring, "a", rates, heir_rates, set())
    assert token not in moves
    plan = plan_split(ring, "a", rates, heir_rates, set(), moves,
                      {token: {k1: 3.0, k2: 3.0}})          # decayed weights: any scale
    assert plan is not None
    cut_token, at, heir = plan
    assert cut_token == token and heir == ring.heir(token) and k1 <= at < k2
    # the neighbour busy, or load already even: no split
    assert plan_split(ring, "a", rates, heir_rates, {"b"}, moves, {token: {k1: 1.0, k2: 1.0}}) is None
    assert plan_split(ring, "a", rates, {"b": 1010.0}, set(), {},
                      {token: {k1: 1.0, k2: 1.0}}) is None
    # the ring already at its token bound: no automatic split
    assert plan_split(ring, "a", rates, heir_rates, set(), moves, {token: {k1: 3.0, k2: 3.0}},
                      max_tokens=len(ring.tokens) + 1) is not None
    assert plan_split(ring, "a", rates, heir_rates, set(), moves, {token: {k1: 3.0, k2: 3.0}},
                      max_tokens=len(ring.tokens)) is None


def test_mapper_merges_parts_again_when_the_split_died_with_its_node():
    """The mapper learnt a split that its node took to the grave: the survivors' ring
    has no such token, so the parts meet again in one range and must be merged, or
    the later part's seqs would be taken for duplicates."""
    from floering.mapper.outbox import Outbox, PendingBatch
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    token = ring.tokens[1]
    keys = [k for k in (f"k{i}" for i in range(300)) if ring.token_for_key(k) == token]
    seqs = list(range(1, len(keys) + 1))
    split = ring.split_token(token, middle(ring, token))
    d = Outbox()
    first = PendingBatch(1, token, "src", 1, len(keys), len(keys),
                         encode_payload(keys, [1] * len(keys)), encode_seqs(seqs),
                         tokens=ring.tokens)
    later = PendingBatch(2, token, "src", len(keys) + 1, len(keys) + 1, 1,
                         encode_payload([keys[0]], [1]), b"", tokens=ring.tokens)
    d.undelivered = {1: first, 2: later}
    assert len(d.fitted(split)) == 3                        # first cut in two, later whole
    survivors = ring.without(["a"])
    fitted = d.fitted(survivors)
    assert [b.token for b in fitted] == [token, token]
    merged, last = fitted
    assert (merged.first_seq, merged.last_seq, merged.count) == (1, len(keys), len(keys))
    k, _ = decode_payload(merged.payload, merged.count)
    got = dict(zip(decode_seqs(merged.first_seq, merged.last_seq, merged.count, merged.seqs), k))
    assert got == dict(zip(seqs, keys)) and last.first_seq == len(keys) + 1
    assert set(d.undelivered.values()) == {merged, last}


def test_sampling_sees_both_keys_of_an_alternating_stream():
    from floering.node.core.split_point import PositionLoad
    load = PositionLoad()
    for n in (96, 100, 64, 37):
        for _ in range(50):
            load.record(1, ["a", "b"] * (n // 2) + ["a"] * (n % 2))
    table = load.samples(1)
    assert set(table) == {position("a"), position("b")}
    assert table[position("a")] == pytest.approx(table[position("b")], rel=0.25)


def test_a_split_off_part_inherits_holders_pinned_concurrently_on_the_whole_range():
    """While a splits its range, another node's commit pins c on that range as an extra
    holding a complete copy (c's place in the clockwise walk was taken). The merged
    ring must pin c on both parts: c's copy is the one that counts if a dies."""
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)
    token = ring.tokens_of("a")[0]
    p = middle(ring, token)
    split = ring.split_token(token, p)
    pinned = ring.with_extras({token: ["c"]}, holding=[(token, "c")])
    for merged in (split.merge(pinned), pinned.merge(split)):
        assert merged.extras_of(p) == ("c",) == merged.extras_of(token)
        assert (p, "c") in merged.retiring and (token, "c") in merged.retiring
        assert merged.owner_of_token(p) == "a"
    assert split.merge(pinned) == pinned.merge(split)
    # extras the view knew before the split (older generation) are not inherited
    older = ring.with_extras({token: ["c"]})
    cleared = older.with_extras({token: ()}).split_token(token, p)
    assert not cleared.merge(older).extras_of(p)


def test_a_late_ack_from_a_node_that_left_and_came_back_as_replica_does_not_count():
    """Found by the split simulation: n1 acked a checkpoint, stopped being a replica
    (and dropped its copy), became one again; the ack then arrived and made the owner
    believe n1 held the range, so a handoff's pins were cleared too early."""
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    c.push("s", WORDS[:500])
    owner = c.cores["n0"]
    token = c.ring.tokens_of("n0")[0]
    i = c.ring.tokens.index(token)
    after = c.ring.tokens[i + 1]
    assert c.ring.replicas_of_token(token) == ("n1",) == (c.ring.owner_of_token(after),)
    shipment = next(s for s in owner.plan_checkpoints() if s.checkpoint.token == token)
    away = c.ring.with_owners({after: "n2"})           # n1 is no longer the replica
    owner.adopt_ring(away)
    back = away.with_owners({after: "n1"})             # ... and is again, with no copy
    owner.adopt_ring(back)
    owner.checkpoint_acked(token, "n1", shipment.checkpoint.seq, need_full=False)
    assert "n1" not in owner.primaries[token].replica_seq
    assert token in owner.under_replicated()
