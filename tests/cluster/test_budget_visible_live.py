"""What a node's budget of request bytes (node.transport.budget.RequestBytes) did is visible:
calls refused and waiting, their wait, bytes held and the most held, in the Stats RPC (`floe
status --json`) and in /metrics. A real TLS node: a client holds its whole share of the
budget with calls whose requests it has not sent yet.

The tests here start real node processes; the in-process ones are in
tests/unit/test_budget_visible.py.
"""

import socket
import threading
import time

import grpc
import pytest

from tests.support.helpers import status, wait_for


MESSAGE = 8 << 20          # the largest message a node takes with the default flags


WAIT = 2.0                 # --request-wait


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Held:
    """A Stats call whose request is sent only when `send()` is called: until then
    the node has reserved room for the largest message for it."""

    def __init__(self, channel: grpc.Channel) -> None:
        from floering.v1 import floe_pb2
        self._go = threading.Event()
        call = channel.stream_unary("/floering.v1.QueryPlane/Stats",
                                    request_serializer=floe_pb2.StatsRequest.SerializeToString,
                                    response_deserializer=floe_pb2.NodeStats.FromString)
        self.future = call.future(self._request(), timeout=60)

    def _request(self):
        from floering.v1 import floe_pb2
        self._go.wait(60)
        yield floe_pb2.StatsRequest()

    def send(self):
        self._go.set()
        return self.future.result(timeout=30)


@pytest.mark.multiprocess
def test_refusals_waits_and_bytes_held_show_in_stats_and_metrics(tmp_path):
    from floering.floe.cluster import LocalCluster
    from floering.node.transport.budget import MEMBER_READS_IN_ALL
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.support.observability_shared import scrape, value
    metrics = free_port()
    limit = 5 * MESSAGE           # the client's share (four messages) and one more
    # the bound reported is of the three budgets together: the non-members' (the
    # flag's), the members' and the Push messages' (the inbound queue's, 256 MiB)
    bound = limit + MEMBER_READS_IN_ALL * MESSAGE + (256 << 20)
    with LocalCluster.up(1, 0, workdir=tmp_path, metrics_port=metrics,
                         extra_args=["--request-wait", str(WAIT),
                                     "--max-request-bytes", str(limit)]) as cluster:
        address = cluster.node("n0").address
        with cluster.channel(address, "client") as client, \
                cluster.channel(address, "operator") as operator:
            ask = floe_pb2_grpc.QueryPlaneStub(operator).Stats
            asked = floe_pb2_grpc.QueryPlaneStub(client).Stats

            def stats():
                return ask(floe_pb2.StatsRequest(), timeout=10)
            first = stats()
            assert (first.request_budget_refused, first.request_budget_waited,
                    first.request_budget_waiting, first.request_budget_bytes,
                    first.request_budget_limit_bytes) == (0, 0, 0, 0, bound)
            assert first.request_budget_wait_seconds == 0
            # the operator's call reserved a message before its (empty) request was read
            assert first.request_budget_peak_bytes == MESSAGE
            holds = [Held(client) for _ in range(4)]
            try:
                wait_for(lambda: stats().request_budget_bytes == 4 * MESSAGE, timeout=10,
                         what="the client's four calls holding a message each")
                began = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    asked(floe_pb2.StatsRequest(), timeout=30)
                waited = time.monotonic() - began
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert WAIT <= waited < WAIT + 5, waited
                after = stats()
                assert (after.request_budget_refused, after.request_budget_waited,
                        after.request_budget_waiting) == (1, 1, 0)
                assert WAIT <= after.request_budget_wait_seconds < waited + 0.1
                assert after.request_budget_bytes == 4 * MESSAGE
                assert after.request_budget_peak_bytes == limit   # the four and a Stats
                # a call that waits is let in once one of the client's requests is read
                late = asked.future(floe_pb2.StatsRequest(), timeout=30)
                wait_for(lambda: stats().request_budget_waiting == 1, timeout=WAIT / 2,
                         what="the client's fifth call waiting")
                assert holds[0].send().request_budget_waiting == 0
                assert late.result().request_budget_waited == 2
                now = stats()
                assert (now.request_budget_refused, now.request_budget_waited,
                        now.request_budget_waiting) == (1, 2, 0)
                assert now.request_budget_bytes == 3 * MESSAGE
                assert now.request_budget_peak_bytes == limit
                wait_seconds = now.request_budget_wait_seconds
                assert after.request_budget_wait_seconds < wait_seconds < \
                    after.request_budget_wait_seconds + WAIT
                samples = scrape(metrics)        # a scrape holds no room itself
                assert value(samples, "floe_request_budget_refused_total") == 1
                assert value(samples, "floe_request_budget_waited_total") == 2
                assert value(samples, "floe_request_budget_wait_seconds_total") == wait_seconds
                assert value(samples, "floe_request_budget_waiting") == 0
                assert value(samples, "floe_request_budget_bytes") == 3 * MESSAGE
                assert value(samples, "floe_request_budget_peak_bytes") == limit
                assert value(samples, "floe_request_budget_limit_bytes") == bound
                assert value(samples, "floe_calls_refused_busy_total",
                             service="floering.v1.QueryPlane", method="Stats") == 1
                # `floe status --json` asks as the client: one call at a time fits
                row = status(tmp_path)["n0"]
                assert (row["request_budget_refused"], row["request_budget_waited"],
                        row["request_budget_waiting"], row["request_budget_bytes"],
                        row["request_budget_peak_bytes"], row["request_budget_limit_bytes"]
                        ) == (1, 2, 0, 3 * MESSAGE, limit, bound)
                assert row["request_budget_wait_seconds"] == wait_seconds
            finally:
                for hold in holds:
                    hold.send()
            wait_for(lambda: stats().request_budget_bytes == 0, timeout=10,
                     what="every request let go")
            assert value(scrape(metrics), "floe_request_budget_bytes") == 0
