"""Merging a shared key's idle pieces back into the key (node.core.folding), on cores
alone: when a fold may be sent, what it sends, and that a resend changes nothing."""

from __future__ import annotations

import pytest

from floering.node.core.batch import Batch, Limits, encode_payload
from floering.wire.errors import InvalidArgument
from floering.node.core.folding import pending
from floering.node.core.node_core import NodeCore
from floering.wire.pieces import fold_key, is_fold_key, merge_pieces, piece_key
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring

MEMBERS = {"a": "h:1", "b": "h:2", "c": "h:3"}
RING = Ring.initial(MEMBERS, 1, 4, "dkg")
PIECE = piece_key("the", 3)
TOKEN = RING.token_for_key(PIECE)
OWNER = RING.owner_of_token(TOKEN)


def core(node: str = OWNER, ring: Ring = RING) -> NodeCore:
    return NodeCore(node, ring, load_reducer("count"), Limits(piece_idle=1.0))


def push(c: NodeCore, key, value, source="m1", seq=1, ring=RING) -> None:
    token = ring.token_for_key(key)
    c.receive_batch(Batch(ring.stamp, token, source, seq, seq, 1,
                          encode_payload([key], [value])))


def ack_round(c: NodeCore) -> None:
    """One checkpoint round every replica acknowledges."""
    for s in c.plan_checkpoints(0.0):
        c.checkpoint_acked(s.checkpoint.token, s.replica, s.checkpoint.seq, False)
    for token in list(c.primaries):
        c.checkpoint_done(token)


def folded_core() -> tuple[NodeCore, bytes]:
    c = core()
    push(c, PIECE, 7)
    assert c.folds.review(c, 0.0) == ()        # first look: noted
    assert c.folds.review(c, 0.5) == ()        # unchanged, not yet idle long enough
    assert c.folds.review(c, 1.5) == ()        # folded, but no replica holds it yet
    state = c.primaries[TOKEN].state
    assert state.get(PIECE) == 0
    [out] = [k for k, v in state.items() if is_fold_key(k)]
    assert state.get(out) == [1, 7] and RING.token_for_key(out) == TOKEN
    return c, out


def test_an_idle_piece_is_folded_into_its_range_and_sent_once_every_replica_holds_it():
    c, out = folded_core()
    ack_round(c)
    [send] = c.folds.review(c, 2.0)
    assert (send.key, send.seq, send.state, send.out_key) == ("the", 1, 7, out)
    assert c.folds.review(c, 2.1) == ()        # in flight: not sent twice
    c.folds.answered(c, out, 1, ok=True)
    assert c.primaries[TOKEN].state.get(out) == [1]
    assert c.folds.review(c, 3.0) == ()


def test_a_failed_send_is_sent_again_and_a_new_fold_numbers_past_the_last():
    c, out = folded_core()
    ack_round(c)
    [send] = c.folds.review(c, 2.0)
    c.folds.answered(c, out, 1, ok=False)
    assert c.folds.review(c, 2.1) == (send,)
    c.folds.answered(c, out, 1, ok=True)
    push(c, PIECE, 2, seq=2)                    # the piece is used again, then idles
    c.folds.review(c, 3.0)
    c.folds.review(c, 4.5)
    assert c.primaries[TOKEN].state.get(out) == [2, 2]


def test_reads_merge_a_fold_on_its_way_and_skip_one_that_arrived():
    parts = [("the", 3), (piece_key("the", 1), 4)]
    on_its_way, arrived = (fold_key("the", 2, 0), [5, 6]), (fold_key("the", 2, 0), [5])
    assert merge_pieces([*parts, on_its_way], lambda a, b: a + b) == {"the": 13}
    assert merge_pieces([*parts, arrived], lambda a, b: a + b) == {"the": 7}


def test_reads_skip_an_outgoing_key_whose_state_is_no_fold():
    forged = [("the", 3), (fold_key("the", 2, 0), 99), (fold_key("the", 3, 0), [1, 2, 3])]
    assert merge_pieces(forged, lambda a, b: a + b) == {"the": 3}


def test_the_receiver_merges_a_fold_once_however_often_it_is_sent():
    c, out = folded_core()
    ack_round(c)
    [send] = c.folds.review(c, 2.0)
    dest = core(RING.owner("the"))
    push(dest, "the", 10, source="m1", seq=1)
    for _ in range(3):                          # sent, resent after a lost answer, ...
        push(dest, send.key, send.state, source=send.source, seq=send.seq)
    assert dest.get("the") == (True, 17)


def test_a_fold_batch_must_carry_states_the_reducer_can_merge():
    dest = core(RING.owner("the"))
    with pytest.raises(InvalidArgument):
        push(dest, "the", "not a count", source="fold:00", seq=1)
    assert dest.get("the") == (False, None)


def test_a_new_primary_finds_a_pending_fold_and_sends_it_again_under_the_same_seq():
    c, out = folded_core()
    ack_round(c)
    [send] = c.folds.review(c, 2.0)
    # The owner dies before the answer: the range comes back as a new primary range
    # (as a takeover builds it) holding the same state.
    rng = c.primaries[TOKEN]
    heir = core()
    heir.primaries[TOKEN].state.replace(rng.state.snapshot())
    assert heir.folds.review(heir, 0.0) == ()   # found, put in the next checkpoint
    ack_round(heir)
    assert heir.folds.review(heir, 0.1) == (send,)
    assert pending(heir.primaries[TOKEN].state.get(out))


def test_every_fold_step_moves_the_epoch_and_the_receiver_shows_the_seq_it_merged():
    """What a scan compares (mapper.scanning): a node's fold epoch moves with each step
    taken there, and the fold marks name the last seq merged per fold source."""
    c = core()
    push(c, PIECE, 7)
    c.folds.review(c, 0.0)
    c.folds.review(c, 0.5)
    assert c.fold_epoch == 0
    c.folds.review(c, 1.5)                      # the piece emptied into its outgoing key
    assert c.fold_epoch == 1
    ack_round(c)
    [send] = c.folds.review(c, 2.0)
    dest = core(RING.owner("the"))
    before = dest.fold_epoch if dest is not c else c.fold_epoch
    push(dest, send.key, send.state, source=send.source, seq=send.seq)
    assert dest.fold_epoch == before + 1        # merged into its key
    assert dest.fold_marks()[send.source] == 1
    push(dest, send.key, send.state, source=send.source, seq=send.seq)
    assert dest.fold_epoch == before + 1        # a resend is dropped: no step
    c.folds.answered(c, send.out_key, 1, ok=True)
    assert c.fold_epoch == (3 if dest is c else 2)   # done
    assert c.stats()["fold_epoch"] == c.fold_epoch
