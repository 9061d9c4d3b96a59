"""Epoch sources: exactly-once for replayed micro-batches, with bounded dedup state."""

import random
from collections import Counter

import pytest

from floering.wire.epochs import (EPOCH_BITS, effective_mark, epoch_seq, epoch_source,
                              floor_key, raise_floor)
from floering.wire.errors import InvalidArgument
from tests.support.helpers import CoreCluster, fail

WORDS = ("in the beginning god created the heaven and the earth and the earth was "
         "without form and void").split() * 15


def test_names_and_seqs():
    assert epoch_source("q1", 3) == "q1#3"
    assert floor_key("q1#3") == "q1#"
    assert floor_key("plain-source") is None
    assert floor_key("#3") is None and floor_key("q#") is None
    assert epoch_seq(0, 0) == 1
    assert epoch_seq(5, 9) == (5 << EPOCH_BITS) + 10
    with pytest.raises(ValueError):
        epoch_seq(1, 1 << EPOCH_BITS)
    with pytest.raises(ValueError):
        epoch_source("a#b", 1)


def test_floor_covers_members_and_drops_their_watermarks():
    marks = {"q#0": epoch_seq(1, 40), "q#1": epoch_seq(1, 7), "other#0": 5, "plain": 9}
    assert raise_floor(marks, "q#1", epoch_seq(2, 0)) == 2   # q#0 and q#1 of epoch 1
    assert marks == {"q#": 2 << EPOCH_BITS, "other#0": 5, "plain": 9}
    # a late resend of epoch 1 is covered by the floor, a new epoch-2 tuple is not
    assert effective_mark(marks, "q#0") == 2 << EPOCH_BITS
    assert epoch_seq(1, 999) <= effective_mark(marks, "q#5")
    assert epoch_seq(2, 0) > effective_mark(marks, "q#5")
    assert effective_mark(marks, "plain") == 9
    # an older epoch never lowers the floor
    assert raise_floor(marks, "q#0", epoch_seq(1, 0)) == 0
    assert marks["q#"] == 2 << EPOCH_BITS


def test_floor_key_is_not_a_valid_source():
    c = CoreCluster(nodes=1, replication=0, tokens_per_node=1)
    with pytest.raises(InvalidArgument):
        c.push("q#", ["word"])


def run_epochs(c, group, epochs, members=3, retry_rng=None, checkpoint_every=None):
    """Like the Spark driver: each epoch's members send their slice of the input with
    seqs from (epoch, position); a retried member first sends part of its slice; a
    zombie attempt of the previous epoch resends late. Returns the expected count."""
    expected = Counter()
    for epoch in range(epochs):
        words = WORDS[epoch * 7 % 50:][:120]
        slices = [words[m::members] for m in range(members)]
        for m, part in enumerate(slices):
            source = epoch_source(group, m)
            if retry_rng is not None and retry_rng.random() < 0.5:
                cut = retry_rng.randrange(len(part))
                c.push(source, part[:cut], first_seq=epoch_seq(epoch, 0))   # failed attempt
            c.push(source, part, first_seq=epoch_seq(epoch, 0))
            expected.update(part)
        if epoch:   # a zombie of the previous epoch, after this one started
            prev = WORDS[(epoch - 1) * 7 % 50:][:120][0::members]
            assert c.push(epoch_source(group, 0), prev, first_seq=epoch_seq(epoch - 1, 0)) == 0
        if checkpoint_every and epoch % checkpoint_every == 0:
            c.checkpoint()
    return expected


def test_retried_and_zombie_attempts_count_once_and_state_stays_bounded():
    c = CoreCluster(nodes=3, replication=1)
    expected = run_epochs(c, "query", epochs=30, retry_rng=random.Random(1),
                          checkpoint_every=3)
    c.push("plain", WORDS[:10])
    expected.update(WORDS[:10])
    assert c.state() == expected
    for core in c.cores.values():
        core.check_invariants()
        for rng in core.primaries.values():
            # one floor, the members of the newest epoch that reached the range, "plain"
            assert len(rng.watermarks) <= 3 + 1 + 1, rng.watermarks
    c.checkpoint()
    assert sum(core.replicas.backups.tuples for core in c.cores.values()) == 0


def test_takeover_replays_backups_of_an_earlier_epoch_before_a_later_one():
    # No checkpoint: the replica holds member 1's epochs 0 and 1 before member 0's
    # epoch 0. Replaying epoch 1 first would raise the floor over member 0's tuples.
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=1)
    c.push(epoch_source("q", 1), WORDS[:30], first_seq=epoch_seq(0, 0))
    c.push(epoch_source("q", 0), WORDS[30:60], first_seq=epoch_seq(0, 0))
    c.push(epoch_source("q", 1), WORDS[60:90], first_seq=epoch_seq(1, 0))
    expected = Counter(WORDS[:90])
    assert c.state() == expected
    victim = c.ring.owner_of_token(c.ring.tokens[0])
    fail(c, victim)
    assert c.state() == expected
    # the heir dedups like the dead primary did
    assert c.push(epoch_source("q", 0), WORDS[30:60], first_seq=epoch_seq(0, 0)) == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_retries_checkpoints_and_a_failure_stay_exact(seed):
    rnd = random.Random(seed)
    c = CoreCluster(nodes=4, replication=1)
    expected = run_epochs(c, "a", epochs=rnd.randrange(2, 8), retry_rng=rnd,
                          checkpoint_every=rnd.choice([None, 1, 2]))
    fail(c, rnd.choice(sorted(c.cores)))
    # the same group goes on after the takeover; a second group runs alongside
    expected += run_epochs(c, "b", epochs=4, retry_rng=rnd, checkpoint_every=2)
    for core in c.cores.values():
        core.check_invariants()
    assert c.state() == expected
