"""A node's Prometheus metrics (--metrics-port; every metric is listed in
docs/operations.md).

What the node already tracks (the Status RPC's stats, the checkpoint loop's timing,
the event log's counts) is read at scrape time by a collector, never copied into
counters of its own. Measured here, as histograms (rates are PromQL's, never
precomputed): RPC latency, the time to apply each message of batches, each checkpoint
round, each range's takeover until it applies again, and the event loop's lag; the
runtime's own methods are timed from outside (Timings), the runtime records nothing
for them. Process (CPU, memory, file descriptors) and GC collectors are on. Each node
has its own registry, so several nodes in one process (tests) never share a metric.

The endpoint is served on the node's event loop, no thread at all: at most
MAX_CONNECTIONS at once (a new one beyond closes the oldest that has not sent its
request yet, else is answered 503), each given READ_TIMEOUT to send a request head of
at most MAX_HEAD bytes and to read its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter,
                               Histogram, ProcessCollector, generate_latest)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily,
                                    SummaryMetricFamily)
from prometheus_client.registry import Collector

from floering.node.core.table_state import state_kernel
from floering.node.transport.intercept import around

# (name without _total, key of the node's stats, help): totals since the process
# started (since it rejoined, after being fenced: Prometheus sees a counter reset).
COUNTERS = (
    ("floe_tuples_applied", "applied", "Tuples applied to ranges this node is primary for"),
    ("floe_duplicate_tuples_dropped", "duplicates",
     "Tuples dropped by dedup: their (source, seq) was already applied"),
    ("floe_batches_refused", "refused", "Batches refused (stale ring or bad input)"),
    ("floe_tuples_backed_up", "backed_up", "Tuples stored as a replica for other primaries"),
    ("floe_checkpoints_shipped", "checkpoints_shipped", "Checkpoints shipped to replicas"),
    ("floe_checkpoints_received", "checkpoints_received", "Checkpoints received as a replica"),
    ("floe_checkpoint_bytes", "checkpoint_bytes",
     "Bytes of checkpoint states and watermarks shipped and acknowledged by replicas"),
    ("floe_moved_bytes", "moved_bytes",
     "Bytes of state moved to other nodes: full range copies (handoffs, splits, new "
     "replicas) and pieces merged back, acknowledged"),
    ("floe_takeovers", "takeovers",
     "Ranges served from this node's replica copy: taken over from dead nodes or handed over"),
    ("floe_deaths_declared", "declared", "Nodes this node declared dead"),
    ("floe_handoffs", "handed_off", "Ranges handed to other nodes (moves, splits, leaving)"),
    ("floe_sources_expired", "sources_expired", "Dedup watermarks dropped for idle sources"),
    ("floe_backup_tuples_expired", "backups_expired",
     "Backed-up tuples dropped because their primary never applied them"),
    ("floe_pieces_folded", "pieces_folded", "Pieces of shared keys merged back into their key"),
    ("floe_rejoins", "rejoined", "Times this process came back empty after being fenced"),
    ("floe_retired_ranges_deleted", "retired_deleted",
     "Ranges a removed member kept, deleted once r+1 others held them"),
    ("floe_retired_ranges_handed_over", "retired_handed_over",
     "Parts of kept ranges merged into ranges the ring had lost"),
    ("floe_request_budget_refused", "request_budget_refused",
     "Calls refused RESOURCE_EXHAUSTED after waiting for room to read their request "
     "(the byte budget of callers other than members)"),
    ("floe_request_budget_waited", "request_budget_waited",
     "Calls that found no room at once to read their request and waited (refused ones "
     "included)"),
    ("floe_request_budget_wait_seconds", "request_budget_wait_seconds",
     "Seconds those calls waited for room, in all"),
)
# (name, key of the node's stats, help): values now.
GAUGES = (
    ("floe_queue_batches", "queue_length", "Batches received and not yet applied"),
    ("floe_queue_bytes", "queued_bytes", "Bytes of batches received and not yet applied"),
    ("floe_backup_tuples", "backup_tuples",
     "Tuples held for other primaries until their checkpoints cover them"),
    ("floe_backup_bytes", "backup_bytes", "Bytes of the batches held for other primaries"),
    ("floe_keys", "keys", "Keys in ranges this node is primary for"),
    ("floe_tokens", "tokens", "Token ranges this node owns"),
    ("floe_ring_share_ratio", "ring_share", "Fraction of the hash space this node owns"),
    ("floe_ring_version", "ring_version", "Version of the ring this node holds"),
    ("floe_under_replicated_ranges", "under_replicated",
     "Ranges this node owns that are not yet on all r+1 nodes"),
    ("floe_lost_ranges", "lost_ranges", "Ranges whose every copy died (never served)"),
    ("floe_fenced", "fenced", "1 while this node is fenced: declared dead, serving nothing"),
    ("floe_serving", "serving", "1 once this node has joined the ring and is not fenced"),
    ("floe_overloaded", "overloaded", "1 while the load monitor finds this node overloaded"),
    ("floe_uptime_seconds", "uptime", "Seconds since the node started"),
    ("floe_retired_ranges", "retired_ranges",
     "Ranges a removed member of this process kept, until r+1 others hold them"),
    ("floe_retired_keys", "retired_keys", "Keys in those ranges"),
    ("floe_request_budget_waiting", "request_budget_waiting",
     "Calls waiting now for room to read their request"),
    ("floe_request_budget_bytes", "request_budget_bytes",
     "Bytes of requests held now for callers other than members: reserved until read, "
     "then the request's own"),
    ("floe_request_budget_peak_bytes", "request_budget_peak_bytes",
     "The most bytes of requests held at once since the node started"),
    ("floe_request_budget_limit_bytes", "request_budget_limit_bytes",
     "The most bytes of requests that may be held at once (--max-request-bytes)"),
)
NO_RETIRED = dict(retired_ranges=0, retired_keys=0, retired_deleted=0, retired_handed_over=0)
# Latency from well under a millisecond (a Get on loopback) to a handoff's seconds.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
               5.0, 10.0, 30.0)
# A message of batches applied (well under a millisecond) to a checkpoint round or a
# takeover (seconds).
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_INTERVAL = 0.25             # seconds between two event-loop lag samples
MAX_TAKEOVERS = 4096            # ranges taken over and not applying again yet, kept
SCRAPE_TIMEOUT = 5.0
MAX_CONNECTIONS = 16            # open at once, idle or scraping
READ_TIMEOUT = 5.0              # to send a request head, and to read the answer
MAX_HEAD = 8192                 # bytes of request line and headers
REFUSAL_READ = 0.1              # a refused connection's request is read this long


def node_snapshot(runtime) -> dict:
    """Everything the collector reports, read at once (on the event loop's thread)."""
    retiring = getattr(runtime, "retiring", None)      # node.runtime.retiring
    return dict(runtime.stats(), **(retiring.stats() if retiring else NO_RETIRED),
                serving=runtime.serving,
                kernel=state_kernel(runtime.reducer),
                declared=runtime.events.counts["detected"],
                checkpoint_bytes=getattr(runtime.peers, "checkpoint_bytes", 0),
                checkpoint_rounds=runtime.checkpoint_rounds,
                checkpoint_seconds=runtime.checkpoint_seconds)


class NodeCollector(Collector):
    """Reads the node's stats when scraped. The HTTP server runs in a thread, and the
    node's state belongs to its event loop: the read is done there."""

    def __init__(self, runtime, loop: asyncio.AbstractEventLoop) -> None:
        self.runtime, self.loop = runtime, loop

    def snapshot(self) -> dict:
        try:
            if asyncio.get_running_loop() is self.loop:   # scraped from the loop itself
                return node_snapshot(self.runtime)
        except RuntimeError:
            pass                                          # no loop here: the usual case

        async def read():
            return node_snapshot(self.runtime)
        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(SCRAPE_TIMEOUT)

    def collect(self):
        stats = self.snapshot()
        info = InfoMetricFamily("floe_node", "The node's id, address, reducer and what "
                                "holds its states (kernel: compiled, the state table; "
                                "dict)")
        info.add_metric([], {"node_id": stats["node_id"], "address": stats["address"],
                             "reducer": stats["reducer"], "kernel": stats["kernel"]})
        yield info
        for name, key, text in COUNTERS:
            yield CounterMetricFamily(name, text, value=stats[key])
        for name, key, text in GAUGES:
            yield GaugeMetricFamily(name, text, value=float(stats[key]))
        yield SummaryMetricFamily(
            "floe_checkpoint_round_duration_seconds",
            "Checkpoint rounds (cut, ship to every replica, merge) and their total time",
            count_value=stats["checkpoint_rounds"], sum_value=stats["checkpoint_seconds"])


class RpcTimer(grpc.aio.ServerInterceptor):
    """Observes each call's duration, by service and method; a stream's is its
    whole life (a mapper's Push stream lasts as long as the mapper)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram("floe_rpc_duration_seconds",
                                 "Time to serve a gRPC call, refused calls included",
                                 ["service", "method"], registry=registry,
                                 buckets=RPC_BUCKETS)
        self.busy = Counter("floe_calls_refused_busy",
                            "Calls refused RESOURCE_EXHAUSTED (Busy: past a caller's share "
                            "of the call slots or of ring views pushed; Overloaded)",
                            ["service", "method"], registry=registry)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        service, _, method = details.method.lstrip("/").rpartition("/")
        observe = self.seconds.labels(service, method).observe
        busy = self.busy.labels(service, method)

        @contextlib.asynccontextmanager
        async def timed(request, context):
            started = time.perf_counter()
            try:
                yield
            except BaseException:
                if _code(context) == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    busy.inc()
                raise
            finally:
                observe(time.perf_counter() - started)
        return around(handler, timed)


def _code(context):
    """The status a call ended with, if it set one."""
    try:
        return context.code()
    except Exception:
        return None


class Timings:
    """Histograms of the runtime's steps, timed around its own methods: a message of
    batches applied (`_apply`), a checkpoint round (`checkpoint_once`), a range from
    its takeover until it applies again (the `taken_over` and `applying_again`
    events), and the event loop's lag (a sampler on the loop)."""

    def __init__(self, registry: CollectorRegistry, runtime) -> None:
        def histogram(name, text, buckets=STEP_BUCKETS):
            return Histogram(name, text, registry=registry, buckets=buckets)
        self.apply = histogram("floe_batch_apply_seconds",
                               "Time to apply one received message of batches (dedup, "
                               "reduce, log), its wait in the queue not included")
        self.checkpoint = histogram("floe_checkpoint_seconds",
                                    "Time of one checkpoint round: cut, ship to every "
                                    "replica, merge")
        self.takeover = histogram("floe_takeover_seconds",
                                  "From taking a dead node's range over to applying its "
                                  "tuples again, per range")
        self.loop_lag = histogram("floe_event_loop_lag_seconds",
                                  "How late the node's event loop ran a timer", LAG_BUCKETS)
        self._taken: dict[int, float] = {}
        runtime._apply = self._timed(runtime._apply, self.apply)
        runtime.checkpoint_once = self._timed(runtime.checkpoint_once, self.checkpoint)
        self._watch(runtime.events)
        self._sampler = asyncio.ensure_future(self._sample_lag())

    @staticmethod
    def _timed(method, histogram: Histogram):
        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                histogram.observe(time.perf_counter() - started)
        return timed

    def _watch(self, events) -> None:
        record, taken = events.record, self._taken

        def recorded(kind: str, node: str, **fields) -> float:
            t = record(kind, node, **fields)
            if kind == "taken_over":
                for token in fields.get("tokens", ())[:MAX_TAKEOVERS - len(taken)]:
                    taken[token] = t
            elif kind == "applying_again" and fields.get("token") in taken:
                self.takeover.observe(max(0.0, t - taken.pop(fields["token"])))
            elif kind == "fenced":
                taken.clear()
            return t
        events.record = recorded

    async def _sample_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self.loop_lag.observe(max(0.0, loop.time() - due))

    def close(self) -> None:
        self._sampler.cancel()


class NodeMetrics:
    """The node's registry (its stats, process and GC collectors), its RPC timer (a
    server interceptor), the runtime's step timings and, once served, the HTTP
    endpoint."""

    def __init__(self, runtime) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(runtime, asyncio.get_running_loop()))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.rpc_timer = RpcTimer(self.registry)
        self.timings = Timings(self.registry, runtime)
        self._http: MetricsServer | None = None

    async def serve(self, host: str, port: int) -> None:
        """GET /metrics on host:port, on the event loop (MetricsServer)."""
        self._http = MetricsServer(self.registry)
        await self._http.start(host, port)

    def close(self) -> None:
        self.timings.close()
        if self._http is not None:
            self._http.close()
            self._http = None


