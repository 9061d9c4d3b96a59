"""The one table between the project's errors and gRPC status codes."""

from __future__ import annotations

import re

import grpc

from floering.wire import errors

# Most specific first: the first matching class decides.
_TO_CODE: tuple[tuple[type[errors.FloeError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.TooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Busy, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Fenced, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.StaleRing, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ReducerMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.UnknownReducer, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.RangeLost, grpc.StatusCode.DATA_LOSS),
    (errors.TimedOut, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Refused, grpc.StatusCode.UNAVAILABLE),
    (errors.Starting, grpc.StatusCode.UNAVAILABLE),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
)

# What gRPC reports when the peer's process is gone: the connect was refused, or the
# kernel reset a connection the process held. A handshake that timed out (a paused or
# starved peer still accepts TCP connections) proves nothing and is not listed.
_GONE = ("Connection refused", "Connection reset", "Broken pipe")

# gRPC's refusal of a message over a channel's or server's size limit, by either side
_OVERSIZE = re.compile(r"(CLIENT|SERVER): (Received|Sent) message larger than max "
                       r"\((\d+) vs\. (\d+)\)")

# The error class is carried in the status details' first word so the client can
# rebuild the exact type (several classes share FAILED_PRECONDITION).
_BY_NAME = {cls.__name__: cls for cls, _ in _TO_CODE}


def code_for(exc: errors.FloeError) -> grpc.StatusCode:
    for cls, code in _TO_CODE:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def details_for(exc: errors.FloeError) -> str:
    return f"{type(exc).__name__}: {exc}"


async def abort(context, exc: errors.FloeError):
    await context.abort(code_for(exc), details_for(exc))


def error_from_rpc(exc: grpc.RpcError) -> errors.FloeError:
    """Turn a failed call into the project's error (Unavailable for transport trouble)."""
    code = exc.code()
    details = exc.details() or ""
    name, sep, message = details.partition(": ")
    cls = _BY_NAME.get(name) if sep else None
    if cls is not None:
        return cls(message)
    # A deadline passed: the peer may only be slow (the failure detector must tell
    # this apart from a refused connection, which proves nothing listens).
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.TimedOut(f"{code.name}: {details}")
    # INTERNAL/UNKNOWN without one of our error names come from the transport (a peer
    # killed mid-stream resets it): as retriable as a refused connection.
    if code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in _GONE):
        return errors.Refused(f"{code.name}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return errors.Unavailable(f"{code.name}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.TooLarge(_oversize(details) or details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return errors.StaleRing(details)
    return errors.FloeError(f"{code.name}: {details}")


def _oversize(details: str) -> str | None:
    """gRPC's words for a message over a size limit, said plainly: which side
    refused it, its size and the limit, and how the limits are set."""
    said = _OVERSIZE.search(details)
    if said is None:
        return None
    side, verb, size, limit = said.groups()
    whose = "the caller's" if side == "CLIENT" else "the node's"
    return (f"a message of {size} bytes {'received' if verb == 'Received' else 'to send'} "
            f"is over {whose} limit of {limit} bytes (a node takes and sends messages "
            f"of up to twice its --max-batch-bytes, at least 8 MiB; a client of nodes "
            f"set higher passes max_message_bytes as large)")
