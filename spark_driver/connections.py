"""One ring connection per Spark Python worker process, reused across its tasks.

Spark reuses a Python worker for many tasks (spark.python.worker.reuse), so a task
need not open gRPC channels and fetch the ring anew: it takes the worker's client and
rebinds it to its own source and first seq (RingClient.rebind), which also reopens the
Push streams and re-reads the ring. Exactly-once is untouched: every task still numbers
its tuples itself and flushes before it returns. A task that fails closes the client
instead of returning it (a retry starts from fresh connections, as before). The pool
is keyed by pid, so a forked child never uses its parent's channels.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_pid = os.getpid()
_idle: dict[tuple, Any] = {}          # key -> the flushed RingClient nobody uses (<= 1)


def acquire(seeds: tuple[str, ...], *, source: str, first_seq: int,
            expect_reducer: str | None, batch_size: int, tls_dir: str | None = None,
            plan: bytes | None = None, names=()):
    """A RingClient for one task: the worker's idle one rebound, or a new one; its
    shared keys routed by the batch's `plan` (mapper/plans.py, encoded); a new one's
    seed channels expect the members `names` ((address, node): the driver's ring)
    places there, where this process saw no ring yet."""
    from floering.mapper import RingClient, TlsFiles
    from floering.mapper.delivery import place
    from floering.mapper.plans import Plan
    routing = Plan.decode(plan) if plan is not None else None
    key = (tuple(seeds), expect_reducer, batch_size, tls_dir)
    with _lock:
        _forget_if_forked()
        client = _idle.pop(key, None)
    if client is not None:
        try:
            client.rebind(source, first_seq, routing)
            return client
        except Exception:
            _close_quietly(client)        # a dead ring or a stale client: start over
    place(names)
    client = RingClient(list(seeds), source=source, first_seq=first_seq,
                        expect_reducer=expect_reducer, batch_size=batch_size,
                        tls=TlsFiles.in_dir(tls_dir, "client") if tls_dir else None)
    if routing is not None:
        try:
            client.rebind(source, first_seq, routing, refetch=False)   # fetched just now
        except BaseException:
            _close_quietly(client)
            raise
    return client


def release(client, seeds: tuple[str, ...], expect_reducer: str | None,
            batch_size: int, tls_dir: str | None = None) -> None:
    """Keep a flushed client for the worker's next task. Only the latest one is
    kept (a worker feeds one ring), so a worker that saw many rings holds no more."""
    key = (tuple(seeds), expect_reducer, batch_size, tls_dir)
    with _lock:
        _forget_if_forked()
        old = [c for c in _idle.values() if c is not client]
        _idle.clear()
        _idle[key] = client
    for other in old:
        _close_quietly(other)


def discard(client) -> None:
    """A task failed: its client is not reused."""
    _close_quietly(client)


def idle_count() -> int:
    with _lock:
        _forget_if_forked()
        return len(_idle)


def close_all() -> None:
    with _lock:
        _forget_if_forked()
        clients = list(_idle.values())
        _idle.clear()
    for client in clients:
        _close_quietly(client)


def _forget_if_forked() -> None:
    # The parent's clients run on the parent's loop thread, which the child does not
    # have: drop them without touching them.
    global _pid
    if _pid != os.getpid():
        _idle.clear()
        _pid = os.getpid()


def _close_quietly(client) -> None:
    try:
        client.__exit__(RuntimeError, None, None)   # release without flushing
    except Exception:
        pass
