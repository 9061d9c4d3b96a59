"""The combiner kernels folding keys straight from UTF-8 buffers (an Arrow string
array's data and offsets): the same parts, byte for byte, as folding the str keys, in
the compiled kernel and the pure-Python one."""

from __future__ import annotations

import random
from array import array

import pytest

from floering.mapper import pycombine
from floering.mapper.batching import MAX_KEY_BYTES
from floering.mapper.words import split_words

try:
    from floering.mapper import ccombine
except ImportError:
    ccombine = None

KERNELS = [pycombine] + ([ccombine] if ccombine is not None else [])
WORDS = [f"w{i}" for i in range(200)] + ["héllo", "日本語", "", "ß" * 40, "don't"]
_RNG = random.Random(3)
TOKENS = tuple(sorted({_RNG.getrandbits(64) for _ in range(7)}))


def buffers(keys: list[str], width: int) -> tuple[bytes, bytes]:
    raw = [k.encode() for k in keys]
    offsets, total = [0], 0
    for r in raw:
        total += len(r)
        offsets.append(total)
    return b"".join(raw), array("i" if width == 4 else "q", offsets).tobytes()


def drain(kernel, combiner, step, append: bool):
    """Fold with `step(combiner, i)` until done, taking parts as they fill: [(t, payload,
    keys, tuples, seqs)] in the order taken."""
    out, i = [], 0

    def take(t):
        seqs = combiner.take_seqs(t) if append else None
        out.append((t, *combiner.take(t, 2), seqs))

    while True:
        i, t, status = step(combiner, i)
        if status == kernel.DONE:
            break
        assert status == kernel.FULL
        take(t)
    for t in combiner.opened:
        if combiner.count(t)[0]:
            take(t)
    return out


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("op", ["count", "sum", "min", "max", "append"])
@pytest.mark.parametrize("width", [4, 8])
def test_folding_utf8_buffers_gives_the_parts_folding_the_str_keys_gives(kernel, op, width):
    rng = random.Random(width)
    keys = [rng.choice(WORDS) for _ in range(5000)]
    values = array("q", [rng.randrange(-1000, 1000) for _ in keys])
    data, offsets = buffers(keys, width)
    start = 17                       # the first keys are not folded (a sliced array)
    as_str = kernel.Combiner(op, TOKENS, MAX_KEY_BYTES)
    as_utf8 = kernel.Combiner(op, TOKENS, MAX_KEY_BYTES)
    got = drain(kernel, as_utf8, lambda c, i: c.fold_utf8(
        data, offsets, width, max(i, start), len(keys), 0, values, 50, 400, 100),
        op == "append")
    want = drain(kernel, as_str, lambda c, i: c.fold(
        keys, max(i, start), 0, values, 50, 400, 100), op == "append")
    assert got == want and got


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
def test_bad_utf8_out_of_range_offsets_and_long_keys_stop_the_fold_at_their_key(kernel):
    combiner = kernel.Combiner("count", (0,), 8)
    for bad in (b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\xe2\x82"):
        data, offsets = buffers(["ab", "c"], 4)
        data += bad
        offsets += array("i", [len(data)]).tobytes()
        assert combiner.fold_utf8(data, offsets, 4, 0, 3, 1, None, 100, 1 << 40) == \
            (2, -1, kernel.BAD_KEY)
    data, offsets = buffers(["ab", "c"], 4)
    wrong = array("i", [0, 2, 9]).tobytes()                 # past the data
    assert combiner.fold_utf8(data, wrong, 4, 0, 2, 1, None, 100, 1 << 40)[2] == kernel.BAD_KEY
    data, offsets = buffers(["ab", "x" * 9], 8)
    assert combiner.fold_utf8(data, offsets, 8, 0, 2, 1, None, 100, 1 << 40)[::2] == \
        (1, kernel.LONG_KEY)
    with pytest.raises(ValueError):
        combiner.fold_utf8(data, offsets, 8, 0, 3, 1, None, 100, 1 << 40)   # too few offsets


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
def test_take_columns_gives_the_totals_back_as_buffers_fold_utf8_takes(kernel):
    keys = ["b", "a", "b", "日本", "a", "b"]
    totals = kernel.Combiner("count", (0,), MAX_KEY_BYTES)
    assert totals.fold_utf8(*buffers(keys, 4), 4, 0, len(keys), 1, None, 100, 1 << 40) == \
        (len(keys), -1, kernel.DONE)
    data, offsets, values = totals.take_columns(0)
    assert data == "ba日本".encode()
    assert array("q", offsets).tolist() == [0, 1, 2, 8]
    assert array("q", values).tolist() == [3, 2, 1]
    assert totals.count(0) == (0, 0)                        # emptied
    again = kernel.Combiner("append", TOKENS, MAX_KEY_BYTES)
    assert again.fold_utf8(data, offsets, 8, 0, 3, 0, values, 100, 0, 10)[2] == kernel.DONE
    sent = {}
    for t in again.opened:
        first, last, _ = again.take_seqs(t)
        sent[t] = (first, last, again.take(t, 1)[0])
    import msgpack
    pairs = {k: v for _, _, payload in sent.values()
             for k, v in zip(*msgpack.unpackb(payload))}
    assert pairs == {"b": 3, "a": 2, "日本": 1}


def split_lines(kernel, lines: list) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    arr = pa.array(lines, pa.string())
    arr = arr.slice(1) if len(arr) > 1 else arr          # a slice: offsets from 1 on
    validity, offsets, data = arr.buffers()
    words, ends, n = kernel.split_words(data, offsets, 4, arr.offset, arr.offset + len(arr),
                                        validity, 0)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(ends),
                                            pa.py_buffer(words)).to_pylist()


