"""A range read out whole for a snapshot, and a snapshot's chunk merged into a range.
Pure: the node core's ranges and an explicit `now`.

Export reads a primary range's states and its per-source watermarks in one step, so
the watermarks cover exactly the states read. Import merges a chunk's states into a
range with the reducer's merge (checked, all or nothing, as a combining mapper's are)
and keeps `import:<snapshot>@<lo>-<token>` = the last chunk merged as one of the range's
watermarks: a chunk sent again is merged once, and checkpoints, replicas, takeovers
and the durable store carry the mark as any watermark."""

from __future__ import annotations

import re

from floering.wire.errors import Fenced, InvalidArgument, ReducerMismatch, StaleRing
from floering.node.core.state_wire import StateColumns
from floering.node.core.snapshot_format import (IMPORT_SOURCE, MAX_CHUNKS, SnapshotError,
                                                check_keys, check_watermarks)

SNAPSHOT_ID = re.compile(r"[0-9a-f]{64}")


class HoldsState(StaleRing):
    """The range holds state already (FAILED_PRECONDITION): merging a snapshot into it
    adds the two; the operator asks for that explicitly."""


def import_mark(snapshot: str, bounds: tuple[int, int]) -> str:
    """The range's mark of the chunks of `snapshot` it took while its bounds were
    `bounds` (lo, token]: a chunk plan holds for those keys only (a range split since
    would skip chunks of keys it never took), so a resume on other bounds finds no
    mark and is refused. A move or any other ring change keeps it."""
    return f"{IMPORT_SOURCE}{snapshot}@{bounds[0]:x}-{bounds[1]:x}"


def _primary(core, ring_stamp: int, token: int):
    core.check_readable()               # starting, fenced, or a range lost: refused
    if ring_stamp != core.ring.stamp:
        raise StaleRing(f"ring stamp {ring_stamp:#x}, node {core.node_id} is at "
                        f"{core.ring.stamp:#x}: read the ring again")
    rng = core.primaries.get(token)
    if rng is None:
        raise StaleRing(f"node {core.node_id} is not the primary of token {token} in ring "
                        f"version {core.ring.version}")
    return rng


def export_range(core, ring_stamp: int, token: int) -> tuple[dict, dict[str, int]]:
    """(states, watermarks) of a range this node is primary for, read at one point:
    a copy (of references) the caller may encode while batches keep applying."""
    rng = _primary(core, ring_stamp, token)
    return rng.state.snapshot(), dict(rng.watermarks)


def export_columns(core, ring_stamp: int, token: int):
    """(view, watermarks) of a range held whole in a state table (a table reducer's
    range with nothing in spill): the table's export as of now (an ExportView, or a
    CutView made a slice at a time as it is read while batches keep applying), with
    the watermarks read at the same point; (None, None) for any other range."""
    rng = _primary(core, ring_stamp, token)
    full = getattr(rng.state, "full_layers", None)
    if full is None:
        return None, None
    view, spill = full()
    if spill:
        return None, None
    return view, dict(rng.watermarks)


def import_chunk(core, reducer: str, ring_stamp: int, token: int, snapshot: str,
                 chunk: int, chunks: int, keys, states, watermarks: dict,
                 into_state: bool, now: float) -> int:
    """Merge chunk `chunk` of `chunks` of a snapshot's states for `token` into the
    range (`keys` may be a decoded frame of column states, StateColumns, `states`
    None: its columns checked and merged into the range's table in one call, its
    rest as keys); returns the chunks of that snapshot the range holds now. A chunk held
    already changes nothing; one past the next is refused. The first chunk brings
    the watermarks (each source's raised to the snapshot's) and, unless `into_state`,
    is refused (HoldsState) by a range that holds any state or watermark."""
    if core.fenced:
        raise Fenced(f"node {core.node_id} was removed from the ring")
    if not SNAPSHOT_ID.fullmatch(snapshot):
        raise InvalidArgument("a snapshot id is 64 lowercase hex digits")
    if not 1 <= chunk <= chunks <= MAX_CHUNKS:
        raise InvalidArgument(f"chunk {chunk} of {chunks}: chunks are 1..chunks, at most "
                              f"{MAX_CHUNKS}")
    if reducer != core.reducer.name:
        raise ReducerMismatch(f"the snapshot's reducer is {reducer!r}, the ring runs "
                              f"{core.reducer.name!r}")
    rng = _primary(core, ring_stamp, token)
    mark = import_mark(snapshot, core.ring.range_of_token(token))
    held = rng.watermarks.get(mark, 0)
    if chunk <= held:
        return held
    if not held and any(source.startswith(f"{IMPORT_SOURCE}{snapshot}@")
                        for source in rng.watermarks):
        raise HoldsState(f"the range of token {token} took part of snapshot "
                         f"{snapshot[:12]} with other bounds: it was split during the "
                         f"import, which cannot resume; import into an empty ring again")
    if chunk != held + 1:
        raise InvalidArgument(f"chunk {chunk} of snapshot {snapshot[:12]} for token "
                              f"{token}: the range holds {held}, the next is {held + 1}")
    marks = _first_chunk(core, rng, token, watermarks, into_state) if chunk == 1 else {}
    if chunk > 1 and watermarks:
        raise SnapshotError("only a range's first chunk carries its watermarks")
    keys, states, columns = checked_parts(core, rng, token, keys, states)
    merge_parts(rng, keys, states, columns)
    for source, seq in marks.items():
        if seq > rng.watermarks.get(source, -1):
            rng.watermarks[source] = seq
        rng.last_seen[source] = now
    rng.watermarks[mark] = chunk
    rng.last_seen[mark] = now
    rng.force_checkpoint()
    return chunk


