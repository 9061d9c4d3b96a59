"""Load shedding as a node runs it: the round's decisions are node.core.shed_round's;
this carries out its effects (ask the neighbours for their load, plan and cut, hand
off, ask a busy neighbour to shed first) and reports back what came of them."""

from __future__ import annotations

import asyncio
import logging
import time

from floering.wire.errors import FloeError, InvalidArgument
from floering.node.core.handoff import HandoffState
from floering.node.core.leaving import (CheckAgain, Go, HandAway, HandedAway, HandingRefused,
                                        LeaveFailed, begin_leave, check_leave)
from floering.node.core.shares import PullRanges
from floering.node.core.shed_round import (AskToShed, CascadeAnswered, CascadeFailed, Finished,
                                           HandoffDone, HandoffRefused, HandOver, PlanComputed,
                                           PlanRound, ShedOutcome, ShedRound)
from floering.node.core.shedding import PeerLoad, cut_positions, shed_reach

log = logging.getLogger("floe.node")


async def shed_load(runtime, reason: str, depth: int = 0, share: dict[int, str] | None = None,
                    member: str = "") -> ShedOutcome:
    """Run one shedding round (node.core.shed_round) to its outcome; with a `share`
    (node.core.requests.shed), hand it to the `member` short of its share instead."""
    shed = ShedRound(reason, depth)
    effects = shed.start() if share is None else shed.start_share(member, share)
    while True:
        match effects:
            case [Finished(outcome=outcome)]:
                return outcome
            case [PlanRound() as e]:
                effects = shed.handle(await _plan(runtime, e))
            case [HandOver(moves=moves)]:
                try:
                    h = await runtime.hand_off(moves, still_ours=True)
                except FloeError as exc:
                    effects = shed.handle(HandoffRefused(str(exc)))
                    continue
                if share is None:
                    runtime.shed_moved()
                effects = shed.handle(HandoffDone(h.state == HandoffState.COMMITTED,
                                                  str(h.state), h.reason))
            case [AskToShed(node=node, depth=asked_depth)]:
                try:
                    moved, detail = await runtime.peers.request_shed(
                        runtime.machine.core.ring.address(node), runtime.machine.node_id,
                        asked_depth)
                except FloeError as exc:
                    effects = shed.handle(CascadeFailed(str(exc)))
                    continue
                effects = shed.handle(CascadeAnswered(bool(moved), str(detail)))


async def _plan(runtime, e: PlanRound) -> PlanComputed:
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
                             tokens_per_node=runtime.config.tokens_per_node, depth=e.depth,
                             relieved=e.relieved)
    for pos in cut_positions(plan):
        try:
            await runtime.split_range(pos)
        except FloeError as exc:
            log.info("load: cut at %#x refused: %s", pos, exc)
    moves = machine.shed_moves(plan)
    log.info("load: %s at %.6f, rate %.0f/s, queue %.1f, busy %.0f%%; nodes %s busy %s; "
             "moving %d ranges", e.reason, time.time(), machine.load.rate(),
             machine.load.queue(), 100 * machine.load.busy(),
             {n: round(r) for n, r in plan.rates_of.items()}, list(plan.busy), len(moves))
    return PlanComputed(moves, plan.ask)


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
    """Scale-in up to leaving, as node.core.leaving decides it: raises InvalidArgument
    when a handoff is refused or aborted (the node stays a member)."""
    machine = runtime.machine
    leaving, effects = begin_leave(machine, runtime.clock() + timeout)
    while True:
        match effects:
            case [Go(warning=warning)]:
                if warning:
                    log.warning(warning)
                return
            case [LeaveFailed(reason=reason)]:
                raise InvalidArgument(reason)
            case [HandAway(moves=moves)]:
                try:
                    h = await runtime.hand_off(
                        moves, max(1.0, leaving.deadline - runtime.clock()), still_ours=True)
                except FloeError as exc:
                    effects = leaving.handle(HandingRefused(str(exc)))
                    continue
                effects = leaving.handle(HandedAway(h.state == HandoffState.COMMITTED,
                                                    h.reason))
            case [CheckAgain()]:
                if machine.copy_in_use():
                    runtime.sync_ring()
                    await asyncio.sleep(0.05)
                effects = check_leave(machine, leaving, runtime.clock())