def expected_words(lines: list) -> list[str]:
    return [w for line in lines[1:] if line is not None for w in split_words(line)]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__.rsplit(".", 1)[-1])
def test_the_kernels_split_lines_into_words_as_split_words_does(kernel):
    lines = ["skip me", "Hello, World! don't 'quote' rock'n'roll ab'' x'", None, "",
             "İstanbul ab'İx \u212aelvin KELVIN ǅemal ﬁne naïve 日本語 o'clock's",
             "'' ' a'b'c' d''e 42abc \u0307i \t\n tail"]
    assert split_lines(kernel, lines) == expected_words(lines)
    rng = random.Random(5)
    alphabet = list("aZ' -İKx\u0307é日") + ["\u212a", "''", "I", "\U0001F600"]
    many = [None if rng.random() < 0.05 else
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))
            for _ in range(3000)]
    assert split_lines(kernel, many) == expected_words(many)


@pytest.mark.skipif(ccombine is None, reason="the compiled kernel is not built")
def test_the_compiled_split_agrees_with_split_words_on_every_code_point():
    """Only U+0130 and U+212A lower-case into ASCII letters; every code point is tried
    inside, before and after words and apostrophes."""
    lines = [""]
    for c in range(0x80, 0x110000):
        if not 0xD800 <= c < 0xE000:
            ch = chr(c)
            lines += [f"a{ch}b", f"x'{ch}y", f"{ch}'a"]
    assert split_lines(ccombine, lines) == expected_words(lines)


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("width", [4, 8])
def test_emit_utf8_makes_the_batches_emit_and_emit_many_make(columns, width):
    """Keys given as UTF-8 buffers (one value, or one value each) and the same keys as
    str: the very same batches, seqs and payload bytes."""
    from floering.mapper.batching import Batcher
    from floering.mapper.routing import Router
    from floering.wire.ring import Ring

    rng = random.Random(4)
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 8)
    keys = [rng.choice(WORDS) for _ in range(3000)]
    values = array("q", [rng.randrange(-5, 1 << 40) for _ in keys])
    made = []
    for as_buffers in (True, False):
        batcher = Batcher(Router(ring), None, "m", 64, first_seq=7, columnar=columns)
        for i in range(0, len(keys), 700):
            part, vals = keys[i:i + 700], values[i:i + 700]
            if as_buffers:
                batcher.emit_utf8(*buffers(part, width), width, len(part), 3)
                batcher.emit_utf8(*buffers(part, width), width, len(part), values=vals)
            else:
                batcher.emit_many(part, 3)
                for key, value in zip(part, vals):
                    batcher.emit(key, value)
        batcher.seal_all()
        made.append([(b.token, b.first_seq, b.last_seq, b.count, b.payload, b.seqs)
                     for b in batcher.sealed])
    assert made[0] == made[1] and made[0]


def test_emit_utf8_refuses_a_bad_key_after_the_keys_before_it():
    from floering.mapper.batching import Batcher
    from floering.mapper.routing import Router
    from floering.wire.errors import InvalidKey
    from floering.wire.ring import Ring

    batcher = Batcher(Router(Ring.initial({"a": "h:1"}, 0, 4)), None, "m", 64)
    data, offsets = buffers(["ok", "fine"], 4)
    data += b"\xff"
    offsets += array("i", [len(data)]).tobytes()
    with pytest.raises(InvalidKey):
        batcher.emit_utf8(data, offsets, 4, 3)
    assert batcher.next_seq == 3                    # seqs 1 and 2 are buffered
