"""The reducer node's protocol core: no I/O, no clock, no randomness.

It decides what a batch does (apply as primary, back up as replica, refuse), cuts
checkpoints and merges the ones it receives, and answers queries. The asyncio shell
(`floering.node.runtime`) feeds it events and carries out what it returns.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Generator, Iterator, Mapping

from floering.node.core.backup_store import BackupEntry
from floering.node.core.batch import Batch, Limits, check_header
from floering.wire.epochs import check_source
from floering.node.core.folding import FOLDING_BALANCERS, FoldBook
from floering.wire.pieces import is_fold_source
from floering.node.core.placement import CopyBook
from floering.wire.errors import (Fenced, InvalidArgument, RangeLost, StaleRing, Starting,
                              TooLarge, inert)
from floering.node.core.ranges import T, Checkpoint, PrimaryRange, ReplicaSide, drain
from floering.node.core.reducers import Reducer
from floering.wire.ring import Ring
from floering.node.core.split_point import PositionLoad
from floering.node.core.state_store import LayeredState, copy_pairs
from floering.node.core.table_state import (Columns, ColumnKeys, check_positions,
                                            marked_keys)
from floering.node.core.streams import StreamGuard


@dataclass(frozen=True)
class Shipment:
    """Send `checkpoint` to `replica`; `base_seq` is what the replica should hold."""

    replica: str
    checkpoint: Checkpoint
    base_seq: int


@dataclass(frozen=True)
class RingChange:
    """What adopting a ring did here."""

    ring: Ring
    taken_over: tuple[int, ...] = ()   # tokens this node now applies, rebuilt from its copy
    lost: tuple[int, ...] = ()         # tokens taken over with no complete copy anywhere
    fenced: bool = False               # this node was removed: it must stop serving


@dataclass(frozen=True)
class PushResult:
    applied: int
    duplicates: int


class NodeCore:
    def __init__(self, node_id: str, ring: Ring, reducer: Reducer,
                 limits: Limits = Limits(), verify_keys: bool = False) -> None:
        self.node_id = node_id
        self.reducer = reducer
        self.limits = limits
        self.verify_keys = verify_keys
        self.ring = ring
        self.primaries: dict[int, PrimaryRange] = {}
        self.replicas = ReplicaSide(reducer)
        self.lost_tokens: set[int] = set(ring.lost)
        self.streams = StreamGuard(limits.max_sources_per_node, limits.source_expiry,
                                   limits.max_stream_ahead)
        self.cuts: list[Checkpoint] = []     # the checkpoints the last round cut
        self.copies = CopyBook(node_id)      # rings held lately, full copies arriving
        # The last checkpoint seq of each range we handed away: taken back, the range
        # numbers on from there, so an acknowledgement of a copy cut before it left
        # never counts for the new one (bounded by the ring's tokens).
        self.released_seq: dict[int, int] = {}
        self.fenced = False
        self._ring_checked: Ring | None = None
        # A process that has not yet heard its peers may be the restart of a member
        # whose state died: it accepts and answers nothing until it knows.
        self.starting = False
        self.applied_by_token: dict[int, int] = {}   # tuples applied per owned token, cumulative
        self.positions = PositionLoad()              # where inside each range the load sits
        self.folds = FoldBook(limits.piece_idle)     # pieces merged back into their keys
        self.fold_merges = 0                         # folds merged into keys we own
        self.counters = dict(applied=0, duplicates=0, refused=0, backed_up=0,
                             checkpoints_shipped=0, checkpoints_received=0, takeovers=0,
                             handed_off=0, sources_expired=0)
        for token in ring.tokens_of(node_id):
            self.primaries[token] = PrimaryRange(token, reducer)
        if ring.pristine:
            # Nothing ever moved: every replica holds its (empty) copy from the start.
            for token in ring.tokens:
                if ring.role_of(node_id, token) == "replica":
                    self.replicas.start_complete(token, ring.owner_of_token(token))

    # ------------------------------------------------------------ ring changes

    def adopt_ring(self, other: Ring) -> RingChange | None:
        """Merge another view of the ring into ours; take over the ranges it gives us.
        Returns None when nothing changed."""
        old = self.ring
        new = old.merge(other)
        if new is old:
            return None
        self.ring = new
        self.copies.adopted(old, new)
        if self.node_id in new.removed:
            # Declared dead (we were paused or cut off): everything here is stale.
            self.fenced = True
            self.primaries.clear()
            self.replicas = ReplicaSide(self.reducer)
            return RingChange(new, fenced=True)
        self._split_ranges(old, new)
        taken, lost = [], []
        for token in new.tokens_of(self.node_id):
            if token in self.primaries:
                continue
            rng = PrimaryRange(token, self.reducer)
            rng.checkpoint_seq = rng.min_ack = self.released_seq.pop(token, 0)
            if self.replicas.is_complete(token) and token not in new.lost:
                # The copy becomes the range's master as it is (it is dropped below):
                # no second dict of a range of millions of keys, built while it serves.
                _, rng.watermarks = self.replicas.rebuild(token, self._keys_of(token),
                                                          into=rng.state)
                taken.append(token)
            else:
                lost.append(token)
                self.lost_tokens.add(token)
            self.replicas.drop(token)
            self.primaries[token] = rng
        for token in list(self.primaries):
            if new.owner_of_token(token) != self.node_id:
                # Handed away (load shedding, scale-in). If we stay one of its replicas
                # our state is a complete copy: keep it as one.
                rng = self.primaries.pop(token)
                self.released_seq[token] = rng.checkpoint_seq
                if new.role_of(self.node_id, token) == "replica":
                    self.replicas.adopt_copy(token, new.owner_of_token(token),
                                             rng.state, dict(rng.watermarks))
                self.counters["handed_off"] += 1
        for token in list(self.replicas.ranges):
            if new.role_of(self.node_id, token) != "replica":
                self.replicas.drop(token)
        for token, rng in self.primaries.items():
            # A node that stopped being a replica dropped its copy: what it acknowledged
            # before no longer counts, nor does an ack of it still on its way.
            replicas = new.replicas_of_token(token)
            before = old.replicas_of_token(token) if old.has_token(token) else ()
            for node in (set(rng.replica_seq) | set(before)) - set(replicas):
                rng.replica_seq.pop(node, None)
                rng.ack_floor[node] = rng.checkpoint_seq
        self.lost_tokens |= set(new.lost)
        self.released_seq = {t: n for t, n in self.released_seq.items() if new.has_token(t)}
        self.counters["takeovers"] += len(taken)
        return RingChange(new, tuple(taken), tuple(lost))

    def _split_ranges(self, old: Ring, new: Ring) -> None:
        """Split what we hold of every range the new ring cuts (`Ring.split_token`):
        primary state, replica copies and backups, each key to its new token."""
        for token, parts in cut_ranges(old, new).items():
            inside = set(parts)

            def part_of(key, token=token, inside=inside):
                part = new.token_for_key(key)
                # A key outside the old range (only a mis-routed batch holds one)
                # stays where it was.
                return part if part in inside else token
            bounds = {t: new.range_of_token(t) for t in parts}
            rng = self.primaries.pop(token, None)
            if rng is not None:
                self.primaries.update(rng.split(parts, part_of, bounds))
            self.replicas.split(token, parts, part_of, bounds)
            self.positions.split(token, lambda pos, t=token, inside=inside: (
                new.token_for_position(pos) if new.token_for_position(pos) in inside else t))
            if token in self.lost_tokens:
                self.lost_tokens |= inside

    def monitored_primaries(self) -> set[str]:
        """The nodes whose ranges we back up: the ones we watch for failure. Also the
        extra destinations of our ranges that own no range themselves (a node joining
        by a handoff): no replica watches them, and a handoff to one that died must
        abort rather than wait for its deadline."""
        ring = self.ring
        watched = {ring.owner_of_token(t) for t in ring.tokens
                   if ring.role_of(self.node_id, t) == "replica"} | _tokenless_extras(
                       ring, ring.tokens_of(self.node_id), self.node_id)
        if ring.tokens_of(self.node_id):
            # A member with no range and no handoff under way (it just joined, or
            # rejoined after being fenced) is watched by its sponsor, so its death is
            # still declared and scans and handoffs do not wait on it.
            watched |= {x for x in _idle_members(ring)
                        if _sponsor(ring, x) == self.node_id}
        return watched

    def heartbeat_targets(self) -> set[str]:
        """Our replicas: the nodes that watch us; with no range of our own, the owners
        of the ranges we are an extra destination of."""
        ring = self.ring
        mine = ring.tokens_of(self.node_id)
        targets = {r for t in mine for r in ring.replicas_of_token(t)}
        if not mine:
            targets |= {ring.owner_of_token(t) for t in ring.tokens
                        if self.node_id in ring.extras_of(t)}
            if not targets and self.node_id in ring.nodes:
                sponsor = _sponsor(ring, self.node_id)
                if sponsor is not None:
                    targets.add(sponsor)
        return targets - {self.node_id}

    def under_replicated(self) -> list[int]:
        """Our ranges not on r+1 nodes: fewer replicas than the ring's members allow
        (only nodes owning ranges are replicas; members that joined empty are not
        yet), or a replica that lacks a checkpoint."""
        ring = self.ring
        want = min(ring.replication, len(ring.nodes) - 1)
        return [t for t, rng in self.primaries.items()
                if len(ring.regular_replicas(t)) < want
                or any(rng.replica_seq.get(r) is None for r in ring.replicas_of_token(t))]

    def _check_started(self) -> None:
        if self.starting:
            raise Starting(f"node {self.node_id} is starting: it has not yet confirmed "
                           f"its place in the ring")

    # ------------------------------------------------------------- data path

    def receive_batch(self, b: Batch, now: float = 0.0,
                      wall: float | None = None) -> PushResult:
        """Apply or back up one batch. `wall`: this node's clock (seconds since the
        epoch), which the sender's stream numbers are checked against."""
        return drain(self.receive_batch_steps(b, now, wall))

    def receive_batch_steps(self, b: Batch, now: float = 0.0, wall: float | None = None
                            ) -> Generator[None, None, PushResult]:
        """receive_batch a step at a time: the caller may run other work where it
        yields. A large batch of a range we are primary of is read, checked and
        verified over several steps (PrimaryRange.apply_steps) and applied whole in
        the last; one we back up is read and checked so and kept in the last
        (ReplicaSide.store_steps). Before each step after the first, the ring and the
        range (or our copy of it) must still be those it was taken under, else it is
        refused StaleRing, nothing applied or kept."""
        try:
            self.streams.check(b.source, b.stream, now, wall)
            result = yield from self._receive_batch_steps(
                b.ring_stamp, b.token, b.source, b.first_seq, b.last_seq, b.count,
                b.payload, b.seqs, now)
            # Recorded once accepted: a refused batch must not retire anyone's stream.
            self.streams.accept(b.source, b.stream, now)
            return result
        except Exception:
            self.counters["refused"] += 1
            raise

    def _receive_batch_steps(self, ring_version, token, source, first_seq, last_seq, count,
                             payload, seqs, now) -> Generator[None, None, PushResult]:
        ring = self.ring
        self._check_started()
        if self.fenced:
            raise Fenced(f"node {self.node_id} was removed from the ring (version "
                         f"{ring.version}); it must rejoin empty")
        if ring_version != ring.stamp:
            raise StaleRing(f"batch was routed with ring version "
                            f"{Ring.version_of_stamp(ring_version)} ({ring_version:#x}), node "
                            f"{self.node_id} is at version {ring.version} ({ring.stamp:#x})")
        if not source:
            raise InvalidArgument("batch has no source id")
        if len(source) > self.limits.max_source_bytes or \
                len(source.encode()) > self.limits.max_source_bytes:
            raise TooLarge(f"source id of {len(source.encode())} bytes is over the limit of "
                           f"{self.limits.max_source_bytes} (--max-source-bytes)")
        check_source(source)
        check_header(count, first_seq, last_seq, seqs, payload, self.limits)
        role = ring.role_of(self.node_id, token) if ring.has_token(token) else None
        if role == "primary":
            rng = self.primaries[token]

            def check(keys):
                # Every key is checked against the token, exactly: a key the range
                # already holds was checked when it first came, so only new ones are
                # hashed (--verify-keys hashes all of them, every time). Columns carry
                # checked positions: all of them are checked, in bulk.
                if isinstance(keys, Columns):
                    self._verify_all(token, keys)
                    keys, new = ColumnKeys(keys), marked_keys(keys)
                else:
                    new = keys if self.verify_keys else rng.state.unknown(keys)
                    self._verify_all(token, new)
                self.positions.record(token, keys)
                if ring.balancer in FOLDING_BALANCERS:
                    self.folds.saw(token, new)
            applied, dups = yield from self._while_ours(
                token, ring, lambda: self.primaries.get(token) is rng, rng.apply_steps(
                    source, first_seq, last_seq, count, payload, seqs, verify=check, now=now,
                    max_sources=self.limits.max_sources_per_range))
            if applied and is_fold_source(source):
                self.fold_merges += 1
            self.counters["applied"] += applied
            self.counters["duplicates"] += dups
            self.applied_by_token[token] = self.applied_by_token.get(token, 0) + applied
            return PushResult(applied, dups)
        if role == "replica":
            replicas = self.replicas
            copy = replicas.range_of(token, ring.owner_of_token(token))
            stored, dups = yield from self._while_ours(
                token, ring, lambda: replicas.ranges.get(token) is copy, replicas.store_steps(
                    copy, source, BackupEntry(first_seq, last_seq, count, payload, seqs, now),
                    self.limits.max_backup_bytes))
            self.counters["backed_up"] += stored
            return PushResult(stored, dups)
        raise StaleRing(f"node {self.node_id} is not a destination of token {token} "
                        f"in ring version {ring.version}")

    def _while_ours(self, token: int, ring: Ring, held, steps: Generator[None, None, T]
                    ) -> Generator[None, None, T]:
        """`steps` run one after the other, each after the first only while we are
        not fenced, the ring is still `ring` and `held()` (the range, or our copy of
        it, is still the one the steps work on)."""
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            yield
            if self.fenced or self.ring.stamp != ring.stamp or not held():
                steps.close()
                raise StaleRing(f"the ring changed (now version {self.ring.version}) while "
                                f"a batch of token {token} was read; nothing of it "
                                f"was kept")

    def _keys_of(self, token: int):
        """A check that every key given belongs to `token` in our ring."""
        return lambda keys: self._verify_all(token, keys)

    def _verify_all(self, token: int, keys) -> None:
        if isinstance(keys, Columns):
            return check_positions(keys, self.ring.range_of_token(token), token)
        token_for_key = self.ring.token_for_key
        for key in keys:
            if token_for_key(key) != token:
                raise InvalidArgument(f"key {inert(key)} does not belong to token {token}")

    # ----------------------------------------------------------- checkpoints

    def plan_checkpoints(self, now: float | None = None, full_copies: bool = True) -> list[Shipment]:
        """Cut a checkpoint of every primary range that changed (or has a replica that
        needs a full copy, unless not `full_copies`; or, given `now`, had none for
        --backup-expiry seconds), say what to ship where. Processing goes on meanwhile
        into fresh active layers; call `checkpoint_done(token)` after shipping."""
        shipments = []
        self.cuts = []
        refresh = self.limits.backup_expiry
        for token, rng in self.primaries.items():
            if rng.state.inactive is not None:
                continue  # the previous checkpoint of this range is still in flight
            replicas = self.ring.replicas_of_token(token)
            behind = [r for r in replicas if rng.replica_seq.get(r) != rng.checkpoint_seq]
            if behind and not full_copies:
                continue   # a replica needs the whole range: not yet (NodeMachine.repair_after)
            if not rng.has_changes(now, refresh if replicas else 0) and not behind:
                continue
            delta = rng.cut_checkpoint(now or 0.0)
            self.cuts.append(delta)
            full = None
            for replica in replicas:
                base = rng.replica_seq.get(replica)
                if base == delta.seq - 1:
                    shipments.append(Shipment(replica, delta, base))
                else:
                    full = full or rng.full_checkpoint(delta)
                    shipments.append(Shipment(replica, full, 0))
            if not replicas:
                rng.checkpoint_shipped()
        return shipments

    def take_cuts(self) -> list[Checkpoint]:
        """The checkpoints the last round cut, once: durable mode writes them."""
        cuts, self.cuts = self.cuts, []
        return cuts

    def checkpoint_acked(self, token: int, replica: str, seq: int, need_full: bool) -> None:
        rng = self.primaries.get(token)
        if rng is None:
            return
        if need_full:
            rng.replica_seq.pop(replica, None)
        elif rng.ack_counts(replica, seq) and replica in self.ring.replicas_of_token(token):
            rng.replica_seq[replica] = seq
            self.counters["checkpoints_shipped"] += 1

    def checkpoint_failed(self, token: int, replica: str) -> None:
        rng = self.primaries.get(token)
        if rng is not None:
            rng.replica_seq.pop(replica, None)

    def checkpoint_done(self, token: int) -> None:
        rng = self.primaries.get(token)
        if rng is not None and rng.state.inactive is not None:
            rng.checkpoint_shipped()

    def receive_checkpoint(self, sender: str, ring_version: int, token: int, seq: int,
                           base_seq: int, full: bool, states: Mapping,
                           watermarks: dict[str, int], now: float = 0.0,
                           sliced: bool = False) -> tuple[bool, int]:
        """Merge a checkpoint of `sender`'s range into our copy. `sliced`: a large
        delta is left pending, for the caller to install a slice per turn of its
        loop (ReplicaSide.step_delta); any read of the copy installs the rest first."""
        ring = self.ring
        self._check_started()
        if self.fenced:
            raise Fenced(f"node {self.node_id} was removed from the ring")
        if not self.copies.accepts(ring, ring_version, sender, token):
            raise StaleRing(f"checkpoint from ring stamp {ring_version:#x}, node "
                            f"{self.node_id} is at {ring.stamp:#x}, where the range of "
                            f"token {token} has moved since or is unknown")
        if not ring.has_token(token) or ring.owner_of_token(token) != sender \
                or ring.role_of(self.node_id, token) != "replica":
            raise StaleRing(f"{self.node_id} does not back up token {token} of {inert(sender)}")
        self.counters["checkpoints_received"] += 1
        return self.replicas.apply_checkpoint(token, sender, seq, base_seq, full, states,
                                              watermarks, now, self.limits.backup_expiry,
                                              sliced=sliced)

    def check_copy_chunk(self, sender: str, ring_version: int, token: int) -> None:
        """A chunk of a full copy of `sender`'s range of `token`, cut under ring stamp
        `ring_version`: refused once the range has moved since (another primary, cut,
        or no longer ours to back up), kept across ring changes that leave it where it
        was (node.core.placement)."""
        self._check_started()
        if self.fenced:
            raise Fenced(f"node {self.node_id} was removed from the ring")
        if not self.copies.chunk(self.ring, ring_version, sender, token):
            raise StaleRing(f"{self.node_id} does not back up token {token} of "
                            f"{inert(sender)} as it was in ring stamp {ring_version:#x}")

    def expire_idle_sources(self, now: float) -> list[str]:
        """Forget the dedup watermarks of sources idle for --source-expiry seconds in
        every owned range (the next checkpoints tell the replicas)."""
        expired = set()
        for rng in self.primaries.values():
            expired.update(rng.expire_idle(now, self.limits.source_expiry))
        self.counters["sources_expired"] += len(expired)
        return sorted(expired)

    # --------------------------------------------------------------- queries

    def get(self, key) -> tuple[bool, object]:
        self._check_started()
        if self.fenced:
            raise Fenced(f"node {self.node_id} was removed from the ring")
        token = self.ring.token_for_key(key)
        if token in self.lost_tokens:
            raise RangeLost(f"every copy of the range of token {token} is lost")
        rng = self.primaries.get(token)
        if rng is None:
            raise StaleRing(f"node {self.node_id} does not own key {inert(key)} in ring "
                            f"version {self.ring.version}")
        state = rng.state.get(key, _ABSENT)
        return (False, None) if state is _ABSENT else (True, state)

    def _check_complete(self) -> None:
        self._check_started()
        if self.fenced:
            raise Fenced(f"node {self.node_id} was removed from the ring")
        if self.lost_tokens:
            raise RangeLost(f"node {self.node_id} owns {len(self.lost_tokens)} ranges whose "
                            f"every copy was lost; results would be partial")

    def top(self, k: int) -> list[tuple[object, object, object]]:
        self._check_complete()
        return self.rank(k, self.items())

    def items(self) -> Iterator[tuple[object, object]]:
        for rng in self.primaries.values():
            yield from rng.state.items()

    def range_snapshots(self) -> Iterator[dict]:
        """A consistent copy of each owned range in turn (the caller may yield to the
        event loop between two: each is a copy, safe while batches keep applying)."""
        self._check_complete()
        for rng in list(self.primaries.values()):
            yield rng.state.snapshot()

    def rank(self, k: int, items) -> list[tuple[object, object, object]]:
        """The best `k` of `items` by the reducer's sort key: (key, state, rank)."""
        sort_key = self.reducer.sort_key
        best = heapq.nlargest(k, items, key=lambda item: sort_key(item[1]))
        return [(key, state, sort_key(state)) for key, state in best]

    def check_readable(self) -> None:
        """Refuses a read of all keys here: starting, fenced, or owning a lost range."""
        self._check_complete()

    def inspect_range(self, token: int) -> tuple[str, dict]:
        """A range's whole state as this node holds it: a copy (of references), which
        the caller may read in chunks while batches keep applying."""
        if token in self.primaries:
            return "primary", self.primaries[token].state.snapshot()
        if token in self.replicas.ranges or token in self.replicas.backups.tokens():
            return "replica", self.replicas.rebuild(token, self._keys_of(token))[0]
        return "", {}

    def inspect_steps(self, token: int, step: int) -> Iterator:
        """inspect_range, yielding None between steps and (role, states) last: an owned
        range of layers (LayeredState) is copied `step` keys of its master at a time,
        as of the call, while batches keep applying between the steps."""
        rng = self.primaries.get(token)
        if rng is not None and isinstance(rng.state, LayeredState):
            keys: list = []
            values: list = []
            fixed: dict = {}
            yield from rng.state.copy_in_steps(keys, values, fixed, step)
            yield "primary", copy_pairs(keys, values, fixed)
        else:
            yield self.inspect_range(token)

    @property
    def fold_epoch(self) -> int:
        """Steps of folds taken here: a piece's state moved to its outgoing key, a fold
        merged into a key, a fold marked done. A scan that saw it change while it read
        may have read a fold half-way: on two nodes, at two moments (mapper.scanning)."""
        return self.folds.folded + self.folds.done + self.fold_merges

    def fold_marks(self) -> dict[str, int]:
        """The last fold seq merged per fold source, over the ranges we own: a scan
        skips a fold it sees on its way whose seq a node shows merged already."""
        marks: dict[str, int] = {}
        for rng in self.primaries.values():
            for source, seq in rng.watermarks.items():
                if is_fold_source(source):
                    marks[source] = max(seq, marks.get(source, 0))
        return marks

    def stats(self) -> dict:
        return dict(
            self.counters,
            keys=sum(len(r.state) for r in self.primaries.values()),
            backup_tuples=self.replicas.backups.tuples,
            backup_bytes=self.replicas.backups.bytes,
            backups_expired=self.replicas.expired,
            ring_version=self.ring.version,
            ring_share=self.ring.share_of(self.node_id),
            lost_ranges=len(self.lost_tokens),
            under_replicated=len(self.under_replicated()),
            pieces_folded=self.folds.folded,
            fold_epoch=self.fold_epoch,
        )

    def check_invariants(self) -> None:
        if self.ring is not self._ring_checked:     # a ring is immutable: once is enough
            self.ring.check_invariants()
            self._ring_checked = self.ring
        owned = set(self.ring.tokens_of(self.node_id))
        if set(self.primaries) != owned:
            raise AssertionError(f"{self.node_id} applies {sorted(self.primaries)} but owns "
                                 f"{sorted(owned)}")
        for rng in self.primaries.values():
            rng.check_invariants()
        self.replicas.backups.check_invariants()


