"""The pure handoff protocol over in-process NodeCores: ranges move between live nodes
while tuples keep arriving, and counts stay exact whoever dies along the way."""

import pytest

from floering.wire.errors import InvalidArgument
from floering.node.core.handoff import Handoff, retired_extras
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from tests.support.helpers import CoreCluster, Feed, fail, run, spread


def test_hand_a_range_to_the_first_replica_under_load():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    token = c.ring.tokens_of("n0")[0]
    heir = c.ring.heir(token)
    h = Handoff("n0", {token: heir}, deadline=100)
    run(c, h, "n0", feed)
    assert h.state == "committed"
    assert c.ring.owner_of_token(token) == heir
    assert "n0" in c.ring.extras_of(token)           # the old owner keeps a copy for now
    assert token in c.cores[heir].primaries and token not in c.cores["n0"].primaries
    c.checkpoint()                                    # the new replicas are filled
    for core in list(c.cores.values()):
        retired = retired_extras(core)
        if retired is not None:
            spread(c, retired)
    assert not c.ring.extras and not c.ring.retiring
    assert c.ring.generation_of(token) >= 1
    feed()
    assert c.state() == feed.sent
    for core in c.cores.values():
        core.check_invariants()


def test_a_new_node_is_an_extra_replica_first_then_takes_over():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    joined = c.ring.add_node("n9", "127.0.0.1:7999", ())
    c.cores["n9"] = NodeCore("n9", joined, load_reducer("count"))
    spread(c, joined)
    token = c.ring.tokens_of("n1")[1]
    h = Handoff("n1", {token: "n9"}, deadline=100)
    prepared = h.prepare(c.cores["n1"], now=0.0)
    assert "n9" in prepared.extras_of(token)
    assert prepared.destinations(token)[:2] == c.ring.destinations(token)
    spread(c, prepared)
    feed()                                            # n9 now receives the token's tuples
    assert c.cores["n9"].replicas.backups.tuples_of(token) > 0
    assert not h.ready(c.cores["n1"])                 # no full copy yet
    assert h.step(c.cores["n1"], now=1.0) is None
    c.checkpoint()                                    # the full copy arrives
    assert h.ready(c.cores["n1"])
    ring = h.step(c.cores["n1"], now=2.0)
    spread(c, ring)
    assert c.ring.owner_of_token(token) == "n9" and c.cores["n9"].counters["takeovers"] == 1
    feed()
    assert c.state() == feed.sent


@pytest.mark.parametrize("victim", ["owner", "target", "target_replica"])
def test_a_death_right_after_the_commit_loses_nothing(victim):
    c = CoreCluster(nodes=4, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    token = c.ring.tokens_of("n0")[0]
    heir = c.ring.heir(token)
    h = Handoff("n0", {token: heir}, deadline=100)
    run(c, h, "n0", feed)
    feed()                                            # acknowledged by the new owner only
    dead = {"owner": "n0", "target": heir,
            "target_replica": c.ring.replicas_of_token(token)[0]}[victim]
    fail(c, dead)                                     # before any new checkpoint
    assert all(not core.lost_tokens for core in c.cores.values())
    feed()
    assert c.state() == feed.sent


def test_the_owner_dying_while_prepared_falls_back_to_failover():
    c = CoreCluster(nodes=4, replication=1, tokens_per_node=2)
    feed = Feed(c)
    feed()
    token = c.ring.tokens_of("n0")[0]
    spread(c, Handoff("n0", {token: "n2"}, deadline=100).prepare(c.cores["n0"], 0.0))
    feed()
    c.checkpoint()
    fail(c, "n0")
    assert c.ring.owner_of_token(token) == "n1" and not c.ring.extras
    feed()
    assert c.state() == feed.sent


def test_a_target_that_dies_aborts_and_the_owner_keeps_the_range():
    c = CoreCluster(nodes=4, replication=1, tokens_per_node=2)
    feed = Feed(c)
    token = c.ring.tokens_of("n0")[0]
    h = Handoff("n0", {token: "n2"}, deadline=100)
    spread(c, h.prepare(c.cores["n0"], 0.0))
    feed()
    fail(c, "n2")
    ring = h.step(c.cores["n0"], now=1.0)
    assert h.state == "aborted" and "n2" in h.reason
    assert ring is None or not ring.extras_of(token)
    assert c.ring.owner_of_token(token) == "n0"
    feed()
    assert c.state() == feed.sent


def test_timeout_aborts_and_clears_the_extras():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=1)
    c.ring = c.ring.add_node("n9", "h:9", ())
    for core in c.cores.values():
        core.adopt_ring(c.ring)
    token = c.ring.tokens_of("n0")[0]
    h = Handoff("n0", {token: "n9"}, deadline=5)
    spread(c, h.prepare(c.cores["n0"], 0.0))
    ring = h.step(c.cores["n0"], now=6.0)             # n9 never acknowledged a checkpoint
    assert h.state == "aborted" and not ring.extras_of(token)