def checked_parts(core, rng, token: int, keys, states) -> tuple:
    """A chunk's entries for the range of `token`, checked whole before anything is
    merged: (keys, states, columns). `keys` may be a decoded frame of column states
    (StateColumns, `states` None): for a range held in a table its columns are checked
    in a scratch table (key bytes, no key twice, every key in the range, states the
    reducer takes) and given as `columns` (the frame and the scratch table's export),
    its rest as keys; for a range of dicts it is read as keys and states. Every key
    is one a push may carry and in the range; a table range's rest states are
    checked too (a dict range's merge_in checks its own). InvalidArgument otherwise."""
    columns = None
    if isinstance(keys, StateColumns):          # a frame: sizes, kinds, offsets checked
        frame = keys
        if getattr(rng.state, "table_class", None) is None:     # a range of dicts
            keys = frame.column_keys() + list(frame.rest_keys)
            states = frame.value_column.tolist() + list(frame.rest_states)
            if len(set(keys)) != len(keys):
                raise InvalidArgument(f"a frame of {len(keys)} entries holds "
                                      f"{len(keys) - len(set(keys))} keys twice")
        else:
            keys, states = list(frame.rest_keys), list(frame.rest_states)
            if len(frame.kinds):
                columns = frame, _checked_columns(core, rng, token, frame)
    check_keys(keys)
    ring = core.ring
    for key in keys:
        if ring.token_for_key(key) != token:
            raise InvalidArgument(f"a key of the chunk belongs to token "
                                  f"{ring.token_for_key(key)}, not {token}")
    if keys and columns is not None:
        core.reducer.check_states(states)   # the rest's states, before the columns merge
    return keys, states, columns


def merge_parts(rng, keys, states, columns) -> None:
    """Merge checked_parts' entries into the range: the columns in one call, then the
    rest (merge_in checks every state first: all or nothing)."""
    if columns is not None:
        _merge_columns(rng, columns[1], columns[0])
    if keys:
        rng.state.merge_in(keys, states)


def parts_as_lists(keys, states, columns) -> tuple[list, list]:
    """checked_parts' entries as two lists (the columns' first)."""
    if columns is None:
        return list(keys), list(states)
    frame = columns[0]
    return (frame.column_keys() + list(keys), frame.value_column.tolist() + list(states))


def _checked_columns(core, rng, token: int, frame):
    """A frame's columns installed (install_parts: every key's bytes checked, its
    position hashed) in a scratch table of the range's kind, then checked: every key
    in the range of `token`, no key twice, every state one the reducer takes. The
    scratch table's export, which the range merges in one call; InvalidArgument
    (nothing changed) otherwise."""
    state = rng.state
    state.reducer.check_states(frame.value_column)
    if 1 in frame.kinds:                    # bytes keys: pieces only if well-formed
        check_keys(frame.column_keys())
    scratch = state.table_class(state.op)
    try:
        scratch.install_parts([(frame.kinds, frame.key_data, frame.offsets,
                                frame.value_column)], mark_dirty=False)
    except ValueError as exc:
        raise InvalidArgument(f"column states: {exc}") from None
    if len(scratch) != len(frame.kinds):
        raise InvalidArgument(f"a frame of {len(frame.kinds)} entries holds "
                              f"{len(frame.kinds) - len(scratch)} keys twice")
    lo, hi = core.ring.range_of_token(token)
    inside = scratch.export(lo, hi, ordered=False)
    if len(inside[0]) != len(frame.kinds):
        raise InvalidArgument(f"{len(frame.kinds) - len(inside[0])} keys of the chunk "
                              f"belong to other ranges than token {token}'s")
    return inside


def _merge_columns(rng, columns, frame) -> None:
    """Merge a checked frame's columns into the range: the table's merge in one call
    while spill holds none of the range's keys, else key by key (merge_in)."""
    state = rng.state
    if not state.spill.holds():
        try:
            state.table.merge(columns, mark_dirty=True)
            return
        except OverflowError:
            pass                            # past int64: the dict path holds big ints
    state.merge_in(frame.column_keys(), frame.value_column.tolist())


def _first_chunk(core, rng, token: int, watermarks, into_state: bool) -> dict[str, int]:
    """The first chunk's watermarks, checked; HoldsState for a range holding state
    unless `into_state`."""
    limit = core.limits.max_sources_per_range
    marks = check_watermarks(watermarks, limit)
    if any(s.startswith(IMPORT_SOURCE) for s in marks):
        raise InvalidArgument(f"a snapshot's watermarks carry no {IMPORT_SOURCE} source")
    if not into_state and (len(rng.state) or rng.watermarks):
        raise HoldsState(f"the range of token {token} on {core.node_id} holds "
                         f"{len(rng.state)} keys and {len(rng.watermarks)} watermarks "
                         f"already (import into a ring with no state, or merge into it "
                         f"explicitly)")
    if len(rng.watermarks.keys() | marks.keys()) + 1 > limit:
        raise InvalidArgument(f"the range of token {token} would track more than {limit} "
                              f"sources (--max-sources-per-range)")
    return marks