_ABSENT = object()


def cut_ranges(old: Ring, new: Ring) -> dict[int, tuple[int, ...]]:
    """Tokens of `old` whose range new tokens cut: token -> the tokens of `new` inside
    its old range (itself included)."""
    cuts: dict[int, list[int]] = {}
    for token in new.tokens:
        if not old.has_token(token):
            whole = old.token_for_position(token)
            if new.has_token(whole):
                cuts.setdefault(whole, [whole]).append(token)
    return {t: tuple(sorted(parts)) for t, parts in cuts.items()}


def _tokenless_extras(ring, tokens, me: str) -> set[str]:
    return {x for t in tokens for x in ring.extras_of(t)
            if x != me and x in ring.nodes and not ring.tokens_of(x)}


def _idle_members(ring) -> set[str]:
    """Members that own no range and are no extra destination of any range."""
    owners = set(ring.owners)
    extras = {x for t in ring.tokens for x in ring.extras_of(t)}
    return {n for n in ring.nodes if n not in owners and n not in extras}


def _sponsor(ring, node: str) -> str | None:
    """The member that watches an idle member: the first range owner after it in id
    order (wrapping). Both sides compute it from the ring, so they agree."""
    owners = sorted(set(ring.owners))
    if not owners:
        return None
    return next((o for o in owners if o > node), owners[0])

