"""The mapper's outbox, pure: routing, ack accounting, re-fitting to a new ring."""

from floering.mapper.outbox import Outbox, PendingBatch
from floering.node.core.batch import decode_payload, encode_payload, encode_seqs
from floering.wire.ring import Ring
from tests.support.helpers import middle

RING = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 2)


def batch_of(ring, token, keys, first_seq, id):
    seqs = list(range(first_seq, first_seq + len(keys)))
    return PendingBatch(id, token, "src", seqs[0], seqs[-1], len(keys),
                        encode_payload(keys, [1] * len(keys)), encode_seqs(seqs),
                        tokens=ring.tokens)


def keys_in(ring, token, n=50):
    return [k for k in (f"k{i}" for i in range(2000)) if ring.token_for_key(k) == token][:n]


def test_a_batch_is_delivered_once_every_destination_acked():
    box = Outbox()
    token = RING.tokens[0]
    b = batch_of(RING, token, keys_in(RING, token), 1, 1)
    ((sent, destinations),) = box.add(b, RING)
    assert sent is b and destinations == RING.destinations(token) and len(destinations) == 2
    assert not box.acked(b, destinations[0]) and len(box) == 1
    assert box.acked(b, destinations[1]) and len(box) == 0
    assert not box.acked(b, destinations[1])          # a late duplicate ack counts for nothing


def test_a_ring_change_reroutes_everything_and_every_destination_acks_anew():
    box = Outbox()
    token = RING.tokens_of("a")[0]
    b = batch_of(RING, token, keys_in(RING, token), 1, 1)
    (_, first), = box.add(b, RING)
    box.acked(b, first[0])
    survivors = RING.without(["a"])
    ((again, destinations),) = box.reroute(survivors)
    assert again is b and destinations == survivors.destinations(token)
    assert b.waiting_for == set(destinations)        # the earlier ack no longer counts


def test_a_split_cuts_undelivered_batches_by_key_in_resend_order():
    box = Outbox()
    token = RING.tokens[1]
    keys = keys_in(RING, token, 200)
    early, late = batch_of(RING, token, keys, 1, 1), batch_of(RING, token, keys[:3], 201, 2)
    box.add(early, RING)
    box.add(late, RING)
    split = RING.split_token(token, middle(RING, token))
    sends = box.reroute(split)
    parts = [b for b, _ in sends]
    assert [b.sort_key()[0] for b in parts] == sorted(b.sort_key()[0] for b in parts)
    assert {b.token for b in parts} <= {token, middle(RING, token)}
    for part in parts:
        got, _ = decode_payload(part.payload, part.count)
        assert {split.token_for_key(k) for k in got} == {part.token}
    assert sum(b.count for b in parts) == 203 and len(box) == len(parts)
