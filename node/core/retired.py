"""What a fenced member held, kept until the ring holds it without that member.

A member removed from the ring (declared dead while paused or cut off, or on a view
it could not refuse) rejoins as a new member with no ranges; what it held is not
thrown away with the member. Each range it was primary for, and each complete copy
it kept for another primary, becomes a *retired range*: its states and per-source
watermarks as they were, read at one point, under the bounds `(lo, token]` it had.

A retired range is deleted only once the current ring holds it on r+1 others: for
every current range that overlaps it, its primary and its r regular replicas each
answer that they hold that range (a primary: not lost; a replica: a complete copy of
a range the ring does not mark lost) with watermarks at or past the retired copy's
for every source (an epoch group's floor counts as the dedup path counts it). Every
tuple the retired copy holds is then on r+1 live members, the way the dedup
watermarks tell it: nothing it holds could be needed again. Until then the range is
kept (memory, and with a data directory a file that survives a restart) and asked
about again.

A current range its primary holds as lost (every copy went with removed members:
two members removed at r=1) is handed the retired copy's part of it
(`restore_chunk`), in chunks, as a snapshot import merges one: each chunk once (the
range keeps an `import:retired/...` mark, which never expires), the first bringing
the watermarks. A range that applied tuples meanwhile (a resend of what the removed
member applied, unacknowledged) is rebuilt from the batches it kept since it was lost
(node.core.lost_log): the copy, then the batches past its watermarks; one that no
longer keeps them is refused and stays lost. Once the last chunk is
merged the range is served again and carries the mark RESTORED among its
watermarks, which checkpoints, copies, takeovers and the data directory carry as
any watermark: the ring keeps the range marked lost, but a member holding it with
that mark serves it (RetainingCore), whether its primary restarted from its
directory or a replica took it over.

Pure: the asking and answering are plumbing (node.runtime.retiring); the rules are
here, with the owner's answer `held`.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass, field

from floering.wire.codec import pack, unpack
from floering.wire.epochs import effective_mark
from floering.wire.errors import Fenced, InvalidArgument, StaleRing
from floering.node.core.lost_log import (LOST_LOG_BYTES, RESTORE_WINDOW, LostLog, batch_size,
                                         busy, install, predates, rebuilt, replaces)
from floering.node.core.node_core import NodeCore, PushResult, RingChange
from floering.node.core.restore import restored_core
from floering.wire.ring import Ring
from floering.node.core.snapshot_format import IMPORT_SOURCE, MAX_CHUNKS
from floering.node.core.snapshots import HoldsState, checked_parts, merge_parts, parts_as_lists

FORMAT = 1
RESTORED = f"{IMPORT_SOURCE}restored"     # a lost range whole again from a retired copy
MEMBER = re.compile(r"[A-Za-z0-9_-]{1,64}(#[0-9]{1,9})?")    # a node id (node.config)
MAX_SEQ = (1 << 63) - 1
MORE_MARKS = 64            # import marks a range may hold besides its sources' watermarks


def check_marks_header(data: bytes, limits) -> None:
    """Refuse encoded watermarks that are not a msgpack map, or hold more entries than
    `checked_marks` takes, from the map's header alone: a 4 MiB map of short names
    costs ~100 MiB and ~2 s to build, which must not be spent on a refused one."""
    if not data:
        return
    first, most = data[0], max(limits.max_sources_per_range, 4096) + MORE_MARKS
    if 0x80 <= first <= 0x8F:
        count = first & 0x0F
    elif first in (0xDE, 0xDF) and len(data) >= (3 if first == 0xDE else 5):
        count = int.from_bytes(data[1:3] if first == 0xDE else data[1:5], "big")
    else:
        raise InvalidArgument("watermarks are a msgpack map of source to seq")
    if count > most:
        raise InvalidArgument(f"{count} watermarks: a range tracks at most {most} sources")


def checked_marks(marks, limits) -> dict:
    """`marks` if they are watermarks a range can hold: a map of at most
    --max-sources-per-range (at least 4,096) sources and 64 import marks, each a name
    within --max-source-bytes (at least 512: an import's mark) and a seq in
    0..2^63-1; else InvalidArgument."""
    if not isinstance(marks, dict):
        raise InvalidArgument("watermarks are a map of source to seq")
    most, longest = max(limits.max_sources_per_range, 4096), max(limits.max_source_bytes, 512)
    if len(marks) > most + MORE_MARKS:
        raise InvalidArgument(f"{len(marks)} watermarks: a range tracks at most "
                              f"{most + MORE_MARKS} sources")
    for source, seq in marks.items():
        if not isinstance(source, str) or len(source.encode()) > longest:
            raise InvalidArgument(f"a watermark's source is text of at most {longest} bytes")
        if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            raise InvalidArgument("a watermark's seq is a number in 0..2^63-1")
    return marks


@dataclass(frozen=True)
class RetiredRange:
    """A range a fenced member held: as its primary or as a complete copy."""

    member: str                 # the member that held it ("n2")
    token: int
    lo: int                     # its range was (lo, token] in the member's last ring
    role: str                   # "primary" or "replica"
    states: dict = field(hash=False, compare=False)
    watermarks: dict = field(hash=False, compare=False)

    @property
    def key(self) -> tuple[str, int]:
        return self.member, self.token


@dataclass(frozen=True)
class Held:
    """A member's answer about one of its ranges, against a retired copy's marks."""

    role: str                   # "primary", "replica" or "" (not ours)
    holds: bool                 # the range whole, at or past the marks asked about
    lost: bool = False          # we own it, but every copy of it was lost


def covers(have: dict, want: dict) -> bool:
    """Does a range with watermarks `have` hold every tuple one with `want` holds?"""
    return all(effective_mark(have, source) >= seq for source, seq in want.items())


def held(core: NodeCore, token: int, want: dict) -> Held:
    """How this member holds the range of `token` of its ring, against `want`
    (InvalidArgument for watermarks no range can hold)."""
    checked_marks(want, core.limits)
    if core.fenced or core.starting or not core.ring.has_token(token):
        return Held("", False)
    rng = core.primaries.get(token)
    if rng is not None:
        # (only a RetainingCore logs its lost ranges)
        if isinstance(core, RetainingCore) and (log := core.lost_logs.get(token)) is not None \
                and log.base is not None and predates(log, want):
            # a copy from before the loss: held if what restored the range holds it,
            # else handed over once more if it holds all of that and more
            if replaces(log, want, core.clock):
                return Held("primary", False, True)
            return Held("primary", covers(log.base, want))
        lost = token in core.lost_tokens
        return Held("primary", not lost and covers(rng.watermarks, want), lost)
    copy = core.replicas.ranges.get(token)
    if copy is not None:
        whole = copy.complete and (token not in core.ring.lost or RESTORED in copy.watermarks)
        return Held("replica", whole and covers(copy.watermarks, want))
    return Held("", False)


# ------------------------------------------------------------ retiring a member


def retire_core(member: str, ring: Ring, primaries: dict, replicas,
                lost=frozenset()) -> list[RetiredRange]:
    """The ranges a member held when it was fenced (`ring`: the ring it held them
    under): its primaries, and its complete copies rebuilt as a takeover would
    rebuild them (checkpoint plus backed-up tuples past it). An incomplete copy was
    never the range whole: it is not kept. A primary it held as `lost` is kept as
    "partial": what it applied since counts, but it never stands for the range whole
    (it restores nothing)."""
    out = []
    for token, rng in sorted(primaries.items()):
        if ring.has_token(token):
            role = "partial" if token in lost else "primary"
            out.append(RetiredRange(member, token, ring.range_of_token(token)[0], role,
                                    rng.state.snapshot(), dict(rng.watermarks)))
    for token, copy in sorted(replicas.ranges.items()):
        if copy.complete and ring.has_token(token):
            states, marks = replicas.rebuild(token, _keys_of(ring, token))
            out.append(RetiredRange(member, token, ring.range_of_token(token)[0], "replica",
                                    states, dict(marks)))
    return out


def retire_directory(member: str, ring: Ring | None, reducer, limits, copies: dict,
                     batches, now: float, corrupt=frozenset()) -> list[RetiredRange]:
    """The ranges a data directory holds for a member no longer served, as its
    restore would rebuild them (copies, and the logged batches past them: a copy
    alone may predate what was acknowledged)."""
    if ring is None:
        return []
    core = restored_core(member, ring, reducer, limits, copies, batches, now,
                         corrupt=corrupt, make=RetainingCore)
    if not isinstance(core, RetainingCore):
        raise TypeError(f"restored_core made a {type(core).__name__}, not a RetainingCore")
    return retire_core(member, core.ring, core.primaries, core.replicas,
                       core.lost_tokens - core.restored)


def _keys_of(ring: Ring, token: int):
    def check(keys):
        for key in keys:
            if ring.token_for_key(key) != token:
                raise InvalidArgument(f"a key does not belong to token {token}")
    return check


class RetainingCore(NodeCore):
    """A node core that, when it learns it was removed, keeps what it held as
    `retired` (NodeCore drops it); and serves again a lost range of its own that a
    retired copy restored (`restored`). Its `lost_tokens` are the lost ranges it owns
    (NodeCore's: every range the ring marks lost), so a read of all keys here is
    refused for a range it serves, not for one another member restored."""

    retired: list[RetiredRange] | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lost_tokens &= set(self.primaries)
        self.lost_logs: dict[int, LostLog] = {}    # node.core.lost_log
        self.lost_log_bytes = 0
        self.clock = 0.0                            # the latest time a batch came

    def _receive_batch_steps(self, ring_version, token, source, first_seq, last_seq, count,
                             payload, seqs, now) -> Generator[None, None, PushResult]:
        result = yield from super()._receive_batch_steps(ring_version, token, source,
                                                         first_seq, last_seq, count,
                                                         payload, seqs, now)
        self.clock = max(self.clock, now)
        log = self.lost_logs.get(token)
        if result.applied and log is not None and log.batches is not None and \
                token in self.primaries:       # (a replayable log)
            size = batch_size(source, payload, seqs)
            if self.lost_log_bytes + size > LOST_LOG_BYTES:
                self.lost_log_bytes -= log.drop()
            else:
                log.batches.append((source, first_seq, last_seq, count, payload, seqs))
                log.size += size
                self.lost_log_bytes += size
        return result

    def _track_lost(self) -> None:
        """Start a log for each lost range of ours still empty; forget those of ranges
        no longer ours or cut since, and the batches of restores past their window."""
        ring = self.ring
        for token, log in list(self.lost_logs.items()):
            expired = log.restored_at is not None and self.clock - log.restored_at > RESTORE_WINDOW
            if token not in self.primaries or ring.range_of_token(token) != log.bounds:
                self.lost_log_bytes -= self.lost_logs.pop(token).drop()
            elif expired and log.replayable:
                self.lost_log_bytes -= log.drop()
        for token in self.lost_tokens - self.lost_logs.keys():
            rng = self.primaries.get(token)
            if rng is not None and not rng.watermarks:
                self.lost_logs[token] = LostLog(ring.range_of_token(token))

    def adopt_ring(self, other: Ring) -> RingChange | None:
        before, primaries, replicas = self.ring, dict(self.primaries), self.replicas
        lost = self.lost_tokens - self.restored
        # A restored copy of a range the ring marks lost: NodeCore would take it over
        # as lost, empty; it is taken over from the copy instead.
        spare = {t: replicas.rebuild(t, _keys_of(before, t))
                 for t, c in replicas.ranges.items()
                 if c.complete and RESTORED in c.watermarks and t not in primaries
                 and _may_take_over(before, other, t, self.node_id)}
        change = super().adopt_ring(other)
        if change is not None and change.fenced and self.retired is None:
            self.retired = retire_core(self.node_id, before, primaries, replicas, lost)
        if change is None or change.fenced:
            return change
        for token, (states, marks) in spare.items():
            rng = self.primaries.get(token)
            if rng is not None and token in self.lost_tokens and not rng.watermarks:
                rng.state.replace(states)
                rng.watermarks = dict(marks)
                rng.force_checkpoint()
        self.lost_tokens = {t for t in self.lost_tokens if t in self.primaries} - self.restored
        self._track_lost()
        return change

    @property
    def restored(self) -> frozenset:
        """Our ranges the ring marks lost that a retired copy made whole again."""
        return frozenset(t for t, r in self.primaries.items() if RESTORED in r.watermarks)


def _may_take_over(ring: Ring, view: Ring, token: int, me: str) -> bool:
    owner = ring.owner_of_token(token) if ring.has_token(token) else None
    return owner in view.removed or (view.has_token(token) and view.owner_of_token(token) == me)


def restore_mark(member: str, token: int, bounds: tuple[int, int]) -> str:
    """The mark a range keeps of the chunks of `member`'s retired range of `token` it
    merged while its bounds were `bounds`."""
    return f"{IMPORT_SOURCE}retired/{member}/{token:x}@{bounds[0]:x}-{bounds[1]:x}"


def restore_chunk(core: RetainingCore, ring_stamp: int, token: int, member: str,
                  retired: int, chunk: int, chunks: int, keys, states, watermarks: dict,
                  now: float) -> int:
    """Merge chunk `chunk` of `chunks` of `member`'s retired range of token `retired`
    into our lost range of `token` (`keys` may be a frame of column states, `states`
    None: checked whole and merged as an import's, snapshots.checked_parts); returns
    the chunks merged so far. A chunk merged
    already changes nothing; the first brings the watermarks (a range that applied
    tuples of a source they name is rebuilt from the batches it kept, else refused:
    HoldsState), or replaces a copy merged before with a fuller one
    (node.core.lost_log)."""
    if core.fenced:
        raise Fenced(f"node {core.node_id} was removed from the ring")
    if ring_stamp != core.ring.stamp:
        raise StaleRing(f"ring stamp {ring_stamp:#x}, node {core.node_id} is at "
                        f"{core.ring.stamp:#x}")
    rng = core.primaries.get(token)
    if rng is None:
        raise StaleRing(f"node {core.node_id} is not the primary of token {token}")
    if not 1 <= chunk <= chunks <= MAX_CHUNKS:
        raise InvalidArgument(f"chunk {chunk} of {chunks}: chunks are 1..chunks, at most "
                              f"{MAX_CHUNKS}")
    if not isinstance(member, str) or not MEMBER.fullmatch(member):
        raise InvalidArgument("the member a retired copy is of is a node id: 1 to 64 "
                              "letters, digits, _ or -, and #N after a restart")
    checked_marks(watermarks, core.limits)
    mark = restore_mark(member, retired, core.ring.range_of_token(token))
    done = rng.watermarks.get(mark, 0)
    if chunk <= done:
        return done
    log = getattr(core, "lost_logs", {}).get(token)
    again = chunk == 1 and replaces(log, watermarks, now)
    if token not in core.lost_tokens and not again:
        raise HoldsState(f"the range of token {token} is not lost: nothing to restore")
    if chunk != done + 1:
        raise InvalidArgument(f"chunk {chunk}: the range holds {done}, the next is {done + 1}")
    if busy(log, mark, now):
        raise HoldsState(f"another retired copy is being merged into the range of token "
                         f"{token}: one at a time")
    parts = checked_parts(core, rng, token, keys, states)    # the whole chunk, or nothing
    if chunk == 1:
        _first_chunk(core, rng, token, log, parts, watermarks, now)
    else:
        merge_parts(rng, *parts)
    rng.watermarks[mark] = chunk
    rng.last_seen[mark] = now
    rng.force_checkpoint()
    if log is not None:
        log.marks.add(mark)
        log.pending = (mark, now) if chunk < chunks else None
        core.clock = max(core.clock, now)
    if chunk == chunks:
        rng.watermarks[RESTORED] = 1
        rng.last_seen[RESTORED] = now
        core.lost_tokens.discard(token)
    return chunk


def _first_chunk(core, rng, token: int, log, parts: tuple, watermarks: dict,
                 now: float) -> None:
    """Merge a retired copy's first chunk, with its watermarks. A range that applied
    tuples of a source the copy holds is rebuilt: the copy, then the batches it
    applied since it was lost replayed past the copy's marks (node.core.lost_log);
    without them (too many, or none kept) it is refused and stays lost."""
    both = sorted(s for s in watermarks if effective_mark(rng.watermarks, s) > 0)
    if log is not None and log.replayable and (both or log.base is not None):
        keys, states = parts_as_lists(*parts)
        install(rng, rebuilt(rng, core.reducer, log, watermarks, keys, states, now), now)
        core.lost_tokens.add(token)         # not served until its last chunk
    elif both:
        raise HoldsState(f"the lost range of token {token} applied tuples of {len(both)} "
                         "sources the retired copy holds too, and no longer keeps the "
                         "batches to merge it exactly: it stays lost")
    else:
        merge_parts(rng, *parts)
        for source, seq in watermarks.items():
            rng.watermarks[source] = max(seq, rng.watermarks.get(source, 0))
            rng.last_seen[source] = now
    if log is not None:
        log.base, log.restored_at = dict(watermarks), now


# ------------------------------------------------------------- confirming


def pieces(ring: Ring, lo: int, token: int) -> list[int]:
    """The tokens of `ring` whose ranges overlap (lo, token]."""
    if lo == token:                      # the whole ring
        return list(ring.tokens)
    inside = {t for t in ring.tokens if Ring.in_range(t, (lo, token))}
    return sorted(inside | {ring.token_for_position(token)})


def holders(ring: Ring, token: int) -> tuple[str, ...]:
    """Who must hold the range of `token`: its primary and its r regular replicas."""
    return (ring.owner_of_token(token), *ring.regular_replicas(token))


@dataclass(frozen=True)
class Ask:
    """Ask `node` whether it holds the range of `token` at `want`, as `role`."""

    key: tuple[str, int]
    token: int
    node: str
    role: str
    want: dict = field(hash=False, compare=False)


class RetiredSet:
    """The retired ranges this process keeps, and the rule that deletes them."""

    def __init__(self) -> None:
        self.ranges: dict[tuple[str, int], RetiredRange] = {}
        self.confirmed = 0               # retired ranges deleted once confirmed

    def add(self, ranges) -> None:
        for r in ranges:
            self.ranges.setdefault(r.key, r)      # the first retired is the older copy

    def members(self) -> set[str]:
        return {member for member, _ in self.ranges}

    def of(self, member: str) -> list[RetiredRange]:
        return [r for (m, _), r in sorted(self.ranges.items()) if m == member]

    @property
    def keys(self) -> int:
        return sum(len(r.states) for r in self.ranges.values())

    def asks(self, ring: Ring) -> list[Ask]:
        """Every question whose answers can confirm a retired range in `ring`."""
        out = []
        for key, r in sorted(self.ranges.items()):
            for token in pieces(ring, r.lo, r.token):
                for i, node in enumerate(holders(ring, token)):
                    out.append(Ask(key, token, node, "primary" if i == 0 else "replica",
                                   r.watermarks))
        return out

    def confirmed_by(self, ring: Ring, answers: dict) -> list[RetiredRange]:
        """Delete, and return, the retired ranges `answers` ({(key, token, node):
        Held}) confirm in `ring`: every range overlapping it held whole, at or past
        its watermarks, by r+1 members."""
        done = []
        for key, r in sorted(self.ranges.items()):
            if all(self._held_by_all(ring, answers, key, token)
                   for token in pieces(ring, r.lo, r.token)):
                done.append(self.ranges.pop(key))
        self.confirmed += len(done)
        return done

    @staticmethod
    def _held_by_all(ring: Ring, answers: dict, key, token: int) -> bool:
        nodes = holders(ring, token)
        if len(nodes) < ring.replication + 1:
            return False                 # the ring cannot place r+1 copies yet
        for i, node in enumerate(nodes):
            answer = answers.get((key, token, node))
            if answer is None or not answer.holds or \
                    answer.role != ("primary" if i == 0 else "replica"):
                return False
        return True


# ------------------------------------------------------------------ the file


def encode(ranges: list[RetiredRange]) -> bytes:
    """The retired ranges of one member, as its file holds them."""
    return pack([FORMAT, [[r.member, r.token, r.lo, r.role, list(r.states.keys()),
                           list(r.states.values()), r.watermarks] for r in ranges]])


def decode(data: bytes) -> list[RetiredRange]:
    version, items = unpack(data)
    if version != FORMAT:
        raise InvalidArgument(f"retired ranges in format {version}, this node reads {FORMAT}")
    return [RetiredRange(member, token, lo, role, dict(zip(keys, states)), dict(marks))
            for member, token, lo, role, keys, states, marks in items]
