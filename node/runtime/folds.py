"""Sending the folds the machine decided (`floering.node.core.folding`): each a one-tuple batch
pushed, like a mapper's, to every node of its key's range.

A round's folds bound for one node travel on one Push stream, many to a message. One
stream per fold made a round of some 500 folds 1,000 streams: the receiver reads a
caller's streams in turns, so most of them outlived their deadline, were sent again
next round, and the nodes, busy with the storm, stopped answering each other's probes.
"""

from __future__ import annotations

import asyncio
import logging

from floering.node.core.batch import Batch, encode_payload
from floering.node.core.machine_io import FoldAnswered, SendFolds

log = logging.getLogger("floe.node")

FOLDS_PER_MESSAGE = 256      # one-tuple batches: some 100 bytes each


async def send_folds(e: SendFolds, peers, handle) -> None:
    """Push every fold of `e`; report each with handle(FoldAnswered): taken by every
    node of its key's range, or not (sent again in a later round)."""
    # Stream 0: a fold is one tuple, deduplicated by its seq; no stream to order.
    batches = [Batch(e.ring_stamp, token, fold.source, fold.seq, fold.seq, 1,
                     encode_payload([fold.key], [fold.state]), id=i)
               for i, (fold, token) in enumerate(zip(e.folds, e.tokens))]
    taken = [True] * len(batches)
    bound: dict[str, list[int]] = {}          # address -> its folds, in order
    for i, addresses in enumerate(e.addresses):
        if None in addresses:
            log.debug("fold %s seq %d not sent: no address for a node of token %d",
                      e.folds[i].source, e.folds[i].seq, e.tokens[i])
            taken[i] = False
            continue
        for address in addresses:
            bound.setdefault(address, []).append(i)

    async def to(address: str, folds: list[int]) -> None:
        acked, error = await peers.push_many(address, [batches[i] for i in folds],
                                             FOLDS_PER_MESSAGE)
        if error is not None:
            log.debug("%d folds not taken by %s: %s", len(folds) - acked, address, error)
        for i in folds[acked:]:
            taken[i] = False

    await asyncio.gather(*(to(a, f) for a, f in bound.items()))
    for fold, ok in zip(e.folds, taken):
        handle(FoldAnswered(fold.out_key, fold.seq, ok, e.epoch))
