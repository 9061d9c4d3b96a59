"""A range's state for a built-in reducer (count, sum, min, max): int64 states in a
state table (`floering.node.core.columnar`), a columnar batch folded in one call.

What a table cannot hold (a float sum or min, a count past int64, an outgoing key's
fold record, a min's None merged in) lives in `spill`, a small layered dict laid over
the table: a key there is read from there, whatever the table still holds for it, and
a batch touching such a key takes the dict path. The table is one layer: a checkpoint
takes its dirty keys (the table marks each key it changes), so the fragment of a
checkpoint is the table's dirty keys with the spill's changed ones laid over them.

It offers LayeredState's interface (get, lookup, unknown, apply, merge_in, swap,
merge_inactive, items, snapshot, replace, put, keys, changed, len), so a range uses
either alike; `inactive` is the fragment of the checkpoint being shipped (or None).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from itertools import accumulate

from floering.node.core.columnar import KERNEL, StateTable, hash_positions
from floering.node.core.columnar.buffers import decode_key, encode_keys
from floering.node.core.columns import Columns
from floering.wire.errors import InvalidArgument, InvalidKey, inert
from floering.wire.pieces import RESERVED, is_fold_key
from floering.node.core.reducers import Count, Max, Min, Reducer, Sum
from floering.node.core.state_store import MISSING, LayeredState, ReplicaState
from floering.node.core.state_wire import (ExportView, Layers, StateColumns, StateRun, keys_of,
                                           layers_of)

TABLE_REDUCERS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}
_INT64 = (-(1 << 63), 1 << 63)


def table_op(reducer: Reducer) -> str | None:
    """The table op of a built-in reducer (exactly one: a subclass may reduce
    otherwise, and keeps the dict path), or None."""
    return TABLE_REDUCERS.get(type(reducer))


def new_state(reducer: Reducer):
    """A range's empty state: a TableState for a built-in reducer where the compiled
    table runs, else layered dicts (the pure-Python table is slower than dicts: it is
    the compiled one's reference, not a node's state)."""
    if table_op(reducer) and KERNEL == "compiled":
        return TableState(reducer)
    return LayeredState(reducer)


def state_kernel(reducer: Reducer) -> str:
    """What holds a range's states here: "compiled" (the state table) or "dict"."""
    return "compiled" if table_op(reducer) and KERNEL == "compiled" else "dict"


def int64_values(values) -> array | None:
    """The values as an int64 array, or None when one is not an int64 (a float, None,
    a bool, an int past int64)."""
    if set(map(type, values)) != {int}:
        return None
    try:
        return array("q", values)
    except OverflowError:
        return None


def key_columns(keys) -> tuple[bytes, bytes, array, array]:
    """kinds, key_data, offsets and positions of a sequence of keys (ASCII str keys
    in one join, no bytes object per key)."""
    try:
        text = "".join(keys)
    except TypeError:
        text = None
    if text is not None and text.isascii():
        data, kinds = text.encode("ascii"), bytes(len(keys))
        offsets = array("Q", [0])
        offsets.extend(accumulate(map(len, keys)))
    else:
        kinds, data, offsets = encode_keys(keys)
    return kinds, data, offsets, hash_positions(data, offsets)


def pairs_of(buffers) -> dict:
    """An export's {key: state}."""
    kinds, data, offsets, _, values = buffers
    return dict(zip(keys_of(kinds, data, offsets), values.tolist()))


CUT_SLICE = 16_384       # entries a cut gives at a time: about half a millisecond
MAX_SLICE = 1 << 16      # at most, whatever a reader asks (some 2.5 ms)


