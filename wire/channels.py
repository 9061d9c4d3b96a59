"""gRPC channels by address, for nodes and mappers alike.

A channel holds a connection and gRPC's reconnect machinery. Kept for every address
ever called, a long-lived process in a ring whose nodes come and go on new addresses
(containers, autoscaling) would keep one per departed node, forever. Here a channel
is closed once the ring no longer names its address and no call has taken it for
`idle` seconds; calling the address again simply opens a new one.

With TLS the server is checked as the caller is: a channel accepts only the
certificate of the member the ring places at its address (its server name,
`<node>.node.floe-ring`, node.transport.tls; once that member left, still the one
placed there last), or of any node (the role's name, `node.floe-ring`) where no ring
named a member yet (a seed) and none was placed there from a ring seen before
(ServerNames.place). A channel is kept per address and name: once the ring names the
member at a seed's address, calls go to a channel that accepts that member only (the
seed's own, when it was placed there already).
"""

from __future__ import annotations

import time
from typing import Callable, Collection, Mapping

import grpc

from floering.wire.tls import NODE_ROLE_NAME, server_name

IDLE = 60.0     # seconds: far past any call's deadline, so no call is cut short
MAX_DROPPED = 64   # channels dropped for a fresh connection, not yet closed
# The largest message a node takes or sends at the default settings (at most
# node.transport.server.message_bytes: twice --max-batch-bytes, at least this). A
# client's channel accepts no larger reply and sends no larger request, so a node (or
# anything answering at its address) cannot make a client hold more per call.
MESSAGE_LIMIT = 8 << 20


def check_message_bytes(max_message_bytes) -> int:
    """`max_message_bytes` if it is a size a channel can take (an int from 1 to 2 GiB
    - 1, gRPC's own bound); else ValueError saying what is wrong. gRPC reads 0 and
    negative limits as "none" or "the default", so they are refused, not passed on."""
    if type(max_message_bytes) is not int:
        raise ValueError(f"max_message_bytes must be an int (bytes), not "
                         f"{type(max_message_bytes).__name__}")
    if not 0 < max_message_bytes < 1 << 31:
        raise ValueError(f"max_message_bytes must be from 1 to {(1 << 31) - 1} bytes, not "
                         f"{max_message_bytes} (a node's default is {MESSAGE_LIMIT})")
    return max_message_bytes


