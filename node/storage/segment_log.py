"""An append-only log of records in segment files, every record checksummed.

A record on disk is `length (u32) | crc32 of payload (u32) | payload`. Segments are
files named by the sequence number of their first record (`00000000000000000001.log`);
a new one starts when the current one passes `segment_bytes`, and whole segments are
deleted once a snapshot covers them (`drop_before`). Only whole segments go, so their
size follows the volume (`segment_size`): on a small one, a few large segments would
fill it before one of them could be deleted.

Recovery rules, checked when the log is opened:
- a torn tail (the process or the machine died mid-write: the last record of the last
  segment is cut short or fails its checksum) is truncated to the last valid record;
  nothing after it was ever synced, so nothing acknowledged is lost;
- anything else that fails (a bad record followed by more data, a bad record in an
  older segment, a gap between segments) is corruption: `CorruptLog` names the file
  and the offset, and the log is not opened. The caller recovers the range from a
  replica or reports it lost; it never serves a partial log.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections import deque
from pathlib import Path
from typing import Iterator

from floering.node.files import open_private, private_dir

HEADER = struct.Struct("<II")            # payload length, crc32 of the payload
MAX_RECORD = 64 << 20                    # a larger length can only be garbage
SUFFIX = ".log"
MAX_SEGMENT = 64 << 20                   # on a roomy volume
MIN_SEGMENT = 1 << 20                    # fewer, larger writes than this are not worth it
SEGMENTS_PER_VOLUME = 32                 # the free space holds this many segments


def segment_size(free_bytes: int) -> int:
    """The segment size for a log on a volume with `free_bytes` free: a 32nd of it,
    whole MiB, between 1 MiB and 64 MiB. The log then rolls and frees space in
    steps small against the volume, and a checkpoint's compaction can give space
    back long before the volume fills."""
    share = max(0, free_bytes) // SEGMENTS_PER_VOLUME
    return max(MIN_SEGMENT, min(MAX_SEGMENT, share - share % MIN_SEGMENT))


def volume_segment_size(directory: str | os.PathLike) -> int:
    """segment_size for the volume holding `directory` (or its nearest parent)."""
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return segment_size(shutil.disk_usage(path).free)


class CorruptLog(Exception):
    """A log that cannot be trusted: `path` and `offset` say where."""

    def __init__(self, path: Path, offset: int, why: str) -> None:
        super().__init__(f"{path}: corrupt at byte {offset}: {why}")
        self.path, self.offset = path, offset


def _segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SUFFIX}"


def scan(data: bytes) -> tuple[list[bytes], int, str]:
    """The valid records at the start of `data`, where they end, and why the rest (if
    any) is not a record."""
    records: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + HEADER.size > len(data):
            return records, offset, "a record header cut short"
        length, crc = HEADER.unpack_from(data, offset)
        end = offset + HEADER.size + length
        if not 0 < length <= MAX_RECORD or end > len(data):
            # Never empty: eight zero bytes (a zero-filled torn write) are no record.
            return records, offset, "a record cut short"
        payload = data[offset + HEADER.size:end]
        if zlib.crc32(payload) != crc:
            return records, offset, "a record failing its checksum"
        records.append(payload)
        offset = end
    return records, offset, ""


class SegmentLog:
    def __init__(self, directory: str | os.PathLike, segment_bytes: int | None = None,
                 first_seq: int = 1) -> None:
        self.directory = Path(directory)
        # None: sized to the volume, as it is when the log is opened
        self.segment_bytes = segment_bytes or volume_segment_size(directory)
        private_dir(self.directory)
        self.segments: list[tuple[int, Path]] = []      # (first seq, path), oldest first
        self.next_seq = first_seq                        # when no segment holds any
        self.truncated = 0                               # bytes of torn tail dropped at open
        self._file = None
        self._size = 0
        # Records appended and not yet synced, and how much of the current segment is
        # synced: after a failed write or fsync (a full disk) `repair` cuts back to
        # that and writes them again.
        self._pending: deque[tuple[int, bytes]] = deque()
        self._synced_size = 0
        self.broken: OSError | None = None
        self._recover()
        self._synced_size = self._size

    # ------------------------------------------------------------ recovery

    def _recover(self) -> None:
        paths = sorted(self.directory.glob("*" + SUFFIX))
        expected = None
        for i, path in enumerate(paths):
            try:
                first = int(path.stem)
            except ValueError:
                raise CorruptLog(path, 0, "not a segment name") from None
            if expected is not None and first != expected:
                raise CorruptLog(path, 0, f"segment starts at record {first}, the previous "
                                          f"one ended before {expected}")
            data = path.read_bytes()
            records, end, why = scan(data)
            if end < len(data):
                if i < len(paths) - 1 or not self._torn(data, end):
                    raise CorruptLog(path, end, why)
                with open(path, "r+b") as f:          # a torn tail: cut it off
                    f.truncate(end)
                    os.fsync(f.fileno())
                self.truncated += len(data) - end
            self.segments.append((first, path))
            expected = first + len(records)
            self._size = end
        if expected is not None:
            self.next_seq = expected

    @staticmethod
    def _torn(data: bytes, end: int) -> bool:
        """Is what follows the last valid record at `end` a single record that a write
        never finished? Only if it is no longer than one record can be and no valid
        record starts anywhere inside it: a bit flipped in a length field mid-log
        must not pass for a torn tail and take the records after it along."""
        rest = len(data) - end
        if rest > HEADER.size + MAX_RECORD:
            return False
        for offset in range(end + 1, len(data) - HEADER.size + 1):
            length, crc = HEADER.unpack_from(data, offset)
            stop = offset + HEADER.size + length
            if length and stop <= len(data) and zlib.crc32(data[offset + HEADER.size:stop]) == crc:
                return False
        return True

    # -------------------------------------------------------------- writing

    def append(self, payload: bytes) -> int:
        """Append one record (not yet synced); returns its sequence number. A write
        that fails (a full disk) leaves the log `broken` until `repair`; the record
        is kept to be written then."""
        if not 0 < len(payload) <= MAX_RECORD:
            raise ValueError(f"a record must hold 1 to {MAX_RECORD} bytes, not {len(payload)}")
        seq = self.next_seq
        self.next_seq += 1
        self._pending.append((seq, payload))
        if self.broken is None:
            try:
                self._write(seq, payload)
            except OSError as exc:
                self.broken = exc
        return seq

    def _write(self, seq: int, payload: bytes) -> None:
        if self._file is None or self._size >= self.segment_bytes:
            self._roll(seq)
        if self._file is None:
            raise OSError(f"{self.directory}: no segment open to write to")
        self._file.write(HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
        self._size += HEADER.size + len(payload)

    def sync(self) -> None:
        """Everything appended so far is on disk when this returns."""
        if self.broken is not None:
            raise self.broken
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        self.mark_synced(self.next_seq - 1, self._size, self._current())

    def flushed(self) -> tuple[int, int, int, int]:
        """Hand what was appended to the OS: (last record, a descriptor to fsync on
        another thread that stays valid if the segment rolls meanwhile, or -1; the
        segment's size then; the segment's first record). See `mark_synced`."""
        if self.broken is not None:
            raise self.broken
        last = self.next_seq - 1
        if self._file is None:
            return last, -1, self._size, self._current()
        self._file.flush()
        return last, os.dup(self._file.fileno()), self._size, self._current()

    def _current(self) -> int:
        return self.segments[-1][0] if self.segments else 0

    def mark_synced(self, last: int, size: int, segment: int) -> None:
        """Records up to `last` (the current segment up to `size`) are on disk."""
        if segment == self._current():
            self._synced_size = max(self._synced_size, size)
        while self._pending and self._pending[0][0] <= last:
            self._pending.popleft()

    def repair(self) -> None:
        """After a failed write or fsync: cut the current segment back to what was
        synced, write the records since again and sync them (raises while the disk
        still fails; call again later)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self.segments:
            with open(self.segments[-1][1], "r+b") as f:
                f.truncate(self._synced_size)
                os.fsync(f.fileno())
            self._size = self._synced_size
        self.broken = None
        try:
            for seq, payload in self._pending:
                self._write(seq, payload)
            self.sync()
        except OSError as exc:
            self.broken = exc
            raise

    def _roll(self, seq: int) -> None:
        """Start writing record `seq` into a new segment (or, just opened, the last)."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            # Everything written so far is synced; the new segment starts empty.
            self._pending = deque(r for r in self._pending if r[0] >= seq)
        if self.segments and self._size < self.segment_bytes and self._file is None:
            path = self.segments[-1][1]                  # reopen the last segment
        else:
            path = self.directory / _segment_name(seq)
            self.segments.append((seq, path))
            self._size = self._synced_size = 0
            self._sync_directory()
        self._file = open_private(path, "ab")

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------- reading

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """Every record as (sequence number, payload), oldest first."""
        if self._file is not None:
            self._file.flush()
        for first, path in self.segments:
            records, end, why = scan(path.read_bytes())
            if why:
                raise CorruptLog(path, end, why)
            for i, payload in enumerate(records):
                yield first + i, payload

    # ----------------------------------------------------------- compaction

    def drop_before(self, seq: int) -> int:
        """Delete the segments whose records all come before `seq` (a snapshot covers
        them); the segment being written stays. Returns how many were deleted."""
        paths = self.detach_before(seq)
        self.remove(paths)
        return len(paths)

    def detach_before(self, seq: int) -> list[Path]:
        """The segments whose records all come before `seq`, no longer the log's (it
        neither reads nor writes them again): their files, for `remove` (which may
        run on another thread: deleting files and syncing the directory took some
        6 ms of an event loop's step)."""
        paths = []
        while len(self.segments) > 1 and self.segments[1][0] <= seq:
            paths.append(self.segments.pop(0)[1])
        return paths

    def remove(self, paths: list[Path]) -> None:
        """Delete detached segments' files, then sync the directory."""
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            self._sync_directory()

    def close(self) -> None:
        """Sync and close; on a broken log what was not synced stays unsynced."""
        if self._file is not None:
            try:
                self.sync()
            except OSError:
                pass
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
