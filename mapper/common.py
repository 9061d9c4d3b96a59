"""What the sync and the asyncio ring clients share: their settings, the delivery,
and the reads' local parts."""

from __future__ import annotations

from floering.mapper.batching import check_settings, default_source
from floering.mapper.delivery import Delivery
from floering.wire.balancers import balancer
from floering.wire.pieces import COMBINED_SOURCE, FOLD_SOURCE, carries_states
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring
from floering.wire.channels import MESSAGE_LIMIT
from floering.wire.tls import TlsFiles

BATCH_TUPLES = 1000         # tuples a batch holds, by default
# distinct keys a token's combining buffer holds, by default: the node's cost of a
# batch is mostly per batch, and a key re-sealed in another batch is sent again
COMBINED_BATCH_KEYS = 4096


class ClientBase:
    def __init__(self, seeds, source: str | None, batch_size: int | None, linger: float,
                 window: int, max_pending_batches: int, timeout: float, rpc_timeout: float,
                 expect_reducer: str | None, tls: TlsFiles | None, combine: bool,
                 max_message_bytes: int = MESSAGE_LIMIT) -> None:
        if batch_size is None:   # an unnamed source combines where the reducer merges
            batch_size = COMBINED_BATCH_KEYS if combine and source is None else BATCH_TUPLES
        seeds = check_settings(seeds, batch_size, max_pending_batches, max_message_bytes)
        if source is not None and carries_states(source):
            raise ValueError(f"source {source[:40]!r}: names beginning {COMBINED_SOURCE!r} "
                             f"or {FOLD_SOURCE!r} are reserved for tuples that carry states")
        self.source = source or default_source()
        self.batch_size = batch_size
        self.linger = linger
        self.combine = combine
        self.max_pending_batches = max_pending_batches
        self.timeout = timeout
        self.rpc_timeout = rpc_timeout
        self._closed = False
        self._merging = None                # the reducer, once a read merges pieces
        self._delivery = Delivery(seeds, window, rpc_timeout, expect_reducer,
                                 tls.channel_credentials() if tls else None,
                                 max_message_bytes=max_message_bytes)

    @property
    def ring(self) -> Ring:
        """The ring this client routes with (fetched when it connects)."""
        return self._delivery.known_ring

    @property
    def reducer(self) -> str:
        return self._delivery.reducer

    @property
    def closed(self) -> bool:
        """Closed, and holding no connection any more."""
        return self._closed and not self._delivery.channels

    @property
    def shares_keys(self) -> bool:
        """The ring's balancer spreads keys over pieces a read must merge."""
        return balancer(self.ring.balancer).pieces > 1

    def _reducer(self):
        """The ring's reducer, loaded here to merge the pieces of shared keys."""
        if self._merging is None:
            self._merging = load_reducer(self.reducer)
        return self._merging

    def delivery_latencies(self) -> list[tuple[float, int]]:
        """(seconds from a batch's first emit to its last ack, tuples in it) for the
        most recent batches delivered."""
        return list(self._delivery.latencies)

    def delivery_stages(self) -> list[tuple[float, float, float, float]]:
        """Where each of the most recent delivered batches' time went, seconds per
        stage of `floering.mapper.delivery.STAGES`: in its token's buffer (from its
        first tuple's due time to its hand-over), queued until first written to a
        stream, to its first ack, to its last (r+1-th) ack."""
        return list(self._delivery.stages)