def _answer(status: str, body: bytes = b"", content_type: str = "text/plain") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class MetricsServer:
    """A small HTTP/1.1 server for GET /metrics on the running loop, bounded in
    connections, head size and time (a connection is answered once, then closed)."""

    def __init__(self, registry: CollectorRegistry, max_connections: int = MAX_CONNECTIONS,
                 read_timeout: float = READ_TIMEOUT) -> None:
        self.registry, self.max_connections = registry, max_connections
        self.read_timeout = read_timeout
        self._open: dict[asyncio.StreamWriter, bool] = {}   # writer -> its request came
        self._server: asyncio.Server | None = None
        self.accepted = self.refused = 0                    # connections; answered 503

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the metrics endpoint is not started")
        return self._server.sockets[0].getsockname()[1]

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._open) >= self.max_connections:
            idle = next((w for w, asked in self._open.items() if not asked), None)
            if idle is None:
                return False
            del self._open[idle]             # the oldest that has not asked: it goes
            idle.transport.abort()
        self._open[writer] = False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if not self._admit(writer):
                self.refused += 1
                writer.write(_answer("503 Service Unavailable", b"too many connections\n"))
                # what it sent, read (closed unread it would be reset, the 503 lost)
                await asyncio.wait_for(reader.read(MAX_HEAD), REFUSAL_READ)
                return
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
            if writer in self._open:
                self._open[writer] = True
            writer.write(self._reply(head))
            await asyncio.wait_for(writer.drain(), self.read_timeout)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass                           # slow, cut short, too long: closed unanswered
        finally:
            self._open.pop(writer, None)
            writer.close()

    def _reply(self, head: bytes) -> bytes:
        method, _, rest = head.split(b"\r\n", 1)[0].partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if method != b"GET":
            return _answer("405 Method Not Allowed")
        if path not in (b"/metrics", b"/"):
            return _answer("404 Not Found")
        try:
            body = generate_latest(self.registry)
        except Exception as exc:           # e.g. the node's stats not read in time
            return _answer("500 Internal Server Error", f"{type(exc).__name__}\n".encode())
        return _answer("200 OK", body, CONTENT_TYPE_LATEST)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
