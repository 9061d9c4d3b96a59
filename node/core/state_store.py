"""Per key state in master / inactive / active layers (Floe §V-C incremental checkpoints).

Updates go to active. A checkpoint swaps active into inactive in O(1) and ships it (it
holds exactly the keys changed since the previous checkpoint), then merges it into
master, while updates keep going into a fresh active. Reads look active -> inactive ->
master, so they always see the newest state.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Generator, Iterator, Mapping

from floering.node.core.reducers import Reducer
from floering.node.core.state_wire import into_dict

MISSING = object()  # "no such key", for callers whose states may be None


class LayeredState:
    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self.master: dict = {}
        self.inactive: dict | None = None
        self.active: dict = {}
        # Copies under way (copy_in_steps): each a dict of what a merge overwrote
        # in master since the copy began (MISSING: a key master did not have).
        self.pins: list[dict] = []

    def get(self, key, default=None):
        if key in self.active:
            return self.active[key]
        inactive = self.inactive
        if inactive is not None and key in inactive:
            return inactive[key]
        return self.master.get(key, default)

    def lookup(self, key):
        """The state of `key`, or the reducer's initial state for a key never seen.
        Called by apply for every key new to active, so get() is inlined."""
        if key in self.active:
            return self.active[key]
        inactive = self.inactive
        if inactive is not None and key in inactive:
            return inactive[key]
        master = self.master
        return master[key] if key in master else self.reducer.initial()

    def unknown(self, keys) -> set:
        """The distinct keys of `keys` no layer holds: never applied to this range.
        (set.difference with a dict runs in C, probing the dict per key of the set.)"""
        new = set(keys).difference(self.active)
        if new and self.inactive:
            new = new.difference(self.inactive)
        return new.difference(self.master) if new else new

    def apply(self, keys, values) -> None:
        """Fold a batch; raises InvalidArgument, changing nothing, for a bad one."""
        self.reducer.apply_batch(keys, values, self.active, self.lookup)

    def merge_in(self, keys, states) -> None:
        """Merge states into keys' (a piece merged back); as apply, all or nothing."""
        self.reducer.merge_batch(keys, states, self.active, self.lookup)

    def changed(self) -> bool:
        """Whether anything changed since the last swap."""
        return bool(self.active)

    def put(self, key, state) -> None:
        """Set a key's state (a fold's step)."""
        self.active[key] = state

    def keys(self) -> list:
        return [*self.master, *(self.inactive or ()), *self.active]

    def swap(self) -> dict:
        """Start a checkpoint: return the fragment (the keys changed since the previous
        one), which stays readable as the inactive layer until merge_inactive."""
        if self.inactive is not None:
            raise RuntimeError("the previous checkpoint has not been merged yet")
        self.inactive, self.active = self.active, {}
        return self.inactive

    def merge_inactive(self) -> None:
        """Finish a checkpoint once its fragment is shipped; no-op without one."""
        if self.inactive is not None:
            master = self.master
            for saved in self.pins:
                for key in self.inactive:
                    if key not in saved:
                        saved[key] = master.get(key, MISSING)
            master.update(self.inactive)
            self.inactive = None

    def items(self) -> Iterator[tuple[object, object]]:
        """Each key once with its newest state, without copying master. Lazy: do not
        apply, swap or merge while iterating (take a snapshot() for that)."""
        active, inactive = self.active, self.inactive or {}
        yield from active.items()
        for key, state in inactive.items():
            if key not in active:
                yield key, state
        for key, state in self.master.items():
            if key not in active and key not in inactive:
                yield key, state

    def snapshot(self) -> dict:
        full = dict(self.master)
        if self.inactive:
            full.update(self.inactive)
        full.update(self.active)
        return full

    def copy_in_steps(self, keys: list, states: list, fixed: dict, step: int
                      ) -> Iterator[None]:
        """The state as of the call, `step` keys of master at a time, yielding after
        each: batches, checkpoints and their merges may run in between. Master's keys
        and states as they began go to `keys` and `states`; `fixed` gets the keys whose
        state is another (MISSING: none), read in place of theirs (copy_pairs). A
        merge saves what it overwrites in master for the copy; master's keys keep
        their order and none is removed, so a copy that a merge's new keys cut off
        goes on from the same position. The small layers are copied as it begins."""
        master = self.master
        over = {**self.inactive, **self.active} if self.inactive else dict(self.active)
        saved: dict = {}
        pins = self.pins
        pins.append(saved)
        try:
            total, at = len(master), 0
            pairs = iter(master.items())
            while at < total:
                try:
                    part = list(islice(pairs, min(step, total - at)))
                except RuntimeError:        # master grew: on from the same position
                    pairs = yield from _skipped(master, at, 16 * step)
                    continue
                keys.extend(k for k, _ in part)
                states.extend(s for _, s in part)
                at += len(part)
                yield
        finally:
            for i, pin in enumerate(pins):
                if pin is saved:
                    del pins[i]
                    break
        fixed.update(saved)
        fixed.update(over)

    def replace(self, full: dict) -> None:
        """Take over a range: `full` (now owned by this store) becomes master. A copy
        under way reads the master it began with, which no merge changes now."""
        self.master, self.inactive, self.active = full, None, {}
        self.pins = []

    def __len__(self) -> int:
        master = self.master
        if not self.active and not self.inactive:
            return len(master)
        # Only the small layers are scanned, never master.
        changed = self.active.keys() | (self.inactive or {}).keys()
        return len(master) + len(changed) - sum(map(master.__contains__, changed))

    def check_invariants(self) -> None:
        if not isinstance(self.master, dict) or not isinstance(self.active, dict):
            raise AssertionError("master and active must be dicts")
        if self.inactive is not None and not isinstance(self.inactive, dict):
            raise AssertionError("inactive must be None or a dict")
        if self.active is self.master or self.active is self.inactive \
                or self.inactive is self.master:
            raise AssertionError("two state layers are the same dict")


def copy_pairs(keys: list, states: list, fixed: dict) -> Iterator[tuple[object, object]]:
    """Each key of a copy_in_steps once, with its state as the copy began."""
    for key, state in zip(keys, states):
        if key not in fixed:
            yield key, state
    for key, state in fixed.items():
        if state is not MISSING:
            yield key, state


def _skipped(master: dict, at: int, step: int) -> Generator[None, None, Iterator]:
    """An iterator of master's items from position `at`, the ones before skipped
    `step` at a time with a yield after each; a skip that master's growth cut off
    begins again, and after three in a row it skips the rest in one go."""
    for tries in range(4):
        pairs, left = iter(master.items()), at
        try:
            while left > step and tries < 3:
                deque(islice(pairs, step), maxlen=0)
                left -= step
                yield
            deque(islice(pairs, left), maxlen=0)
            return pairs
        except RuntimeError:
            continue
    return islice(master.items(), at, None)


class ReplicaState:
    """A replica's copy of a primary's range as of the primary's last checkpoint."""

    def __init__(self) -> None:
        self.master: dict = {}

    def apply_fragment(self, fragment: Mapping) -> None:
        self.master.update(fragment)

    def fragment_in_steps(self, fragment, step: int) -> Iterator[None]:
        """apply_fragment `step` entries at a time, yielding after each."""
        return into_dict(self.master, fragment, step)

    def replace(self, full: Mapping) -> None:
        # Copied: one full checkpoint may be handed to several replicas in-process.
        self.master = dict(full)

    def get(self, key, default=None):
        return self.master.get(key, default)

    def __len__(self) -> int:
        return len(self.master)
