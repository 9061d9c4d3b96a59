"""Call slots: who may hold how many of the calls a node serves at once.

A node serves at most `--max-concurrent-rpcs` calls at once (a stream holds its slot
until it ends). One caller must not be able to take them all: a client that opens a
thousand idle streams would shut out the members' heartbeats, the health checks and
every other client. So the slots are shared out:

- reserved slots per kind of call, which the shared pool's exhaustion cannot take:
  a tenth for the members (a caller with a node certificate; without TLS, the calls
  only members make), a fiftieth for health checks (the unary `Check`: a `Watch`
  stream counts as its caller's), a fiftieth for operators;
- every caller but a member holds at most a quarter of the limit at once, counted
  per identity (its certificate's role and name; without TLS, its host: the peer's
  address without the port, so a caller opening many connections is still one
  caller) and per connection. A health check takes a slot of the health reserve
  whoever asks; past that reserve it counts against its caller's quarter like any
  call, so a flood of checks cannot take the shared pool.

In the clear (`--insecure`, loopback only) nothing tells a caller from a member: the
calls only members make get the members' reserve whoever makes them, and every
other call of the host shares one quarter.

A refusal is `Busy`: retriable, a client backs off and calls again.

Ring views pushed to a node (`ExchangeRing`) cost it a merge each, whoever sends
them: a member pushing views without end would keep the node merging. So each
caller identity may push VIEWS_PER_SECOND views a second, in bursts of VIEW_BURST
(`ViewRate`, a token bucket per identity), a view costing one token per VIEW_BYTES
of its encoding begun (a view of 16 MiB, the most a node takes, costs 64: its merge
is that much longer); past that its views are refused `Busy` until its bucket
refills. Honest members push a view to each peer when their ring changes and when a
heartbeat shows a peer's differs (at most one a heartbeat, 20 a second by default),
below the rate. In the clear every member is its host, so nothing is counted there.
"""

from __future__ import annotations

from dataclasses import dataclass

from floering.wire.errors import Busy, inert