class CutView(ExportView):
    """A table's export as of a cut (StateTable.cut), made a slice at a time as it is
    read: a reader takes `slices()` (each slice made once by the cut and kept for any
    other reader, on any thread: a delta is shipped from the event loop while the
    disk's thread writes it), so no step exports the whole range while batches keep
    applying. `buffers`, the whole export as one, is made on first use: in one call
    of the table when no slice was made yet."""

    def __init__(self, cut) -> None:
        self._cut = cut
        self._size = len(cut)
        self._whole: tuple | None = None
        self._dict = None

    def __len__(self) -> int:
        return self._size

    def slices(self, most: int = CUT_SLICE):
        """The export's slices in order, each of at most `most` entries (those made
        already as they were made)."""
        i, most = 0, min(max(1, most), MAX_SLICE)
        while (part := self._cut.part(i, most)) is not None:
            yield part
            i += 1

    @property
    def buffers(self) -> tuple:
        if self._whole is None:
            first = self._cut.part(0, max(1, self._size))
            if first is not None and len(first[0]) == self._size:
                self._whole = first
            else:
                self._whole = _joined(list(self.slices(MAX_SLICE)))
        return self._whole

    def __iter__(self):
        for kinds, data, offsets, _, _ in self.slices():
            yield from keys_of(kinds, data, offsets)

    def values(self):
        for part in self.slices():
            yield from part[4]


def _joined(parts: list[tuple]) -> tuple:
    """Exports one after another as one export."""
    offsets, base = array("Q", [0]), 0
    for part in parts:
        offsets.extend(base + o for o in part[2][1:])
        base += part[2][-1]
    return (b"".join(p[0] for p in parts), b"".join(p[1] for p in parts), offsets,
            array("Q", b"".join(p[3].tobytes() for p in parts)),
            array("q", b"".join(p[4].tobytes() for p in parts)))


class _Spill(LayeredState):
    """The dict layers over a table: a key in none of them is read from the table."""

    def __init__(self, reducer: Reducer, table) -> None:
        super().__init__(reducer)
        self.table = table

    def lookup(self, key):
        state = self.get(key, MISSING)
        if state is MISSING:
            state = self.table.get(key, MISSING)
        return self.reducer.initial() if state is MISSING else state

    def holds(self) -> bool:
        return bool(self.active or self.master or self.inactive)


