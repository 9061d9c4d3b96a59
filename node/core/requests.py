"""Requests from outside as machine events: whoever serves a call (the gRPC servicers
through node.runtime.service, the simulation over its network) hands the machine a
`Requested` and gets one `Reply` back, its value or the FloeError that refuses it.
What to answer is decided here: whether we serve yet, whether the caller's reducer is
ours, which ring view to give, whether a read or an operation is within bounds. The
data behind an answer (a scan's chunks, a copy arriving in steps) stays the caller's
to move. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import msgpack

from floering.node.core.machine_io import HeardFrom, Note, ProbedFor, RingSeen, SignOfLife
from floering.node.core.membership import base_name
from floering.wire.errors import (Fenced, InvalidArgument, ReducerMismatch, StaleRing, Starting,
                                  TooLarge, inert)

if TYPE_CHECKING:
    from floering.node.core.machine import NodeMachine


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on what a caller may ask (the --max-* options)."""

    max_top: int = 10_000
    max_scan_chunk: int = 50_000
    max_handoff_timeout: float = 600.0


# The kinds of request, named as the calls that carry them.
STARTED = "Started"
GET_RING = "GetRing"
EXCHANGE_RING = "ExchangeRing"
HEARTBEAT = "Heartbeat"
CHECKPOINT = "ShipCheckpoint"
COPY_CHUNK = "CopyChunk"
GET = "Get"
TOP = "Top"
SCAN = "Scan"
STATS = "Stats"
TIMEOUT = "Timeout"
SHED = "RequestShed"
PROBE = "Probe"
PROBED = "Probed"          # how our call for a peer's Probe ended

PROBE_TIMEOUT = (0.01, 5.0)     # seconds a peer's Probe may have us wait, at least and most
TOP_DEFAULT = 10                # keys a Top call asking for 0 gets
SCAN_CHUNK = 5000               # keys per chunk of a Scan asking for 0


def check_started(m: NodeMachine, now: float = 0.0, out: list | None = None) -> None:
    if m.core.starting:
        raise Starting(f"{m.started_as or m.core.node_id} is starting: it has not yet "
                       f"confirmed its place in the ring")


def ring_view(m: NodeMachine, now: float, out: list, starting_ok: bool = False,
              expect_reducer: str = "") -> tuple:
    """Our ring, and whether we are still starting (then only if `starting_ok`: the
    ring we would found, for a starting peer's decision)."""
    core = m.core
    if core.starting:
        if not starting_ok:
            check_started(m)
        return core.ring, True
    name = core.reducer.name
    if expect_reducer and expect_reducer != name:
        raise ReducerMismatch(f"the ring runs reducer {name!r}, the caller "
                              f"expects {inert(expect_reducer)}")
    return core.ring, False


def exchange_ring(m: NodeMachine, now: float, out: list, sender: str, ring,
                  caller: str = ""):
    """Take a peer's view; answer with ours. `caller`: the name its certificate gives
    (a sender's word is not checked in the clear)."""
    check_started(m)
    if sender:
        m.handle_into(SignOfLife(sender), now, out)
    m.handle_into(RingSeen(ring, False, caller or sender), now, out)
    return m.core.ring


def heartbeat(m: NodeMachine, now: float, out: list, sender: str, ring_stamp: int,
              incarnation: int) -> tuple[int, int]:
    """Our ring stamp and incarnation."""
    check_started(m)
    if m.core.fenced:
        raise Fenced(f"{m.core.node_id} was removed from the ring")
    m.handle_into(HeardFrom(sender, ring_stamp, incarnation), now, out)
    return m.core.ring.stamp, m.incarnation


def checkpoint(m: NodeMachine, now: float, out: list, sender: str, ring_stamp: int,
               incarnation: int, watermarks) -> None:
    """A checkpoint arriving: the caller merges it (in steps) once we may take it."""
    check_started(m)
    m.handle_into(HeardFrom(sender, ring_stamp, incarnation), now, out)
    if not isinstance(watermarks, dict):
        raise InvalidArgument("watermarks must be a msgpack map")


def copy_chunk(m: NodeMachine, now: float, out: list, sender: str, ring_stamp: int,
               token: int) -> None:
    """A chunk of a full copy: refused once its range moved (NodeCore.check_copy_chunk)."""
    check_started(m)
    m.core.check_copy_chunk(sender, ring_stamp, token)


def get(m: NodeMachine, now: float, out: list, key) -> tuple[bool, object, int]:
    found, state = m.core.get(key)
    return found, state, m.core.ring.version


def top(m: NodeMachine, now: float, out: list, k: int) -> int:
    """How many keys a Top call ranks (0: TOP_DEFAULT)."""
    limit = m.limits.max_top
    if k > limit:
        raise TooLarge(f"top {k} is over the limit of {limit} keys (--max-top)")
    return k or TOP_DEFAULT


