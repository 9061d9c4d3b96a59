"""What durable mode's DiskPlan (`floering.node.core.persistence`) takes in and gives out:
frozen values. Events say what happened (a batch kept, a log synced, a checkpoint
cut or merged, the core after a machine event, a write done, the disk failing or
taking writes again); effects say what to do about it. The asyncio runtime
(node/runtime/durability.py) carries them out on a NodeStore, the simulation on a
simulated disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from floering.node.core.batch import Batch
from floering.node.core.ranges import Checkpoint
from floering.wire.ring import Ring

if TYPE_CHECKING:
    from floering.node.core.node_core import NodeCore


@dataclass(frozen=True)
class CopyWrite:
    """A change to one range's copy: the keys changed (or all of them, `full`) and the
    watermarks the copy covers from now on."""

    token: int
    primary: str
    states: Mapping = field(hash=False)
    watermarks: dict = field(hash=False)
    full: bool = False
    complete: bool = True


# ------------------------------------------------------------------- events


@dataclass(frozen=True)
class Began:
    """Serving starts as `core`'s member; the directory held `disk_member` (None:
    nothing): copies of the ranges of `disk_tokens`, under `disk_ring`, and the
    corrupt ones of `corrupt`. Another member's directory is wiped for this one;
    the same member's core was restored from it (`floering.node.core.restore`)."""

    core: NodeCore = field(hash=False)
    disk_member: str | None
    disk_ring: Ring | None = field(default=None, hash=False)
    disk_tokens: frozenset[int] = frozenset()
    corrupt: frozenset[int] = frozenset()


@dataclass(frozen=True)
class BatchKept:
    """The core took `batch`: `kept` of its tuples applied or backed up."""

    batch: Batch
    kept: int


@dataclass(frozen=True)
class AckWanted:
    """A request's batches are all taken: its acknowledgement `ticket` waits."""

    ticket: int


@dataclass(frozen=True)
class SyncWanted:
    """A checkpoint round is about to ship: `ticket` waits until everything logged so
    far is synced. A replica's copy must never get ahead of what we come back with
    from our disk: it would go back with our next full checkpoint, below batches its
    backups no longer hold."""

    ticket: int


@dataclass(frozen=True)
class LogSynced:
    upto: int                  # every record up to this one is on disk


@dataclass(frozen=True)
class RoundCut:
    node_id: str
    cuts: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class CheckpointMerged:
    """A checkpoint of a range we back up was merged into our copy; its
    acknowledgement `ticket` waits for the copy on disk."""

    token: int
    primary: str
    states: Mapping = field(hash=False)
    watermarks: dict = field(hash=False)
    full: bool = False
    ticket: int = 0


@dataclass(frozen=True)
class CoreSettled:
    """The core after a machine event: its member and the ranges it holds."""

    core: NodeCore = field(hash=False)


@dataclass(frozen=True)
class CopiesWritten:
    write: int


@dataclass(frozen=True)
class DiskFailed:
    """A log write, an fsync or a copy write failed (a full disk)."""

    why: str


@dataclass(frozen=True)
class DiskRepaired:
    """The records not synced were written again and synced, up to `synced`; the
    copies take writes again."""

    synced: int


# ------------------------------------------------------------------ effects


@dataclass(frozen=True)
class AppendRecord:
    record: int                # its number in the log: the store must agree
    batch: Batch


@dataclass(frozen=True)
class SyncLog:
    """Start a group commit (soon, for every record appended meanwhile); report
    LogSynced or DiskFailed."""


@dataclass(frozen=True)
class ReleaseAcks:
    tickets: tuple[int, ...]


@dataclass(frozen=True)
class FailAcks:
    tickets: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class WriteCopies:
    """One atomic, synced write, after every write before it: `copies`, the copies of
    `dropped` tokens gone, and the ring (with `replace_all`, `copies` are the only
    ones left). Report CopiesWritten(write) or DiskFailed."""

    write: int
    copies: tuple[CopyWrite, ...]
    dropped: tuple[int, ...] = ()
    ring_wire: bytes | None = None
    replace_all: bool = False


@dataclass(frozen=True)
class CompactLog:
    before: int                # no record before this one is needed any more


@dataclass(frozen=True)
class SaveIdentity:
    """The directory now holds this member: its log is emptied at once (record
    numbers go on), then, after every write queued before, its copies and ring are
    wiped and the identity written."""

    node_id: str
    incarnation: int


@dataclass(frozen=True)
class RefuseBatches:
    """Refuse batches before applying them; try to repair the disk every so often
    and report DiskRepaired once it takes writes."""

    why: str


@dataclass(frozen=True)
class AcceptBatches:
    pass
