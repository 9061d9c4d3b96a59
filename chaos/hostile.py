"""A hostile (or careless) client against one node of a live ring: forged ring views,
requests past the node's limits, a stream number that would retire every later stream
of its source, garbage at a replica, a key outside its batch's
range, a value the reducer cannot take. Every one must be refused
with the status that names why, while the load goes on; the harness then checks that
every acknowledged tuple is counted exactly and that nobody was declared dead.

It calls in the clear, with no certificate: on a ring in the clear, so what is refused
is refused by the node's validation alone (under TLS the handshake would stop it first).
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from floering.floe.cluster import LocalCluster
from floering.chaos.timeline import Injected
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.node.core.batch import encode_payload
from floering.wire.codec import pack, pack_entries
from floering.node.core.forged_views import forged_views
from floering.wire.ring import Ring


def _refused(call, expected: grpc.StatusCode) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        if exc.code() != expected:
            raise AssertionError(f"refused with {exc.code().name}, not {expected.name}: "
                                 f"{exc.details()}") from None
        return exc.code().name
    raise AssertionError("accepted")


def attack(address: str) -> dict[str, str]:
    """Every hostile request once; returns how each was refused (raises if one was not)."""
    outcome = {}
    with grpc.insecure_channel(address) as channel:
        control = floe_pb2_grpc.ControlPlaneStub(channel)
        query = floe_pb2_grpc.QueryPlaneStub(channel)
        data = floe_pb2_grpc.DataPlaneStub(channel)
        ring = Ring.from_wire(control.GetRing(floe_pb2.GetRingRequest(), timeout=5).ring)
        invalid, exhausted = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
        for name, view in forged_views(ring).items():
            outcome[f"ring view: {name}"] = _refused(lambda: control.ExchangeRing(
                floe_pb2.RingView(version=view.version, ring=view.to_wire(),
                                  sender="mallory"), timeout=5), invalid)
        outcome["top of 10^9"] = _refused(
            lambda: query.Top(floe_pb2.TopRequest(k=10 ** 9), timeout=5), exhausted)
        outcome["scan chunks of 10^9"] = _refused(
            lambda: list(query.Scan(floe_pb2.ScanRequest(chunk=10 ** 9), timeout=5)), exhausted)
        token = ring.tokens_of(ring.owners[0])[0]

        def push(**fields):
            batch = dict(ring_stamp=ring.stamp, token=token, source="mallory", first_seq=1,
                         last_seq=1, count=1, id=1, payload=encode_payload(["x"], [1]))
            batch.update(fields)
            return lambda: list(data.Push(iter([floe_pb2.PushRequest(
                batches=[floe_pb2.Batch(**batch)])]), timeout=5))

        outcome["source id of 10,000 characters"] = _refused(push(source="m" * 10_000),
                                                             exhausted)
        outcome["stream numbered 2^64-1"] = _refused(push(stream=2 ** 64 - 1), invalid)
        me = next(n for n, a in ring.addresses if a == address)
        backed = next(t for t in ring.tokens if ring.role_of(me, t) == "replica")
        outcome["undecodable batch at a replica"] = _refused(
            push(token=backed, payload=b"\xc1" * 64), invalid)
        owned = ring.tokens_of(me)[0]
        stray = next(k for k in (f"k{i}" for i in range(10_000))
                     if ring.token_for_key(k) != owned)
        outcome["a key outside the batch's range"] = _refused(
            push(token=owned, payload=encode_payload([stray], [1])), invalid)
        outcome["a value the reducer cannot take"] = _refused(
            push(token=backed, payload=encode_payload(["x"], ["one"])), invalid)
        outcome["timeout of NaN on a move"] = _refused(lambda: control.Move(
            floe_pb2.MoveRequest(tokens=[token], target=ring.nodes[0], timeout=float("nan")),
            timeout=5), invalid)
    return outcome


def hostile_clients(cluster: LocalCluster, node_ids) -> Injected:
    if cluster.tls() is not None:
        raise RuntimeError("the hostile client calls without a certificate: it needs a "
                           "cluster in the clear (tls=False)")
    at = time.time()
    detail = {node_id: attack(cluster.node(node_id).address) for node_id in node_ids}
    return Injected("hostile", tuple(node_ids), at, detail=detail)


def impersonate(cluster: LocalCluster, address: str, scratch: Path) -> dict[str, str]:
    """On a TLS ring: callers without the right credentials, each once against the
    node at `address`. Returns how each was refused (raises if one was not)."""
    from floering.floe.cluster import channel
    from floering.wire.tls import TlsFiles
    from floering.node.transport.tls import generate
    outcome = {}
    unavailable, denied = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED
    get_ring = floe_pb2.GetRingRequest()
    with grpc.insecure_channel(address) as clear:
        outcome["no certificate"] = _refused(lambda: floe_pb2_grpc.ControlPlaneStub(
            clear).GetRing(get_ring, timeout=5), unavailable)
    me = next(n.node_id for n in cluster.nodes if n.address == address)
    other = next(n.node_id for n in cluster.nodes if n.node_id != me and n.alive())
    # A certificate named like a member, from a CA the ring does not trust.
    foreign = TlsFiles.in_dir(generate(scratch / "foreign-ca", [other]), other)
    with channel(address, foreign) as ch:
        outcome["a member's name from another CA"] = _refused(
            lambda: floe_pb2_grpc.ControlPlaneStub(ch).GetRing(get_ring, timeout=5),
            unavailable)
    with cluster.channel(address) as ch:
        ring = Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            get_ring, timeout=5).ring)
    backed = next(t for t in ring.tokens if ring.role_of(me, t) == "replica")
    owner = ring.owner_of_token(backed)
    forger = next(n for n in ring.nodes if n not in (me, owner))
    view = ring.without([owner]).with_version(ring.version + 1)
    calls = {
        "ring view": lambda c, sender: c.ExchangeRing(floe_pb2.RingView(
            version=view.version, ring=view.to_wire(), sender=sender), timeout=5),
        "heartbeat": lambda c, sender: c.Heartbeat(floe_pb2.HeartbeatRequest(
            sender=sender, ring_stamp=ring.stamp), timeout=5),
        "checkpoint": lambda c, sender: c.ShipCheckpoint(floe_pb2.CheckpointFragment(
            sender=sender, ring_stamp=ring.stamp, token=backed, checkpoint_seq=10 ** 6,
            full=True, states=pack_entries({"forged": 10 ** 6}), watermarks=pack({})),
            timeout=5),
        "leave": lambda c, sender: c.Leave(floe_pb2.LeaveRequest(), timeout=5),
    }
    for role in ("client", "operator"):
        with cluster.channel(address, role) as ch:
            control = floe_pb2_grpc.ControlPlaneStub(ch)
            for what, call in calls.items():
                if role == "operator" and what == "leave":
                    continue                           # an operator's to call
                outcome[f"{what} with the {role}'s certificate"] = _refused(
                    lambda: call(control, owner), denied)
    with cluster.channel(address, forger) as ch:
        control = floe_pb2_grpc.ControlPlaneStub(ch)
        for what in ("ring view", "heartbeat", "checkpoint"):
            outcome[f"{what} from {forger} claiming to be {owner}"] = _refused(
                lambda: calls[what](control, owner), denied)
        outcome[f"checkpoint of {owner}'s range from {forger} as itself"] = _refused(
            lambda: calls["checkpoint"](control, forger), grpc.StatusCode.FAILED_PRECONDITION)
    return outcome


def impostors(cluster: LocalCluster, node_ids, scratch: Path) -> Injected:
    if cluster.tls() is None:
        raise RuntimeError("impostors are refused by their certificates: they need a "
                           "cluster with TLS")
    at = time.time()
    detail = {node_id: impersonate(cluster, cluster.node(node_id).address, scratch / node_id)
              for node_id in node_ids}
    return Injected("impostor", tuple(node_ids), at, detail=detail)


class IdleStreams:
    """`count` calls held open against the node at `address` and never fed: Push
    streams with no batch and health Watch streams (every role may open one), taken
    in turn from `kinds`, as one caller on one connection. `refused` counts those the
    node refused (by status code name), `ended` those it ended without an error (a
    node ends an idle Push stream whose caller has others waiting to be read: held
    calls that must stay held are Watch streams); the rest stay open until `close()`.
    `options`: the channel's (("grpc.use_local_subchannel_pool", 1): a connection of
    its own, not shared with another channel of this process to the same address)."""

    def __init__(self, address: str, tls, count: int, options=(),
                 kinds: tuple[str, ...] = ("watch", "push")) -> None:
        import asyncio
        import threading
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from floering.wire.channels import open_channel
        if not kinds or set(kinds) - {"watch", "push"}:
            raise ValueError(f"kinds must be of 'watch' and 'push', not {kinds!r}")
        self.refused: dict[str, int] = {}
        self.ended = 0
        self.details: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

        async def hold():
            stop = self._stop = asyncio.Event()
            channel = open_channel(address, tls.channel_credentials() if tls else None,
                                   list(options))
            data = floe_pb2_grpc.DataPlaneStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            never = asyncio.Event()

            async def nothing():
                await never.wait()
                return
                yield

            async def one(i):
                call = data.Push(nothing()) if kinds[i % len(kinds)] == "push" else \
                    health.Watch(health_pb2.HealthCheckRequest(service=""))
                try:
                    async for _ in call:
                        pass
                    self.ended += 1
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.CANCELLED:
                        name = exc.code().name
                        self.refused[name] = self.refused.get(name, 0) + 1
                        if len(self.details) < 5:
                            self.details.append(exc.details() or "")
            tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
            self._ready.set()
            await stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await channel.close()

        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(hold(),), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def close(self) -> None:
        if self._stop is None:
            raise RuntimeError("the held calls never started: nothing to stop")
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> "IdleStreams":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LargePushes:
    """`streams` Push streams against the node at `address`, opened at once by one
    caller on one connection, each sending `messages` requests of two batches near
    `max_batch_bytes` each (about 7 MiB a request with the default flags): valid
    tuples of one key, `key`, of a range the node owns, that take the applier about
    a tenth of a second a request, so they arrive far faster than they are applied.
    With `garbage`, every batch's payload is undecodable instead (refused when its
    turn to be applied comes, with the rest of its stream). `acked` counts the tuples
    the node acknowledged as applied; `refused` the streams refused, by status code
    name."""

    KEY_BYTES = 30                # about 35 bytes a tuple: 100,000 tuples a batch

    def __init__(self, address: str, streams: int, messages: int = 1,
                 max_batch_bytes: int = 4 << 20, garbage: bool = False) -> None:
        import threading
        self.address, self.streams, self.messages = address, streams, messages
        self.acked = 0
        self.refused: dict[str, int] = {}
        self._lock = threading.Lock()
        with grpc.insecure_channel(address) as channel:
            ring = Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(channel).GetRing(
                floe_pb2.GetRingRequest(), timeout=10).ring)
        me = next(n for n, a in ring.addresses if a == address)
        self.token = ring.tokens_of(me)[0]
        self.key = next(k for k in (f"{i:0{self.KEY_BYTES}d}" for i in range(100_000))
                        if ring.token_for_key(k) == self.token)
        self.ring_stamp = ring.stamp
        tuples = 100_000
        while len(encode_payload([self.key] * tuples, [1] * tuples)) > max_batch_bytes * 0.9:
            tuples = tuples * 9 // 10
        self.tuples = tuples
        self.payload = encode_payload([self.key] * tuples, [1] * tuples)
        self.source = "large"
        if garbage:
            self.payload, self.source = b"\xc1" * len(self.payload), "garbage"

    def _requests(self, stream: int):
        for m in range(self.messages):
            batches = []
            for b in range(2):
                first = 1 + (2 * m + b) * self.tuples
                batches.append(floe_pb2.Batch(
                    ring_stamp=self.ring_stamp, token=self.token,
                    source=f"{self.source}-{stream}",
                    first_seq=first, last_seq=first + self.tuples - 1, count=self.tuples,
                    id=2 * m + b + 1, payload=self.payload))
            yield floe_pb2.PushRequest(batches=batches)

    def run(self, timeout: float = 300) -> None:
        """Every stream sent and answered (or refused)."""
        from concurrent.futures import ThreadPoolExecutor
        with grpc.insecure_channel(self.address, options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.use_local_subchannel_pool", 1)]) as channel:
            push = floe_pb2_grpc.DataPlaneStub(channel).Push

            def one(stream: int) -> None:
                try:
                    for reply in push(self._requests(stream), timeout=timeout):
                        with self._lock:
                            self.acked += sum(a.applied for a in reply.acks)
                except grpc.RpcError as exc:
                    with self._lock:
                        name = exc.code().name
                        self.refused[name] = self.refused.get(name, 0) + 1
            with ThreadPoolExecutor(self.streams) as pool:
                list(pool.map(one, range(self.streams)))
