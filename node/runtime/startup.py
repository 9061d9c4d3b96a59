"""Before a process serves: ask the peers what they know and decide who it is.

The rules are pure (`floering.node.core.membership`, the steps
`floering.node.core.startup_round`); this module only asks and waits.
"""

from __future__ import annotations

import asyncio
import logging
import time

from floering.node.core.columnar import KERNEL
from floering.wire.errors import FloeError, InvalidArgument, Unavailable, inert
from floering.node.core.membership import StartDecision, decide_start
from floering.wire.ring import Ring
from floering.node.core.startup_round import AskPeers, Answered, Decide, Startup, Stop

log = logging.getLogger("floe.node")


async def ask_peers(peers, targets: list[str],
                    timeout: float) -> tuple[list[Ring], int, list[str]]:
    """One round: the rings that answered, how many of them are starting peers'
    founding rings, and what the others said."""
    answers = await asyncio.gather(*(peers.ring_at_start(a, timeout) for a in targets),
                                   return_exceptions=True)
    seen, starting, errors = [], 0, []
    for address, answer in zip(targets, answers):
        if isinstance(answer, FloeError):
            errors.append(f"{address}: {answer}")
        elif isinstance(answer, BaseException):
            raise answer
        else:
            wire, is_starting = answer
            seen.append(Ring.from_wire(wire))
            starting += is_starting
    return seen, starting, errors


async def decide_membership(config, peers, incarnation: int, initial: Ring,
                            seeds: list[str] | None, clock=time.monotonic,
                            me: str | None = None, members=None) -> StartDecision:
    """Ask the peers (or, joining, the seeds) for their rings and decide who this
    process is: a founding member taking its place, a joiner, or the restart of a
    member whose state died with its process.

    Alone a process cannot tell a restart from a fresh start, so it waits for a
    running peer's answer, or for every founding peer to answer as starting too (a
    fresh cluster); after --startup-grace, starting peers' answers suffice."""
    joining = seeds is not None
    me = me or config.node_id
    # A member back from its data directory (`me`, `members`) asks the members its
    # ring names; a fresh process the peers it was configured with.
    members = members or config.peers
    targets = seeds if seeds is not None else [a for n, a in members if n != me]
    startup = Startup(me, joining, clock(), config.startup_grace)
    timeout = min(config.rpc_timeout, 1.0)
    effects = startup.start()
    while True:
        match effects:
            case [AskPeers(delay=delay, warning=warning)]:
                if warning:
                    log.warning("%s", warning)
                if delay:
                    await asyncio.sleep(delay)
                seen, starting, errors = await ask_peers(peers, targets, timeout)
                effects = startup.handle(Answered(clock(), tuple(seen), starting,
                                                  len(targets), tuple(errors)))
            case [Stop(reason=reason)]:
                raise Unavailable(reason)
            case [Decide(seen=decided)]:
                seen = list(decided)
                break
    for ring in seen + [initial]:
        if ring.replication != config.replication:
            raise InvalidArgument(f"the ring runs r={ring.replication}, this node was started "
                             f"with --replication {config.replication}")
        if ring.reducer and ring.reducer != config.reducer_identity:
            raise InvalidArgument(f"the ring runs reducer {inert(ring.reducer, 200)}, this node "
                             f"was started with {config.reducer_identity}")
    return decide_start(me, incarnation, config.advertise, seen, None if joining else initial)


def record_start(events, decision: StartDecision, incarnation: int, configured_id: str,
                 joining: bool) -> None:
    """Tell the event log and the human log who this process turned out to be."""
    events.record("started", decision.node_id, incarnation=incarnation,
                  replaces=decision.replaces, why=decision.why, joining=joining)
    log.info("%s starts; built-in reducers' state: %s", decision.node_id,
             "the compiled state table" if KERNEL == "compiled" else
             "dicts (the compiled state table is not built)")
    if decision.replaces:
        t = events.record("detected", decision.node_id, about=[decision.replaces],
                          why="restarted: " + decision.why)
        log.warning("declaring %s dead at %.6f: %s; this process holds none of its "
                    "state and joins empty as %s", decision.replaces, t,
                    decision.why, decision.node_id)
    elif decision.node_id != configured_id:
        log.warning("%s; this process joins empty as %s", decision.why, decision.node_id)
    elif joining:
        log.info("%s joins ring v%d", decision.node_id, decision.ring.version)
