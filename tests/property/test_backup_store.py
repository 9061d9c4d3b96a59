from hypothesis import given, strategies as st

from floering.node.core.backup_store import BackupEntry, BackupStore


def entry(first, last, payload=b"p"):
    return BackupEntry(first, last, last - first + 1, payload, b"")


def test_eviction_drops_exactly_what_the_watermark_covers():
    store = BackupStore()
    store.add(7, "s1", entry(1, 10))
    store.add(7, "s1", entry(11, 20))
    store.add(7, "s2", entry(1, 5))
    store.add(9, "s1", entry(1, 10))
    assert store.evict(7, {"s1": 10}) == 10
    assert [(s, e.first_seq) for s, e in store.entries(7)] == [("s1", 11), ("s2", 1)]
    # a batch straddling the watermark stays: part of it is not yet checkpointed
    assert store.evict(7, {"s1": 15, "s2": 5}) == 5
    assert [(s, e.first_seq) for s, e in store.entries(7)] == [("s1", 11)]
    assert store.tuples == 20 and store.tuples_of(9) == 10
    store.check_invariants()


def test_resent_batch_is_stored_once():
    store = BackupStore()
    store.add(1, "s", entry(1, 10))
    store.add(1, "s", entry(1, 10))
    assert store.tuples == 10
    store.check_invariants()


def test_an_earlier_batch_is_kept_in_its_place_once_the_copy_went_back():
    # The copy covered 1-19 and its backups went; its primary came back from its disk
    # without 13-19 (never synced there) and its full checkpoint took the copy back to
    # 12: a resend of 13-19 is new again, though later batches are held.
    store = BackupStore()
    store.add(1, "s", entry(33, 38))
    store.add(1, "s", entry(41, 42))
    store.add(1, "s", entry(13, 19))
    assert [e.first_seq for _, e in store.entries(1)] == [13, 33, 41]
    store.add(1, "s", entry(34, 36))                 # inside one held: a resend
    store.add(1, "s", entry(30, 38))                 # more of the same batch: it replaces
    assert [(e.first_seq, e.last_seq) for _, e in store.entries(1)] == [(13, 19), (30, 38),
                                                                         (41, 42)]
    assert store.tuples == 7 + 9 + 2
    store.check_invariants()


def test_drop_token_updates_totals():
    store = BackupStore()
    store.add(1, "s", entry(1, 10, b"abc"))
    store.drop_token(1)
    assert (store.tuples, store.bytes) == (0, 0)
    store.check_invariants()


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 5)), max_size=40),
       st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 120)))
def test_eviction_property(batches, marks):
    store, next_seq, kept = BackupStore(), {}, []
    for source, size in batches:
        first = next_seq.get(source, 1)
        next_seq[source] = first + size
        store.add(0, source, entry(first, first + size - 1))
        kept.append((source, first, first + size - 1))
    store.evict(0, marks)
    expect = sorted((s, f) for s, f, last in kept if last > marks.get(s, 0))
    assert sorted((s, e.first_seq) for s, e in store.entries(0)) == expect
    store.check_invariants()
