"""Durable nodes (--data-dir): the disk is one more replica of every range a node
holds. The store and the restore path in one process, then real node processes
killed together (SIGKILL, and a power loss that tears every log's tail) and
restarted on their data directories, exact against an independent count."""

from collections import Counter

import pytest

from floering.node.core.batch import Batch, Limits, encode_payload
from floering.node.core.node_core import NodeCore
from floering.node.core.persistence import DiskPlan
from floering.node.core.persistence_io import Began, WriteCopies
from floering.node.core.reducers import load_reducer
from floering.node.core.restore import DiskCopy, restored_core
from floering.wire.ring import Ring
from floering.node.storage import node_store
from floering.node.storage.node_store import CopyWrite, NodeStore
from tests.support.simulation import Simulation
from tests.support.simulation_shared import check

RING = Ring.initial({"p": "127.0.0.1:1", "b": "127.0.0.1:2"}, 1, 2)


def words_of(token: int, n: int, ring: Ring = RING) -> list[str]:
    return [k for k in (f"w{i}" for i in range(20 * n)) if ring.token_for_key(k) == token][:n]


def feed(core: NodeCore, store: NodeStore, token: int, keys, seq: int) -> int:
    b = Batch(core.ring.stamp, token, "s", seq, seq + len(keys) - 1, len(keys),
              encode_payload(keys, [1] * len(keys)))
    assert core.receive_batch(b).applied == len(keys)
    store.append_batch(b)
    return seq + len(keys)


def cut_and_write(core: NodeCore, store: NodeStore) -> None:
    core.plan_checkpoints()
    store.write([CopyWrite(c.token, core.node_id, c.states, dict(c.watermarks))
                 for c in core.cuts])
    for token in core.primaries:
        core.checkpoint_done(token)


def test_a_core_comes_back_from_its_copies_and_the_batches_logged_past_them(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 7)
    core = NodeCore("p", RING, load_reducer("count"))
    t1, t2 = RING.tokens_of("p")
    seq = feed(core, store, t1, words_of(t1, 30), 1)
    seq = feed(core, store, t2, words_of(t2, 30), seq)
    cut_and_write(core, store)                     # copies cover these...
    seq = feed(core, store, t1, words_of(t1, 10), seq)    # ...not these: only the log
    store.close()

    store = NodeStore(tmp_path)
    loaded = store.load()
    assert (loaded.node_id, loaded.incarnation) == ("p", 7)
    back = restored_core("p", RING, load_reducer("count"), Limits(), loaded.copies,
                         loaded.batches, now=0.0)
    assert dict(back.items()) == dict(core.items())
    assert back.primaries[t1].watermarks == core.primaries[t1].watermarks
    # replaying again changes nothing: the watermarks make the log idempotent
    again = restored_core("p", RING, load_reducer("count"), Limits(), loaded.copies,
                          loaded.batches + loaded.batches, now=0.0)
    assert dict(again.items()) == dict(core.items())


