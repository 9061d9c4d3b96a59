"""Combining on the mapper (local-global aggregation, as Flink's mini-batch and
Spark's partial aggregation do it): for a reducer with a merge, the tuples of one key
routed to one token are folded into one partial state on the mapper, and the node
merges that state in instead of reducing each tuple.

Exactly-once is kept the way it is for plain batches. A sealed batch holds one tuple
per key, each with a seq of its own drawn when the batch is sealed; resends and
replays carry the same (source, seq)s, so the nodes' dedup drops them, and a split
cuts a batch by key without cutting a key's state. The source is named
`combined:...` so every node (and a replica replaying its backups) merges its tuples.

Only for the client's own source: what a batch holds depends on when it was sealed,
so another process replaying a named source (a retried Spark task) could not rebuild
it. Memory stays bounded: a buffer is sealed at `batch_size` distinct keys or at
`max_inputs` tuples folded into it, and `emit_many` counts its keys in chunks.

str keys with an int64 value, for a built-in reducer (count, sum, min, max) and no
sharing balancer, go through the combiner kernel (COMBINE_KERNEL: "compiled", the
Cython mapper/ccombine.pyx, or "python", mapper/pycombine.py, the same interface, used
without the extension or with FLOE_PURE=1): keys hashed, routed and folded per token
in one call, a token's states sealed straight into a batch payload (format 2 when the
ring speaks it), without a Python object per tuple. Anything else takes the dict path;
a token's open buffer is of one kind at a time (the other kind is sealed first)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from typing import Callable, Hashable, Iterable

from floering.mapper.batching import (MAX_KEY_BYTES, PLAIN_VALUES, SEAL_BYTES, Batcher,
                                     check_str_keys, check_value, key_size, refuse_key,
                                     value_size, wrong_kind)
from floering.mapper.outbox import PendingBatch
from floering.mapper.sharing import check_key
from floering.node.core.batch import encode_payload
from floering.wire.errors import FloeError
from floering.wire.pieces import COMBINED_SOURCE
from floering.node.core.reducers import Count, Max, Min, Reducer, Sum, reducer_from_identity
from floering.mapper.kernel import (COMBINE_KERNEL, Combiner, KernelBuffer,  # noqa: F401
                                    kernel, kernel_value, new_combiner)

# The reducers the kernel combines: their states are int64 folded by +, min or max.
KERNEL_OPS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}

CHUNK = 1 << 16       # keys emit_many counts at a time
# What a tuple's integer value may be (msgpack's integers): a combined count past it
# is sent as several tuples (`_spill_locked`), never dropped.
LOWEST, HIGHEST = -(1 << 63), (1 << 64) - 1


class ColumnBuffer(KernelBuffer):
    """A token's open buffer held in the combiner (its part `index`)."""
    __slots__ = ()


class StateBuffer:
    __slots__ = ("states", "inputs", "since", "tokens", "nbytes")

    def __init__(self, now: float, tokens: tuple) -> None:
        self.states: dict = {}     # key -> the partial state of the tuples folded in
        self.inputs = 0            # tuples folded in
        self.nbytes = 0            # about its keys' and states' bytes in a batch
        self.since = now
        self.tokens = tokens


def combiner_for(identity: str) -> Reducer | None:
    """The ring's reducer, loaded here to combine with, or None when it has no merge
    or this process cannot load it (then tuples go uncombined)."""
    if not identity:
        return None
    try:
        reducer = reducer_from_identity(identity)
    except FloeError:
        return None
    return reducer if reducer.merge is not None else None


