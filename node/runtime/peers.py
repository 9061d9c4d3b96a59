"""How a node calls its peers: the `Peers` interface the runtime is written against,
and an in-memory implementation that connects runtimes in one event loop (tests run
the real runtime without gRPC). The gRPC one is node.transport.peers.PeerPool.

Both carry rings and checkpoint states in their wire encodings, so no object is ever
shared between two nodes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from floering.wire.codec import pack_entries, unpack_entries
from floering.wire.errors import Refused, Unavailable
from floering.node.core.membership import base_name
from floering.wire.ring import Ring
from floering.node.runtime.inbound import StreamState


class Peers(Protocol):
    async def ship_checkpoint(self, address: str, *, sender: str, ring_stamp: int,
                              checkpoint, base_seq: int,
                              incarnation: int = 0) -> tuple[bool, int]: ...

    async def heartbeat(self, address: str, *, sender: str, ring_stamp: int,
                        incarnation: int = 0,
                        timeout: float | None = None) -> tuple[int, int]: ...

    async def probe(self, address: str, target: str, timeout: float) -> bool: ...

    async def stats(self, address: str): ...

    async def request_shed(self, address: str, sender: str, depth: int) -> tuple[bool, str]: ...

    async def ring_at_start(self, address: str, timeout: float) -> tuple[bytes, bool]: ...

    async def exchange_ring(self, address: str, *, sender: str, ring_wire: bytes,
                            version: int, reducer: str) -> tuple[bytes, str | None]: ...

    async def push(self, address: str, batch) -> None: ...

    async def reconnect(self, address: str) -> None: ...

    async def retire_channels(self, named) -> list[str]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class PeerStats:
    apply_rate: float
    overloaded: bool


class Network:
    """The services of in-memory nodes by address; a node not in it, or cut off,
    refuses every call, as a dead process does."""

    def __init__(self, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self.services: dict[str, object] = {}
        self.down: set[str] = set()

    def peers(self) -> "InMemoryPeers":
        return InMemoryPeers(self)


class InMemoryPeers:
    def __init__(self, network: Network) -> None:
        self.network = network

    async def _call(self, address: str, timeout: float | None, call):
        service = self.network.services.get(address)
        if service is None or address in self.network.down:
            raise Refused(f"connection refused: nothing listens at {address}")
        await asyncio.sleep(0)          # a call is never answered synchronously
        try:
            result = call(service)
            if asyncio.iscoroutine(result):
                result = await asyncio.wait_for(result, timeout or self.network.timeout)
            return result
        except asyncio.TimeoutError:
            raise Unavailable(f"deadline exceeded calling {address}") from None

    async def ship_checkpoint(self, address, *, sender, ring_stamp, checkpoint, base_seq,
                              incarnation=0):
        states = unpack_entries(pack_entries(checkpoint.states))
        need_full, seq, _ = await self._call(address, None, lambda s: s.receive_checkpoint(
            sender, ring_stamp, incarnation, checkpoint.token, checkpoint.seq, base_seq,
            checkpoint.full, states, dict(checkpoint.watermarks)))
        return need_full, seq

    async def heartbeat(self, address, *, sender, ring_stamp, incarnation=0, timeout=None):
        return await self._call(address, timeout, lambda s: (
            *s.heartbeat(sender, ring_stamp, incarnation), s.node_id))

    async def probe(self, address, target, timeout):
        return await self._call(address, 2 * timeout, lambda s: s.probe(target, timeout))

    async def stats(self, address):
        st = await self._call(address, None, lambda s: s.stats())
        return PeerStats(st["apply_rate"], st["overloaded"])

    async def request_shed(self, address, sender, depth):
        outcome = await self._call(address, 30.0, lambda s: s.shed(sender, depth))
        return outcome.moved, outcome.detail

    async def ring_at_start(self, address, timeout):
        ring, starting = await self._call(address, timeout,
                                          lambda s: s.ring_view(starting_ok=True))
        return ring.to_wire(), starting

    async def exchange_ring(self, address, *, sender, ring_wire, version, reducer):
        ring, name = await self._call(address, None, lambda s: (
            s.exchange_ring(sender, Ring.from_wire(ring_wire)), s.node_id))
        return ring.to_wire(), base_name(name)     # whom the server's certificate names

    async def push(self, address, batch):
        async def submit(service):
            return await service.submit([batch], StreamState())
        await self._call(address, None, submit)

    async def reconnect(self, address: str) -> None:
        pass                            # no connection is kept per address here

    async def retire_channels(self, named) -> list[str]:
        return []                       # nothing is held per address here

    async def close(self) -> None:
        pass
