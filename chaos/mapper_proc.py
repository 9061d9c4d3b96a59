"""A mapper as its own process, so the harness can SIGKILL it mid-chunk.

    python -m floering.chaos.mapper_proc --seeds HOST:PORT,... --load JSON --seed N --mapper M \
        --journal FILE [--first-chunk I] [--timeout S] [--tls-dir DIR]

Sends chunk after chunk of `chaos.load.chunk_keys(load, seed, mapper, i)` at the load's
fixed rate, each emitted then flushed, until SIGTERM (it then finishes the chunk in
hand and exits 0). It journals, unbuffered, one line per step:

    start SOURCE T
    E I T          chunk I is about to be emitted
    S I T          chunk I is handed to the client; flush() starts
    A I T          flush() returned: chunk I is on r+1 nodes
    F I T ERROR    flush() failed; the process exits 3

A line written before SIGKILL is in the kernel already, so the journal tells the
harness exactly which chunks were acknowledged and which were in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import TypedDict

from floering.chaos.load import chunk_ids, chunk_keys
from floering.chaos.scenarios import Load


class Journal:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *fields) -> None:
        os.write(self.fd, (" ".join(str(f) for f in fields) + "\n").encode())


class JournalState(TypedDict):
    """A mapper's journal read back (read_journal)."""
    source: str | None
    started: float | None
    emitted: list[int]
    flushing: list[int]
    flushing_at: dict[int, float]
    acked: dict[int, float]
    failed: dict[int, str]
    first: float | None
    last_emitted_at: float | None


def read_journal(path: str) -> JournalState:
    """{'source', 'emitted': [i...], 'acked': {i: t}, 'failed': {i: error},
    'first': t of the first emit, 'started': t}."""
    out: JournalState = {"source": None, "started": None, "emitted": [], "flushing": [],
                    "flushing_at": {}, "acked": {}, "failed": {}, "first": None,
                    "last_emitted_at": None}
    try:
        text = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "start" and len(parts) >= 3:
            out["source"], out["started"] = parts[1], float(parts[2])
        elif parts[0] == "E" and len(parts) >= 3:
            out["emitted"].append(int(parts[1]))
            out["last_emitted_at"] = float(parts[2])
            if out["first"] is None:
                out["first"] = float(parts[2])
        elif parts[0] == "S" and len(parts) >= 3:
            out["flushing"].append(int(parts[1]))
            out["flushing_at"][int(parts[1])] = float(parts[2])
        elif parts[0] == "A" and len(parts) >= 3:
            out["acked"][int(parts[1])] = float(parts[2])
        elif parts[0] == "F" and len(parts) >= 3:
            out["failed"][int(parts[1])] = parts[3] if len(parts) > 3 else ""
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", required=True)
    parser.add_argument("--load", required=True, help="the scenario's load, as JSON")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--mapper", type=int, required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--first-chunk", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds a flush may wait for its acknowledgements")
    parser.add_argument("--tls-dir", help="the ring's ca.pem and client.pem/.key, when it "
                                          "runs mutual TLS")
    args = parser.parse_args(argv)
    load = Load(**json.loads(args.load))

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    from floering.mapper import RingClient
    from floering.wire.tls import TlsFiles
    journal = Journal(args.journal)
    tls = TlsFiles.in_dir(args.tls_dir, "client") if args.tls_dir else None
    client = RingClient(args.seeds, linger=0.005, batch_size=1000, timeout=args.timeout,
                        tls=tls)
    journal.write("start", client.source, f"{time.time():.6f}")
    period = load.chunk / load.rate
    index = args.first_chunk
    keys = chunk_keys(load, args.seed, args.mapper, index)
    started = time.monotonic()
    while not stopping:
        due = started + (index - args.first_chunk) * period
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
            if stopping:
                break
        journal.write("E", index, f"{time.time():.6f}")
        try:
            if load.ids:
                for key, tid in zip(keys, chunk_ids(args.mapper, index, len(keys))):
                    client.emit(key, tid)
            else:
                client.emit_many(keys)
            journal.write("S", index, f"{time.time():.6f}")
            client.flush()
        except Exception as exc:  # reported through the journal and the exit code
            journal.write("F", index, f"{time.time():.6f}", repr(exc).replace("\n", " "))
            return 3
        journal.write("A", index, f"{time.time():.6f}")
        index += 1
        keys = chunk_keys(load, args.seed, args.mapper, index)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


class MapperHandle:
    """The harness's side: start one mapper process and stop it by its own PID."""

    def __init__(self, seeds: list[str], load: Load, seed: int, mapper: int, journal: str,
                 log: str, first_chunk: int = 0, tls_dir: str | None = None,
                 timeout: float = 30.0, prefix: list[str] | None = None) -> None:
        """`prefix`: what the command runs under, e.g. `ip netns exec NS` to run the
        mapper on a host of its own (chaos.netns); its pid is then still the
        mapper's, as `ip netns exec` execs the command."""
        import dataclasses
        import subprocess
        from floering.floe.cluster import node_env
        self.mapper, self.journal, self.log = mapper, journal, log
        self.first_chunk = first_chunk
        cmd = [*(prefix or []), sys.executable, "-m", "floering.chaos.mapper_proc",
               "--seeds", ",".join(seeds),
               "--load", json.dumps(dataclasses.asdict(load)), "--seed", str(seed),
               "--mapper", str(mapper), "--journal", journal,
               "--first-chunk", str(first_chunk), "--timeout", str(timeout)]
        if tls_dir is not None:
            cmd += ["--tls-dir", str(tls_dir)]
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env=node_env())
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)   # Popen knows the PID is still its child

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (finish the chunk in hand), wait; SIGKILL if it does not exit."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except Exception:
            self.signal(signal.SIGKILL)
            return self.popen.wait(10)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def journal_state(self) -> JournalState:
        return read_journal(self.journal)