class TableState:
    def __init__(self, reducer: Reducer, table_class=StateTable) -> None:
        self.reducer = reducer
        self.op = table_op(reducer)
        self.table_class = table_class
        self.table = table_class(self.op)
        self.spill = _Spill(reducer, self.table)
        self.shadow = False        # some key in spill may also be in a batch
        self.inactive: Layers | None = None

    # ------------------------------------------------------------------ reads

    def get(self, key, default=None):
        if self.spill.holds():
            state = self.spill.get(key, MISSING)
            if state is not MISSING:
                return state
        try:
            return self.table.get(key, default)
        except InvalidKey:
            return default

    def lookup(self, key):
        return self.spill.lookup(key)

    def __contains__(self, key) -> bool:
        return self.get(key, MISSING) is not MISSING

    def unknown(self, keys) -> set:
        """The distinct keys of `keys` no layer holds: never applied to this range."""
        get = self.get
        return {key for key in set(keys) if get(key, MISSING) is MISSING}

    def _shadowed(self) -> set:
        """The keys spill holds (they hide whatever the table has of them)."""
        spill = self.spill
        return {*spill.master, *(spill.inactive or ()), *spill.active}

    def items(self):
        """Each key once with its newest state, table keys in position order."""
        hidden = self._shadowed()
        pairs = pairs_of(self.table.export()).items()
        if hidden:
            pairs = [kv for kv in pairs if kv[0] not in hidden]
        yield from pairs
        yield from self.spill.items()

    def keys(self) -> list:
        return [key for key, _ in self.items()]

    def snapshot(self) -> dict:
        full = pairs_of(self.table.export(ordered=False))
        full.update(self.spill.snapshot())
        return full

    def __len__(self) -> int:
        hidden = self._shadowed()
        inside = sum(1 for key in hidden if _in_table(self.table, key))
        return len(self.table) + len(hidden) - inside

    # ---------------------------------------------------------------- writes

    def apply(self, keys, values) -> None:
        """Fold a batch; raises InvalidArgument, changing nothing, for a bad one."""
        self._fold(keys, values, False)

    def merge_in(self, keys, states) -> None:
        """Merge states into keys' (with the reducer's merge); all or nothing."""
        self._fold(keys, states, True)

    def _fold(self, keys, values, merge: bool) -> None:
        if len(keys) != len(values):
            raise InvalidArgument(f"batch has {len(keys)} keys but {len(values)} values")
        (self.reducer.check_states if merge else self.reducer.check_values)(values)
        if not keys:
            return
        vals = int64_values(values)
        if vals is not None and not self._touches_spill(keys):
            try:
                kinds, data, offsets, positions = key_columns(keys)
                self.table.apply(kinds, data, offsets, positions, vals)
                return
            except OverflowError:
                pass                    # past int64: the dict path holds big ints
        self._dict_path(keys, values, merge)

    def apply_prepared(self, keys, values, merge: bool, start: int, columns, ints) -> None:
        """Fold a format 1 batch from tuple `start` on whose values the reducer checked
        and whose key columns and int64 values were built (ranges.Prepared): in one
        call of the table, as _fold's."""
        if start >= len(keys):
            return
        if not self._touches_spill(keys[start:] if start else keys):
            try:
                self.table.apply(*columns, ints, start)
                return
            except OverflowError:
                pass
        self._dict_path(keys[start:], values[start:], merge)

    def apply_columns(self, cols, start: int = 0) -> None:
        """Fold a checked format 2 batch (`columns.Columns`) from tuple `start` on: in
        one call of the table, without a Python object per tuple. Its values are int64,
        which every table op takes as a value and as a state alike."""
        if start >= cols.count:
            return
        if self.shadow and self.spill.holds():
            keys = cols.keys()[start:]
            if self._touches_spill(keys):
                self._dict_path(keys, tuple(cols.values[start:]), False)
                return
        try:
            self.table.apply(cols.table_kinds(), cols.key_data, cols.offsets,
                             cols.positions, cols.values, start)
        except OverflowError:
            self._dict_path(cols.keys()[start:], tuple(cols.values[start:]), False)

    def _touches_spill(self, keys) -> bool:
        if not (self.shadow and self.spill.holds()):
            return False
        hidden = self._shadowed()
        return any(key in hidden for key in keys)

    def _dict_path(self, keys, values, merge: bool) -> None:
        """Fold into spill (the states read through to the table): every key of the
        batch is then spill's. Checked (and all or nothing) as LayeredState's fold."""
        spill = self.spill
        (spill.merge_in if merge else spill.apply)(keys, values)
        if not all(map(is_fold_key, keys)):
            self.shadow = True

    def put(self, key, state) -> None:
        """Set a key's state (a fold's step): in the table when it holds the key and
        the state is an int64, else in spill."""
        if type(state) is int and _INT64[0] <= state < _INT64[1] and \
                key not in self._shadowed():
            kinds, data, offsets, positions = key_columns((key,))
            self.table.install((kinds, data, offsets, positions, array("q", (state,))),
                               mark_dirty=True)
            return
        self.spill.active[key] = state
        if not is_fold_key(key):
            self.shadow = True

    def replace(self, full: dict) -> None:
        """Take over a range: `full` becomes the state (not kept: copied in)."""
        self.table = self.table_class(self.op)
        self.spill = _Spill(self.reducer, self.table)
        self.inactive = None
        self.install(full, mark_dirty=False)

    def adopt(self, other: "TableState") -> None:
        """Take `other`'s states over as they are (no copy): its table, and its spill
        as one layer. `other` must not be used after."""
        self.table, self.inactive, self.shadow = other.table, None, other.shadow
        self.spill = _Spill(self.reducer, self.table)
        self.spill.master = other.spill.snapshot()

    def split_ranges(self, bounds: dict) -> dict | None:
        """The range cut by position: token -> a TableState of the keys whose positions
        are in its (lo, hi] of `bounds`, each chosen by the table over its positions
        (no key decoded). None when that cannot be the whole of it (spill holds keys,
        a checkpoint is being cut, or some key lies in none of the parts): the caller
        cuts key by key."""
        if self.spill.holds() or self.inactive is not None:
            return None
        out, taken = {}, 0
        for token, (lo, hi) in bounds.items():
            buffers = self.table.export(lo, hi, ordered=False)
            part = out[token] = TableState(self.reducer, self.table_class)
            part.table.install(buffers, mark_dirty=False)
            taken += len(buffers[0])
        return out if taken == len(self.table) else None

    def install(self, states, mark_dirty: bool) -> None:
        """Set the states of `states`' keys (the table's where they are int64 and
        spill does not hold the key): received column states (node.core.state_wire),
        a full copy's frames in one call of the table while spill holds nothing."""
        parts: list = []
        for layer in layers_of(states):
            if isinstance(layer, StateColumns) and not self.spill.holds():
                parts.append((layer.kinds, layer.key_data, layer.offsets, layer.value_column))
                if not layer.rest_keys:
                    continue
                layer = layer.rest()        # laid over the columns up to here
            self._install_parts(parts, mark_dirty)
            parts = []
            self._install_pairs(layer, mark_dirty)
        self._install_parts(parts, mark_dirty)

    def _install_parts(self, parts: list, mark_dirty: bool) -> None:
        """Frames' columns into the table in one call (positions hashed there, room
        made once): all or nothing, InvalidArgument for a bad one."""
        if parts:
            try:
                self.table.install_parts(parts, mark_dirty=mark_dirty)
            except ValueError as exc:
                raise InvalidArgument(f"column states: {exc}") from None

    def _install_pairs(self, states, mark_dirty: bool) -> None:
        keys, vals, rest = [], [], {}
        hidden = self._shadowed() if self.spill.holds() else ()
        for key, state in states.items():
            if type(state) is int and _INT64[0] <= state < _INT64[1] and \
                    type(key) in (str, bytes, int) and key not in hidden:
                keys.append(key)
                vals.append(state)
            else:
                rest[key] = state
        if keys:
            kinds, data, offsets, positions = key_columns(keys)
            self.table.install((kinds, data, offsets, positions, array("q", vals)),
                               mark_dirty=mark_dirty)
        if rest:
            (self.spill.active if mark_dirty else self.spill.master).update(rest)
            if not all(map(is_fold_key, rest)):
                self.shadow = True

    # ------------------------------------------------------------ checkpoints

    def changed(self) -> bool:
        """Whether anything changed since the last swap."""
        return bool(self.table.dirty_count or self.spill.active)

    def _dirty(self) -> tuple:
        """The keys changed as columns, in the order each first changed: as a dict's
        active layer holds them, so a delta's frames are a dict node's, byte for byte."""
        try:
            return self.table.take_dirty(ordered=False)
        except TypeError:               # a table built before take_dirty took `ordered`
            return self.table.take_dirty()

    @property
    def active(self) -> dict:
        """The keys changed since the last swap, with their states (a copy)."""
        buffers = self.table.take_dirty()
        self.table.install(buffers, mark_dirty=True)         # still dirty
        out = pairs_of(buffers)
        out.update(self.spill.active)
        return out

    def swap(self) -> "Layers":
        """Start a checkpoint: the keys changed since the previous one (the table's as
        a cut of its changed keys, spill's over them), readable as `inactive` until
        merge_inactive."""
        if self.inactive is not None:
            raise RuntimeError("the previous checkpoint has not been merged yet")
        cut = self.table.take_dirty_cut()     # made a slice at a time as it is read
        fragment = Layers(ExportView(self._dirty()) if cut is None else CutView(cut),
                          self.spill.swap())
        self.inactive = fragment
        return fragment

    def merge_inactive(self) -> None:
        if self.inactive is not None:
            self.spill.merge_inactive()
            self.inactive = None

    def full_layers(self) -> tuple:
        """The whole range as of now, as layers (later ones over earlier ones): the
        table's cut (a CutView, exported a slice at a time as it is read; the export
        at once when the table has no cut free) and spill's copy."""
        cut = self.table.cut()
        view = ExportView(self.table.export(ordered=False)) if cut is None else CutView(cut)
        return view, self.spill.snapshot()

    def check_invariants(self) -> None:
        self.spill.check_invariants()
        if self.spill.table is not self.table:
            raise AssertionError("spill reads through to another table")
        if self.inactive is None and self.spill.inactive is not None:
            raise AssertionError("spill's checkpoint is cut without the table's")


