"""A snapshot or restore chunk (ImportRange, RestoreRange: up to 8 MiB of entries) is
decoded in steps between which the event loop runs, refusing exactly what the one-go
decode refuses."""

import asyncio
import time
from types import SimpleNamespace

import msgpack
import pytest

from floering.wire.codec import unpack_columns, unpack_columns_sliced
from floering.wire.errors import InvalidArgument
from floering.node.transport.snapshots import (AT_ONCE_BYTES, chunk_columns,
                                               chunk_columns_async)


def sliced(data: bytes, size: int = 3):
    out: list = []
    steps = sum(1 for _ in unpack_columns_sliced(out, data, size))
    return tuple(out), steps


GOOD = [
    b"",
    msgpack.packb([[], []]),
    msgpack.packb([["a", "b", "a"], [1, 2, 3]]),
    msgpack.packb([[["t", 1], b"k"] * 5, [[1, [2, 3]], {"x": 1}] * 5]),
]
BAD = [
    msgpack.packb([["a"], [1, 2]]),            # lengths differ
    msgpack.packb([["a"], [1], [2]]),          # three columns
    msgpack.packb([["a"]]),
    msgpack.packb({"a": 1}),
    msgpack.packb(7),
    msgpack.packb([{"a": 1}, [1]]),            # a column that is not an array
    msgpack.packb([["a"], 5]),
    msgpack.packb([["a", "b"], [1, 2]]) + b"\x00",   # extra data
    msgpack.packb([["a", "b"], [1, 2]])[:-1],        # cut short
    b"\xdd\xff\xff\xff\xff",                   # an array claiming 4 G entries
    b"\xc1" * 100,
]


@pytest.mark.parametrize("data", GOOD)
def test_the_steps_decode_what_the_one_go_decode_does(data):
    (keys, states), _ = sliced(data)
    assert (keys, states) == tuple(unpack_columns(data))
    assert type(keys) is tuple and type(states) is tuple


@pytest.mark.parametrize("data", BAD)
def test_the_steps_refuse_what_the_one_go_decode_refuses(data):
    with pytest.raises(InvalidArgument):
        unpack_columns(data)
    with pytest.raises(InvalidArgument):
        sliced(data)


async def test_a_large_chunk_is_decoded_while_the_loop_runs():
    n = 300_000
    entries = msgpack.packb([[f"key-{i}" for i in range(n)], list(range(n))])
    assert len(entries) > AT_ONCE_BYTES
    request = SimpleNamespace(entries=entries, watermarks=msgpack.packb({"s": 3}))
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    started = time.perf_counter()
    keys, states, marks = await chunk_columns_async(request)
    took = time.perf_counter() - started
    ticker.cancel()
    assert ticks >= n // 8192 - 1, (ticks, took)
    assert (keys, states, marks) == chunk_columns(request)
    assert len(keys) == n and marks == {"s": 3}
    big = SimpleNamespace(entries=b"\x00" * (AT_ONCE_BYTES + 1), watermarks=b"")
    with pytest.raises(InvalidArgument):
        await chunk_columns_async(big)
