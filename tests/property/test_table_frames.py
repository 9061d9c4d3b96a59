"""A frame of column states' columns packed and read by the compiled kernel and by the
pure-Python one: the same bytes and the same columns for any columns, and the same
refusal (ValueError naming what is wrong, never a crash) for any damaged frame."""

from array import array

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.core import columnar
from floering.node.core.columnar import pytable
from floering.wire.errors import InvalidArgument
from floering.node.core.state_wire import HEADER_BYTES, decode, encode_frame

pytestmark = pytest.mark.skipif(columnar.KERNEL != "compiled", reason="extension not built")
if columnar.KERNEL == "compiled":
    from floering.node.core.columnar import ctable

LIMIT = 2 ** 63
value = st.one_of(st.integers(-130, 130), st.integers(-40_000, 40_000),
                  st.integers(-2 ** 33, 2 ** 33), st.integers(-LIMIT, LIMIT - 1),
                  st.sampled_from([-LIMIT, LIMIT - 1, -129, 128, -32769, 32768,
                                   -2 ** 31 - 1, 2 ** 31, 127, -128]))
entry = st.tuples(st.integers(0, 2), st.binary(max_size=6), value)


def columns_of(entries):
    kinds = bytes(k for k, _, _ in entries)
    offsets = array("Q", [0])
    for _, key, _ in entries:
        offsets.append(offsets[-1] + len(key))
    return (kinds, b"".join(key for _, key, _ in entries), offsets,
            array("q", [v for _, _, v in entries]))


@settings(max_examples=400, deadline=None)
@given(st.lists(entry, max_size=40), st.data())
def test_both_kernels_pack_the_same_bytes_and_read_back_the_same_columns(entries, data):
    kinds, keys, offsets, values = columns_of(entries)
    n = len(kinds)
    start = data.draw(st.integers(0, n))
    end = data.draw(st.integers(start, n))
    packed = ctable.pack_frame_columns(kinds, keys, offsets, values, start, end)
    assert packed == pytable.pack_frame_columns(kinds, keys, offsets, values, start, end)
    width, body = packed
    nkeys = offsets[end] - offsets[start]
    frame = b"h" * 5 + body
    got = ctable.unpack_frame_columns(frame, 5, end - start, nkeys, width)
    assert got == pytable.unpack_frame_columns(frame, 5, end - start, nkeys, width)
    assert got[0] == kinds[start:end]
    assert got[1] == keys[offsets[start]:offsets[end]]
    assert list(got[2]) == [o - offsets[start] for o in offsets[start:end + 1]]
    assert list(got[3]) == list(values[start:end])
    assert width == min(w for w in (1, 2, 4, 8)
                        if all(-2 ** (8 * w - 1) <= v < 2 ** (8 * w - 1)
                               for v in values[start:end]))


def _outcome(kernel, *args):
    try:
        return kernel.unpack_frame_columns(*args)
    except ValueError as exc:
        return ("refused", str(exc))


@settings(max_examples=600, deadline=None)
@given(st.lists(entry, min_size=1, max_size=12), st.data())
def test_both_kernels_refuse_a_damaged_frame_alike(entries, data):
    kinds, keys, offsets, values = columns_of(entries)
    width, body = ctable.pack_frame_columns(kinds, keys, offsets, values, 0, len(kinds))
    bad = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        bad[data.draw(st.integers(0, len(bad) - 1))] = data.draw(st.integers(0, 255))
    n = data.draw(st.sampled_from([len(kinds), len(kinds) + 1, 0, 2 ** 31]))
    nkeys = data.draw(st.sampled_from([len(keys), len(keys) + 1, 2 ** 40, 2 ** 64 - 1]))
    w = data.draw(st.sampled_from([width, 1, 2, 3, 8]))
    cut = data.draw(st.integers(0, len(bad)))
    for frame in (bytes(bad), bytes(bad[:cut])):
        got = _outcome(ctable, frame, 0, n, nkeys, w)
        assert got == _outcome(pytable, frame, 0, n, nkeys, w)


@pytest.mark.parametrize("kernel", ["ctable", "pytable"])
def test_packing_refuses_columns_that_do_not_hold_together(kernel):
    pack = (ctable if kernel == "ctable" else pytable).pack_frame_columns
    with pytest.raises(ValueError, match="decrease"):
        pack(b"\x00\x00", b"abcd", array("Q", [0, 3, 2]), array("q", [1, 2]), 0, 2)
    with pytest.raises(ValueError, match="decrease"):
        pack(b"\x00", b"ab", array("Q", [0, 9]), array("q", [1]), 0, 1)
    with pytest.raises(ValueError, match="outside"):
        pack(b"\x00", b"ab", array("Q", [0, 2]), array("q", [1]), 1, 2)
    with pytest.raises(ValueError, match="n \\+ 1"):
        pack(b"\x00", b"ab", array("Q", [0]), array("q", [1]), 0, 1)