INSTALL_STEP = 16_384     # entries of a full copy installed per step (a frame, 1-3 ms)


def copy_in_steps(reducer: Reducer, states, step: int = INSTALL_STEP) -> Iterator:
    """A replica's copy of a full copy's frames (a StateRun) built into a new
    TableState about `step` entries at a time, yielding None after each (a caller lets
    its event loop run between) and the TableState last, which TableCopy.replace
    then takes over as it is. The table is grown once for every frame first. A bad
    frame raises InvalidArgument: the copy being built is dropped, nothing else
    changed (as with replace's install in one call)."""
    state = TableState(reducer)
    layers = layers_of(states)
    frames = [layer for layer in layers if isinstance(layer, StateColumns)]
    state.table.reserve(sum(len(f.kinds) for f in frames), sum(len(f.key_data) for f in frames))
    yield None                      # the index cleared: a step of its own
    run: list = []
    held = 0
    for layer in layers:
        run.append(layer)
        held += len(layer.kinds) + len(layer.rest_keys) if isinstance(layer, StateColumns) \
            else len(layer)
        if held >= step:
            state.install(StateRun(run), mark_dirty=False)
            run, held = [], 0
            yield None
    state.install(StateRun(run), mark_dirty=False)
    yield state


GROW_STEP = 65_536        # entries a step places in a growing index (1-2 ms)


