"""Helpers of tests/cluster/test_tls.py that other test files use too: status_of.
"""

import grpc


def status_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
