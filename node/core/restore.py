"""A node back from its data directory (node.storage.node_store): a takeover from
its own disk. Every range it held comes back as a replica copy plus the batches
logged past it; the ranges its ring gives it are then rebuilt exactly as a replica
rebuilds a dead primary's (`ReplicaSide.rebuild`), so a restart and a failover share
one replay path, deduplicated by the same watermarks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from floering.node.core.backup_store import BackupEntry, split_entry
from floering.node.core.batch import Batch, Limits
from floering.wire.epochs import effective_mark
from floering.node.core.node_core import NodeCore
from floering.node.core.ranges import ReplicaSide
from floering.node.core.reducers import Reducer
from floering.wire.ring import Ring
from floering.node.core.state_wire import StateRun
from floering.node.core.table_state import TableCopy


@dataclass
class DiskCopy:
    """One range's checkpointed copy as read back."""

    token: int
    primary: str
    watermarks: dict[str, int]
    complete: bool = True
    states: Any = field(default_factory=dict)   # a dict, or a StateRun of frames read back


def restored_core(node_id: str, ring: Ring, reducer: Reducer, limits: Limits,
                  copies: dict[int, DiskCopy], batches, now: float,
                  verify_keys: bool = False, corrupt=frozenset(), make=NodeCore) -> NodeCore:
    """The core `node_id` had in `ring`, from its copies and its logged batches
    ((token, batch) in the order accepted). The copies' states become the ranges'
    (the caller gives them up); a primary's replayed keys stay in its active layer.
    The ranges whose copies were `corrupt` come back as after our death alone
    (`without_corrupt`): the core's ring is then one version newer. `make` builds
    the core (NodeCore or a subclass)."""
    ring = without_corrupt(ring, node_id, corrupt)
    core = make(node_id, ring, reducer, limits, verify_keys)
    side = ReplicaSide(reducer)
    for token, copy in copies.items():
        if ring.has_token(token):
            # The copy read back becomes the range's, uncopied (`copies` are ours).
            side.adopt_copy(token, copy.primary, {}, copy.watermarks)
            taken = side.ranges[token].copy
            # A table takes the frames read back in one call; a dict copy a dict.
            states = copy.states
            if not isinstance(taken, TableCopy) and isinstance(states, StateRun):
                states = states.to_dict()
            taken.master = states
            side.ranges[token].complete = copy.complete
    covered = covered_by_every_copy(ring, node_id, copies)
    for token, b in batches:
        if covered(b):
            continue            # the replay and the eviction below would skip it anyway
        # The ring may have cut or joined ranges since the batch was logged: each of
        # its keys goes to the range holding it now (a batch that does not decode
        # stays whole, and its replay skips it as the primary did).
        held = token if ring.has_token(token) else ring.token_for_position(token)
        entry = BackupEntry(b.first_seq, b.last_seq, b.count, b.payload, b.seqs, now)
        for part, piece in split_entry(entry, ring.token_for_key, held).items():
            side.backups.add(part, b.source, piece)
    for token in ring.tokens:
        role = ring.role_of(node_id, token)
        if role == "primary":
            # The copy as read becomes master, what the replay changed the active
            # layer: all a restart writes back of it (node.core.persistence).
            rng = core.primaries[token]
            _, rng.watermarks = side.rebuild(token, core._keys_of(token), into=rng.state)
            side.drop(token)
        elif role == "replica":
            owner = ring.owner_of_token(token)
            if token not in side.ranges and ring.pristine and token not in corrupt:
                side.start_complete(token, owner)
            elif token in side.ranges:
                side.ranges[token].primary = owner
                side.backups.evict(token, side.ranges[token].watermarks)
        else:
            side.drop(token)
    core.replicas = side
    return core


def without_corrupt(ring: Ring, node_id: str, corrupt) -> Ring:
    """The ring a member comes back under when its copies of some ranges failed to
    read (`corrupt` tokens): each of those it owned goes to its heir, which takes
    it over from its own copy exactly as if we had died (or reports it lost if
    that copy is incomplete); one with no heir (r=0) is lost. A corrupt copy we
    kept for another primary needs no change: ours is simply incomplete, and the
    primary's next checkpoint to us is a full one."""
    owned = [t for t in sorted(corrupt)
             if ring.has_token(t) and ring.owner_of_token(t) == node_id]
    moves = {t: heir for t in owned if (heir := ring.heir(t)) is not None}
    lost = [t for t in owned if t not in moves]
    if moves:
        ring = ring.with_owners(moves)
    if lost:
        ring = ring.with_lost(lost)
    return ring


def covered_by_every_copy(ring: Ring, node_id: str, copies: dict[int, DiskCopy]):
    """Whether a logged batch is covered by the copy of every range `node_id` holds
    in `ring`: wherever its keys go now, none is past that range's watermarks, so
    it needs no decoding (most of a log is behind the copies). Never, while a range
    held has no copy."""
    held = [copies.get(t) for t in ring.tokens if ring.role_of(node_id, t) is not None]
    if any(c is None for c in held):
        return lambda b: False
    marks = [c.watermarks for c in held if c is not None]
    return lambda b: all(b.last_seq <= effective_mark(w, b.source) for w in marks)


def batch_record(b: Batch) -> tuple:
    return (b.source, b.first_seq, b.last_seq, b.count, b.payload, b.seqs)


def batch_from_record(token: int, record) -> Batch:
    source, first, last, count, payload, seqs = record
    return Batch(0, token, source, first, last, count, payload, seqs)