def test_bad_requests_are_refused_clearly():
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=1)
    mine, theirs = c.ring.tokens_of("n0")[0], c.ring.tokens_of("n1")[0]
    for moves in ({theirs: "n2"}, {mine: "n0"}, {mine: "zz"}, {}):
        with pytest.raises(InvalidArgument):
            Handoff("n0", moves, deadline=1).prepare(c.cores["n0"], 0.0)


def test_a_handoff_and_a_concurrent_removal_merge_the_same_way_everywhere():
    c = CoreCluster(nodes=5, replication=1, tokens_per_node=2)
    token = c.ring.tokens_of("n0")[0]
    handed = c.ring.with_owners({token: c.ring.heir(token)})
    removed = c.ring.without(["n3"])
    a, b = handed.merge(removed), removed.merge(handed)
    assert a == b and a.owner_of_token(token) == c.ring.heir(token) and "n3" in a.removed
    # a stale view of the token (older generation) never undoes the handoff
    assert a.merge(c.ring) .owner_of_token(token) == c.ring.heir(token)


def test_a_joining_node_pinned_as_an_extra_is_watched_by_the_owner_handing_to_it():
    # A node with no range is nobody's primary, so no replica watches it. Once it is
    # the extra destination of a handoff, the owner must watch it (and it must send
    # the owner heartbeats): dead, it would otherwise never be declared, the handoff
    # would wait for its deadline and mappers would keep routing to it.
    c = CoreCluster(nodes=3, replication=1, tokens_per_node=2)
    joined = c.ring.add_node("n9", "127.0.0.1:7999", ())
    c.cores["n9"] = NodeCore("n9", joined, load_reducer("count"))
    spread(c, joined)
    # Idle (no range, no handoff yet): its sponsor, the first range owner after it in id
    # order, watches it and it heartbeats exactly that node.
    watchers = [k.node_id for k in c.cores.values() if "n9" in k.monitored_primaries()]
    assert watchers == ["n0"]
    assert c.cores["n9"].heartbeat_targets() == {"n0"}
    token = c.ring.tokens_of("n1")[1]
    h = Handoff("n1", {token: "n9"}, deadline=100)
    spread(c, h.prepare(c.cores["n1"], now=0.0))
    assert "n9" in c.cores["n1"].monitored_primaries()
    assert "n9" not in c.cores["n0"].monitored_primaries()   # no longer idle
    assert c.cores["n9"].heartbeat_targets() == {"n1"}
    # Nodes that own ranges are still watched only by their replicas, as before.
    assert c.cores["n1"].monitored_primaries() - {"n9"} == {
        c.ring.owner_of_token(t) for t in c.ring.tokens
        if c.ring.role_of("n1", t) == "replica"}
    feed = Feed(c)
    feed()
    c.checkpoint()
    spread(c, h.step(c.cores["n1"], now=1.0))         # committed: n9 owns a range now
    assert h.state == "committed"
    assert "n9" not in c.cores["n1"].monitored_primaries() or \
        c.ring.role_of("n1", c.ring.tokens_of("n9")[0]) == "replica"
    assert c.cores["n9"].heartbeat_targets() == set(c.ring.replicas_of_token(token))


