"""What a lost range applied, kept so a retired copy merges into it exactly. Pure.

A range the ring marks lost (every copy went with removed members) is served again
from a retired copy (node.core.retired). Meanwhile the mappers go on: a batch the
removed member applied but never acknowledged is sent again, to the lost range, which
applies it too. The dedup watermarks cannot tell those apart from new tuples once
both are merged, so the lost range keeps every batch it applied since it was lost
(`LostLog`, at most LOST_LOG_BYTES for the whole node): a retired copy is then merged
as a takeover rebuilds a copy, its states and watermarks first, and the kept batches
replayed over them, each tuple at or below the copy's watermark skipped (`rebuilt`).

Two retired copies of one range (the member that held it before, and the member that
took it over from that one before both were removed) are merged one at a time. The
first fixes the range's `base`; a later copy whose watermarks are at or past the base
for every source holds all the base holds and more: within RESTORE_WINDOW it replaces
it (rebuilt again over the same batches), up to MAX_COPIES copies in all (each leaves
its mark among the range's watermarks). A copy made before the restore (it
lacks the restore's marks) counts as held only if the base covers it: the lost range's
own marks say nothing of the tuples it never had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from floering.wire.epochs import effective_mark
from floering.node.core.ranges import PrimaryRange
from floering.node.core.snapshot_format import IMPORT_SOURCE

LOST_LOG_BYTES = 64 << 20      # batches kept by all the lost ranges of a node
RESTORE_WINDOW = 120.0         # seconds after a restore a fuller copy may replace it
MAX_COPIES = 3                 # retired copies merged into one lost range, at most
PENDING_WAIT = 30.0            # seconds another copy waits while one's chunks come
BATCH_OVERHEAD = 96            # bytes counted per batch besides its payload


@dataclass
class LostLog:
    """The batches a lost range applied since it was lost, and what restored it."""

    bounds: tuple[int, int]                 # the range's bounds when it was lost
    batches: list | None = field(default_factory=list)   # None: too many, or expired
    size: int = 0
    marks: set = field(default_factory=set)    # the restore marks of the copies merged
    base: dict | None = None                # watermarks of the retired copy merged
    pending: tuple[str, float] | None = None   # a copy's mark, while its chunks come
    restored_at: float | None = None

    @property
    def replayable(self) -> bool:
        return self.batches is not None

    def drop(self) -> int:
        """Forget the batches (the base and marks stay); returns the bytes freed."""
        freed, self.batches, self.size = self.size, None, 0
        return freed


def busy(log: LostLog | None, mark: str, now: float) -> bool:
    """Is another copy's merge under way (its next chunk due within PENDING_WAIT)?"""
    return (log is not None and log.pending is not None and log.pending[0] != mark
            and now - log.pending[1] < PENDING_WAIT)


def batch_size(source: str, payload: bytes, seqs: bytes) -> int:
    return len(payload) + len(seqs or b"") + len(source) + BATCH_OVERHEAD


def predates(log: LostLog, want: dict) -> bool:
    """Was a copy with watermarks `want` made before the range was restored? A copy of
    the restored range carries the marks of the copies merged into it."""
    return not log.marks & want.keys()


def dominates(want: dict, base: dict) -> bool:
    """Does a copy with watermarks `want` hold everything one with `base` holds?"""
    return all(effective_mark(want, s) >= seq for s, seq in base.items()
               if not s.startswith(IMPORT_SOURCE))


def replaces(log: LostLog | None, want: dict, now: float) -> bool:
    """May a retired copy with watermarks `want` replace the copy that restored the
    range (it holds all of it and more, and the batches are still kept)?"""
    return (log is not None and log.replayable and log.base is not None
            and log.restored_at is not None and now - log.restored_at <= RESTORE_WINDOW
            and len(log.marks) < MAX_COPIES
            and want != log.base and predates(log, want) and dominates(want, log.base))


def rebuilt(rng: PrimaryRange, reducer, log: LostLog, watermarks: dict, keys, states,
            now: float) -> PrimaryRange:
    """The range as a retired copy (`watermarks`, its first chunk `keys`/`states`)
    and the batches the lost range applied make it: the copy first, each kept batch
    replayed over it past the copy's watermarks. `rng` is not changed (a chunk or
    batch refused leaves it as it was)."""
    if log.batches is None:
        raise ValueError(f"range {rng.token}: its lost batches were dropped, it cannot be replayed")
    out = PrimaryRange(rng.token, reducer)
    out.watermarks = dict(watermarks)
    if keys:
        out.state.merge_in(keys, states)
    for source, first_seq, last_seq, count, payload, seqs in log.batches:
        out.apply(source, first_seq, last_seq, count, payload, seqs, now=now)
    return out


def install(rng: PrimaryRange, new: PrimaryRange, now: float) -> None:
    """`rng` takes `new`'s states and watermarks (keeping its own import marks), and
    ships its replicas a full checkpoint next; late acks of earlier ones no longer
    count."""
    marks = {s: seq for s, seq in rng.watermarks.items() if s.startswith(IMPORT_SOURCE)}
    rng._freeze_full()
    rng.state.replace(new.state.snapshot())
    rng.watermarks = {**new.watermarks, **marks}
    for source in new.watermarks:
        rng.last_seen.setdefault(source, now)
    rng.replica_seq.clear()
    rng.min_ack = rng.checkpoint_seq
    rng.force_checkpoint()
