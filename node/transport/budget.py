"""Bytes of inbound messages taken in at once, bounded: decoding a message costs a few
times its bytes in objects, so a dozen large ones at once would double a node's
memory (which the allocator then keeps). A message waits for room, up to `wait`
seconds, then is refused (Overloaded: RESOURCE_EXHAUSTED, which a sender retries);
one larger than the whole budget goes alone."""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager

from floering.wire.errors import Overloaded

INBOUND_BYTES = 32 << 20     # bytes of messages being decoded at once, node-wide
INBOUND_WAIT = 5.0           # seconds a message waits for room before it is refused


class ByteBudget:
    def __init__(self, limit: int = INBOUND_BYTES, wait: float = INBOUND_WAIT) -> None:
        self.limit, self.wait = limit, wait
        self.held = 0
        self._room: asyncio.Condition | None = None

    @asynccontextmanager
    async def hold(self, nbytes: int):
        n = min(max(nbytes, 0), self.limit)
        if self._room is None:
            self._room = asyncio.Condition()
        room = self._room
        async with room:
            try:
                await asyncio.wait_for(room.wait_for(lambda: self.held + n <= self.limit),
                                       self.wait)
            except asyncio.TimeoutError:
                raise Overloaded(f"{self.held} bytes of messages are being taken in, the "
                                 f"most at once is {self.limit}: retry later") from None
            self.held += n
        try:
            yield
        finally:
            async with room:
                self.held -= n
                room.notify_all()


# Bytes of requests read at once for one caller, and for all callers but the members,
# in messages of the largest size a node takes (a request's size is known only once
# read: it reserves the largest, then keeps what it took).
READS_PER_CALLER = 4
READS_IN_ALL = 16
READ_WAIT = 30.0             # seconds a call waits for room to read its request
# The members' own budget, larger: a checkpoint round sends a call per range and
# replica at once, and a member's heartbeats wait behind its calls in its turn.
MEMBER_READS_PER_CALLER = 16
MEMBER_READS_IN_ALL = 64
# Push messages read but not yet applied, per caller identity (every Push stream
# of the caller's, members' too); in all, the inbound queue's bound in bytes.
PUSH_READS_PER_CALLER = 8
# Push streams of one caller reading a message, or holding one read that waits for
# room, at once: gRPC reads a stream's message whole once its handler asks for it
# (a stream past them waits its turn before asking, held back by flow control).
READING_PER_CALLER = 8


class Tally:
    """Bytes held in several budgets together, and the most held at once."""

    __slots__ = ("held", "peak")

    def __init__(self) -> None:
        self.held = self.peak = 0


class Held:
    """Bytes reserved for one call's request: the largest message until it is read,
    then its own size, until the call ends."""

    __slots__ = ("identity", "size")

    def __init__(self, identity: str, size: int) -> None:
        self.identity, self.size = identity, size


class RequestBytes:
    """Bytes of the requests a node holds for callers other than its members, bounded
    per caller identity and in all. A call reserves the largest message (`message`
    bytes) before gRPC reads its request, so no more requests are read at once than
    there is room for; once read, it keeps only the request's own bytes until it
    ends. A call that finds no room waits its turn (first come, first served among a
    caller's calls; another caller's are not held back by this one's), up to `wait`
    seconds, then is refused Overloaded (RESOURCE_EXHAUSTED, which a caller retries).
    A request not yet read is held back by HTTP/2 flow control (the stream's initial
    window, node.transport.server). What it did is counted (`stats`: the node's
    NodeStats and metrics)."""

    def __init__(self, message: int, per_identity: int | None = None,
                 total: int | None = None, wait: float | None = READ_WAIT,
                 tally: Tally | None = None) -> None:
        self.message = max(1, message)
        self.per_identity = max(self.message, per_identity or READS_PER_CALLER * self.message)
        self.total = max(self.per_identity, total or READS_IN_ALL * self.message)
        self.wait = wait                          # None: a call waits its turn however long
        self.tally = tally if tally is not None else Tally()
        self.held = 0
        self.peak = 0                             # the most bytes held at once, so far
        self.by_identity: dict[str, int] = {}     # one entry per caller holding bytes
        self.refused = 0                          # calls refused after their wait
        self.waited = 0                           # calls that found no room at once
        self.wait_seconds = 0.0                   # their time waiting, ended waits
        # Calls waiting for room, in order: at most one per call being served.
        self._waiting: deque[tuple[str, int, asyncio.Future]] = deque()

    def _fits(self, identity: str, n: int) -> bool:
        return (self.held + n <= self.total
                and self.by_identity.get(identity, 0) + n <= self.per_identity)

    async def reserve(self, identity: str, nbytes: int | None = None) -> Held:
        """Room to read one request of `identity`'s (or to keep one of `nbytes`
        already read), or Overloaded after `wait`."""
        n = self.message if nbytes is None else min(max(nbytes, 0), self.message)
        if self._fits(identity, n) and not any(w[0] == identity for w in self._waiting):
            self._add(identity, n)
            return Held(identity, n)
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        entry = (identity, n, turn)
        self._waiting.append(entry)
        self.waited += 1
        began = loop.time()
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.wait)
        except BaseException as exc:
            if turn.done() and not turn.cancelled():        # granted meanwhile
                self.release(Held(identity, n))
            else:
                turn.cancel()
                self._waiting.remove(entry)
            if not isinstance(exc, asyncio.TimeoutError):
                raise
            self.refused += 1
            raise Overloaded(
                f"{self.by_identity.get(identity, 0)} bytes of this caller's requests and "
                f"{self.held} in all are held, the most are {self.per_identity} and "
                f"{self.total}: retry later") from None
        finally:
            self.wait_seconds += loop.time() - began
        return Held(identity, n)

    def stats(self) -> dict:
        """What the budget did, for the node's stats (NodeStats) and metrics: calls
        refused after their wait, calls that waited (refused ones included) and their
        seconds waiting, calls waiting now, bytes held now, the most held at once and
        the node-wide bound."""
        return dict(request_budget_refused=self.refused,
                    request_budget_waited=self.waited,
                    request_budget_wait_seconds=self.wait_seconds,
                    request_budget_waiting=len(self._waiting),
                    request_budget_bytes=self.held,
                    request_budget_peak_bytes=self.peak,
                    request_budget_limit_bytes=self.total)

    def _add(self, identity: str, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)
        tally = self.tally
        tally.held += n
        tally.peak = max(tally.peak, tally.held)
        left = self.by_identity.get(identity, 0) + n
        if left:
            self.by_identity[identity] = left
        else:
            self.by_identity.pop(identity, None)

    def keep(self, held: Held, size: int) -> None:
        """The request is read: `size` of its reserved bytes stay held."""
        size = min(max(size, 0), held.size)
        self._add(held.identity, size - held.size)
        held.size = size
        self._grant()

    def release(self, held: Held) -> None:
        self._add(held.identity, -held.size)
        held.size = 0
        self._grant()

    def _grant(self) -> None:
        """Room handed to the waiting calls that now fit, in order."""
        if not self._waiting:
            return
        blocked: set[str] = set()          # a caller's calls keep their order
        for entry in list(self._waiting):
            identity, n, turn = entry
            if identity in blocked:
                continue
            if not self._fits(identity, n):
                blocked.add(identity)
                if self.held + n > self.total:
                    return
                continue
            self._waiting.remove(entry)
            self._add(identity, n)
            turn.set_result(None)


