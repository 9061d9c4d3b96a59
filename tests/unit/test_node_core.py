from collections import Counter

import msgpack
import pytest

from floering.node.core.batch import Batch
from floering.wire.errors import Fenced, InvalidArgument, InvalidKey, RangeLost, StaleRing, TooLarge
from tests.support.helpers import CoreCluster

WORDS = ("the quick brown fox jumps over the lazy dog and the dog sleeps " * 20).split()


def test_push_applies_exactly_once_per_key():
    c = CoreCluster()
    c.push("s1", WORDS)
    assert c.state() == Counter(WORDS)
    for core in c.cores.values():
        core.check_invariants()


def test_resent_batches_are_not_counted_twice():
    c = CoreCluster()
    c.push("s1", WORDS)
    applied = c.push("s1", WORDS)              # the same (source, seq)s again
    assert applied == 0
    c.push("s2", WORDS)                        # another source counts
    assert c.state() == Counter(WORDS * 2)


def test_partially_applied_batch_applies_only_its_new_tail():
    c = CoreCluster(nodes=1, replication=0, tokens_per_node=1)
    c.push("s", WORDS[:10])
    c.push("s", WORDS[:20])                   # seqs 1..20: 1..10 already applied
    assert c.state() == Counter(WORDS[:20])


def test_replica_rebuild_equals_primary_after_checkpoints():
    c = CoreCluster(nodes=4, replication=2)
    c.push("s1", WORDS[:100])
    c.checkpoint()
    c.push("s1", WORDS[100:], first_seq=101)  # past the checkpoint: only in backups
    c.push("s2", WORDS)
    c.checkpoint()
    c.push("s3", WORDS[:50])
    for token in c.ring.tokens:
        primary = c.ring.owner_of_token(token)
        role, expect = c.cores[primary].inspect_range(token)
        assert role == "primary"
        for replica in c.ring.replicas_of_token(token):
            assert c.cores[replica].inspect_range(token) == ("replica", expect)


def test_checkpoint_evicts_exactly_the_covered_backups():
    c = CoreCluster(nodes=2, replication=1)
    c.push("s1", WORDS)
    assert sum(core.replicas.backups.tuples for core in c.cores.values()) == len(WORDS)
    c.checkpoint()
    assert sum(core.replicas.backups.tuples for core in c.cores.values()) == 0


def test_replica_that_missed_a_checkpoint_gets_a_full_one():
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=1)
    c.push("s1", WORDS[:50])
    c.checkpoint()
    c.push("s1", WORDS[50:], first_seq=51)
    # the next checkpoint of n0 is lost on the way
    n0 = c.cores["n0"]
    for s in n0.plan_checkpoints():
        n0.checkpoint_failed(s.checkpoint.token, s.replica)
    for token in n0.primaries:
        n0.checkpoint_done(token)
    c.checkpoint()  # n0 now ships a full checkpoint to n1
    for token in c.ring.tokens:
        owner = c.ring.owner_of_token(token)
        replica = c.ring.replicas_of_token(token)[0]
        assert c.cores[replica].inspect_range(token)[1] == c.cores[owner].inspect_range(token)[1]


def _fields(c, **overrides):
    token, fields = c.batches("s", ["a", "a", "b"])[0]
    fields.update(overrides)
    return c.ring.owner_of_token(fields["token"]), fields


@pytest.mark.parametrize("overrides, error", [
    (dict(payload=b"\xc1\x00"), InvalidArgument),
    (dict(payload=msgpack.packb([[1.5, 2.5, 3.5], [1, 1, 1]])), InvalidKey),
    (dict(payload=msgpack.packb([["a", "a", "b"], ["x", 1, 1]])), InvalidArgument),
    (dict(payload=b"x" * (5 << 20)), TooLarge),
    (dict(ring_stamp=99), StaleRing),
    (dict(source=""), InvalidArgument),
])
def test_bad_batches_change_nothing(overrides, error):
    c = CoreCluster(nodes=1, replication=0, tokens_per_node=1)
    owner, fields = _fields(c, **overrides)
    with pytest.raises(error):
        c.cores[owner].receive_batch(Batch(**fields))
    assert c.state() == {}
    c.push("ok", ["z"])                        # and the node keeps working
    assert c.state() == {"z": 1}


def test_batch_for_a_token_the_node_does_not_serve_is_refused():
    c = CoreCluster(nodes=3, replication=0)
    token, fields = c.batches("s", ["a"])[0]
    stranger = next(n for n in c.cores if n != c.ring.owner_of_token(token))
    with pytest.raises(StaleRing):
        c.cores[stranger].receive_batch(Batch(**fields))


def test_misrouted_key_is_refused():
    c = CoreCluster(nodes=2, replication=0, tokens_per_node=2)
    token, fields = c.batches("s", ["a"])[0]
    other = next(t for t in c.ring.tokens if t != token and
                 c.ring.owner_of_token(t) == c.ring.owner_of_token(token))
    fields["token"] = other
    with pytest.raises(InvalidArgument):
        c.cores[c.ring.owner_of_token(other)].receive_batch(Batch(**fields))


from tests.support.helpers import fail  # noqa: E402


def test_takeover_rebuilds_the_dead_primarys_ranges_exactly():
    c = CoreCluster(nodes=4, replication=1)
    c.push("s1", WORDS[:150])
    c.checkpoint()
    c.push("s1", WORDS[150:], first_seq=151)   # only in backups when n1 dies
    fail(c, "n1")
    assert c.ring.version == 2 and "n1" in c.ring.removed
    assert c.state() == Counter(WORDS)
    c.push("s1", WORDS)                         # the mapper resends: deduplicated
    c.push("s2", WORDS[:10])
    assert c.state() == Counter(WORDS + WORDS[:10])
    for core in c.cores.values():
        core.check_invariants()
        assert not core.lost_tokens


def test_two_adjacent_failures_with_r2_lose_nothing():
    c = CoreCluster(nodes=5, replication=2)
    c.push("s", WORDS)
    c.checkpoint()
    c.push("t", WORDS[:40])
    fail(c, "n1", "n2")
    assert c.state() == Counter(WORDS + WORDS[:40])


def test_more_than_r_adjacent_failures_are_reported_lost():
    c = CoreCluster(nodes=4, replication=1)
    c.push("s", WORDS)
    fail(c, "n1", "n2")
    owners = {c.ring.owner_of_token(t) for t in c.ring.lost}
    assert c.ring.lost and owners
    with pytest.raises(RangeLost):
        for node in owners:
            c.cores[node].check_readable()


def test_concurrent_removals_merge_to_the_same_ring():
    c = CoreCluster(nodes=6, replication=1)
    a, b = c.ring.without(["n1"]), c.ring.without(["n4"])
    assert a.merge(b) == b.merge(a) == c.ring.without(["n1", "n4"]).with_version(3)


def test_a_removed_node_is_fenced():
    c = CoreCluster(nodes=3, replication=1)
    stale = c.cores["n0"]
    change = stale.adopt_ring(c.ring.without(["n0"]))
    assert change.fenced and stale.fenced
    token, fields = c.batches("s", ["a"])[0]
    with pytest.raises(Fenced):
        stale.receive_batch(Batch(**fields))