def index_room(table, keys: int, most: int = GROW_STEP) -> Iterator[None]:
    """Grow `table`'s index for `keys` more keys a share at a time (StateTable.
    grow_index), yielding after each share: nothing when it holds them already."""
    while not table.grow_index(keys, most):
        yield None


def pieces(layers: list, most: int) -> Iterator:
    """The layers with each frame (StateColumns) of more than `most` entries cut in
    pieces of `most` (its rest in the last), in order: the pieces share the frame's
    key bytes, their offsets are the frame's own."""
    for layer in layers:
        if not isinstance(layer, StateColumns) or len(layer.kinds) <= most:
            yield layer
            continue
        n = len(layer.kinds)
        for start in range(0, n, most):
            end = min(n, start + most)
            last = end == n
            yield StateColumns(layer.kinds[start:end], layer.key_data,
                               layer.offsets[start:end + 1], layer.value_column[start:end],
                               layer.rest_keys if last else (),
                               layer.rest_states if last else ())


class TableCopy:
    """A replica's copy of a table-backed range as of the primary's last checkpoint:
    ReplicaState's interface over a TableState, which a takeover adopts as it is."""

    def __init__(self, reducer: Reducer) -> None:
        self.state = TableState(reducer)

    def apply_fragment(self, fragment) -> None:
        self.state.install(fragment, mark_dirty=False)

    def fragment_in_steps(self, fragment, step: int = INSTALL_STEP) -> Iterator[None]:
        """apply_fragment about `step` entries at a time, yielding after each: its
        frames in order (one of more than `step` entries in pieces), each laid over
        the ones before as install lays them, the table's index grown for each in
        steps of their own first (index_room: most of a delta's keys may be held
        already, so room is not made for all of them at once). A bad frame raises
        InvalidArgument with the ones before it installed (the caller counts the
        copy as half changed: ReplicaSide)."""
        state = self.state                # replace() may swap it: this one is installed
        run: list = []
        held = 0
        for layer in pieces(layers_of(fragment), step):
            run.append(layer)
            held += delta_size(layer)
            if held >= step:
                yield from index_room(state.table, held)
                state.install(StateRun(run), mark_dirty=False)
                run, held = [], 0
                yield None
        if run:
            yield from index_room(state.table, held)
            state.install(StateRun(run), mark_dirty=False)

    def replace(self, full) -> None:
        """The whole range: a mapping (copied in), or a range's TableState (taken over
        as it is: its owner drops it)."""
        state = TableState(self.state.reducer)
        if isinstance(full, TableState):
            state.adopt(full)
        else:
            state.replace(full)         # all or nothing: the copy stays as it was
        self.state = state

    @property
    def master(self) -> dict:
        """The copy as a dict (a copy)."""
        return self.state.snapshot()

    @master.setter
    def master(self, full) -> None:
        self.state.replace(full)

    def get(self, key, default=None):
        return self.state.get(key, default)

    def split_ranges(self, bounds: dict) -> dict | None:
        """As TableState.split_ranges, into copies."""
        parts = self.state.split_ranges(bounds)
        if parts is None:
            return None
        out = {}
        for token, state in parts.items():
            out[token] = TableCopy(self.state.reducer)
            out[token].state = state
        return out

    def __len__(self) -> int:
        return len(self.state)


