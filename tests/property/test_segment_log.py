"""The segment log's recovery rules, as properties: a torn tail is cut to the last
valid record, everything else that fails its checks is refused naming the file."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.storage.segment_log import HEADER, CorruptLog, SegmentLog

records = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=40)


def written(directory: Path, payloads, segment_bytes=1 << 20) -> SegmentLog:
    log = SegmentLog(directory, segment_bytes=segment_bytes)
    for payload in payloads:
        log.append(payload)
    log.sync()
    log.close()
    return log


def contents(directory: Path) -> list[bytes]:
    return [payload for _, payload in SegmentLog(directory)]


@settings(max_examples=60, deadline=None)
@given(records, st.integers(min_value=64, max_value=4096))
def test_what_was_synced_reads_back_in_order_across_segments(payloads, segment_bytes):
    with tempfile.TemporaryDirectory() as d:
        written(Path(d), payloads, segment_bytes)
        log = SegmentLog(d, segment_bytes=segment_bytes)
        assert [(seq, p) for seq, p in log] == list(enumerate(payloads, 1))
        assert log.append(b"next") == len(payloads) + 1      # numbering continues


@settings(max_examples=80, deadline=None)
@given(records, st.data())
def test_a_torn_tail_is_cut_to_the_last_whole_record(payloads, data):
    with tempfile.TemporaryDirectory() as d:
        written(Path(d), payloads)
        (segment,) = Path(d).glob("*.log")
        size = segment.stat().st_size
        cut = data.draw(st.integers(min_value=0, max_value=size - 1), label="cut at")
        with open(segment, "r+b") as f:
            f.truncate(cut)
        # the records wholly before the cut survive, in order; nothing else
        ends, whole = 0, 0
        for p in payloads:
            if ends + HEADER.size + len(p) > cut:
                break
            ends += HEADER.size + len(p)
            whole += 1
        log = SegmentLog(d)
        assert [p for _, p in log] == payloads[:whole]
        assert log.truncated == cut - ends and segment.stat().st_size == ends


@settings(max_examples=40, deadline=None)
@given(records, st.binary(min_size=1, max_size=100))
def test_a_zero_filled_or_garbled_last_write_is_a_torn_tail(payloads, garbage):
    with tempfile.TemporaryDirectory() as d:
        written(Path(d), payloads)
        (segment,) = Path(d).glob("*.log")
        with open(segment, "ab") as f:               # a write that never completed
            f.write(bytes(len(garbage)) if garbage[0] % 2 else garbage)
        assert contents(Path(d)) == payloads


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=2, max_size=30), st.data())
def test_a_damaged_record_before_the_last_is_refused_naming_the_file(payloads, data):
    with tempfile.TemporaryDirectory() as d:
        written(Path(d), payloads)
        (segment,) = Path(d).glob("*.log")
        last = HEADER.size + len(payloads[-1])
        raw = bytearray(segment.read_bytes())
        at = data.draw(st.integers(min_value=0, max_value=len(raw) - last - 1), label="byte")
        raw[at] ^= data.draw(st.integers(min_value=1, max_value=255), label="flip")
        segment.write_bytes(bytes(raw))
        with pytest.raises(CorruptLog) as refused:
            SegmentLog(d)
        assert str(segment) in str(refused.value)


def test_a_damaged_older_segment_or_a_missing_one_is_refused(tmp_path):
    written(tmp_path, [b"x" * 100] * 30, segment_bytes=500)
    segments = sorted(tmp_path.glob("*.log"))
    assert len(segments) >= 4
    with open(segments[0], "r+b") as f:                # the tail of an older segment
        f.truncate(os.path.getsize(segments[0]) - 3)
    with pytest.raises(CorruptLog, match=segments[0].name):
        SegmentLog(tmp_path)
    segments[0].unlink()                               # dropped as covered: fine...
    segments[2].unlink()                               # ...but a gap loses records
    with pytest.raises(CorruptLog, match="previous"):
        SegmentLog(tmp_path)


def test_dropping_covered_segments_keeps_the_rest_and_the_numbering(tmp_path):
    log = SegmentLog(tmp_path, segment_bytes=500)
    seqs = [log.append(bytes([i % 250 + 1]) * 100) for i in range(30)]
    log.sync()
    dropped = log.drop_before(20)
    assert dropped >= 1
    kept = [seq for seq, _ in log]
    assert kept[-1] == 30 and kept[0] <= 20 and kept == list(range(kept[0], 31))
    log.close()
    reopened = SegmentLog(tmp_path, segment_bytes=500)
    assert [seq for seq, _ in reopened] == kept and reopened.append(b"y") == 31
    assert seqs == list(range(1, 31))


def test_an_empty_or_oversized_record_is_refused(tmp_path):
    log = SegmentLog(tmp_path)
    with pytest.raises(ValueError):
        log.append(b"")


def test_segments_let_go_are_deleted_later_and_the_log_goes_on(tmp_path):
    """Segments before a seq leave the log at once (detach_before: it neither reads
    nor writes them); their files go when `remove` runs (on the disk's thread)."""
    log = SegmentLog(tmp_path / "log", segment_bytes=64)
    for i in range(40):
        log.append(b"x" * 20)
    log.sync()
    before = sorted(p.name for p in (tmp_path / "log").iterdir())
    paths = log.detach_before(20)
    assert paths and all(p.exists() for p in paths)
    assert all(seq > 0 for seq, _ in log.segments) and log.segments[0][0] <= 20
    log.append(b"y")
    log.sync()
    log.remove(paths)
    assert not any(p.exists() for p in paths)
    after = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert set(after) - set(before) <= {log.segments[-1][1].name}
    assert [seq for seq, _ in log][-1] == log.next_seq - 1
    log.remove(paths)                   # a second time changes nothing
