import pytest
from hypothesis import assume, given, settings, strategies as st

from floering.wire.errors import InvalidArgument, InvalidKey
from floering.wire.hashing import HASH_SPACE, key_bytes, position
from floering.wire.ring import Ring

keys = st.one_of(st.text(max_size=12), st.binary(max_size=12),
                 st.integers(-2 ** 63, 2 ** 64 - 1))


@st.composite
def rings(draw):
    n = draw(st.integers(1, 8))
    members = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(n)}
    return Ring.initial(members, draw(st.integers(0, 3)), draw(st.integers(1, 8)))


def brute_force_owner(ring, key):
    pos = position(key)
    holders = [t for t in ring.tokens if Ring.in_range(pos, ring.range_of_token(t))]
    assert len(holders) == 1, holders
    return ring.owner_of_token(holders[0])


@settings(max_examples=200)
@given(rings(), keys)
def test_exactly_one_owner_per_key(ring, key):
    assert ring.owner(key) == brute_force_owner(ring, key)


@settings(max_examples=200)
@given(rings(), keys)
def test_replicas_are_distinct_and_not_the_owner(ring, key):
    replicas = ring.replicas(key)
    assert ring.owner(key) not in replicas
    assert len(set(replicas)) == len(replicas) == min(ring.replication, len(ring.nodes) - 1)


@settings(max_examples=200)
@given(rings(), st.data())
def test_moving_a_token_changes_ownership_only_inside_the_moved_interval(ring, data):
    assume(len(ring.tokens) > 2)
    i = data.draw(st.integers(0, len(ring.tokens) - 1))
    token = ring.tokens[i]
    prev, nxt = ring.tokens[i - 1], ring.tokens[(i + 1) % len(ring.tokens)]
    width = (nxt - prev) % HASH_SPACE
    assume(width > 2)
    new = (prev + data.draw(st.integers(1, width - 1))) % HASH_SPACE
    assume(new != token)
    moved = ring.move_token(token, new)
    assert moved.version == ring.version + 1
    # Measured clockwise from the previous token, the keys between the old and the
    # new position are the only ones that may change hands.
    before = (new - prev) % HASH_SPACE < (token - prev) % HASH_SPACE
    interval = (new, token) if before else (token, new)
    for key in data.draw(st.lists(keys, min_size=1, max_size=50)):
        if not Ring.in_range(position(key), interval):
            assert moved.owner(key) == ring.owner(key)
    # and positions inside it do move when the neighbour has another owner
    if ring.owner_of_token(nxt) != ring.owner_of_token(token):
        inside = (interval[0] + 1) % HASH_SPACE
        assert moved.owner_of_token(moved.token_for_position(inside)) != \
            ring.owner_of_token(ring.token_for_position(inside))


@settings(max_examples=200)
@given(rings(), st.lists(st.integers(0, HASH_SPACE - 1), min_size=1, max_size=4, unique=True),
       st.lists(keys, min_size=1, max_size=50))
def test_adding_a_node_moves_only_keys_into_it(ring, new_tokens, sample):
    assume(not any(ring.has_token(t) for t in new_tokens))
    grown = ring.add_node("new", "127.0.0.1:9999", new_tokens)
    for key in sample:
        if grown.owner(key) != ring.owner(key):
            assert grown.owner(key) == "new"


@settings(max_examples=200)
@given(rings(), st.data(), st.lists(keys, min_size=1, max_size=50))
def test_removing_a_node_moves_its_keys_to_each_tokens_heir(ring, data, sample):
    assume(len(ring.nodes) > 1)
    gone = data.draw(st.sampled_from(ring.nodes))
    shrunk = ring.remove_node(gone)
    assert gone not in shrunk.nodes and not shrunk.tokens_of(gone)
    for key in sample:
        token = ring.token_for_key(key)
        if ring.owner(key) == gone:
            heir = ring.heir(token) if ring.replication else None
            assert shrunk.owner(key) != gone
            if heir is not None:
                assert shrunk.owner(key) == heir
        else:
            assert shrunk.owner(key) == ring.owner(key)