MEMBER, OPERATOR, HEALTH, CLIENT = "member", "operator", "health", "client"
FLAG = "--max-concurrent-rpcs"


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string, without its port: "ipv4:127.0.0.1:5000" ->
    "ipv4:127.0.0.1", "ipv6:[::1]:5000" -> "ipv6:[::1]"; anything else (a Unix socket,
    an unknown form) as it is."""
    kind, sep, rest = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return peer
    if kind == "ipv6" and rest.startswith("["):
        end = rest.find("]")
        return f"{kind}:{rest[:end + 1]}" if end > 0 else peer
    host, colon, port = rest.rpartition(":")
    return f"{kind}:{host}" if colon and host and port.isdigit() else peer


def kind_of(role: str | None, method: str, node_only: bool) -> str:
    """The kind of a call by its caller's role (None without TLS) and its method
    (`node_only`: a method only members call)."""
    if role == "node" or (role is None and node_only):
        return MEMBER
    if method == "Check":
        return HEALTH
    if role == "operator":
        return OPERATOR
    return CLIENT


@dataclass(frozen=True)
class Ticket:
    """A slot taken: given back with `CallSlots.give`."""

    kind: str
    identity: str
    connection: str
    reserved: bool


class CallSlots:
    """The slots of one server: every count is of calls being served, so the maps hold
    at most `limit` entries."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.reserve = {MEMBER: max(1, limit // 10), HEALTH: max(1, limit // 50),
                        OPERATOR: max(1, limit // 50)}
        self.shared = max(1, self.limit - sum(self.reserve.values()))
        self.per_identity = max(1, limit // 4)
        self.per_connection = max(1, limit // 4)
        self.in_shared = 0
        self.in_reserve = dict.fromkeys(self.reserve, 0)
        self.by_identity: dict[str, int] = {}
        self.by_connection: dict[str, int] = {}
        self.refused = 0

    @property
    def active(self) -> int:
        return self.in_shared + sum(self.in_reserve.values())

    def take(self, kind: str, identity: str, connection: str) -> Ticket:
        """A slot for a call, or Busy naming the bound it would pass. A health check
        takes the health reserve first, whoever asks; past it, it is counted as any
        call of its caller."""
        if kind == HEALTH and self.in_reserve[HEALTH] < self.reserve[HEALTH]:
            self.in_reserve[HEALTH] += 1
            return self._held(Ticket(kind, identity, connection, True))
        if kind != MEMBER:
            held = self.by_identity.get(identity, 0)
            if held >= self.per_identity:
                self.refused += 1
                raise Busy(f"{inert(identity, 80)} holds {held} calls, the most one caller "
                           f"may hold at once (a quarter of {FLAG})")
            held = self.by_connection.get(connection, 0)
            if held >= self.per_connection:
                self.refused += 1
                raise Busy(f"this connection holds {held} calls, the most one connection "
                           f"may hold at once (a quarter of {FLAG})")
        if self.in_shared < self.shared:
            self.in_shared += 1
            reserved = False
        elif kind in (MEMBER, OPERATOR) and self.in_reserve[kind] < self.reserve[kind]:
            self.in_reserve[kind] += 1
            reserved = True
        else:
            self.refused += 1
            raise Busy(f"{self.active} calls are being served, the most at once for a "
                       f"{kind} call ({FLAG}, {self.limit})")
        return self._held(Ticket(kind, identity, connection, reserved))

    def _held(self, ticket: Ticket) -> Ticket:
        self.by_identity[ticket.identity] = self.by_identity.get(ticket.identity, 0) + 1
        self.by_connection[ticket.connection] = \
            self.by_connection.get(ticket.connection, 0) + 1
        return ticket

    def give(self, ticket: Ticket) -> None:
        if ticket.reserved:
            self.in_reserve[ticket.kind] -= 1
        else:
            self.in_shared -= 1
        for counts, key in ((self.by_identity, ticket.identity),
                            (self.by_connection, ticket.connection)):
            left = counts[key] - 1
            if left:
                counts[key] = left
            else:
                del counts[key]


VIEWS_PER_SECOND = 50.0
VIEW_BURST = 100
VIEW_BYTES = 256 << 10        # a view costs a token per this many bytes begun
MAX_VIEW_CALLERS = 1024       # identities tracked; full buckets are forgotten first


class ViewRate:
    """Ring views each caller identity may push: a token bucket per identity, at
    `rate` a second up to `burst`; `now` is the caller's clock."""

    def __init__(self, rate: float = VIEWS_PER_SECOND, burst: int = VIEW_BURST,
                 max_callers: int = MAX_VIEW_CALLERS) -> None:
        self.rate, self.burst, self.max_callers = rate, burst, max_callers
        self.buckets: dict[str, tuple[float, float]] = {}   # identity -> (tokens, when)
        self.refused = 0

    def _tokens(self, identity: str, now: float) -> float:
        tokens, when = self.buckets.get(identity, (float(self.burst), now))
        return min(float(self.burst), tokens + max(0.0, now - when) * self.rate)

    def take(self, identity: str, now: float, size: int = 0) -> None:
        """Count one view of `size` bytes pushed by `identity`, or Busy if it pushed
        its share."""
        cost = min(float(self.burst), 1.0 + size // VIEW_BYTES)
        tokens = self._tokens(identity, now)
        if tokens < cost:
            self.buckets[identity] = (tokens, now)
            self.refused += 1
            raise Busy(f"{inert(identity, 80)} pushed more ring views than a member may "
                       f"({self.rate:g} a second, {self.burst} at once, a view a token per "
                       f"{VIEW_BYTES >> 10} KiB): refused until its share refills")
        self.buckets[identity] = (tokens - cost, now)
        if len(self.buckets) > self.max_callers:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (they hold nothing), then the oldest."""
        for identity in [i for i in self.buckets if self._tokens(i, now) >= self.burst]:
            del self.buckets[identity]
        while len(self.buckets) > self.max_callers:
            del self.buckets[min(self.buckets, key=lambda i: self.buckets[i][1])]