def test_a_batch_logged_under_a_token_cut_since_goes_to_the_range_holding_it(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 7)
    core = NodeCore("p", RING, load_reducer("count"))
    t1 = RING.tokens_of("p")[0]
    lo, _ = RING.range_of_token(t1)
    cut = (lo + (t1 - lo) % 2 ** 64 // 2) % 2 ** 64
    split = RING.split_token(t1, cut)
    words = words_of(t1, 40)
    head = [w for w in words if split.token_for_key(w) == cut]
    assert head and len(head) < len(words)
    feed(core, store, t1, words, 1)
    store.close()
    store = NodeStore(tmp_path)
    loaded = store.load()
    back = restored_core("p", split, load_reducer("count"), Limits(), {}, loaded.batches, 0.0)
    assert dict(back.primaries[cut].state.snapshot()) == Counter(head)
    assert sum(back.primaries[t1].state.snapshot().values()) == len(words) - len(head)


def test_a_replicas_copy_and_backups_come_back_as_a_replica(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("b", 9)
    primary = NodeCore("p", RING, load_reducer("count"))
    replica = NodeCore("b", RING, load_reducer("count"))
    t1 = RING.tokens_of("p")[0]
    words = words_of(t1, 20)
    for i, w in enumerate(words, 1):
        b = Batch(RING.stamp, t1, "s", i, i, 1, encode_payload([w], [1]))
        primary.receive_batch(b)
        replica.receive_batch(b)
        store.append_batch(b)
        if i == 10:
            for s in primary.plan_checkpoints():
                cp = s.checkpoint
                replica.receive_checkpoint("p", RING.stamp, cp.token, cp.seq, s.base_seq,
                                           cp.full, dict(cp.states), dict(cp.watermarks))
                store.write([CopyWrite(cp.token, "p", dict(cp.states), dict(cp.watermarks),
                                       cp.full)])
                primary.checkpoint_done(cp.token)
    store.close()
    loaded = NodeStore(tmp_path).load()
    back = restored_core("b", RING, load_reducer("count"), Limits(), loaded.copies,
                         loaded.batches, 0.0)
    assert back.replicas.backups.tuples_of(t1) == 10          # past the copy's watermark
    assert back.replicas.rebuild(t1)[0] == primary.primaries[t1].state.snapshot()


def test_a_restart_writes_back_what_the_replay_changed_and_then_the_copies_hold_it_all(tmp_path):
    store = NodeStore(tmp_path)
    store.save_identity("p", 7)
    store.write([], ring_wire=RING.to_wire())
    core = NodeCore("p", RING, load_reducer("count"))
    t1, t2 = RING.tokens_of("p")
    seq = feed(core, store, t1, words_of(t1, 30), 1)
    seq = feed(core, store, t2, words_of(t2, 30), seq)
    cut_and_write(core, store)
    feed(core, store, t1, words_of(t1, 40), seq)          # past the copies: only logged
    store.sync_now()
    store.close()

    store = NodeStore(tmp_path)
    loaded = store.load()
    back = restored_core("p", RING, load_reducer("count"), Limits(), loaded.copies,
                         loaded.batches, 0.0)
    plan = DiskPlan(7, store.log.next_seq, store.log.next_seq - 1)
    (write,) = [e for e in plan.handle(Began(back, "p", RING, frozenset(loaded.copies)))
                if isinstance(e, WriteCopies)]
    assert not write.replace_all
    assert {c.token: len(c.states) for c in write.copies if not c.full} == {t1: 40, t2: 0}
    store.write(write.copies, write.dropped, write.ring_wire, write.replace_all)
    store.drop_log_before(store.log.next_seq)              # the copies alone now
    store.close()

    store = NodeStore(tmp_path)
    loaded = store.load()
    again = restored_core("p", RING, load_reducer("count"), Limits(), loaded.copies, [], 0.0)
    assert dict(again.items()) == dict(core.items())
    assert {t: r.watermarks for t, r in again.primaries.items()} == \
        {t: r.watermarks for t, r in core.primaries.items()}
    store.close()


def test_copies_are_read_back_exact_across_runs_and_a_value_that_does_not_decode_is_its_range_corrupt(
        tmp_path, monkeypatch):
    monkeypatch.setattr(node_store, "RUN", 3)                  # tokens cut across runs
    store = NodeStore(tmp_path)
    store.save_identity("p", 7)
    states = {1: {"a": 1, b"b": 2, 3: 2 ** 70}, 2: {}, 5: {f"k{i}": (i, "x") for i in range(7)},
              2 ** 64 - 1: {"z": None}}
    store.write([CopyWrite(t, "p", s, {"s": t}, True) for t, s in states.items()])
    store._write([(node_store.KEYS + node_store.TOKEN.pack(4) + b"\xa1q", b"\x01")], [],
                 sync=True)                                     # no copy of token 4: ignored
    assert {t: c.states for t, c in store.load().copies.items()} == states
    store._write([(node_store.KEYS + node_store.TOKEN.pack(5) + b"\xa1q", b"\xc1")], [],
                 sync=True)                                     # 0xc1 is never msgpack
    loaded = store.load()
    assert {t: c.states for t, c in loaded.copies.items()} == \
        {t: s for t, s in states.items() if t != 5}             # the others, whole
    assert list(loaded.corrupt) == [5] and "does not decode" in loaded.corrupt[5]
    store.close()


def flip_a_byte_mid_file(path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)[0]
        f.seek(size // 2)
        f.write(bytes([byte ^ 0xFF]))


def test_a_damaged_block_leaves_out_the_ranges_in_it_and_reads_every_other_exact(tmp_path):
    """RocksDB's own iteration just ends at a block failing its checksum (only the
    iterator's status says why): read as it was, every range after the damage came
    back empty, served as if whole. Per range now: the damaged ones are named, every
    other is read back exact."""
    store = NodeStore(tmp_path)
    store.save_identity("p", 1)
    states = {t * 1000: {f"k{t}-{i}": i for i in range(2000)} for t in range(1, 9)}
    store.write([CopyWrite(t, "p", s, {"s": t}, True) for t, s in states.items()])
    store.db.flush()                                    # into a table file, in blocks
    store.close()
    tables = list((tmp_path / "state").glob("*.sst"))
    assert len(tables) == 1
    flip_a_byte_mid_file(tables[0])
    store = NodeStore(tmp_path)
    loaded = store.load()
    store.close()
    assert loaded.corrupt and set(loaded.corrupt) | set(loaded.copies) == set(states)
    assert all(tables[0].name in why and "checksum" in why for why in loaded.corrupt.values())
    assert max(loaded.copies) > max(loaded.corrupt)     # read on past the damage
    assert {t: c.states for t, c in loaded.copies.items()} == \
        {t: states[t] for t in loaded.copies}


def test_a_member_whose_copy_of_a_range_it_owned_is_corrupt_gives_the_range_to_its_heir():
    ring = Ring.initial({"p": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.1:3"}, 1, 2)
    mine, backed = ring.tokens_of("p")[0], ring.tokens_of("c")[0]
    assert ring.role_of("p", backed) == "replica"
    copies = {t: DiskCopy(t, ring.owner_of_token(t), {"s": 5}, True, {"x": 1})
              for t in ring.tokens if ring.role_of("p", t)}
    core = restored_core("p", ring, load_reducer("count"), Limits(),
                         {t: c for t, c in copies.items() if t not in (mine, backed)}, [], 0.0,
                         corrupt=frozenset({mine, backed}))
    heir = ring.heir(mine)
    assert core.ring.version == ring.version + 1 and core.ring.owner_of_token(mine) == heir
    assert mine not in core.primaries and not core.replicas.is_complete(mine)
    assert not core.replicas.is_complete(backed)     # a full checkpoint makes it whole
    assert not core.ring.lost and core.ring.tokens_of("p") == ring.tokens_of("p")[1:]
    # What the heir does with that ring: takes the range over from its complete copy.
    b = NodeCore(heir, ring, load_reducer("count"), Limits())
    b.replicas.adopt_copy(mine, "p", {"x": 1}, {"s": 5})
    change = b.adopt_ring(core.ring)
    assert change.taken_over == (mine,) and b.get("x") == (True, 1)
    # With nobody else holding it (r=0) the range is lost, never served empty.
    alone = Ring.initial({"p": "127.0.0.1:1"}, 0, 2)
    t = alone.tokens[0]
    core = restored_core("p", alone, load_reducer("count"), Limits(), {}, [], 0.0,
                         corrupt=frozenset({t}))
    assert core.ring.lost == {t} and t in core.lost_tokens


def test_a_log_behind_every_copy_comes_back_as_the_copies_alone():
    p, b = RING.tokens_of("p"), RING.tokens_of("b")            # p backs up b's ranges
    batches, seq = [], 1
    for t in (*p, *b):
        keys = words_of(t, 5)
        batches.append((t, Batch(0, t, "s", seq, seq + 4, 5, encode_payload(keys, [1] * 5))))
        seq += 5
    copies = lambda mark: {t: DiskCopy(t, "p" if t in p else "b", {"s": mark}, True, {"x": 1})
                           for t in (*p, *b)}
    covered = restored_core("p", RING, load_reducer("count"), Limits(), copies(seq - 1),
                            batches, 0.0)
    copies_only = {t: {"x": 1} for t in p}
    assert {t: r.state.snapshot() for t, r in covered.primaries.items()} == copies_only
    assert covered.replicas.backups.tuples == 0                 # nothing replayed or kept
    # one copy behind: the batches are read, each going where its keys are
    behind = copies(seq - 1)
    behind[b[1]].watermarks = {"s": 0}
    back = restored_core("p", RING, load_reducer("count"), Limits(), behind, batches, 0.0)
    assert {t: r.state.snapshot() for t, r in back.primaries.items()} == copies_only
    assert back.replicas.backups.tuples == back.replicas.backups.tuples_of(b[1]) == 5


# ------------------------------------------------ simulated, crashed twice

def slow_copy_writes(sim: Simulation, name: str, seconds: float) -> None:
    sim.process(name).durable.disk.write_delay = seconds


@pytest.mark.parametrize("seed", range(8))
def test_a_second_crash_during_the_restart_write_loses_nothing_acknowledged(seed):
    # n1 loses power and comes back from its disk as the same member; its first copy
    # write (what the replay of its log changed) takes half a second, as a large
    # node's does, while its log goes on being synced. It loses power again before
    # that write is done: the old log must still hold what its copies do not.
    sim = Simulation(seed, nodes=4, replication=1, tokens=2, durable=True)
    faults = [(0.8, slow_copy_writes, (sim, "n1", 0.5)), (0.8, sim.crash, ("n1", 0.0)),
              (0.9, sim.crash, ("n1", 0.0)), (1.0, slow_copy_writes, (sim, "n1", 0.0))]
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    assert sum(" starts from its disk as n1" in line for line in sim.log) == 2, sim.log
    check(sim, seed)


# ------------------------------------------------------- real processes