def test_a_frame_of_a_million_keys_decodes_to_what_was_encoded():
    n = 1 << 20
    keys = [f"k{i:07d}" for i in range(n)]
    data = "".join(keys).encode()
    offsets = array("Q", range(0, 8 * n + 1, 8))
    values = array("q", [i * 3 - n for i in range(n)])
    frame = encode_frame(bytes(n), data, offsets, values)
    assert frame[4] == 4                        # values of up to 2**22 in 4 bytes
    got = decode(frame)
    assert got.key_data == data and got.offsets == offsets and got.value_column == values
    with pytest.raises(InvalidArgument, match="without decreasing"):
        damaged = bytearray(frame)
        damaged[HEADER_BYTES + n + 4 * 1000] = 0xFF     # offset 1000 jumps past 1001
        decode(bytes(damaged))


# ------------------------------------------------------------ install in one call

POOL = ["a", b"a", "b", 0, -7, 10 ** 30, "\u00e9t\u00e9", b"", "", "\x00i5", 5, b"\xff"]
pair = st.tuples(st.sampled_from(POOL), value)


def part_of(pairs):
    from floering.node.core.columnar.buffers import encode_keys
    kinds, data, offsets = encode_keys([k for k, _ in pairs])
    return kinds, data, offsets, array("q", [v for _, v in pairs])


@settings(max_examples=300, deadline=None)
@given(st.lists(pair, max_size=8), st.lists(st.lists(pair, max_size=10), max_size=5),
       st.booleans())
def test_install_parts_is_install_of_each_part_in_turn_in_both_kernels(before, parts, mark):
    from floering.node.core.columnar.buffers import encode_keys
    from floering.wire.hashing import position
    tables = [ctable.StateTable("sum"), pytable.StateTable("sum"), ctable.StateTable("sum")]
    for table in tables:
        table.install((*part_of(before)[:3], array("Q", [position(k) for k, _ in before]),
                       part_of(before)[3]), mark_dirty=True)
    tables[0].install_parts([part_of(p) for p in parts], mark_dirty=mark)
    tables[1].install_parts([part_of(p) for p in parts], mark_dirty=mark)
    for p in parts:
        kinds, data, offsets = encode_keys([k for k, _ in p])
        tables[2].install((kinds, data, offsets, array("Q", [position(k) for k, _ in p]),
                           array("q", [v for _, v in p])), mark_dirty=mark)
    model = dict(before)
    for p in parts:
        model.update(p)
    for table in tables:
        assert dict(table.items()) == model
    dirty = [t.take_dirty() for t in tables]
    assert dirty[0] == dirty[1] == dirty[2]


@pytest.mark.parametrize("bad, says", [
    ((b"\x03", b"ab", array("Q", [0, 2]), array("q", [1])), "kind"),
    ((b"\x00", b"ab", array("Q", [0, 3]), array("q", [1])), "offsets"),
    ((b"\x00\x00", b"abc", array("Q", [0, 2, 1]), array("q", [1, 2])), "offsets"),
    ((b"\x00", b"\xff\xfe", array("Q", [0, 2]), array("q", [1])), "what its kind"),
    ((b"\x02", b"\x00i012", array("Q", [0, 5]), array("q", [1])), "what its kind"),
    ((b"\x00", b"ab", array("Q", [0, 2]), array("q", [1, 2])), "n \\+ 1 offsets"),
    ((b"\x00", b"ab", array("Q", [0, 2])), "a part must be"),
])
@pytest.mark.parametrize("kernel", ["ctable", "pytable"])
def test_install_parts_refuses_a_bad_part_and_changes_nothing(kernel, bad, says):
    module = ctable if kernel == "ctable" else pytable
    table = module.StateTable("count")
    good = part_of([("x", 1), ("y", 2), (b"z", 3)])
    table.install_parts([good], mark_dirty=True)
    before, dirty = table.items(), table.dirty_count
    with pytest.raises((ValueError, TypeError), match=says):
        table.install_parts([part_of([("x", 9), ("new", 4)] * 300), bad,
                             part_of([("later", 5)])], mark_dirty=True)
    assert table.items() == before and table.dirty_count == dirty
    assert table.get("new") is None and table.get("x") == 1
