"""Merging the pieces a shared key no longer uses back into the key, exactly once.

In a ring whose balancer grows and shrinks a hot key's pool of pieces (`dkg`,
`smalops`: `floering.wire.balancers`), a piece left out of a pool keeps its state, and
reads merge it. The owner of a piece's range folds it back once its state has not
changed for `idle` seconds:

1. In one step of that range's state, the piece's state is replaced by the reducer's
   initial one and put under an outgoing key of the same range (`pieces.fold_key`,
   the first nonce that hashes into the range): [n, state], n one more than that
   outgoing key's last fold. Both land in the range's next checkpoint.
2. Once every replica has acknowledged a checkpoint that holds the step, the owner
   sends the state to its key's range as a one-tuple batch of source
   `fold:<hash of the outgoing key>`, seq n, which primary and replicas take like any
   batch (deduplicated by that source's watermark) but merge with the reducer's
   `merge` instead of reducing.
3. Once every destination acknowledged it, the outgoing key becomes [n].

Why the wait in 2: a takeover rebuilds a range from its checkpoint plus the batches
backed up past it; a fold is no batch, so a copy from before it would still hold the
piece's state, and the key would count it twice. Once every copy holds the step, any
node that takes the range over finds [n, state] and sends it again under the same
(source, seq), which the receiver drops if it merged it already. A new primary (a
takeover, a handoff, a split, a restart) finds its outgoing keys and pieces by a scan
of its range, `scan_step` keys per checkpoint round. Reads merge a pending outgoing
key as a piece (`merge_pieces`). A scan reads the two ends of a fold on two nodes at
two moments: each node's first chunk carries its fold epoch (`NodeCore.fold_epoch`,
every step above moves it) and the fold seqs it merged (`fold_marks`), so the reader
skips a fold on its way that a node shows merged, and raises rather than hand on a
sum when a step ran during the scan (`mapper.scanning`). `get` asks the pieces only,
so while a fold is on its way (a checkpoint round or two) it misses that part of the
key.
"""

from __future__ import annotations

from dataclasses import dataclass

from floering.node.core.state_store import MISSING
from floering.wire.pieces import (fold_key, fold_source, is_fold_key, is_piece,
                                       on_its_way, parse_piece)

FOLDING_BALANCERS = frozenset({"dkg", "dchoices", "wchoices", "smalops"})  # pools shrink
NONCE_TRIES = 16_384      # outgoing keys tried, once per piece and range (~25 ms at
#                           most): a range under ~1/4000 of the ring may find none,
#                           and its pieces then stay where they are
SCAN_STEP = 50_000        # keys of a new primary range looked at per round
MAX_FOLDS = 64            # folds per range per round
MAX_TRACKED = 65_536      # pieces and outgoing keys tracked per range


@dataclass(frozen=True)
class FoldSend:
    """Send `state` to `key`'s range, as seq `seq` of the source of `out_key`."""

    out_key: bytes
    seq: int
    key: object
    state: object

    @property
    def source(self) -> str:
        return fold_source(self.out_key)


def routed(ring, folds) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]:
    """The token each fold's key is in, and the addresses of that range's nodes."""
    tokens = tuple(ring.token_for_key(f.key) for f in folds)
    return tokens, tuple(tuple(ring.address(n) for n in ring.destinations(t))
                         for t in tokens)


pending = on_its_way        # [n, state]: a fold on its way (pieces.on_its_way)


def outgoing_key(ring, token: int, key, index: int) -> bytes | None:
    """The outgoing key of piece `index` of `key` in the range of `token`, or None."""
    for nonce in range(NONCE_TRIES):
        out = fold_key(key, index, nonce)
        if ring.token_for_key(out) == token:
            return out
    return None


class RangeFolds:
    """What one primary range holds of pieces and outgoing keys."""

    def __init__(self, rng) -> None:
        self.rng = rng
        # the range's keys when it became ours, looked at a step per round
        self.todo: list | None = rng.state.keys()
        self.at = 0
        self.pieces: dict = {}     # piece key -> (its state when last looked at, since)
        self.gates: dict = {}      # pending outgoing key -> checkpoint seq to be acked
        self.outs: dict = {}       # piece key -> its outgoing key here (None: none found)


