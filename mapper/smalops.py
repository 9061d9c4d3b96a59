"""SMALOPS (`smalops`, Bhattacharya and Wood): move heavy streams between consumers to
cut queueing delay, the mapper acting as the paper's gateway.

- **Heavy streams.** Counted per window of `window` tuples (the paper's lossy counting
  over strictly demarcated windows; here a Space-Saving sketch of `capacity`
  counters, started afresh each window): a key with more than `heavy` of a window's
  tuples is heavy. Only heavy keys are tracked; one that stops being heavy is dropped
  and goes back to its own node.
- **Placement.** A node's size is the sum of the sizes of the heavy streams placed on
  it. A key that becomes heavy is placed by the power of two choices: the smaller of
  its own node and its piece 1's. At the end of each window (the decision interval),
  best fit: the heavy streams of every node above the mean, smallest first, each move
  to the node below the mean that minimises |size + target - mean|, unless the move
  would widen the gap between source and target.
- **A stream on a node** is sent to the first piece of its key (`floering.wire.pieces`,
  pieces 0 to `max_pieces` - 1) that the ring places on that node; a node none of
  them lands on is not a candidate for that key. A stream moves whole: unlike `dkg`,
  one key never goes to two nodes at once, so a single key hotter than a node stays
  where it is (the paper's design, which moves streams and never splits one).
- **Split state.** What a stream left behind stays in the piece it was sent to; reads
  merge every piece (`RingClient`), in place of the paper's message sets that rebuild
  the order for the consumer: a reducer with `merge` needs no order.
"""

from __future__ import annotations

from floering.wire.pieces import piece_key
from floering.wire.ring import Ring
from floering.node.core.sketch import SpaceSaving


class SmalopsChooser:
    def __init__(self, max_pieces: int, window: int = 10_000, heavy: float = 0.01,
                 capacity: int = 256) -> None:
        if window < 1 or not 0 < heavy < 1:
            raise ValueError("window must be >= 1 and heavy in (0, 1)")
        self.max_pieces, self.window, self.heavy = max_pieces, window, heavy
        self.sketch = SpaceSaving(capacity)
        self.streams: dict = {}             # heavy key -> the piece its tuples go to
        self.seen = 0
        self.migrations = 0

    def placer(self, ring: Ring, route):
        streams, sketch, window = self.streams, self.sketch, self.window

        def place(key, _seq=0):
            sketch.add(key)
            sent = streams.get(key, key)
            self.seen += 1
            if self.seen % window == 0:
                self.decide(ring)
            return sent, route(sent)
        return place

    def decide(self, ring: Ring) -> None:
        """End of a window: place the heavy streams, best fit, start the next window."""
        sizes = dict(self.sketch.above(self.heavy))
        load = dict.fromkeys(ring.nodes, 0.0)
        placed = {}
        for key, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
            piece = self.streams.get(key)
            if piece is None:                # newly heavy: the less loaded of two choices
                piece = min((key, piece_key(key, 1)), key=lambda p: load[ring.owner(p)])
            placed[key] = piece
            load[ring.owner(piece)] += size
        self._best_fit(ring, sizes, placed, load)
        self.streams.clear()
        self.streams.update((k, p) for k, p in placed.items() if p != k)
        self.sketch.clear()                       # the next window counts afresh

    def _best_fit(self, ring: Ring, sizes: dict, placed: dict, load: dict) -> None:
        mean = sum(load.values()) / len(load)
        for source in sorted(load, key=lambda n: -load[n]):
            if load[source] <= mean:
                break
            mine = sorted((k for k, p in placed.items() if ring.owner(p) == source),
                          key=lambda k: sizes[k])
            for key in mine:
                size, best = sizes[key], None
                for i in range(self.max_pieces):
                    piece = piece_key(key, i)
                    target = ring.owner(piece)
                    if load[target] >= mean or target == source:
                        continue
                    fit = abs(size + load[target] - mean)
                    if best is None or fit < best[0]:
                        best = (fit, piece, target)
                if best is None:
                    continue
                _, piece, target = best
                gap = abs(load[source] - load[target])
                if abs((load[source] - size) - (load[target] + size)) < gap:
                    placed[key] = piece
                    load[source] -= size
                    load[target] += size
                    self.migrations += 1
