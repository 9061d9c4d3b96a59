"""gRPC channels by address, for nodes and mappers alike.

A channel holds a connection and gRPC's reconnect machinery. Kept for every address
ever called, a long-lived process in a ring whose nodes come and go on new addresses
(containers, autoscaling) would keep one per departed node, forever. Here a channel
is closed once the ring no longer names its address and no call has taken it for
`idle` seconds; calling the address again simply opens a new one.
"""

from __future__ import annotations

import time
from typing import Callable, Collection

import grpc

IDLE = 60.0     # seconds: far past any call's deadline, so no call is cut short


def open_channel(address: str, credentials: grpc.ChannelCredentials | None,
                 options) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: TLS with `credentials`, in the clear without."""
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)


class ChannelPool:
    def __init__(self, make: Callable[[str], grpc.aio.Channel], idle: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make = make
        self._idle = IDLE if idle is None else idle
        self._clock = clock
        self._open: dict[str, grpc.aio.Channel] = {}
        self._taken: dict[str, float] = {}      # address -> when a call last took it

    def get(self, address: str) -> grpc.aio.Channel:
        self._taken[address] = self._clock()
        channel = self._open.get(address)
        if channel is None:
            channel = self._open[address] = self._make(address)
        return channel

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, address: str) -> bool:
        return address in self._open

    def __bool__(self) -> bool:
        return bool(self._open)

    async def retire(self, named: Collection[str]) -> list[str]:
        """Close the channels to addresses not in `named` (the ring's) that no call
        took for `idle` seconds; return those addresses."""
        cutoff = self._clock() - self._idle
        gone = [a for a in self._open if a not in named and self._taken[a] <= cutoff]
        # All out of the pool before the first close yields: a call meanwhile opens a
        # new channel rather than take one about to close.
        closing = [self._open.pop(a) for a in gone]
        for address in gone:
            del self._taken[address]
        for channel in closing:
            await channel.close()
        return gone

    async def close(self) -> None:
        channels = list(self._open.values())
        self._open.clear()
        self._taken.clear()
        for channel in channels:
            await channel.close()
