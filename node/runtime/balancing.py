"""Load shedding as a node runs it: ask the neighbours for their load, let the machine
plan (node.core.shedding), then cut, hand off or ask a busy neighbour to shed first.
A member short of its share of the ring asks the same way (node.core.shares): the
member it asks hands it the ranges the rule names rather than shedding by load."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from floering.node.core.errors import FloeError, InvalidArgument
from floering.node.core.handoff import HandoffState
from floering.node.core.shares import PullRanges
from floering.node.core.shedding import PeerLoad, cut_positions, shed_reach

log = logging.getLogger("floe.node")


@dataclass(frozen=True)
class ShedOutcome:
    """What one node's shedding did: `moved` whether it handed ranges away (committed);
    `asked` the neighbour it asked to shed first, and whether that one moved any."""

    detail: str
    moved: bool = False
    asked: str = ""
    asked_moved: bool = False


async def shed_load(runtime, reason: str, depth: int = 0, sender: str = "") -> ShedOutcome:
    """Shed what the machine plans; when it asked a busy neighbour to shed first
    and that one moved ranges, plan again at once with what it freed rather than
    after a cool-down. Asked by a `sender` short of its share: hand it its ranges."""
    share = runtime.machine.share_moves_for(sender) if sender else None
    if share is not None:
        return await _hand_share(runtime, sender, share)
    outcome = await _shed_once(runtime, reason, depth)
    if outcome.asked and outcome.asked_moved:
        retry = await _shed_once(runtime, f"{reason}, after {outcome.asked} shed", depth,
                                 relieved=outcome.asked)
        outcome = ShedOutcome(f"{outcome.detail}; {retry.detail}", retry.moved)
    return outcome



async def _shed_once(runtime, reason: str, depth: int,
                     relieved: str | None = None) -> ShedOutcome:
    machine = runtime.machine
    ring = machine.core.ring
    reach = shed_reach(ring, machine.node_id, runtime.config.balance_reach)
    answers = await asyncio.gather(*(runtime.peers.stats(ring.address(n)) for n in reach),
                                   return_exceptions=True)
    loads: dict = {}
    for node, st in zip(reach, answers):
        if isinstance(st, BaseException):
            log.info("load: no stats from %s: %r", node, st)
            loads[node] = None
        else:
            loads[node] = PeerLoad(st.apply_rate, st.overloaded)
    plan = machine.plan_shed(loads, reach=runtime.config.balance_reach,
                             tokens_per_node=runtime.config.tokens_per_node, depth=depth,
                             relieved=relieved)
    for pos in cut_positions(plan):
        try:
            await runtime.split_range(pos)
        except FloeError as exc:
            log.info("load: cut at %#x refused: %s", pos, exc)
    moves = machine.shed_moves(plan)
    log.info("load: %s at %.6f, rate %.0f/s, queue %.1f, busy %.0f%%; nodes %s busy %s; "
             "moving %d ranges", reason, time.time(), machine.load.rate(),
             machine.load.queue(), 100 * machine.load.busy(),
             {n: round(r) for n, r in plan.rates_of.items()}, list(plan.busy), len(moves))
    if moves:
        h = await runtime.hand_off(moves)
        machine.shed_done(runtime.clock())
        return ShedOutcome(f"moved {len(moves)} ranges: {h.state} {h.reason}",
                           moved=h.state == HandoffState.COMMITTED)
    if plan.ask:
        try:
            moved, detail = await runtime.peers.request_shed(
                ring.address(plan.ask), machine.node_id, depth + 1)
        except FloeError as exc:
            return ShedOutcome(f"cascade to {plan.ask} failed: {exc}")
        return ShedOutcome(f"asked {plan.ask} to shed first: {detail}", asked=plan.ask,
                           asked_moved=moved)
    return ShedOutcome("nothing to move")


async def _hand_share(runtime, sender: str, moves: dict[int, str]) -> ShedOutcome:
    if not moves:
        return ShedOutcome(f"{sender} is short of its share; another member (or a "
                           f"handoff under way) gives it ranges")
    log.info("share: handing %d ranges to %s, short of its share of the ring",
             len(moves), sender)
    try:
        h = await runtime.hand_off(moves)
    except FloeError as exc:
        return ShedOutcome(f"handing {len(moves)} ranges to {sender} refused: {exc}")
    return ShedOutcome(f"handed {len(moves)} ranges to {sender}: {h.state} {h.reason}",
                       moved=h.state == HandoffState.COMMITTED)


async def pull_share(runtime, effect: PullRanges) -> None:
    """Ask the member the rule names for ranges; it hands them over by itself."""
    log.info("share: %s owns too little of the ring; asking %s for %d ranges",
             runtime.machine.node_id, effect.donor, effect.ranges)
    try:
        moved, detail = await runtime.peers.request_shed(
            effect.address, runtime.machine.node_id, 0)
    except FloeError as exc:
        log.info("share: %s did not hand ranges over: %s", effect.donor, exc)
        return
    log.info("share: %s answered (moved: %s): %s", effect.donor, moved, detail)


async def hand_all_away(runtime, timeout: float) -> None:
    """Scale-in up to leaving: spread every range of ours over the other members
    (node.core.shares.spread_leave), then wait until the new owners no longer need our
    copies. A range that comes back meanwhile (its new owner died and our copy made
    us its holder) is handed on again, so leaving never drops one."""
    machine = runtime.machine
    machine.begin_leaving()
    deadline = runtime.clock() + timeout
    while True:
        moves = machine.leave_moves()
        if moves:
            h = await runtime.hand_off(moves, max(1.0, deadline - runtime.clock()))
            if h.state != HandoffState.COMMITTED:
                raise InvalidArgument(f"cannot leave: {h.reason}")
        while machine.copy_in_use():
            if runtime.clock() > deadline:
                log.warning("leaving while other ranges still use our copy")
                return
            runtime.sync_ring()
            await asyncio.sleep(0.05)
        if not machine.leave_moves():
            return
        if runtime.clock() > deadline:
            log.warning("leaving with ranges that came back to us")
            return