class Turns:
    """Turns to read a stream's next message, at most `per_identity` at once per caller
    identity, handed out in order (one caller's waits hold back no other caller's).
    gRPC reads a message whole, up to the largest a node takes, as soon as a handler
    asks for it, before anyone knows its size: without turns a caller's every stream
    asks at once, and the node holds one message per stream (250 streams of 8 MiB,
    2 GiB). A turn is held while the stream waits for its message and until the
    message has room (RequestBytes.reserve), so a caller holds at most `per_identity`
    messages without room. A stream waiting for its turn is not read: its sender is
    held back by HTTP/2 flow control (the stream's 64 KiB window). A stream idle with
    its turn while another waits is ended (node.transport.server.DataPlane)."""

    def __init__(self, per_identity: int = READING_PER_CALLER) -> None:
        self.per_identity = max(1, per_identity)
        self.by_identity: dict[str, int] = {}      # turns held, callers holding one
        # streams waiting for a turn, per caller: at most one per stream being served
        self._waiting: dict[str, deque[asyncio.Future]] = {}
        self.waited = 0                            # turns that were not free at once

    def holding(self, identity: str) -> int:
        return self.by_identity.get(identity, 0)

    def wanted(self, identity: str) -> bool:
        """Whether a stream of `identity`'s waits for a turn."""
        return any(not turn.done() for turn in self._waiting.get(identity, ()))

    async def take(self, identity: str) -> None:
        queue = self._waiting.get(identity)
        if queue is None and self.holding(identity) < self.per_identity:
            self.by_identity[identity] = self.holding(identity) + 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(identity, deque()).append(turn)
        self.waited += 1
        try:
            await turn          # handed over by give(), counted for us already
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give(identity)                # granted meanwhile: pass it on
            else:
                turn.cancel()
                queue = self._waiting.get(identity)
                # give() may have passed over our cancelled turn already
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self._waiting[identity]
            raise

    def give(self, identity: str) -> None:
        queue = self._waiting.get(identity)
        while queue:
            turn = queue.popleft()
            if not queue:
                del self._waiting[identity]
            if not turn.done():
                turn.set_result(None)              # the turn passes on, still counted
                return
        left = self.holding(identity) - 1
        if left > 0:
            self.by_identity[identity] = left
        else:
            self.by_identity.pop(identity, None)


class Budgets:
    """A node's budgets of request bytes (docs/security.md, *Bytes of requests in
    flight*): `callers` for the one-message requests of any caller but a member,
    `members` for the members' (larger), `pushes` for the Push messages of every
    caller read but not yet applied. Their stats are reported together."""

    def __init__(self, message: int, total: int | None = None,
                 wait: float = READ_WAIT, push_total: int | None = None) -> None:
        self.tally = Tally()
        self.callers = RequestBytes(message, total=total, wait=wait, tally=self.tally)
        self.members = RequestBytes(message, MEMBER_READS_PER_CALLER * message,
                                    MEMBER_READS_IN_ALL * message, wait, self.tally)
        # a Push message waits for room as long as the applier takes (the inbound
        # queue's own wait): never refused, its sender held back by flow control
        self.pushes = RequestBytes(message, PUSH_READS_PER_CALLER * message,
                                   push_total, None, self.tally)
        self.reading = Turns(READING_PER_CALLER)     # Push streams reading at once

    def all(self) -> tuple[RequestBytes, ...]:
        return self.callers, self.members, self.pushes

    def stats(self) -> dict:
        """RequestBytes.stats of the three together: counts summed, bytes held and the
        most held at once over all three, the bound the sum of theirs."""
        parts = [b.stats() for b in self.all()]
        summed = {k: sum(p[k] for p in parts) for k in parts[0]}
        summed.update(request_budget_bytes=self.tally.held,
                      request_budget_peak_bytes=self.tally.peak)
        return summed
