"""A process that serves on a node's address with a certificate of the ring's CA that
is not that node's, and answers like the node would if anyone let it: heartbeats
echo the caller's ring stamp, every pushed batch is acknowledged, every read
answers 424242. Every call that reaches it is recorded, one line per call, in the
file given. It loads everything, says READY, and binds once a line comes on stdin
(so it takes the address the moment the node dies).

    python -m tests.support.impostor ADDRESS TLS_DIR NAME CALLS_FILE
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures

import grpc
import msgpack
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from floering.wire.tls import TlsFiles
from floering.v1 import floe_pb2, floe_pb2_grpc

FORGED = 424242


class Recorder(grpc.ServerInterceptor):
    def __init__(self, path: str) -> None:
        self.path, self.lock = path, threading.Lock()

    def intercept_service(self, continuation, details):
        with self.lock, open(self.path, "a") as out:
            out.write(details.method + "\n")
        return continuation(details)


class Control(floe_pb2_grpc.ControlPlaneServicer):
    def Heartbeat(self, request, context):
        return floe_pb2.HeartbeatReply(sender="n2", ring_stamp=request.ring_stamp,
                                       incarnation=request.incarnation)

    def Probe(self, request, context):
        return floe_pb2.ProbeReply(alive=True)


class Data(floe_pb2_grpc.DataPlaneServicer):
    def Push(self, request_iterator, context):
        for request in request_iterator:
            yield floe_pb2.PushReply(acks=[
                floe_pb2.PushAck(id=b.id, applied=b.count, ring_stamp=b.ring_stamp)
                for b in request.batches])


class Query(floe_pb2_grpc.QueryPlaneServicer):
    def Get(self, request, context):
        return floe_pb2.GetReply(found=True, state=msgpack.packb(FORGED))


def main(address: str, tls_dir: str, name: str, calls: str) -> None:
    files = TlsFiles.in_dir(tls_dir, name)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[Recorder(calls)])
    floe_pb2_grpc.add_ControlPlaneServicer_to_server(Control(), server)
    floe_pb2_grpc.add_DataPlaneServicer_to_server(Data(), server)
    floe_pb2_grpc.add_QueryPlaneServicer_to_server(Query(), server)
    checks = health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    print("READY", flush=True)          # everything loaded: binds once told to
    sys.stdin.readline()
    server.add_secure_port(address, files.server_credentials())
    server.start()
    print("SERVING", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(0)


if __name__ == "__main__":
    main(*sys.argv[1:5])
