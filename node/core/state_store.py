"""Per key state in master / inactive / active layers (Floe §V-C).

Updates go to active. A checkpoint swaps active into inactive in O(1) and ships it,
then merges it into master, while updates keep going into a fresh active. Reads look
active -> inactive -> master, so they always see the newest state.
"""

from __future__ import annotations

from typing import Iterator

from node.core.reducers import Reducer

_ABSENT = object()


class LayeredState:
    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self.master: dict = {}
        self.inactive: dict | None = None
        self.active: dict = {}

    def get(self, key, default=None):
        state = self.active.get(key, _ABSENT)
        if state is _ABSENT and self.inactive is not None:
            state = self.inactive.get(key, _ABSENT)
        if state is _ABSENT:
            state = self.master.get(key, _ABSENT)
        return default if state is _ABSENT else state

    def lookup(self, key):
        state = self.get(key, _ABSENT)
        return self.reducer.initial() if state is _ABSENT else state

    def apply(self, keys, values) -> None:
        self.reducer.apply_batch(keys, values, self.active, self.lookup)

    def swap(self) -> dict:
        if self.inactive is not None:
            raise RuntimeError("the previous checkpoint has not been merged yet")
        self.inactive, self.active = self.active, {}
        return self.inactive

    def merge_inactive(self) -> None:
        if self.inactive is not None:
            self.master.update(self.inactive)
            self.inactive = None

    def snapshot(self) -> dict:
        full = dict(self.master)
        if self.inactive:
            full.update(self.inactive)
        full.update(self.active)
        return full

    def items(self) -> Iterator[tuple[object, object]]:
        return iter(self.snapshot().items())

    def replace(self, full: dict) -> None:
        self.master, self.inactive, self.active = full, None, {}

    def __len__(self) -> int:
        if not self.active and not self.inactive:
            return len(self.master)
        return len(self.master.keys() | (self.inactive or {}).keys() | self.active.keys())

    def check_invariants(self) -> None:
        if not isinstance(self.master, dict) or not isinstance(self.active, dict):
            raise AssertionError("master and active must be dicts")
        if self.inactive is not None and not isinstance(self.inactive, dict):
            raise AssertionError("inactive must be None or a dict")


class ReplicaState:
    """A replica's copy of a primary range as of the primary's last checkpoint."""

    def __init__(self) -> None:
        self.master: dict = {}

    def apply_fragment(self, fragment: dict) -> None:
        self.master.update(fragment)

    def replace(self, full: dict) -> None:
        self.master = dict(full)

    def get(self, key, default=None):
        return self.master.get(key, default)

    def __len__(self) -> int:
        return len(self.master)