class FoldBook:
    def __init__(self, idle: float, scan_step: int = SCAN_STEP) -> None:
        self.idle = idle
        self.scan_step = scan_step
        self.ranges: dict[int, RangeFolds] = {}
        self.in_flight: set[bytes] = set()   # outgoing keys sent, not yet answered
        self.folded = 0                        # folds made, for stats
        self.done = 0                          # folds every destination took

    def saw(self, token: int, keys) -> None:
        """Keys new to a primary range (or all of a batch's): note its pieces."""
        rf = self.ranges.get(token)
        if rf is None:
            return                             # its first round scans the whole range
        for key in keys:
            if type(key) is bytes and is_piece(key) and len(rf.pieces) < MAX_TRACKED:
                rf.pieces.setdefault(key, (None, 0.0))

    def review(self, core, now: float) -> tuple[FoldSend, ...]:
        """One round: fold idle pieces, and say which folds may be sent now."""
        primaries = core.primaries
        self.ranges = {t: rf for t, rf in self.ranges.items()
                       if primaries.get(t) is rf.rng}
        sends: list[FoldSend] = []
        for token, rng in primaries.items():
            rf = self.ranges.get(token)
            if rf is None:
                rf = self.ranges[token] = RangeFolds(rng)
            self._scan(rf, now)
            self._fold_idle(core, token, rf, now)
            sends.extend(self._ready(core, token, rf))
        return tuple(sends)

    def _scan(self, rf: RangeFolds, now: float) -> None:
        if rf.todo is None:
            return
        step = rf.todo[rf.at:rf.at + self.scan_step]
        rf.at += len(step)
        if rf.at >= len(rf.todo):
            rf.todo = None
        state = rf.rng.state
        for key in step:
            if type(key) is not bytes or len(rf.pieces) + len(rf.gates) >= MAX_TRACKED:
                continue
            if is_piece(key):
                rf.pieces.setdefault(key, (None, now))
            elif is_fold_key(key) and pending(held := state.get(key)):
                # in this range's next checkpoint, which every replica must take first
                state.put(key, held)
                rf.gates.setdefault(key, rf.rng.checkpoint_seq + 1)

    def _fold_idle(self, core, token: int, rf: RangeFolds, now: float) -> None:
        state, reducer = rf.rng.state, core.reducer
        initial = reducer.initial()
        folds = 0
        for piece, (seen, since) in list(rf.pieces.items()):
            held = state.get(piece, MISSING)
            if held is MISSING:
                continue                   # noted, but its batch was refused
            if held != seen:
                rf.pieces[piece] = (held, now)
            elif now - since >= self.idle and held != initial and folds < MAX_FOLDS:
                folds += self._fold(core, token, rf, piece, held, now)

    def _fold(self, core, token: int, rf: RangeFolds, piece, held, now: float) -> int:
        rf.pieces[piece] = (held, now)     # if it cannot be folded now: again later
        try:
            key, index = parse_piece(piece)
        except ValueError:
            del rf.pieces[piece]
            return 0
        if piece not in rf.outs:
            rf.outs[piece] = outgoing_key(core.ring, token, key, index)
        out = rf.outs[piece]
        state = rf.rng.state
        last = state.get(out) if out is not None else None
        if out is None or pending(last):
            return 0                       # none in range, or the last one is on its way
        n = last[0] + 1 if isinstance(last, (list, tuple)) and last and \
            type(last[0]) is int else 1
        initial = core.reducer.initial()
        state.put(piece, initial)
        state.put(out, [n, held])
        rf.pieces[piece] = (initial, now)
        rf.gates[out] = rf.rng.checkpoint_seq + 1
        self.folded += 1
        return 1

    def _ready(self, core, token: int, rf: RangeFolds) -> list[FoldSend]:
        rng = rf.rng
        replicas = core.ring.replicas_of_token(token)
        sends = []
        for out, gate in list(rf.gates.items()):
            held = rng.state.get(out)
            if not pending(held):
                del rf.gates[out]
                continue
            if out in self.in_flight or rng.checkpoint_seq < gate or \
                    any(rng.replica_seq.get(r, 0) < gate for r in replicas):
                continue
            self.in_flight.add(out)
            sends.append(FoldSend(out, held[0], parse_piece(out)[0], held[1]))
        return sends

    def answered(self, core, out: bytes, seq: int, ok: bool) -> None:
        """A fold's send ended: every destination of its key took seq `seq` of `out`
        (`ok`), or it is sent again next round."""
        self.in_flight.discard(out)
        rng = core.primaries.get(core.ring.token_for_key(out)) if ok else None
        if rng is not None:
            held = rng.state.get(out)
            if pending(held) and held[0] == seq:
                rng.state.put(out, [seq])
                self.done += 1