def size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC channel options: messages sent and received at most this large (a larger
    one fails its call RESOURCE_EXHAUSTED, raised as TooLarge naming both sizes)."""
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def server_options(name: str | None = None) -> list[tuple[str, str]]:
    """gRPC channel options that make the TLS handshake accept only a server whose
    certificate carries `name` (default: any node's)."""
    return [("grpc.ssl_target_name_override", name or NODE_ROLE_NAME)]


def open_channel(address: str, credentials: grpc.ChannelCredentials | None,
                 options, name: str | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: TLS with `credentials`, to a server whose
    certificate carries `name` (a node's server name; default: any node's), in the
    clear without credentials."""
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials,
                                       options=[*options, *server_options(name)])
    return grpc.aio.insecure_channel(address, options=options)


class ServerNames:
    """The server name a channel to an address must find in the certificate: the
    member's the ring (`ring_of()`, read at each call) places there, or placed there
    last (a member that left keeps its address: nobody else answers for it), else any
    node's. The lookup is rebuilt only when the ring object changes; at most
    `remembered` addresses are kept."""

    def __init__(self, ring_of: Callable[[], object], remembered: int = 4096) -> None:
        self._ring_of = ring_of
        self._ring: object = None
        self._names: dict[str, str] = {}
        self._nodes: dict[str, str] = {}       # address -> the node its name is of
        self._remembered = remembered

    def __call__(self, address: str) -> str:
        try:
            ring = self._ring_of()
        except Exception:          # no ring yet (a starting node or client)
            ring = None
        if ring is not self._ring:
            self._ring = ring
            placed: dict[str, dict[str, str]] = {}
            for node, at in (getattr(ring, "addresses", None) or ()):
                placed.setdefault(at, {})[server_name(node)] = node.split("#", 1)[0]
            for at, names in placed.items():
                if len(names) > 1:
                    continue        # two members at one address: the name we knew stays
                self._names.pop(at, None)          # the newest last: kept longest
                (self._names[at], self._nodes[at]), = names.items()
            while len(self._names) > self._remembered:
                oldest = next(iter(self._names))
                del self._names[oldest]
                self._nodes.pop(oldest, None)
        return self._names.get(address, NODE_ROLE_NAME)

    def place(self, nodes: Mapping[str, str]) -> None:
        """Expect the member `nodes` ({address: node}) names at each address it is
        not told of otherwise: a ring seen before (the last one this process knew),
        so a seed's first channel already expects the member its ring will name
        there, and serves on once it does (one connection, one handshake). Only
        tighter than any node's name; a ring naming another member there wins."""
        for address, node in list(nodes.items())[-self._remembered:]:
            if address not in self._names:
                self._names[address] = server_name(node)
                self._nodes[address] = node.split("#", 1)[0]

    def unplace(self, addresses: Collection[str]) -> None:
        """Forget what `place` expected at `addresses` where no ring named a member
        since: any node's certificate is accepted there again."""
        self(next(iter(addresses), ""))
        named = {at for _, at in (getattr(self._ring, "addresses", None) or ())}
        for address in addresses:
            if address not in named:
                self._names.pop(address, None)
                self._nodes.pop(address, None)

    def node_at(self, address: str) -> str:
        """The node whose certificate a call to `address` accepts now (its configured
        id: `n2` for `n2#1` too), "" where any node's is accepted."""
        return self._nodes.get(address, "") if self(address) != NODE_ROLE_NAME else ""


class ChannelPool:
    """Channels by address (and, with `names`, by the server name expected there:
    `make(address, name)` opens one)."""

    def __init__(self, make: Callable[..., grpc.aio.Channel], idle: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 names: Callable[[str], str] | None = None) -> None:
        self._make = make
        self._idle = IDLE if idle is None else idle
        self._clock = clock
        self._names = names
        self._open: dict[tuple[str, str | None], grpc.aio.Channel] = {}
        self._taken: dict[tuple[str, str | None], float] = {}   # when a call last took it
        # Channels dropped for a fresh connection, with when: calls still on them end
        # by their deadlines, so each is closed at the first retire `idle` later.
        self._dropped: list[tuple[float, grpc.aio.Channel]] = []

    def _name(self, address: str) -> str | None:
        return None if self._names is None else self._names(address)

    def get(self, address: str) -> grpc.aio.Channel:
        name = self._name(address)
        key = (address, name)
        self._taken[key] = self._clock()
        channel = self._open.get(key)
        if channel is None:
            channel = self._open[key] = (self._make(address) if name is None
                                         else self._make(address, name))
        return channel

    async def drop(self, address: str) -> None:
        """The next call to `address` opens a new channel. A channel in reconnect
        backoff fails calls at once with the last error it saw, which may predate the
        process now listening there (a member restarted on its port)."""
        now = self._clock()
        for key in [k for k in self._open if k[0] == address]:
            del self._taken[key]
            self._dropped.append((now, self._open.pop(key)))
        while len(self._dropped) > MAX_DROPPED:         # bounded: close the oldest now
            await self._dropped.pop(0)[1].close()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, address: str) -> bool:
        return any(a == address for a, _ in self._open)

    def __bool__(self) -> bool:
        return bool(self._open)

    async def retire(self, named: Collection[str]) -> list[str]:
        """Close the channels to addresses not in `named` (the ring's), or expecting
        a server name the ring no longer places there, that no call took for `idle`
        seconds; return their addresses."""
        cutoff = self._clock() - self._idle
        gone = [key for key in self._open
                if (key[0] not in named or key[1] != self._name(key[0]))
                and self._taken[key] <= cutoff]
        # All out of the pool before the first close yields: a call meanwhile opens a
        # new channel rather than take one about to close.
        closing = [self._open.pop(key) for key in gone]
        for key in gone:
            del self._taken[key]
        closing += [channel for at, channel in self._dropped if at <= cutoff]
        self._dropped = [(at, channel) for at, channel in self._dropped if at > cutoff]
        for channel in closing:
            await channel.close()
        return [address for address, _ in gone]

    async def close(self) -> None:
        channels = [*self._open.values(), *(channel for _, channel in self._dropped)]
        self._open.clear()
        self._dropped.clear()
        self._taken.clear()
        for channel in channels:
            await channel.close()
