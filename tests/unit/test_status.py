"""How a failed call's gRPC status becomes the project's error: the failure detector
relies on telling a peer that is gone (refused, reset) from one that is only late."""

import grpc
import pytest

from floering.wire import errors
from floering.wire.status import error_from_rpc


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


# Status details as grpcio reports them on loopback (recorded against real processes).
REFUSED = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:47312: "
           "Failed to connect to remote host: Connection refused")
RESET = "Stream removed (recvmsg:Connection reset by peer (104))"
BROKEN = "Stream removed (sendmsg: Broken pipe (32))"
HANDSHAKE = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:47321: "
             "connection attempt timed out before receiving SETTINGS frame")


@pytest.mark.parametrize("details", [REFUSED, RESET, BROKEN])
def test_a_refused_or_reset_connection_proves_the_peer_gone(details):
    err = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, details))
    assert isinstance(err, errors.Refused)
    assert err.retriable and isinstance(err, errors.Unavailable)   # callers retry as before


def test_a_deadline_is_a_timeout_not_a_refusal():
    err = error_from_rpc(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    assert isinstance(err, errors.TimedOut) and not isinstance(err, errors.Refused)
    assert err.retriable and isinstance(err, errors.Unavailable)


def test_a_stalled_handshake_proves_nothing():
    # a stopped or starved process still accepts TCP connections, then never answers
    err = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, HANDSHAKE))
    assert type(err) is errors.Unavailable


def test_our_own_error_names_still_win():
    err = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Unavailable: draining"))
    assert type(err) is errors.Unavailable
    err = error_from_rpc(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "Fenced: n2 was removed"))
    assert type(err) is errors.Fenced
