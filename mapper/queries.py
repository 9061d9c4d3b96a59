"""The mapper's reads, as coroutines on the delivery's loop: both clients run them,
the sync one on its loop thread, the asyncio one on the caller's loop. Each is asked
at the client's ring; a node at another ring refuses, and the read fetches the ring
and starts over (until `timeout`)."""

from __future__ import annotations

import asyncio
import functools
import heapq

import grpc

from floering.v1 import floe_pb2
from floering.wire.balancers import balancer
from floering.node.core.batch import KEY_TYPES
from floering.wire.codec import pack, unpack
from floering.wire.errors import InvalidKey
from floering.wire.pieces import check_user_key, piece_key
from floering.wire.ring import Ring
from floering.wire.status import error_from_rpc


async def query(delivery, timeout: float, make_call):
    """await make_call(ring); on a stale ring fetch the newest one and retry (at once
    when the client adopted a newer ring while the call was out); on a busy node
    (every call slot the caller may hold there taken) call again, backing off."""
    deadline = delivery.clock() + timeout
    backoff = 0.02
    while True:
        ring = delivery.ring
        try:
            return await make_call(ring)
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
        refused_at = delivery.clock()    # the clock the machine's shared fetches keep
        if not (err.refresh_ring or err.retriable) or refused_at > deadline:
            raise err
        if not err.refresh_ring:        # busy (every call slot it may hold is taken)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)
            continue
        if delivery.ring is not ring:
            continue        # a newer ring came while the call was out: try it at once
        await asyncio.sleep(0.05)
        await delivery.fetch_ring_after(refused_at)


def check_query_key(key) -> None:
    if type(key) not in KEY_TYPES:
        raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")
    if type(key) is bytes:
        check_user_key(key)


async def get_state(delivery, timeout: float, rpc_timeout: float, key, reducer):
    """The reducer state of `key` (its pieces merged with `reducer()`), or None."""
    check_query_key(key)

    async def call(ring: Ring):
        keys = [piece_key(key, i) for i in range(balancer(ring.balancer).pieces)]
        return await asyncio.gather(*(
            delivery.query_stub(ring.address(ring.owner(k))).Get(
                floe_pb2.GetRequest(key=pack(k)), timeout=rpc_timeout)
            for k in keys))

    states = [unpack(reply.state) for reply in await query(delivery, timeout, call)
              if reply.found]
    if len(states) > 1:                 # the pieces of a shared key
        return functools.reduce(reducer().merge, states)
    return states[0] if states else None


async def top_entries(delivery, timeout: float, rpc_timeout: float, k: int) -> list:
    """The k best (key, state) of a ring whose keys are not shared, best first."""
    async def call(ring: Ring):
        return await asyncio.gather(*(
            delivery.query_stub(address).Top(floe_pb2.TopRequest(k=k), timeout=rpc_timeout)
            for _, address in ring.addresses))

    entries = [e for reply in await query(delivery, timeout, call) for e in unpack(reply.entries)]
    return [(key, state) for key, state, _ in heapq.nlargest(k, entries, key=lambda e: e[2])]


def top_of(items, k: int, reducer) -> list:
    """The k best of merged (key, state)s (a ring whose keys are shared)."""
    return heapq.nlargest(k, items, key=lambda e: reducer.sort_key(e[1]))


async def node_stats(delivery, timeout: float, rpc_timeout: float,
                     also: dict[str, str] | None) -> list[dict]:
    """NodeStats of every member, then of `also`; an unreachable node gives
    {'node_id', 'address', 'error'}."""
    async def call(ring: Ring):
        async def one(node, address):
            try:
                s = await delivery.query_stub(address).Stats(
                    floe_pb2.StatsRequest(), timeout=rpc_timeout)
            except grpc.RpcError as exc:
                return {"node_id": node, "address": address, "error": exc.code().name}
            return {f.name: plain(getattr(s, f.name)) for f in s.DESCRIPTOR.fields}
        asked = list(ring.addresses) + sorted((also or {}).items())
        return await asyncio.gather(*(one(n, a) for n, a in asked))
    return await query(delivery, timeout, call)


def plain(value):
    """A repeated field as a list (JSON-friendly); scalars as they are."""
    return value if isinstance(value, (str, bytes, int, float, bool)) else list(value)
