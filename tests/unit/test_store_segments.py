"""A data directory keeps each range's states as segments (frames of column states,
node.core.state_wire): a whole range as generation 0, each checkpoint's changed keys
as the next generation, folded back into one generation 0 past a bound. Read back
exact; a damaged segment is its range corrupt, named; a directory of the earlier
format (one entry a key) is still read, and one of a newer format refused."""


import pytest

from floering.node.storage import node_store
from floering.node.storage.node_store import (CopyWrite, NewerFormat, NodeStore, open_store,
                                              segment_key, write_per_key)


def segments_of(store: NodeStore, token: int) -> list[tuple[bytes, bytes]]:
    prefix = node_store._key_prefix(token) + node_store.SEGMENT
    out = []
    for k, v in store.db.items(from_key=prefix):
        if not k.startswith(prefix):
            break
        out.append((k, v))
    return out


MIXED = {"a": 1, b"b": 2, 3: 2 ** 70, "n": None, "t": (1, "x"), "f": 0.5, -4: -(2 ** 40)}


def test_generations_lay_over_each_other_and_read_back_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(node_store, "SEGMENT_ENTRIES", 7)     # parts of a generation
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    whole = {f"k{i}": i for i in range(40)} | MIXED
    expect = {5: dict(whole), 9: {"z": 1}}
    store.write([CopyWrite(t, "p", s, {"s": 1}, True) for t, s in expect.items()])
    for round_ in range(3):
        change = {f"k{i}": 100 * round_ + i for i in range(round_, 40, 3)} | {f"new{round_}": 7}
        expect[5].update(change)
        store.write([CopyWrite(5, "p", change, {"s": round_ + 2}), CopyWrite(9, "p", {}, {"s": 9})])
    assert len(segments_of(store, 5)) == 7 + 3 + 2 + 2       # 47 entries, then 15, 14, 14
    assert node_store._generation(segments_of(store, 5)[-1][0]) == 3
    store.close()
    store = NodeStore(tmp_path)
    loaded = store.load()
    assert not loaded.corrupt
    assert {t: c.states for t, c in loaded.copies.items()} == expect
    assert loaded.copies[5].watermarks == {"s": 4} and loaded.copies[9].watermarks == {"s": 9}
    assert store.segments[5].next_generation == 4 and store.segments[5].first == 47
    store.close()


def test_later_generations_fold_into_one_read_back_from_the_store(tmp_path, monkeypatch):
    monkeypatch.setattr(node_store, "FOLD_ENTRIES", 10)
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    expect = {f"k{i}": i for i in range(20)}
    store.write([CopyWrite(7, "p", dict(expect), {}, True)])
    gens = []
    for round_ in range(6):
        change = {f"k{round_}": -round_, f"r{round_}": round_, f"q{round_}": 1, f"x{round_}": 2}
        expect.update(change)
        store.write([CopyWrite(7, "p", change, {})])
        gens.append(sorted({node_store._generation(k) for k, _ in segments_of(store, 7)}))
    # Later entries 4, 8, ... 24: a write folds once they are past the first's 20.
    assert gens == [list(range(g + 2)) for g in range(6)]
    store.write([CopyWrite(7, "p", {"k0": 99}, {})])           # 24 later entries: folds
    expect["k0"] = 99
    assert {node_store._generation(k) for k, _ in segments_of(store, 7)} == {0}
    assert store.load().copies[7].states == expect
    assert store.segments[7].first == len(expect) and store.segments[7].later == 0
    store.close()


