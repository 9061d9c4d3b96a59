import msgpack
import pytest
from hypothesis import given, strategies as st

from floering.node.core.batch import (Limits, check_header, decode_payload, decode_seqs,
                             encode_payload, encode_seqs)
from floering.node.core.dedup import first_new_index
from floering.wire.errors import InvalidArgument, InvalidKey, TooLarge


def test_round_trip_keeps_key_types():
    keys, values = ["a", b"b", 3], [1, 2, 3]
    assert decode_payload(encode_payload(keys, values), 3) == (("a", b"b", 3), (1, 2, 3))


def test_contiguous_seqs_travel_as_nothing():
    assert encode_seqs([5, 6, 7]) == b""
    assert list(decode_seqs(5, 7, 3, b"")) == [5, 6, 7]
    assert decode_seqs(5, 9, 2, encode_seqs([5, 9])) == (5, 9)


@pytest.mark.parametrize("payload, error", [
    (b"\xc1", InvalidArgument),                                   # never-used msgpack byte
    (msgpack.packb([["a"], [1], [2]]), InvalidArgument),          # three arrays
    (msgpack.packb({"keys": ["a"]}), InvalidArgument),            # a map
    (msgpack.packb([["a", "b"], [1]]), InvalidArgument),          # count mismatch
    (msgpack.packb([[1.5], [1]]), InvalidKey),                    # float key
    (msgpack.packb([[None], [1]]), InvalidKey),                   # nil key
    (msgpack.packb([[True], [1]]), InvalidKey),                   # bool key
    (msgpack.packb([[["x"]], [1]]), InvalidKey),                  # array key
    (b"\x92\x91\xa2\xff\xfe\x91\x01", InvalidKey),                # str that is not UTF-8
])
def test_bad_payloads_are_refused_with_a_reason(payload, error):
    with pytest.raises(error) as info:
        decode_payload(payload, 1)
    assert str(info.value)


def test_header_limits():
    limits = Limits(max_batch_bytes=100, max_batch_tuples=10)
    check_header(1, 1, 1, b"", b"x", limits)
    with pytest.raises(TooLarge):
        check_header(1, 1, 1, b"", b"x" * 101, limits)
    with pytest.raises(TooLarge):
        check_header(11, 1, 11, b"", b"x", limits)
    with pytest.raises(InvalidArgument):
        check_header(0, 1, 1, b"", b"x", limits)
    with pytest.raises(InvalidArgument):
        check_header(3, 5, 4, b"", b"x", limits)
    with pytest.raises(InvalidArgument):
        check_header(3, 1, 10, b"", b"x", limits)   # contiguous claim that does not add up


def test_bad_seqs_are_refused():
    with pytest.raises(InvalidArgument):
        decode_seqs(1, 3, 2, msgpack.packb([3, 1]))
    with pytest.raises(InvalidArgument):
        decode_seqs(1, 3, 2, msgpack.packb([1, 2]))  # does not end at last_seq
    with pytest.raises(InvalidArgument):
        decode_seqs(1, 3, 2, b"\xc1")


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50, unique=True),
       st.integers(0, 10_001))
def test_first_new_index_skips_exactly_the_applied_prefix(seqs, watermark):
    seqs.sort()
    index = first_new_index(watermark, seqs[0], seqs[-1], len(seqs), lambda: seqs)
    assert all(s <= watermark for s in seqs[:index])
    assert all(s > watermark for s in seqs[index:])


def test_a_pushed_key_may_use_the_reserved_mark_only_as_a_well_formed_piece():
    from floering.wire.pieces import FOLD_MARK, PIECE_MARK, RESERVED, fold_key, piece_key
    fine = [piece_key("w", 1), piece_key(b"w", 15), piece_key(7, 2), b"\x00flo", "\x00floe:x"]
    assert decode_payload(encode_payload(fine, [1] * 5), 5)[0] == tuple(fine)
    for key in (fold_key("w", 1, 0),                       # only its owner writes it
                FOLD_MARK + b"junk", RESERVED + b"other",
                PIECE_MARK + b"\xc1",                      # not msgpack
                PIECE_MARK + msgpack.packb(("w", 1, 2)),   # three parts
                PIECE_MARK + msgpack.packb(({"a": 1}, 1)),  # an unhashable base
                PIECE_MARK + msgpack.packb(([1], 1)),
                PIECE_MARK + msgpack.packb(("w", 0)),      # piece 0 is the key itself
                PIECE_MARK + msgpack.packb(("w", 1 << 20)),
                piece_key(piece_key("w", 1), 1)):          # a piece of a piece
        with pytest.raises(InvalidKey):
            decode_payload(encode_payload(["ok", key], [1, 1]), 2)
