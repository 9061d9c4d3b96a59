"""Durable mode's plan alone (node.core.persistence): events in, effects out, no disk."""

from floering.node.core.batch import Batch, encode_payload
from floering.node.core.node_core import NodeCore
from floering.node.core.persistence import DiskPlan
from floering.node.core.persistence_io import (AcceptBatches, AckWanted, AppendRecord, Began,
                                      BatchKept, CheckpointMerged, CompactLog, CopiesWritten,
                                      DiskFailed, DiskRepaired, FailAcks, LogSynced,
                                      RefuseBatches, ReleaseAcks, SaveIdentity,
                                      SyncLog, SyncWanted, WriteCopies)
from floering.node.core.batch import Limits
from floering.node.core.reducers import load_reducer
from floering.node.core.restore import DiskCopy, restored_core
from floering.wire.ring import Ring
from floering.node.storage.node_store import NodeStore

RING = Ring.initial({"p": "a:1", "b": "a:2", "c": "a:3"}, 1, 2)


def words_of(token: int, n: int, ring: Ring = RING) -> list[str]:
    return [k for k in (f"w{i}" for i in range(40 * n)) if ring.token_for_key(k) == token][:n]


def started(node: str = "p") -> tuple[DiskPlan, NodeCore, list]:
    core = NodeCore(node, RING, load_reducer("count"))
    plan = DiskPlan(incarnation=7)
    return plan, core, plan.handle(Began(core, None))


def keep(plan: DiskPlan, core: NodeCore, token: int, keys: list, seq: int) -> list:
    b = Batch(core.ring.stamp, token, "s", seq, seq + len(keys) - 1, len(keys),
              encode_payload(keys, [1] * len(keys)))
    return plan.handle(BatchKept(b, core.receive_batch(b).applied))


def of(kind, effects) -> list:
    return [e for e in effects if isinstance(e, kind)]


def done(plan: DiskPlan, effects) -> list:
    """Every write of `effects` done, in order; the effects that follows."""
    out = []
    for w in of(WriteCopies, effects):
        out += plan.handle(CopiesWritten(w.write))
    return out


def test_a_new_directory_is_named_then_written_whole_with_the_ring():
    plan, core, effects = started()
    assert effects[0] == SaveIdentity("p", 7)
    (whole,) = of(WriteCopies, effects)
    assert whole.replace_all and whole.ring_wire == RING.to_wire()
    assert {c.token for c in whole.copies} == set(core.primaries) | set(core.replicas.ranges)


def test_an_ack_waits_for_the_fsync_of_everything_logged_so_far():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    assert of(AppendRecord, keep(plan, core, t, words_of(t, 3), 1))[0].record == 1
    assert plan.handle(AckWanted(1)) == [SyncLog()]
    # a duplicate is not logged, and its ack waits for the batch it repeats
    assert keep(plan, core, t, words_of(t, 3), 1) == []
    assert plan.handle(AckWanted(2)) == [SyncLog()]
    assert plan.handle(LogSynced(1)) == [ReleaseAcks((1, 2))]
    assert plan.handle(AckWanted(3)) == [ReleaseAcks((3,))]


def test_a_written_cut_covers_the_records_logged_before_it_and_the_log_goes():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    keep(plan, core, t, words_of(t, 3), 1)
    keep(plan, core, t, words_of(t, 2), 4)
    plan.handle(LogSynced(2))
    core.plan_checkpoints()
    cut = plan.after(core)
    (write,) = of(WriteCopies, cut)
    assert not write.copies[0].full and write.copies[0].watermarks == {"s": 5}
    keep(plan, core, t, words_of(t, 1), 6)                   # after the cut: not covered
    assert plan.handle(CopiesWritten(write.write)) == [CompactLog(3)]


def test_a_write_covers_nothing_logged_after_it_was_taken():
    plan, core, effects = started("b")
    done(plan, effects)
    t = RING.tokens_of("p")[0]                               # b backs up p's range
    (merged,) = of(WriteCopies, plan.handle(CheckpointMerged(t, "p", {}, {"s": 10}, False)))
    keep(plan, core, t, words_of(t, 2), 4)                   # seqs 4-5, below 10, later
    plan.handle(LogSynced(1))
    assert of(CompactLog, plan.handle(CopiesWritten(merged.write))) == []
    assert plan.uncovered[t]["s"][0][0] == 1