class CombiningBatcher(Batcher):
    def __init__(self, router, chooser, source: str, batch_size: int, reducer: Reducer,
                 max_inputs: int, columnar: bool | None = False,
                 speaks_columns=None, clock=time.monotonic) -> None:
        super().__init__(router, chooser, COMBINED_SOURCE + source, batch_size,
                         columnar=columnar, speaks_columns=speaks_columns, clock=clock)
        self.reducer = reducer
        self.max_inputs = max_inputs
        self.combining = True
        self._tuples = itertools.count(1)   # numbers a sharing balancer chooses pieces by
        self.kernel_op = KERNEL_OPS.get(type(reducer))
        self.combiner: Combiner | None = None   # the kernel's parts, for the ring's tokens

    def rebind(self, source: str, first_seq: int, ring, plan=None) -> None:
        # A named, replayable sequence: its batches must be rebuilt alike by whoever
        # replays it, which sealing times do not allow. Send it uncombined.
        with self.lock:
            self.combining = False
        super().rebind(source, first_seq, ring, plan)

    def emit(self, key, value, due: float | None = None) -> bool:
        if not self.combining:
            return super().emit(key, value, due)
        return self.emit_many((key,), value, due)

    def emit_many(self, keys: Iterable, value, due: float | None = None) -> bool:
        if not self.combining:
            return super().emit_many(keys, value, due)
        if type(value) not in PLAIN_VALUES:
            check_value(value)
        self.reducer.check_value(value)     # refused here, before it is folded in
        sealed = False
        if type(keys) is list:          # folded in place, CHUNK keys at a time
            whole = len(keys) <= CHUNK
            for i in range(0, len(keys), CHUNK):
                sealed |= self._fold(keys if whole else keys[i:i + CHUNK], value,
                                     due or self.clock())
            return sealed
        keys = iter(keys)
        while chunk := list(itertools.islice(keys, CHUNK)):
            sealed |= self._fold(chunk, value, due or self.clock())
        return sealed

    def _fold(self, keys: list, value, born: float) -> bool:
        # str keys the kernel takes, checked in one pass in C (none folded if one is
        # refused); anything else is looked at key by key as before
        checked = bool(self.kernels and self.kernel_op and kernel_value(value)
                       and kernel.check_keys(keys, MAX_KEY_BYTES)[1] == kernel.DONE)
        only_str = checked or not set(map(type, keys)) - {str}
        if not only_str:
            for key in keys:        # Counter would take True for 1, or fail on a list
                check_key(key)
        with self.lock:
            tokens, route, sealed, place = self._routing_locked()
            op = self.kernel_op
            if place is None and only_str and op and self.kernels and kernel_value(value):
                return self._fold_kernel_locked(keys, value, born, tokens, op,
                                                checked) or sealed
            self._seal_kind_locked(ColumnBuffer)
            return self._fold_dict_locked(keys, value, born, tokens, route, place) or sealed

    def _fold_kernel_locked(self, keys: list, value: int, born: float, tokens: tuple,
                            op: str, checked: bool = False) -> bool:
        if not checked:
            check_str_keys(keys)
        self._seal_kind_locked(StateBuffer)
        combiner = self.combiner
        if combiner is None or combiner.tokens != tokens:   # (a new ring sealed them all)
            combiner = self.combiner = new_combiner(op, tokens, MAX_KEY_BYTES)
        buffers, size, most = self.buffers, self.batch_size, self.max_inputs
        sealed, i = False, 0
        while True:
            i, t, status = combiner.fold(keys, i, value, None, size, most, 0, SEAL_BYTES)
            for index in combiner.opened:
                buffers[tokens[index]] = ColumnBuffer(born, tokens, index)
            combiner.opened.clear()
            if status == kernel.DONE:
                return sealed
            if status not in (kernel.FULL, kernel.OVERFLOW):
                refuse_key(keys[i])
            # full, or key i's sum would leave int64: the token's states go first
            self._seal_locked(tokens[t])
            sealed = True

    def _fold_dict_locked(self, keys: list, value, born: float, tokens, route,
                          place) -> bool:
        sealed = False
        reducer = self.reducer
        # (key, tuples of it) with a router's cache, else (piece, token, tuples of it)
        counted: Iterable[tuple]
        cached: Callable[[Hashable], int | None] | None
        if place is None:
            counted = Counter(keys).items()     # one route and one fold per key
            cached = route.cached
        else:
            # A sharing balancer weighs every tuple: place each, then count pieces.
            tuples = self._tuples
            counted = ((key, token, n) for (key, token), n in
                       Counter(place(k, next(tuples)) for k in keys).items())
            cached = None
        buffers, size, most = self.buffers, self.batch_size, self.max_inputs
        # a key's state is sized as the value folded in (a built-in's is a number)
        state_bytes = value_size(value)
        additive = reducer.additive
        low, high = LOWEST, HIGHEST
        combine, merge = reducer.combine, reducer.merge
        if merge is None:
            raise ValueError(f"reducer {reducer.name or type(reducer).__name__} has no "
                             f"merge: its tuples cannot be combined")
        # The hot loop: one pass per distinct key, no call but dict methods where
        # the reducer is additive (a count or a sum).
        for item in counted:
            if cached is None:
                key, token, n = item
            else:
                key, n = item
                token = cached(key)
                if token is None:
                    token = route(key)
            buf = buffers.get(token)
            if buf is None:
                buf = buffers[token] = StateBuffer(born, tokens)
            elif not isinstance(buf, StateBuffer):
                raise wrong_kind(token, buf, StateBuffer)
            states = buf.states
            if key not in states:
                buf.nbytes += (len(key) if type(key) is str and key.isascii()
                               else key_size(key)) + state_bytes
            if additive:
                total = states.get(key, 0) + n * value
                if type(total) is int and not low <= total <= high:
                    buf = self._spill_locked(token, key, total, born, tokens)
                    states = buf.states
                    sealed = True
                else:
                    states[key] = total
            else:
                partial = combine(key, value, n)
                states[key] = merge(states[key], partial) if key in states else partial
            buf.inputs += n
            if len(states) >= size or buf.inputs >= most or buf.nbytes >= SEAL_BYTES:
                self._seal_locked(token)
                sealed = True
        return sealed

    def _spill_locked(self, token: int, key, total: int, born: float,
                      tokens: tuple) -> StateBuffer:
        """`key`'s combined count `total` no longer fits a tuple's value (64 bits):
        it goes as several tuples, each in a batch of its own sealing, every one but
        the last holding the most a value may; the last stays in the token's buffer,
        which is returned."""
        step = HIGHEST if total > 0 else LOWEST
        while not LOWEST <= total <= HIGHEST:
            self._state_buffer_locked(token, born, tokens).states[key] = step
            self._seal_locked(token)
            total -= step
        buf = self._state_buffer_locked(token, born, tokens)
        buf.states[key] = total
        return buf

    def _state_buffer_locked(self, token: int, born: float, tokens: tuple) -> StateBuffer:
        """The token's open buffer of partial states (opened if none is)."""
        buf = self.buffers.get(token)
        if buf is None:
            buf = self.buffers[token] = StateBuffer(born, tokens)
        elif not isinstance(buf, StateBuffer):
            raise wrong_kind(token, buf, StateBuffer)
        return buf

    def _seal_locked(self, token: int) -> None:
        buf = self.buffers[token]
        if type(buf) is ColumnBuffer:
            combiner = self.combiner
            if combiner is None:
                raise RuntimeError(f"token {token}'s buffer is in the combiner kernel, "
                                   f"which this batcher has not opened")
            payload, count, inputs = combiner.take(buf.index, 2 if self.columns() else 1)
            del self.buffers[token]
            return self._sealed_locked(token, buf, payload, count, inputs)
        if not isinstance(buf, StateBuffer):
            return super()._seal_locked(token)
        # Encoded before the buffer is let go: a state that cannot be encoded leaves
        # it whole (the error is raised again at each seal, nothing is dropped).
        payload = encode_payload(list(buf.states), list(buf.states.values()))
        del self.buffers[token]
        self._sealed_locked(token, buf, payload, len(buf.states), buf.inputs)

    def _sealed_locked(self, token: int, buf: ColumnBuffer | StateBuffer, payload: bytes,
                       count: int, inputs: int) -> None:
        first = self.next_seq
        self.next_seq += count
        self.sealed.append(PendingBatch(
            next(self._batch_ids), token, self.source, first, first + count - 1, count,
            payload, b"", buf.since, tokens=buf.tokens, inputs=inputs))