def delta_size(states) -> int:
    """Entries of received states (a StateRun, StateColumns or a dict), duplicates
    across layers counted as often as they come."""
    return sum(len(layer.kinds) + len(layer.rest_keys) if isinstance(layer, StateColumns)
               else len(layer) for layer in layers_of(states))


def copies_in_tables(reducer: Reducer) -> bool:
    """Whether a replica's copy of a range is a table (new_copy), else a dict."""
    return bool(table_op(reducer)) and KERNEL == "compiled"


def new_copy(reducer: Reducer):
    """A replica's empty copy of a range, held as the range's primary holds it."""
    if copies_in_tables(reducer):
        return TableCopy(reducer)
    return ReplicaState()


def _in_table(table, key) -> bool:
    try:
        return table.get(key, MISSING) is not MISSING
    except InvalidKey:
        return False


class ColumnKeys:
    """A columnar batch's keys as a sequence, each decoded when read (a sample of a
    few of them)."""

    def __init__(self, cols: Columns) -> None:
        self.cols = cols

    def __len__(self) -> int:
        return self.cols.count

    def __getitem__(self, i: int):
        cols = self.cols
        if not 0 <= i < cols.count:
            raise IndexError(i)
        kind = cols.kinds[0] if len(cols.kinds) == 1 else cols.kinds[i]
        return decode_key(kind, cols.key_data[cols.offsets[i]:cols.offsets[i + 1]])


def marked_keys(cols: Columns) -> tuple:
    """The batch's keys with the reserved mark (pieces of shared keys), or none."""
    if RESERVED not in cols.key_data:
        return ()
    return tuple(k for k in cols.keys() if type(k) is bytes and k.startswith(RESERVED))


def check_positions(cols: Columns, bounds: tuple[int, int], token: int) -> None:
    """Every position of the batch in the range (lo, hi] of `token` (wrapping; lo ==
    hi: the whole ring), in a pass or two at C speed; InvalidArgument naming a key
    outside it. (A format 2 position was checked to be its key's hash.)"""
    lo, hi = bounds
    positions = cols.positions
    if lo < hi:
        inside = min(positions) > lo and max(positions) <= hi
    elif lo > hi:       # (lo, 2**64) and [0, hi]: no position in (hi, lo]
        inside = max(filter(lo.__ge__, positions), default=0) <= hi
    else:
        return
    if not inside:
        bad = next(i for i, p in enumerate(positions)
                   if not (lo < p <= hi if lo < hi else (p > lo or p <= hi)))
        raise InvalidArgument(f"key {inert(ColumnKeys(cols)[bad])} does not belong to "
                              f"token {token}")