def test_a_split_range_keeps_a_backed_up_record_until_every_part_covers_it():
    plan, core, effects = started("b")
    done(plan, effects)
    t = RING.tokens_of("p")[0]                               # b backs up p's range
    keep(plan, core, t, words_of(t, 10), 1)
    plan.handle(LogSynced(1))
    lo, _ = RING.range_of_token(t)
    head = (lo + (t - lo) % 2 ** 64 // 2) % 2 ** 64
    core.adopt_ring(RING.split_token(t, head))
    (whole,) = of(WriteCopies, plan.after(core))
    assert {c.token for c in whole.copies} == {t, head}
    assert set(plan.uncovered) == {t, head}
    plan.handle(CopiesWritten(whole.write))
    (tail,) = of(WriteCopies, plan.handle(CheckpointMerged(t, "p", {}, {"s": 10}, True)))
    assert of(CompactLog, plan.handle(CopiesWritten(tail.write))) == []
    (part,) = of(WriteCopies, plan.handle(CheckpointMerged(head, "p", {}, {"s": 10}, True)))
    assert plan.handle(CopiesWritten(part.write)) == [CompactLog(2)]


def test_a_range_handed_away_keeps_its_records_until_the_write_dropping_it_is_done():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    keep(plan, core, t, words_of(t, 3), 1)
    plan.handle(LogSynced(1))
    ring = RING.with_owners({t: "c"})
    core.adopt_ring(ring)
    assert ring.role_of("p", t) is None
    (drop,) = of(WriteCopies, plan.after(core))
    assert t in drop.dropped
    assert plan.uncovered == {}
    assert of(CompactLog, plan.handle(CopiesWritten(drop.write))) == [CompactLog(2)]


def test_a_failed_disk_fails_the_waiting_acks_refuses_and_rewrites_everything_when_repaired():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    keep(plan, core, t, words_of(t, 3), 1)
    plan.handle(AckWanted(1))
    core.plan_checkpoints()
    (pending,) = of(WriteCopies, plan.after(core))
    failed = plan.handle(DiskFailed("no space left"))
    assert FailAcks((1,), "no space left") in failed and RefuseBatches("no space left") in failed
    assert plan.handle(AckWanted(2)) == [FailAcks((2,), "no space left")]
    assert plan.handle(CopiesWritten(pending.write)) == []   # queued before: covers nothing
    core.plan_checkpoints()
    assert of(WriteCopies, plan.after(core)) == []            # cuts wait for the rewrite
    assert plan.handle(DiskRepaired(1)) == [AcceptBatches()]
    (rewrite,) = of(WriteCopies, plan.after(core))
    assert rewrite.replace_all


def test_a_rejoined_member_wipes_the_directory_and_numbers_on():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    keep(plan, core, t, words_of(t, 3), 1)
    plan.handle(AckWanted(1))
    fresh = NodeCore("p#1", RING.without(["p"]).add_node("p#1", "a:1", (), 8),
                     load_reducer("count"))
    effects = plan.after(fresh)
    assert effects[0] == SaveIdentity("p#1", 7)
    assert of(FailAcks, effects) and of(WriteCopies, effects)[0].replace_all
    b = Batch(0, t, "s", 9, 9, 1, encode_payload(["x"], [1]))
    assert of(AppendRecord, plan.handle(BatchKept(b, 1)))[0].record == 2


def test_a_member_back_from_its_directory_logs_its_backups_again_before_the_old_log_goes():
    primary = NodeCore("p", RING, load_reducer("count"))
    replica = NodeCore("b", RING, load_reducer("count"))
    t = RING.tokens_of("p")[0]
    for i, w in enumerate(words_of(t, 4), 1):
        b = Batch(RING.stamp, t, "s", i, i, 1, encode_payload([w], [1]))
        primary.receive_batch(b)
        replica.receive_batch(b)
    plan = DiskPlan(7, next_record=10, synced=9)
    effects = plan.handle(Began(replica, "b"))
    assert [a.record for a in of(AppendRecord, effects)] == [10, 11, 12, 13]
    assert SyncLog() in effects and not of(SaveIdentity, effects)
    assert of(CompactLog, done(plan, effects)) == []         # not synced yet: the old log stays
    assert of(CompactLog, plan.handle(LogSynced(13))) == [CompactLog(10)]


def test_an_emptied_log_numbers_on(tmp_path):
    store = NodeStore(tmp_path)
    b = Batch(0, 1, "s", 1, 1, 1, encode_payload(["x"], [1]))
    assert [store.append_batch(b) for _ in range(3)] == [1, 2, 3]
    store.reset_log()
    assert store.append_batch(b) == 4
    store.sync_now()
    store.close()
    again = NodeStore(tmp_path)
    assert [r for r, _ in again.log] == [4] and again.log.next_seq == 5
    again.close()


def test_a_merged_checkpoint_is_acknowledged_once_its_copy_is_on_disk():
    plan, core, effects = started("b")
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    (write,) = of(WriteCopies, plan.handle(CheckpointMerged(t, "p", {"k": 1}, {"s": 3}, True,
                                                            ticket=5)))
    assert plan.handle(CopiesWritten(write.write)) == [ReleaseAcks((5,))]
    (write,) = of(WriteCopies, plan.handle(CheckpointMerged(t, "p", {}, {"s": 4}, False, 6)))
    assert FailAcks((6,), "disk full") in plan.handle(DiskFailed("disk full"))


def test_a_ring_change_that_leaves_the_ranges_held_alone_is_written_alone():
    plan, core, effects = started("c")
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    assert RING.role_of("c", t) is None
    core.adopt_ring(RING.with_extras({t: ["c"]}))          # a new extra, no copy yet
    (write,) = of(WriteCopies, plan.after(core))
    assert write.copies == () and write.ring_wire == core.ring.to_wire()
    assert plan.after(core) == []


def test_a_duplicates_ack_also_waits_for_the_copies_written_so_far():
    plan, core, effects = started("b")
    done(plan, effects)
    t = RING.tokens_of("p")[0]                               # b backs up p's range
    core.receive_checkpoint("p", RING.stamp, t, 1, 0, True, {}, {"s": 3})
    (write,) = of(WriteCopies, plan.handle(CheckpointMerged(t, "p", {}, {"s": 3}, True, 9)))
    assert keep(plan, core, t, words_of(t, 3), 1) == []      # the copy in memory holds it
    assert plan.handle(AckWanted(1)) == []
    assert plan.handle(CopiesWritten(write.write)) == [ReleaseAcks((1,)), ReleaseAcks((9,))]


def test_a_replica_holds_what_it_acks_after_a_primary_back_from_its_disk_took_its_copy_back():
    # p applied 4-6 and shipped it; back from its disk without it (never synced
    # there), its full checkpoint takes b's copy back to 3: b must hold the resent
    # 4-6 again, though it holds a later batch (10-12) p never got.
    t = RING.tokens_of("p")[0]
    words = words_of(t, 12)
    batches = [Batch(RING.stamp, t, "s", i, i + 2, 3, encode_payload(words[i - 1:i + 2], [1] * 3))
               for i in (1, 4, 10)]
    p = NodeCore("p", RING, load_reducer("count"))
    b = NodeCore("b", RING, load_reducer("count"))
    for x in batches[:2]:
        p.receive_batch(x)
        b.receive_batch(x)
    for s in p.plan_checkpoints():
        cp = s.checkpoint
        b.receive_checkpoint("p", RING.stamp, t, cp.seq, s.base_seq, cp.full, dict(cp.states),
                             dict(cp.watermarks))
    b.receive_batch(batches[2])
    back = NodeCore("p", RING, load_reducer("count"))            # p, back from its disk
    back.receive_batch(batches[0])
    (s,) = [s for s in back.plan_checkpoints() if s.replica == "b" and s.checkpoint.token == t]
    cp = s.checkpoint
    assert cp.full and cp.watermarks == {"s": 3}
    b.receive_checkpoint("p", RING.stamp, t, cp.seq, 0, True, dict(cp.states), dict(cp.watermarks))
    assert b.receive_batch(batches[1]).applied == 3                 # resent: acknowledged...
    state, _ = b.replicas.rebuild(t)
    assert sum(state.values()) == 9                                  # ...and held


def test_a_round_ships_once_everything_logged_is_synced_and_not_while_the_disk_fails():
    plan, core, effects = started()
    done(plan, effects)
    t = RING.tokens_of("p")[0]
    keep(plan, core, t, words_of(t, 3), 1)
    assert plan.handle(SyncWanted(1)) == [SyncLog()]
    assert plan.handle(LogSynced(1)) == [ReleaseAcks((1,))]
    assert plan.handle(SyncWanted(2)) == [ReleaseAcks((2,))]    # nothing new: at once
    keep(plan, core, t, words_of(t, 1), 4)
    plan.handle(DiskFailed("disk full"))
    assert plan.handle(SyncWanted(3)) == [FailAcks((3,), "disk full")]


def test_a_member_back_from_its_directory_compacts_nothing_before_its_restart_write_is_done():
    # p's old log holds records 1-9, batches past its copy on disk. They are covered
    # once the restart's write is done, not once the log is synced (the fsync of a
    # few records is over long before the write of millions of keys).
    p = NodeCore("p", RING, load_reducer("count"))
    t = RING.tokens_of("p")[0]
    for i, w in enumerate(words_of(t, 4), 1):
        p.receive_batch(Batch(RING.stamp, t, "s", i, i, 1, encode_payload([w], [1])))
    plan = DiskPlan(7, next_record=10, synced=9)
    (restart,) = of(WriteCopies, plan.handle(Began(p, "p")))
    assert of(CompactLog, plan.handle(LogSynced(9))) == []
    assert of(CompactLog, plan.handle(DiskFailed("disk full"))) == []      # nor after a failure
    assert of(CompactLog, plan.handle(CopiesWritten(restart.write))) == []
    assert of(CompactLog, plan.handle(DiskRepaired(9))) == []
    (rewrite,) = of(WriteCopies, plan.after(p))
    assert rewrite.replace_all
    assert plan.handle(CopiesWritten(rewrite.write)) == [CompactLog(10)]


def restarted_p(batches) -> tuple[NodeCore, frozenset]:
    """p back from a directory holding copies of its first range (a, b once each, up
    to seq 2), of c's first range it backs up, and of b's first range, which it does
    not hold; and the tokens of those copies."""
    mine, theirs, gone = RING.tokens_of("p")[0], RING.tokens_of("c")[0], RING.tokens_of("b")[0]
    a, b = words_of(mine, 2)
    copies = {mine: DiskCopy(mine, "p", {"s": 2}, True, {a: 1, b: 1}),
              theirs: DiskCopy(theirs, "c", {"s": 5}, True, {"x": 3}),
              gone: DiskCopy(gone, "b", {}, True, {"y": 1})}
    return (restored_core("p", RING, load_reducer("count"), Limits(), copies, batches, 0.0),
            frozenset(copies))


def test_a_member_back_from_its_directory_writes_only_what_the_replay_changed():
    mine, theirs = RING.tokens_of("p")[0], RING.tokens_of("c")[0]
    a, _, c = words_of(mine, 3)
    logged = [Batch(0, mine, "s", 2, 4, 3, encode_payload([a, a, c], [1] * 3))]
    core, on_disk = restarted_p([(mine, x) for x in logged])
    assert core.primaries[mine].state.active == {a: 2, c: 1}        # seq 2 was in the copy
    plan = DiskPlan(7, next_record=2, synced=1)
    (write,) = of(WriteCopies, plan.handle(Began(core, "p", RING, on_disk)))
    assert not write.replace_all and write.ring_wire == RING.to_wire()
    assert write.dropped == (RING.tokens_of("b")[0],)
    by_token = {c.token: c for c in write.copies}
    assert not by_token[mine].full and by_token[mine].states == {a: 2, c: 1}
    assert by_token[mine].watermarks == {"s": 4}
    assert not by_token[theirs].full and by_token[theirs].states == {}     # meta only
    assert by_token[theirs].watermarks == {"s": 5} and by_token[theirs].primary == "c"
    for token in (RING.tokens_of("p")[1], RING.tokens_of("c")[1]):   # no copy on disk
        assert by_token[token].full


def test_a_range_changed_since_its_copy_was_read_is_written_whole_after_a_restart():
    mine = RING.tokens_of("p")[0]
    core, on_disk = restarted_p([])
    lo, _ = RING.range_of_token(mine)
    head = (lo + (mine - lo) % 2 ** 64 // 2) % 2 ** 64
    core.adopt_ring(RING.split_token(mine, head))       # a newer ring heard at start
    plan = DiskPlan(7)
    (write,) = of(WriteCopies, plan.handle(Began(core, "p", RING, on_disk)))
    by_token = {c.token: c for c in write.copies}
    assert by_token[mine].full and by_token[head].full
    assert sum(len(by_token[t].states) for t in (mine, head)) == 2


def test_a_restart_drops_the_damaged_copies_and_writes_the_ring_that_gave_them_away():
    """p's copies of its own first range and of c's range it backs up did not read
    back: the first went to its heir (the restored core's ring says so), the second
    is missing until c ships a full checkpoint. Neither stays on disk, the rest is
    written as after any restart, and the ring written is the one with the change."""
    mine, theirs = RING.tokens_of("p")[0], RING.tokens_of("c")[0]
    core, on_disk = restarted_p([])
    copies = {t: DiskCopy(t, RING.owner_of_token(t), {"s": 1}, True, {"x": 1})
              for t in on_disk - {mine, theirs}}
    core = restored_core("p", RING, load_reducer("count"), Limits(), copies, [], 0.0,
                         corrupt=frozenset({mine, theirs}))
    assert core.ring.owner_of_token(mine) == RING.heir(mine)
    plan = DiskPlan(7)
    (write,) = of(WriteCopies, plan.handle(Began(core, "p", RING, frozenset(copies),
                                                 frozenset({mine, theirs}))))
    assert mine in write.dropped and theirs in write.dropped
    assert not {mine, theirs} & {c.token for c in write.copies}
    assert write.ring_wire == core.ring.to_wire()


def test_a_whole_write_of_table_ranges_takes_their_columns_not_a_dict_of_every_key(tmp_path):
    """A range held in the state table is written whole as its export's columns (and
    spill) laid as layers: no dict of every key is made while the write is planned on
    the event loop (a 1 s step at 1.25 M keys). What the store reads back is the
    range, key for key, for a primary and a replica's copy alike."""
    from floering.node.core.state_wire import ExportView, Layers
    from floering.node.core.table_state import TableCopy, copies_in_tables
    plan, core, effects = started()
    done(plan, effects)
    mine, theirs = RING.tokens_of("p")[0], next(iter(core.replicas.ranges))
    keys = words_of(mine, 300)
    keep(plan, core, mine, keys, 1)
    rep = core.replicas.ranges[theirs]
    rep.copy.apply_fragment({f"r{i}": i + 1 for i in range(200)})
    plan.rewrite = True
    (write,) = of(WriteCopies, plan.after(core))
    copies = {c.token: c for c in write.copies}
    assert copies[mine].full and copies[theirs].full
    want = {mine: core.primaries[mine].state.snapshot(), theirs: dict(rep.copy.master)}
    assert want[mine] == dict.fromkeys(keys, 1) and len(want[theirs]) == 200
    if copies_in_tables(core.reducer):
        assert isinstance(rep.copy, TableCopy)
        for token in (mine, theirs):
            states = copies[token].states
            assert isinstance(states, Layers) and isinstance(states.layers[0], ExportView)
            assert states.layers[0]._dict is None          # not decoded into a dict
    assert {t: dict(copies[t].states) for t in want} == want
    store = NodeStore(tmp_path / "d")
    store.save_identity("p", 7)
    store.write(write.copies, (), write.ring_wire, write.replace_all)
    store.close()
    back = NodeStore(tmp_path / "d")
    loaded = back.load()
    got = {t: dict(c.states) for t, c in loaded.copies.items() if t in want}
    back.close()
    assert got == want
