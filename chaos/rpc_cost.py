"""What one message costs gRPC's asyncio stack in CPU, back to back and spaced out.

    python -m floering.chaos.rpc_cost [--round-trips 2000] [--gaps 0,0.001,0.005]

A server process echoes each message of one bidirectional stream (grpc.aio, as the
nodes' Push stream is served); the client writes a 100-byte message, reads its echo,
waits `gap` seconds, and again. Printed per round trip: the client's and the server's
CPU time, and each against the back-to-back cost. Nothing of the ring runs: this is
the floor under every batch a mapper sends and every acknowledgement a node returns,
and how it grows when messages come one at a time to a process that went idle in
between (a light stream's usual case).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import time

import grpc
import psutil

MESSAGE = b"x" * 100
CALL_DEADLINE = 30.0     # seconds, on top of the run's own length


def _serve(ports) -> None:
    async def echo(requests, context):
        async for message in requests:
            yield message

    async def main():
        handler = grpc.method_handlers_generic_handler(
            "floering.bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


async def _round_trips(address: str, count: int, gap: float) -> float:
    """Client CPU seconds per round trip over `count` spaced by `gap` seconds."""
    async with grpc.aio.insecure_channel(address) as channel:
        # A deadline for the whole run: a server that stopped answering fails it.
        call = channel.stream_stream("/floering.bench.Echo/Stream")(
            timeout=CALL_DEADLINE + count * (gap + 0.01))
        await call.write(MESSAGE)           # connected and warm before the clock starts
        await call.read()
        started = time.process_time()
        for _ in range(count):
            await call.write(MESSAGE)
            await call.read()
            if gap:
                await asyncio.sleep(gap)
        cpu = time.process_time() - started
        await call.done_writing()
    return cpu / count


def measure(round_trips: int, gaps: list[float]) -> list[tuple[float, float, float]]:
    """(gap, client CPU s, server CPU s) per round trip, for each gap."""
    # A fresh interpreter: a forked child of a process already running gRPC hangs.
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    server = spawn.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        try:
            address = f"127.0.0.1:{ports.get(timeout=CALL_DEADLINE)}"
        except queue.Empty:
            raise RuntimeError(f"the echo server did not start in {CALL_DEADLINE:g} s") from None
        process = psutil.Process(server.pid)
        rows = []
        for gap in gaps:
            # spaced runs take longer per round trip: fewer of them
            count = round_trips if gap == 0 else max(100, round_trips // 5)
            before = sum(process.cpu_times()[:2])
            client = asyncio.run(_round_trips(address, count, gap))
            served = (sum(process.cpu_times()[:2]) - before) / (count + 1)
            rows.append((gap, client, served))
        return rows
    finally:
        server.kill()
        server.join()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=2000,
                        help="back-to-back round trips (a fifth as many spaced; default: "
                             "%(default)s)")
    parser.add_argument("--gaps", default="0,0.001,0.005",
                        help="comma-separated seconds between two round trips "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    gaps = [float(g) for g in args.gaps.split(",")]
    if 0.0 not in gaps:
        gaps.insert(0, 0.0)
    rows = measure(args.round_trips, gaps)
    base_client, base_server = rows[0][1], rows[0][2]
    print("grpc.aio bidirectional stream, 100-byte messages, loopback, CPU per round trip")
    for gap, client, served in rows:
        print(f"gap {gap * 1e3:4.1f} ms: client {client * 1e6:6.0f} us "
              f"({client / base_client:4.2f}x back to back), server {served * 1e6:6.0f} us "
              f"({served / base_server:4.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
