"""Probing a suspect as a node runs it (SWIM): directly and through every other member
at once; the machine (node.core.detector) decides what the answers mean."""

from __future__ import annotations

import asyncio

from floering.node.core.detector import ALIVE, REFUSED, TIMED_OUT, UNASKED
from floering.node.core.errors import Fenced, FloeError, Refused, Unavailable
from floering.node.core.machine_io import ProbeAbandoned, ProbedFor, ProbeFinished, StartProbe


async def probe_round(runtime, e: StartProbe) -> None:
    """One probe round of a suspect: directly and through every member the machine
    named, at once. The machine decides what the answers mean."""
    probe = e.probe
    me = runtime.machine.node_id

    async def direct(fresh: bool = False):
        try:
            _, incarnation, member = await runtime.peers.heartbeat(
                e.address, sender=me, ring_stamp=e.ring_stamp,
                incarnation=runtime.incarnation, timeout=probe.deadline)
        except Fenced as exc:
            return REFUSED, 0, f": {exc}", ""   # it knows it was removed
        except Refused as exc:
            if fresh:
                return REFUSED, 0, f": {exc}", ""       # nothing listens
            # Our channel may be in reconnect backoff, repeating a refusal from before
            # a new process bound the address: only a new connection tells.
            await runtime.peers.reconnect(e.address)
            return await direct(fresh=True)
        except Unavailable:
            return TIMED_OUT, 0, "", ""          # a deadline or a stalled handshake
        except FloeError:
            return ALIVE, 0, "", ""              # it answered, if only with an error
        return ALIVE, incarnation, "", member   # and which member it is now

    async def indirect(via_address: str):
        try:
            alive = await runtime.peers.probe(via_address, probe.node, probe.deadline)
        except FloeError:
            # No answer, or a refusal (gone, fenced, starting, a connection reset):
            # this member confirms nothing, and we may be the one cut off.
            return UNASKED
        return ALIVE if alive else TIMED_OUT

    try:
        (answer, incarnation, failure, member), *seen = await asyncio.gather(
            direct(), *(indirect(a) for a in e.via_addresses))
    except BaseException:
        runtime._handle(ProbeAbandoned(probe))    # cancelled: a later tick probes again
        raise
    runtime._handle(ProbeFinished(probe, answer, tuple(seen), e.epoch, incarnation, failure,
                                  member))

async def probe_for(runtime, target: str, timeout: float) -> bool:
    """Serve an indirect probe: can we reach `target`?"""
    address = runtime.machine.address_of(target)
    if address is None:
        return False
    try:
        _, incarnation, member = await runtime.peers.heartbeat(
            address, sender=runtime.core.node_id, ring_stamp=runtime.core.ring.stamp,
            incarnation=runtime.incarnation, timeout=timeout)
    except FloeError:
        runtime._handle(ProbedFor(target))    # our own evidence the target is gone
        return False
    if not runtime.machine.is_process_of(target, incarnation, member):
        runtime._handle(ProbedFor(target))
        return False
    runtime.sign_of_life(target)
    return True