@settings(max_examples=100)
@given(rings())
def test_wire_round_trip(ring):
    assert Ring.from_wire(ring.to_wire()) == ring


@settings(max_examples=200)
@given(st.binary(max_size=64))
def test_garbage_ring_bytes_raise_invalid_argument(data):
    try:
        Ring.from_wire(data)
    except InvalidArgument:
        pass


def test_initial_ring_deals_tokens_round_robin():
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)
    assert ring.owners == ("a", "b", "c", "a", "b", "c")
    assert ring.version == 1 and ring.tokens[-1] == HASH_SPACE - 1
    assert [ring.heir(t) for t in ring.tokens_of("a")] == ["b", "b"]
    assert ring.share_of("a") == pytest.approx(1 / 3)
    ring.check_invariants()


def test_changes_return_new_rings_and_validate():
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    t = ring.tokens[0]
    changed = ring.with_token_owner(t, "b")
    assert ring.owner_of_token(t) == "a" and changed.owner_of_token(t) == "b"
    with pytest.raises(ValueError):
        ring.with_token_owner(t, "zz")
    with pytest.raises(ValueError):
        ring.move_token(t, ring.tokens[1] + 1)        # would pass a neighbour
    with pytest.raises(ValueError):
        ring.add_node("a", "h:9", [5])
    with pytest.raises(ValueError):
        Ring.initial({"a": "h:1"}, 0, 1).remove_node("a")
    with pytest.raises(ValueError):
        ring.address("zz")


def test_hashing_is_stable_and_typed():
    assert position("5") != position(5)
    assert key_bytes(5) == b"\x00i5"
    # pinned: a change of hashing would silently re-route every key
    assert position("hello") == 14688674573012802306
    assert position(b"") == 0
    for bad in (True, 1.5, None, ("a",)):
        with pytest.raises(InvalidKey):
            position(bad)
    with pytest.raises(InvalidKey):
        position("\ud800")


@settings(max_examples=200)
@given(rings(), st.data())
def test_concurrent_removals_merge_the_same_way_on_every_node(ring, data):
    assume(len(ring.nodes) > 2)
    first = data.draw(st.sets(st.sampled_from(ring.nodes), min_size=1, max_size=len(ring.nodes) - 2))
    rest = [n for n in ring.nodes if n not in first]
    second = data.draw(st.sets(st.sampled_from(rest), min_size=1, max_size=len(rest) - 1))
    a, b = ring.without(first), ring.without(second)
    merged = a.merge(b)
    assert merged == b.merge(a)
    together = ring.without(first | second)
    assert (merged.owners, merged.removed) == (together.owners, together.removed)
    # every token of a removed node went to the first surviving node clockwise
    survivors = set(ring.nodes) - first - second
    n = len(ring.tokens)
    for i, token in enumerate(ring.tokens):
        heir = next(ring.owners[(i + s) % n] for s in range(n) if ring.owners[(i + s) % n] in survivors)
        assert merged.owner_of_token(token) == heir


def test_a_member_joining_in_one_view_survives_a_merge_with_a_removal():
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)
    joined = ring.add_node("a#1", "h:9", ())          # an empty member, no tokens yet
    shrunk = ring.without(["b"])
    for merged in (joined.merge(shrunk), shrunk.merge(joined)):
        assert "a#1" in merged.nodes and "b" not in merged.nodes
        assert merged.share_of("a#1") == 0 and merged.version == 3
    assert joined.merge(shrunk) == shrunk.merge(joined)


def test_two_views_that_remove_every_member_between_them_are_refused_not_merged():
    from floering.wire.errors import InvalidArgument
    ring = Ring.initial({"n0": "a:1", "n1": "a:2", "n2": "a:3"}, 1, 2)
    alone, rest = ring.without(["n1", "n2"]), ring.without(["n0"])
    for a, b in ((alone, rest), (rest, alone)):
        with pytest.raises(InvalidArgument, match="remove every member"):
            a.merge(b)
