"""Probing a suspect as a node runs it (SWIM): directly and through every other member
at once. How each call ended is reported; the machine decides what that means
(node.core.calls)."""

from __future__ import annotations

import asyncio

from floering.node.core.calls import ask_again_fresh, failure_of
from floering.wire.errors import FloeError
from floering.node.core.machine_io import ProbeAbandoned, ProbeAnswered, StartProbe
from floering.node.core.requests import PROBE, PROBED


async def probe_round(runtime, e: StartProbe) -> None:
    """One probe round of a suspect: directly and through every member the machine
    named, at once."""
    probe = e.probe
    me = runtime.machine.node_id

    async def direct(fresh: bool = False):
        try:
            _, incarnation, member = await runtime.peers.heartbeat(
                e.address, sender=me, ring_stamp=e.ring_stamp,
                incarnation=runtime.incarnation, timeout=probe.deadline)
        except FloeError as exc:
            failure = failure_of(exc)
            if ask_again_fresh(failure, fresh):
                await runtime.peers.reconnect(e.address)
                return await direct(fresh=True)
            return failure, 0, str(exc), ""
        return None, incarnation, "", member     # and which member it is now

    async def indirect(via_address: str):
        try:
            alive = await runtime.peers.probe(via_address, probe.node, probe.deadline)
        except FloeError as exc:
            return failure_of(exc), False
        return None, bool(alive)

    try:
        (failure, incarnation, why, member), *seen = await asyncio.gather(
            direct(), *(indirect(a) for a in e.via_addresses))
    except BaseException:
        runtime._handle(ProbeAbandoned(probe))    # cancelled: a later tick probes again
        raise
    runtime._handle(ProbeAnswered(probe, failure, tuple(seen), e.epoch, incarnation, why,
                                  member))

async def probe_for(runtime, target: str, timeout: float) -> bool:
    """Serve an indirect probe: can we reach `target`? The machine says where to call
    and for how long, and what the call's end means (node.core.requests)."""
    address, timeout = runtime.ask(PROBE, target=target, timeout=timeout)
    if address is None:
        return False
    try:
        _, incarnation, member = await runtime.peers.heartbeat(
            address, sender=runtime.core.node_id, ring_stamp=runtime.core.ring.stamp,
            incarnation=runtime.incarnation, timeout=timeout)
    except FloeError as exc:
        return runtime.ask(PROBED, target=target, failure=failure_of(exc))
    return runtime.ask(PROBED, target=target, failure=None, incarnation=incarnation,
                       member=member)
