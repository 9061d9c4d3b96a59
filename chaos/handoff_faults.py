"""SIGKILL the giver or the receiver of a live handoff while it is in flight.

The harness starts the handoff the way an operator does (the Handoff RPC behind
`floe move` / `floe scale`), waits until the giver logs "handing N ranges to X"
(written once the prepare ring is adopted: the extras are pinned and the final
checkpoint is on its way) and kills at once (or after a seeded `lag`), before the
giver logs "handed off" or "handoff aborted". A handoff takes at least one checkpoint
round trip (25-40 ms in the CI scenarios, 150-300 ms with bigger ranges), the log is
polled every half millisecond, and whether the kill really landed inside the window
is checked afterwards against the giver's log, never assumed: `in_flight` in the
fault's detail says so, and the harness fails the round when it is false.

What happened to the handoff is read back from the logs (`handoff_outcome`, pure):
committed, aborted (with the giver's reason), or the giver died and its heirs took
the ranges over.
"""

from __future__ import annotations

import signal
import threading
import time
from functools import partial
from pathlib import Path

from floering.floe.cluster import LocalCluster
from floering.chaos.faults import signal_nodes
from floering.chaos.scenarios import PlannedFault
from floering.chaos.timeline import Event, Injected, event_lines


def givers_of(p: PlannedFault) -> dict[str, tuple[str, list[int]]]:
    """{giver: (receiver, tokens)} of a planned handoff (one receiver per giver)."""
    out: dict[str, tuple[str, list[int]]] = {}
    for giver, token, receiver in p.moves:
        out.setdefault(giver, (receiver, []))[1].append(token)
    return out


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def handoff_state(text: str, receiver: str) -> str:
    """Where the giver's events (since the handoff was requested) say its handoff to
    `receiver` is: 'requested', 'in flight', 'committed' or 'aborted'. A leave hands
    its ranges to several members in one handoff; `receiver` is then one of them."""
    return _scan(text, receiver)[0]


def _scan(text: str, receiver: str) -> tuple[str, dict]:
    """(state, the event that finished the handoff or {})."""
    state = "requested"
    for e in event_lines(text):   # a line still being written is skipped
        kind = e.get("kind")
        if kind == "handoff_prepared" and state == "requested" \
                and receiver in (e.get("to") or ()):
            state = "in flight"
        elif state == "in flight" and kind == "handoff_committed":
            return "committed", e
        elif state == "in flight" and kind == "handoff_aborted":
            return "aborted", e
    return state, {}


class _Call(threading.Thread):
    """One operator request (a Handoff RPC) on its own thread."""

    def __init__(self, run_request, label: str) -> None:
        super().__init__(daemon=True, name=f"handoff-{label}")
        self.run_request, self.label = run_request, label
        self.reply: dict = {}

    def run(self) -> None:
        started = time.time()
        try:
            r = self.run_request()
            self.reply = {"accepted": bool(r.accepted), "detail": r.detail,
                          "ring_version": int(r.ring_version)}
        except Exception as exc:       # the giver died under the call, or refused it
            self.reply = {"error": f"{type(exc).__name__}: {exc}"}
        self.reply["seconds"] = round(time.time() - started, 3)


def kill_mid_handoff(cluster: LocalCluster, p: PlannedFault, timeout: float = 30.0) -> Injected:
    """Start the planned handoff, SIGKILL the victim once the watched giver's handoff
    is in flight, wait for the operator calls to return; the detail records it all."""
    from floering.mapper.admin import request_handoff
    givers = givers_of(p)
    offsets = {g: _size(cluster.node(g).events) for g in givers}
    detail: dict = {"handoff": p.handoff, "side": "giver" if p.victims[0] == p.watch
                    else "receiver", "watch": p.watch,
                    "moves": {g: {"to": r, "tokens": t} for g, (r, t) in givers.items()},
                    "offsets": offsets}
    if p.handoff == "scale-out":
        t = time.time()
        (added,) = cluster.add_nodes(1)
        if added.node_id != p.newcomer:
            raise RuntimeError(f"the new node is {added.node_id}, the plan expected {p.newcomer}")
        _wait_member(cluster, givers, p.newcomer)
        detail["joined_s"] = round(time.time() - t, 3)
    calls = []
    operator = cluster.tls("operator")
    for giver, (receiver, tokens) in givers.items():
        address = cluster.node(giver).address
        if p.handoff == "scale-in":
            request = partial(request_handoff, address, [], leave=True, timeout=timeout,
                              tls=operator)
        else:
            request = partial(request_handoff, address, tokens, receiver, timeout=timeout,
                              tls=operator)
        calls.append(_Call(request, giver))
    watched_call = next(c for c in calls if c.label == p.watch)
    receiver = givers[p.watch][0]
    log = cluster.node(p.watch).events
    # The other donors' calls first: starting threads and channels contends for the
    # GIL, and the watched handoff's window (25-60 ms) is when this loop must run.
    for c in calls:
        if c is not watched_call:
            c.start()
    requested = time.time()
    watched_call.start()
    # Wait for the watched giver to say its handoff is under way.
    deadline = time.monotonic() + timeout
    state = "requested"
    gap, last = 0.0, time.monotonic()
    while time.monotonic() < deadline:
        state = handoff_state(read_from(log, offsets[p.watch]), receiver)
        now = time.monotonic()
        gap, last = max(gap, now - last), now
        if state != "requested" or not watched_call.is_alive():
            break
        time.sleep(0.0005)
    seen = time.time()
    detail["max_poll_gap_ms"] = round(gap * 1e3, 1)   # how late the harness could look
    # A planned lag kills later in the handoff (after the final checkpoint left, say),
    # but never waits past its end: a handoff that finished first makes in_flight false.
    while state == "in flight" and time.time() < seen + p.lag:
        time.sleep(0.0005)
        state = handoff_state(read_from(log, offsets[p.watch]), receiver)
    at = signal_nodes(cluster, p.victims, signal.SIGKILL)
    # Had the handoff finished before the signal? The giver's events say; one written
    # after the kill by a surviving giver carries a time we can compare.
    after = read_from(log, offsets[p.watch])
    finished_before = _finished_before(after, receiver, at)
    detail.update({"state_when_killed": state, "requested_at": requested, "in_flight_seen": seen,
                   "lag_ms": round(p.lag * 1e3, 1), "killed_after_ms": round((at - seen) * 1e3, 2),
                   "in_flight": state == "in flight" and not finished_before})
    for c in calls:
        c.join(timeout + 10)
    detail["operator"] = {c.label: c.reply for c in calls}
    return Injected("kill-mid-handoff", tuple(p.victims), at, detail=detail,
                    tokens=dict(p.ranges))