def test_a_store_not_read_yet_writes_its_change_as_the_next_generation(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    store.write([CopyWrite(3, "p", {"a": 1, "b": 1}, {}, True)])
    store.write([CopyWrite(3, "p", {"a": 2}, {})])
    store.close()
    store = NodeStore(tmp_path)                                # not loaded: looked up
    store.write([CopyWrite(3, "p", {"b": 5}, {})])
    assert [node_store._generation(k) for k, _ in segments_of(store, 3)] == [0, 1, 2]
    assert store.load().copies[3].states == {"a": 2, "b": 5}
    store.close()


@pytest.mark.parametrize("damage", ["checksum", "frame"])
def test_a_damaged_segment_is_its_range_corrupt_and_named(tmp_path, monkeypatch, damage):
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    states = {t: {f"k{t}-{i}": i for i in range(300)} for t in (10, 20, 30)}
    store.write([CopyWrite(t, "p", s, {"s": t}, True) for t, s in states.items()])
    store.write([CopyWrite(20, "p", {"k20-1": 50}, {"s": 21})])
    key, value = segments_of(store, 20)[-1]
    if damage == "checksum":
        bad = value[:-1] + bytes([value[-1] ^ 0xFF])
    else:                       # a checksum that matches a frame of another version
        frame = bytearray(value[4:])
        frame[3] = 9
        bad = node_store.segment_value(bytes(frame))
    store._write([(key, bad)], [], sync=True)
    loaded = store.load()
    assert list(loaded.corrupt) == [20]
    why = loaded.corrupt[20]
    assert "segment 0 of generation 1" in why
    assert ("checksum does not match" if damage == "checksum" else "frame version 9") in why
    assert {t: c.states for t, c in loaded.copies.items()} == \
        {t: s for t, s in states.items() if t != 20}
    # A fold never folds what does not read back: the change goes as a generation.
    monkeypatch.setattr(node_store, "FOLD_GENERATIONS", 1)
    store.write([CopyWrite(20, "p", {"x": 1}, {})])
    assert 20 in store.load().corrupt
    store.close()


def test_a_directory_of_the_earlier_format_is_read_and_takes_segments_over_it(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    old = {4: dict(MIXED), 8: {f"w{i}": i for i in range(50)}}
    write_per_key(store, [CopyWrite(t, "p", s, {"s": 1}, True) for t, s in old.items()])
    assert store.db.get(node_store.VERSION) is None      # as an earlier floe left it
    store.close()
    store, loaded, quarantined = open_store(tmp_path)
    assert not quarantined and not loaded.corrupt
    assert {t: c.states for t, c in loaded.copies.items()} == old
    # A restart writes what its replay changed: a generation over the entries.
    store.write([CopyWrite(8, "p", {"w3": -1, "w99": 9}, {"s": 2})])
    old[8].update({"w3": -1, "w99": 9})
    assert store.load().copies[8].states == old[8]
    assert store.db.get(node_store.VERSION) == bytes([node_store.FORMAT])
    store.write([CopyWrite(8, "p", old[8], {"s": 3}, True)])   # whole: entries gone
    assert [k for k, _ in store.db.items(from_key=node_store._key_prefix(8))
            if k.startswith(node_store._key_prefix(8))] == [segment_key(8, 0, 0)]
    assert {t: c.states for t, c in store.load().copies.items()} == old
    store.close()


def test_a_directory_of_a_newer_format_is_refused_naming_the_way_out(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    store._write([(node_store.VERSION, bytes([node_store.FORMAT + 1]))], [], sync=True)
    store.close()
    with pytest.raises(NewerFormat, match=r"store format 3.*--wipe"):
        open_store(tmp_path)
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}.corrupt-*"))   # not moved aside


def test_a_node_on_a_directory_of_a_newer_format_stops_saying_why(tmp_path):
    import socket
    import subprocess
    import sys
    store = NodeStore(tmp_path / "d")
    store.save_identity("n0", 1)
    store._write([(node_store.VERSION, bytes([node_store.FORMAT + 1]))], [], sync=True)
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "floering.node", "--node-id", "n0",
                           "--listen", f"127.0.0.1:{port}", "--peers", f"n0=127.0.0.1:{port}",
                           "--replication", "0", "--insecure", "--data-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "store format 3" in done.stderr and "floe down --wipe" in done.stderr
    assert "Traceback" not in done.stderr


def test_one_write_folds_ranges_up_to_its_budget_and_the_rest_in_later_writes(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(node_store, "FOLD_GENERATIONS", 2)
    monkeypatch.setattr(node_store, "FOLD_BUDGET", 5)
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    expect = {t: {f"k{t}-{i}": i for i in range(8)} for t in (1, 2, 3)}
    store.write([CopyWrite(t, "p", dict(s), {}, True) for t, s in expect.items()])

    def round_(n):
        for t in expect:
            expect[t][f"k{t}-0"] = n
        store.write([CopyWrite(t, "p", {f"k{t}-0": n}, {}) for t in expect])
        return [max(node_store._generation(k) for k, _ in segments_of(store, t)) for t in expect]

    assert round_(1) == [1, 1, 1] and round_(2) == [2, 2, 2]
    assert round_(3) == [0, 3, 3]          # the first's 8 entries spend the budget of 5
    assert round_(4) == [1, 0, 4]
    assert round_(5) == [2, 1, 0]
    assert {t: c.states for t, c in store.load().copies.items()} == expect
    store.close()


def test_the_storage_bench_reads_back_what_it_wrote_in_both_formats(tmp_path, monkeypatch,
                                                                    capsys):
    from floering.chaos import storage_bench
    monkeypatch.setattr(storage_bench, "drop_caches", lambda: False)
    assert storage_bench.main(["--node", "--keys", "3000", "--delta", "400", "--rounds", "3",
                               "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "one entry a key (format 1)" in out and "segments (format 2)" in out


def test_a_tables_changes_fold_as_frames_exact(tmp_path, monkeypatch):
    """A table range's checkpoints (an export's columns and spill's dict) fold with the
    segments read back as frames, in a scratch table: no dict is made of either."""
    from floering.node.core.reducers import Count
    from floering.node.core.state_wire import Layers, StateColumns
    from floering.node.core.table_state import TableState
    monkeypatch.setattr(node_store, "FOLD_ENTRIES", 10)
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    state = TableState(Count())
    first = [f"k{i}" for i in range(200)]
    state.apply(first, [1] * 200)
    expect = {k: 1 for k in first}
    store.write([CopyWrite(7, "p", state.snapshot(), {}, True)])
    state.swap()
    state.merge_inactive()
    gens = []
    for round_ in range(8):
        keys = [f"k{i}" for i in range(round_, 200, 7)] + [f"n{round_}-{i}" for i in range(20)]
        state.apply(keys, [round_ + 1] * len(keys))
        for k in keys:
            expect[k] = expect.get(k, 0) + round_ + 1
        if round_ >= 6:                       # spill (past int64): its keys as a dict
            state.merge_in([b"big"], [2 ** 70 + round_])
            expect[b"big"] = expect.get(b"big", 0) + 2 ** 70 + round_
        change = state.swap()
        with monkeypatch.context() as m:      # folds and plain rounds make no dict
            if round_ < 6:
                for cls in (StateColumns, Layers):
                    m.setattr(cls, "to_dict", lambda self: pytest.fail("a dict was made"))
            store.write([CopyWrite(7, "p", change, {})])
        state.merge_inactive()
        gens.append(max(node_store._generation(k) for k, _ in segments_of(store, 7)))
    assert 0 in gens[:6]                      # folded, before spill held a key
    assert store.load().copies[7].states == expect == dict(state.snapshot())
    store.close()
