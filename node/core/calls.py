"""What the end of a call to a peer means, decided in one place: executors (the node
runtime over gRPC, the simulation over its network) report how a call ended as a
`Failure` (or None: it answered), and the machine reads it here, so both judge alike.

A call ends answered, or failed as one of:
- FENCED: the peer says it was removed from the ring (only it knows);
- STALE: the peer's ring differs from ours (ours may be behind);
- REFUSED: nothing listens at the address (connection refused or reset): its process
  is gone, the one transport failure that proves it;
- UNAVAILABLE: no answer in time, a stalled handshake, or a process still starting;
- ERROR: the peer answered, with another error.
"""

from __future__ import annotations

from enum import StrEnum

from floering.node.core.detector import ALIVE, REFUSED, TIMED_OUT, UNASKED
from floering.wire.errors import Fenced, FloeError, Refused, StaleRing, Unavailable


class Failure(StrEnum):
    FENCED = "fenced"
    STALE = "stale"
    REFUSED = "refused"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


def failure_of(exc: FloeError) -> Failure:
    """How a call that raised `exc` ended (the error classes of wire.errors)."""
    if isinstance(exc, Fenced):
        return Failure.FENCED
    if isinstance(exc, StaleRing):
        return Failure.STALE
    if isinstance(exc, Refused):
        return Failure.REFUSED
    if isinstance(exc, Unavailable):
        return Failure.UNAVAILABLE
    return Failure.ERROR


def refreshes(failure: str | None) -> bool:
    """A heartbeat that ended so says our ring is stale, or that the peer was removed:
    exchange rings with it."""
    return failure in (Failure.FENCED, Failure.STALE)


def ask_again_fresh(failure: str | None, fresh: bool) -> bool:
    """A direct probe refused over a channel that may be in reconnect backoff (still
    repeating a refusal from before a new process bound the address): only a new
    connection tells, so ask once more over one."""
    return failure == Failure.REFUSED and not fresh


def direct_evidence(failure: str | None) -> str:
    """What a direct probe of the suspect found: REFUSED (it is gone, or it knows it
    was removed), TIMED_OUT (no answer in time), or ALIVE (it answered, if only with
    an error)."""
    if failure in (Failure.FENCED, Failure.REFUSED):
        return REFUSED
    if failure == Failure.UNAVAILABLE:
        return TIMED_OUT
    return ALIVE


def via_evidence(failure: str | None, reached: bool) -> str:
    """What a member asked to probe the suspect said: ALIVE, TIMED_OUT (it cannot reach
    it either) or UNASKED (no answer from it, or a refusal: it confirms nothing, and we
    may be the one cut off)."""
    if failure is not None:
        return UNASKED
    return ALIVE if reached else TIMED_OUT