def test_the_owner_dying_mid_handoff_after_its_replica_handed_the_next_range_on():
    # Scale-out: n2 is handing T to a new node n9 (prepared: n9 and n2's replica n3 are
    # pinned as T's future destinations) when n3 hands the range right after T to n9
    # and commits. n9 is now T's regular replica but has no copy yet; n3 still holds
    # T's complete copy, as a pinned extra. If n2 dies now, T must go to n3, not n9.
    c = CoreCluster(nodes=4, replication=1, tokens_per_node=2)
    joined = c.ring.add_node("n9", "127.0.0.1:7999", ())
    c.cores["n9"] = NodeCore("n9", joined, load_reducer("count"))
    spread(c, joined)
    feed = Feed(c)
    feed()
    c.checkpoint()
    tokens = c.ring.tokens
    t = next(x for x in c.ring.tokens_of("n2")
             if c.ring.owner_of_token(tokens[(tokens.index(x) + 1) % len(tokens)]) == "n3")
    u = tokens[(tokens.index(t) + 1) % len(tokens)]
    h2 = Handoff("n2", {t: "n9"}, deadline=100)
    spread(c, h2.prepare(c.cores["n2"], now=0.0))
    h3 = Handoff("n3", {u: "n9"}, deadline=100)
    spread(c, h3.prepare(c.cores["n3"], now=0.0))
    assert set(c.ring.extras_of(t)) == {"n3", "n9"}
    feed()
    c.checkpoint()
    c.cores["n9"].replicas.drop(t)            # n2's final checkpoint has not reached n9 yet
    spread(c, h3.step(c.cores["n3"], now=1.0))
    assert h3.state == "committed" and c.ring.regular_replicas(t) == ("n9",)
    feed()                                        # tuples of T still go to n2, n9 and n3
    fail(c, "n2")
    assert c.ring.owner_of_token(t) == "n3"
    assert all(not core.lost_tokens for core in c.cores.values())
    feed()
    assert c.state() == feed.sent


def test_an_idle_member_is_watched_by_exactly_one_sponsor_and_declared_dead_when_gone():
    # A member with no range (joined, or rejoined empty after being fenced) must still
    # be watched: dead and never declared, it would stay in the ring and every scan,
    # which reads every member, would fail on it.
    c = CoreCluster(nodes=4, replication=1, tokens_per_node=2)
    ring = c.ring.add_node("m0", "127.0.0.1:7990", ()).add_node("z9", "127.0.0.1:7991", ())
    for node in ("m0", "z9"):
        c.cores[node] = NodeCore(node, ring, load_reducer("count"))
    spread(c, ring)
    watchers = {x: sorted(k.node_id for k in c.cores.values() if x in k.monitored_primaries())
                for x in ("m0", "z9")}
    assert watchers == {"m0": ["n0"], "z9": ["n0"]}       # z9 wraps to the first owner
    assert c.cores["m0"].heartbeat_targets() == {"n0"}
    assert c.cores["z9"].heartbeat_targets() == {"n0"}
    # Declared dead, it leaves the ring; nothing else changes owner.
    after = c.ring.without(["z9"])
    assert "z9" not in after.nodes and after.owners == c.ring.owners


def test_a_replica_pushed_in_and_out_again_before_it_was_filled_is_no_heir():
    # n3 hands its token to n0: n0 becomes the (still empty) replica of n2's range and
    # n3 keeps its complete copy as a holding extra. Then n0 hands that token on to a
    # newcomer, pushing n0 out of n2's walk before n2 ever filled it. When n2 dies its
    # range must go to n3, which holds it, not to n0, which holds nothing.
    from floering.node.core.handoff import commit_ring
    from floering.wire.ring import Ring
    ring = Ring.initial({f"n{i}": f"a:{i}" for i in range(4)}, 1, 1)
    a, b, c, d = ring.tokens
    first = commit_ring(ring, {d: "n0"})
    assert ("n3" in first.extras_of(c)) and (c, "n3") in first.retiring
    joined = first.add_node("n9", "a:9", ())
    second = commit_ring(joined, {d: "n9"})
    assert (c, "n0") not in second.retiring and (c, "n3") in second.retiring
    assert second.remove_node("n2").owner_of_token(c) == "n3"
