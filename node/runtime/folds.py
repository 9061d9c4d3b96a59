"""Sending the folds the machine decided (`floering.node.core.folding`): each a one-tuple batch
pushed, like a mapper's, to every node of its key's range."""

from __future__ import annotations

import asyncio
import logging

from floering.node.core.batch import Batch, encode_payload
from floering.wire.errors import FloeError, Unavailable
from floering.node.core.machine_io import FoldAnswered, SendFolds

log = logging.getLogger("floe.node")


async def send_folds(e: SendFolds, peers, handle) -> None:
    """Push every fold of `e`; report each with handle(FoldAnswered)."""
    async def one(fold, token: int, addresses) -> None:
        # Stream 0: a fold is one tuple, deduplicated by its seq; no stream to order.
        batch = Batch(e.ring_stamp, token, fold.source, fold.seq, fold.seq, 1,
                      encode_payload([fold.key], [fold.state]))
        try:
            if None in addresses:
                raise Unavailable(f"no address for a node of token {token}")
            await asyncio.gather(*(peers.push(a, batch) for a in addresses))
            ok = True
        except FloeError as exc:
            log.debug("fold %s seq %d not taken: %s", fold.source, fold.seq, exc)
            ok = False
        handle(FoldAnswered(fold.out_key, fold.seq, ok, e.epoch))

    await asyncio.gather(*(one(*f) for f in zip(e.folds, e.tokens, e.addresses)))
