"""Stream numbers: which Push stream of a source is the current one.

A mapper numbers each Push stream it opens to a node with its wall clock in
microseconds, so a restarted stream always outnumbers the one it replaced; a node
refuses batches of a stream older than the newest it has taken from that source (a
late message of a broken stream must not land after its resend). The numbers are the
sender's word, so they are bounded: one far ahead of this node's clock would retire
every later stream of the source, and one entry per source ever seen would grow
without end. A number is recorded only once its batch is accepted.
"""

from __future__ import annotations

from floering.node.core.dedup import SHARES, owner_of
from floering.wire.errors import InvalidArgument, StaleRing, TooLarge, inert

SWEEP_EVERY = 10.0     # seconds between two sweeps of idle sources, at most


class StreamGuard:
    def __init__(self, max_sources: int, idle_expiry: float, max_ahead: float) -> None:
        self.max_sources = max_sources
        self.idle_expiry = idle_expiry
        self.max_ahead = max_ahead
        self.newest: dict[str, tuple[int, float]] = {}   # source -> (stream, last seen)
        self.owned: dict[str, int] = {}    # identity mark -> its sources in `newest`
        self._next_sweep = float("-inf")

    def check(self, source: str, stream: int, now: float, wall: float | None) -> None:
        """Raise if a batch of `source` on `stream` must be refused. `wall` is this
        node's clock in seconds since the epoch (None: no clock to check against)."""
        if wall is not None and stream > (wall + self.max_ahead) * 1e6:
            raise InvalidArgument(
                f"stream number {stream} is more than {self.max_ahead:.0f} s ahead of this "
                f"node's clock (streams are numbered in wall-clock microseconds; "
                f"--max-stream-ahead)")
        seen = self.newest.get(source)
        if seen is not None:
            if stream < seen[0]:
                raise StaleRing(f"batch from {inert(source)}'s stream {stream}, which "
                                f"stream {seen[0]} replaced")
            return
        if len(self.newest) >= self.max_sources:
            self._sweep(now)
            if len(self.newest) >= self.max_sources:
                raise TooLarge(f"{len(self.newest)} sources are streaming to this node, the "
                               f"limit (--max-sources-per-node); idle ones expire after "
                               f"{self.idle_expiry:.0f} s")
        owner = owner_of(source)
        share = max(1, self.max_sources // SHARES)
        if owner is not None and self.owned.get(owner, 0) >= share:
            self._sweep(now)
            if self.owned.get(owner, 0) >= share:
                raise TooLarge(f"{self.owned[owner]} sources of this caller's identity are "
                               f"streaming to this node, its share (a quarter of "
                               f"--max-sources-per-node); idle ones expire after "
                               f"{self.idle_expiry:.0f} s")

    def accept(self, source: str, stream: int, now: float) -> None:
        if source not in self.newest:
            owner = owner_of(source)
            if owner is not None:
                self.owned[owner] = self.owned.get(owner, 0) + 1
        self.newest[source] = (stream, now)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        cutoff = now - self.idle_expiry
        self.newest = {s: seen for s, seen in self.newest.items() if seen[1] > cutoff}
        self.owned = {}
        for source in self.newest:
            owner = owner_of(source)
            if owner is not None:
                self.owned[owner] = self.owned.get(owner, 0) + 1