def scan(m: NodeMachine, now: float, out: list, ring_stamp: int | None = None,
         asked: int = 0, default: int = SCAN_CHUNK) -> int:
    """The chunk size (keys) of a scan asked for at `ring_stamp` (None: only the chunk
    is checked), once the scan may begin: refused when the node cannot answer it.
    `asked` 0: `default`, within the limit."""
    limit = m.limits.max_scan_chunk
    if asked > limit:
        raise TooLarge(f"scan chunks of {asked} keys are over the limit of {limit} "
                       f"(--max-scan-chunk)")
    if ring_stamp is not None:
        core = m.core
        if ring_stamp and ring_stamp != core.ring.stamp:
            raise StaleRing(f"scan for ring stamp {ring_stamp:#x}, node {core.node_id} is "
                            f"at {core.ring.stamp:#x}")
        core.check_readable()
    return asked or min(default, limit)


def stats(m: NodeMachine, now: float, out: list) -> dict:
    """What the machine knows of itself; the executor adds its queues and process."""
    core, load = m.core, m.load
    rates = load.token_rates()
    return dict(core.stats(), fenced=core.fenced, cpu=load.cpu(), busy=load.busy(),
                apply_rate=sum(rates.values()), overloaded=load.overloaded,
                tokens=len(core.ring.tokens_of(core.node_id)),
                leaving=m.leaving or m.departing,   # handing all away too
                suspects=sorted(m.detector.suspected), load=msgpack.packb(dict(rates)),
                rejoined=m.rejoined, node_id=core.node_id, reducer=core.reducer.name)


def timeout(m: NodeMachine, now: float, out: list, asked: float) -> float | None:
    """A caller's timeout for a move, split or leave: 0 for the default (None), else
    finite, positive and bounded."""
    limit = m.limits.max_handoff_timeout
    if not 0 <= asked <= limit:         # NaN fails too
        raise InvalidArgument(f"timeout must be 0 (the default) to {limit} seconds "
                              f"(--max-handoff-timeout), not {inert(asked)}")
    return asked or None


def shed(m: NodeMachine, now: float, out: list, sender: str,
         identity: str = "") -> tuple[str, dict[int, str] | None]:
    """The member a shedding request speaks for ("": none), and the ranges we hand it
    (None: an ordinary shedding round; SharePulling.share_moves_for). A member short of
    its share is handed ranges by name: only a caller whose certificate names that
    member may ask for it (another member's request is an ordinary shedding request)."""
    member = sender if not identity or base_name(sender) == identity else ""
    share = m.share_moves_for(member) if member else None
    if share is not None:
        out.append(Note(f"share: handing {len(share)} ranges to {member}, short of its "
                        f"share of the ring"))
    return member, share


def probe(m: NodeMachine, now: float, out: list, target: str,
          timeout: float) -> tuple[str | None, float]:
    """A peer asks whether we reach `target` (an indirect probe): where to call it
    (None: no member of our ring, so we do not) and for how long, the caller's timeout
    bounded (NaN: the shortest)."""
    low, high = PROBE_TIMEOUT
    return m.address_of(target), min(timeout, high) if timeout >= low else low


def probed(m: NodeMachine, now: float, out: list, target: str, failure: str | None,
           incarnation: int = 0, member: str = "") -> bool:
    """How our call to `target` for a peer's Probe ended (node.core.calls): whether we
    reach it, taken as our own evidence too."""
    reached, evidence = probe_evidence(m, target, failure, incarnation, member)
    m.handle_into(evidence, now, out)
    return reached


def probe_evidence(m: NodeMachine, target: str, failure: str | None, incarnation: int = 0,
                   member: str = "") -> tuple[bool, SignOfLife | ProbedFor]:
    """Whether a call to `target` that ended so reached it, and what that tells us: a
    sign of life when the process the ring knows answered (not another member or
    incarnation at its address), else our own evidence that it is gone."""
    if failure is None and m.is_process_of(target, incarnation, member):
        return True, SignOfLife(target)
    return False, ProbedFor(target)


ANSWERS: dict[str, Callable[..., Any]] = {
    STARTED: check_started, GET_RING: ring_view, EXCHANGE_RING: exchange_ring, HEARTBEAT: heartbeat,
    CHECKPOINT: checkpoint, COPY_CHUNK: copy_chunk, GET: get, TOP: top, SCAN: scan,
    STATS: stats, TIMEOUT: timeout, SHED: shed, PROBE: probe, PROBED: probed,
}


def answer(m: NodeMachine, kind: str, fields: dict, now: float, out: list):
    """The value `kind` is answered with; raises the FloeError that refuses it."""
    try:
        decide = ANSWERS[kind]
    except KeyError:
        raise InvalidArgument(f"unknown request {inert(kind)}") from None
    return decide(m, now, out, **fields)
