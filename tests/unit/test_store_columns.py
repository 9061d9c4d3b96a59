"""A durable store's copies read back as frames (a StateRun) and installed into a
table in one call hold exactly what the dict path read: checked against a Counter,
for the compiled table and the pure one, over full writes, deltas (segments of later
generations laid over earlier ones) and a format-1 copy with segments over it."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from floering.node.core.columnar import pytable
from floering.node.core.persistence_io import CopyWrite
from floering.node.core.reducers import Count
from floering.node.core.state_wire import StateRun
from floering.node.core.table_state import TableCopy, TableState
from floering.node.storage import node_store
from floering.node.storage.node_store import NodeStore

pytestmark = pytest.mark.fast

TOKENS = [(1 << 62) * (i + 1) - 1 for i in range(3)]


def _key(rnd: random.Random):
    kind = rnd.randrange(4)
    if kind == 0:
        return f"w{rnd.randrange(3000)}"
    if kind == 1:
        return f"é{rnd.randrange(300)}"
    if kind == 2:
        return bytes([rnd.randrange(256) for _ in range(rnd.randrange(1, 5))])
    return rnd.randrange(-500, 500)


def _written(tmp_path, seed: int, per_key_first: bool):
    """A store written in rounds (a full write, then deltas), and the Counters of
    what each range should hold."""
    rnd = random.Random(seed)
    store = NodeStore(tmp_path / f"s{seed}")
    store.save_identity("n0", 1)
    truth = {t: Counter() for t in TOKENS}
    for round_ in range(6):
        changed: dict[int, dict] = {t: {} for t in TOKENS}
        for _ in range(rnd.randrange(1, 2000)):
            t = rnd.choice(TOKENS)
            k = _key(rnd)
            truth[t][k] += rnd.randrange(1, 5)
            changed[t][k] = truth[t][k]
        if round_ == 0:
            copies = [CopyWrite(t, "n0", dict(truth[t]), {"s": 1}, True) for t in TOKENS]
            if per_key_first:
                node_store.write_per_key(store, copies)
            else:
                store.write(copies)
        else:
            store.write([CopyWrite(t, "n0", c, {"s": round_ + 1}) for t, c in changed.items()])
    store.close()
    return tmp_path / f"s{seed}", truth


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("per_key_first", [False, True])
def test_frames_installed_in_a_table_hold_what_the_dict_path_read(tmp_path, seed,
                                                                    per_key_first):
    path, truth = _written(tmp_path, seed, per_key_first)
    store = NodeStore(path)
    loaded = store.load()
    store.close()
    assert loaded is not None and not loaded.corrupt
    for t in TOKENS:
        states = loaded.copies[t].states
        assert isinstance(states, StateRun)
        expected = dict(truth[t])
        assert states.to_dict() == expected                    # the dict path
        compiled = TableCopy(Count())
        compiled.master = states                               # frames, one call
        assert compiled.state.snapshot() == expected
        pure = TableState(Count(), table_class=pytable.StateTable)
        pure.replace(states)
        assert pure.snapshot() == expected


def test_a_damaged_segment_still_leaves_its_copy_for_corrupt(tmp_path):
    path, _ = _written(tmp_path, 7, False)
    store = NodeStore(path)
    key = next(k for k, _ in store.db.items(from_key=node_store.KEYS)
               if node_store._is_segment(k))
    value = bytearray(store.db.get(key))
    value[-1] ^= 0xFF
    store.db.put(key, bytes(value))
    loaded = store.load()
    store.close()
    assert loaded is not None
    token = node_store.TOKEN.unpack_from(key, 1)[0]
    assert token in loaded.corrupt and token not in loaded.copies