def _finished_before(text: str, receiver: str, at: float) -> bool:
    state, event = _scan(text, receiver)
    return state in ("committed", "aborted") and event["t"] < at


def _wait_member(cluster: LocalCluster, givers, newcomer: str, timeout: float = 30.0) -> None:
    """Until every giver's ring has the new node (a handoff to a node the giver does not
    know yet is refused)."""
    from floering.mapper import RingClient
    deadline = time.monotonic() + timeout
    for giver in givers:
        with RingClient([cluster.node(giver).address], timeout=30,
                        tls=cluster.tls("client")) as client:
            while newcomer not in client.refresh_ring().nodes:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{giver} did not learn of {newcomer} in {timeout}s")
                time.sleep(0.02)


# ----------------------------------------------------------------- the outcome

def handoff_outcome(injected: Injected, logs: dict[str, str], events: list[Event]) -> dict:
    """Per giver, what became of its handoff, from its structured events (`logs`: the
    text of each node's events file) written since it was requested; and which nodes
    took over the moved ranges. Pure.

    committed: the giver recorded handoff_committed; aborted: handoff_aborted, with
    why; giver killed: it died first, and `taken_over` says which heirs rebuilt the
    moved ranges."""
    d = injected.detail
    victim = injected.victims[0]
    per_giver = {}
    for giver, move in d["moves"].items():
        text = logs.get(giver, "")[d["offsets"][giver]:]
        state, event = _scan(text, move["to"])
        row: dict = {"to": move["to"], "ranges": len(move["tokens"])}
        reply = d.get("operator", {}).get(giver, {})
        if state == "committed":
            row.update(outcome="committed", at_ms=round((event["t"] - injected.at) * 1e3, 1),
                       took_ms=round(event["ms"]))
        elif state == "aborted":
            row.update(outcome="aborted", reason=event["reason"])
        elif giver == victim:
            row["outcome"] = "giver killed"
        elif state == "requested" and reply and not reply.get("accepted"):
            # refused before it began (the receiver was already gone)
            row.update(outcome="refused", reason=reply.get("detail") or reply.get("error", ""))
        else:
            row["outcome"] = state         # never finished: a hang the harness reports
        moved = set(move["tokens"])
        takes: dict = {}
        for e in sorted(events, key=lambda e: e.t):
            if e.kind == "taken_over" and e.t >= injected.at - 0.001:
                for t in moved.intersection(e.tokens):
                    takes.setdefault(t, e.node)
        row["taken_over_by"] = sorted(set(takes.values()))
        row["ranges_taken_over"] = len(takes)
        per_giver[giver] = row
    outcomes = {r["outcome"] for r in per_giver.values()}
    watched = per_giver[d["watch"]]
    if watched["outcome"] == "giver killed":
        summary = ("taken over by the heir" if watched["ranges_taken_over"] == watched["ranges"]
                   else f"giver killed; only {watched['ranges_taken_over']} of "
                        f"{watched['ranges']} moving ranges taken over")
    else:
        summary = watched["outcome"]
    return {"summary": summary, "outcomes": sorted(outcomes), "givers": per_giver}


def handoff_errors(outcome: dict) -> list[str]:
    """What a correct recovery must not show: a handoff still running, a dead giver's
    moving ranges not taken over."""
    errors = []
    for giver, row in outcome["givers"].items():
        if row["outcome"] in ("requested", "in flight"):
            errors.append(f"{giver}'s handoff to {row['to']} never finished ({row['outcome']})")
        if row["outcome"] == "giver killed" and row["ranges_taken_over"] < row["ranges"]:
            errors.append(f"{giver} died handing off {row['ranges']} ranges; only "
                          f"{row['ranges_taken_over']} were taken over")
    return errors
