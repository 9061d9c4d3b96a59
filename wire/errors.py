"""The project's errors, each with the flags a client's retry loop branches on.

`wire/status.py` is the one table that maps these to gRPC status codes.
"""

from __future__ import annotations


class FloeError(Exception):
    """Base class. `retriable`: the same call may succeed later unchanged.
    `refresh_ring`: the caller's ring view is stale; fetch the ring, then retry."""

    retriable = False
    refresh_ring = False


class InvalidArgument(FloeError):
    """Malformed input: bad msgpack, wrong field types, bad key or value."""


class InvalidKey(InvalidArgument):
    """A key that is not str, bytes or int, or a str that is not valid UTF-8."""


class TooLarge(FloeError):
    """A batch or message over the configured size limit."""


class Overloaded(FloeError):
    """The node is shedding load; slow down and retry."""

    retriable = True


class Busy(Overloaded):
    """Every call slot this caller may hold, or every one left for its kind of call,
    is taken (node.core.slots): call again a moment later."""


class StaleRing(FloeError):
    """The sender's ring version differs from the receiver's, or the receiver is
    not a destination of the batch's range in its ring."""

    retriable = True
    refresh_ring = True


class Fenced(FloeError):
    """The node was removed from the ring; it must rejoin empty."""

    refresh_ring = True


class ReducerMismatch(FloeError):
    """The caller expects a different reducer than the ring runs."""


class UnknownReducer(FloeError):
    """A reducer import path that cannot be loaded."""


class RangeLost(FloeError):
    """Every copy of a range is gone; queries for it cannot be answered exactly."""


class Unavailable(FloeError):
    """A node could not be reached."""

    retriable = True
    refresh_ring = True


class Starting(Unavailable):
    """The node's process just started and has not yet confirmed its place in the
    ring with its peers (it may be a restart of a member whose state is gone)."""


class Refused(Unavailable):
    """Nothing listens at the node's address any more (connection refused, or reset
    mid-call): its process is gone. The one transport failure that proves it."""


class TimedOut(Unavailable):
    """A node did not answer before the deadline: it may be dead, paused, cut off or
    only slow. Unlike a refused connection, this alone does not prove it is gone."""


def inert(value, limit: int = 60) -> str:
    """A caller's value as safe text for a status or a log line: its repr (quotes,
    newlines and control characters escaped), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
