"""Per-failure timings, from the moment a fault is injected to the moment its ranges
are safe again, read from the nodes' structured events (node.runtime.events).

For each victim of a node fault:

- injected:      the harness sent the signal (its own clock; same machine as the nodes);
- detected:      the first node that declared it dead (`detected`);
- taken over:    the last heir that rebuilt its ranges from its replica copy
                 (`taken_over`);
- applying:      the last of its ranges to apply new tuples again at the heir
                 (`applying_again`); this is what we call recovery: the range is
                 serving the load again;
- re-replicated: the last heir that had every range on r+1 nodes again
                 (`re_replicated`, first one after its takeover);
- fenced:        a paused victim learnt it was declared dead and rejoined empty.

Pure but for `read_events`: parsing takes event text, matching takes events and faults.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

STAGES = ("detected", "taken_over", "applying", "re_replicated")


@dataclass(frozen=True)
class Event:
    kind: str                     # detected | taken_over | applying | re_replicated | fenced
    t: float                      # wall-clock seconds (time.time())
    node: str                     # the node (as started) whose events these are
    about: tuple[str, ...] = ()   # the dead node(s) it concerns
    tokens: tuple[int, ...] = ()  # the ranges it concerns


def event_lines(text: str) -> list[dict]:
    """A node's structured events (JSON lines written by node.runtime.events), oldest
    first; a torn last line, from a kill mid-write, is skipped."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def parse_events(node: str, text: str) -> list[Event]:
    """The timeline's events among a node's structured events."""
    events = []
    for e in event_lines(text):
        kind, t = e.get("kind"), float(e.get("t", 0.0))
        if kind == "detected":
            events.append(Event("detected", t, node, tuple(e["about"])))
        elif kind == "taken_over":
            events.append(Event("taken_over", t, node, tuple(e["previous"]),
                                tuple(int(x) for x in e["tokens"])))
        elif kind == "applying_again":
            events.append(Event("applying", t, node, (e["previous"],), (int(e["token"]),)))
        elif kind == "re_replicated":
            events.append(Event("re_replicated", t, node))
        elif kind == "fenced":
            events.append(Event("fenced", t, node, (e["node"],)))
    return events


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def read_events(node: str, path: str) -> list[Event]:
    return parse_events(node, _read(path))


def node_events(path: str) -> list[dict]:
    """Every structured event of a node's events file, oldest first."""
    return event_lines(_read(path))



def applying_again_times(nodes, dead: str) -> list[float]:
    """Wall-clock times at which a range `dead` owned applied its first tuple at its
    heir (the `applying_again` events of `nodes`, a cluster's NodeProcesses). Not the
    ring's takeovers: a handoff logs one too, and the ring may hand the heir's new
    ranges on soon after."""
    return [e.t for node in nodes for e in read_events(node.node_id, node.events)
            if e.kind == "applying" and dead in e.about]


def takeover_times(nodes, dead: str) -> list[float]:
    """Wall-clock times at which each range `dead` owned was first taken over by its
    heir (the first `taken_over` event naming `dead` for that range: later handoffs of
    the heir's new ranges name the heir, not `dead`)."""
    first: dict[int, float] = {}
    for node in nodes:
        for e in read_events(node.node_id, node.events):
            if e.kind == "taken_over" and dead in e.about:
                for token in e.tokens:
                    first[token] = min(first.get(token, e.t), e.t)
    return list(first.values())

@dataclass(frozen=True)
class Injected:
    """A fault as the harness carried it out."""

    kind: str                     # kill | pause | kill-mapper | kill-mid-handoff | restart
    #                               | rolling-restart | hostile | partition | lossy-link
    victims: tuple[str, ...]
    at: float                     # wall clock when the signal was sent
    resumed: float | None = None  # pause: when SIGCONT was sent; network faults: healed
    detail: dict = field(default_factory=dict)
    # The ranges each victim owned when it was hit: a range can pass through a dead
    # node on its way to a live heir (two neighbours killed with r=2), so takeovers
    # are matched by range, not by the previous owner a node logs.
    tokens: dict = field(default_factory=dict)


@dataclass
class FailureTimeline:
    victim: str
    kind: str
    simultaneous: int             # victims of the same fault
    injected: float
    detected: float | None = None
    taken_over: float | None = None
    applying: float | None = None
    re_replicated: float | None = None
    fenced: float | None = None
    heirs: tuple[str, ...] = ()
    ranges_applying: int = 0      # taken-over ranges seen applying new tuples again

    def ms(self, stage: str) -> float | None:
        value = getattr(self, stage)
        return None if value is None else round((value - self.injected) * 1e3, 1)

    @property
    def complete(self) -> bool:
        return all(getattr(self, s) is not None for s in STAGES)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update({f"{s}_ms": self.ms(s) for s in (*STAGES, "fenced")})
        return data


def failure_timelines(faults: list[Injected], events: list[Event]) -> list[FailureTimeline]:
    """One timeline per victim of every node fault (mapper kills have none, nor has a
    node killed mid-handoff that owned no range yet, such as a joining node)."""
    out = []
    for fault in faults:
        if fault.kind not in ("kill", "pause", "kill-mid-handoff", "restart", "partition"):
            continue
        for victim in fault.victims:
            # (a node cut off from its replicas only is not declared: no timeline)
            if fault.kind in ("kill-mid-handoff", "partition") and not fault.tokens.get(victim):
                continue
            out.append(_timeline(fault, victim, events))
    return out


def _timeline(fault: Injected, victim: str, events: list[Event]) -> FailureTimeline:
    since = fault.at - 0.001
    events = sorted((e for e in events if e.t >= since), key=lambda e: e.t)
    tl = FailureTimeline(victim, fault.kind, len(fault.victims), fault.at)
    tl.detected = min((e.t for e in events if e.kind == "detected" and victim in e.about),
                      default=None)
    tl.fenced = min((e.t for e in events if e.kind == "fenced" and e.node == victim),
                    default=None)
    tokens = set(fault.tokens.get(victim, ()))
    if tokens:
        takes = _first_per_token(events, "taken_over", tokens)
        applying = list(_first_per_token(events, "applying", tokens).values())
        complete = len(takes) == len(tokens)
    else:   # no range map: trust the previous owner the heir logged
        takes = {i: e for i, e in enumerate(
            e for e in events if e.kind == "taken_over" and victim in e.about)}
        applying = list({e.tokens: e for e in events
                         if e.kind == "applying" and victim in e.about}.values())
        complete = bool(takes)
    if complete:
        tl.taken_over = max(e.t for e in takes.values())
    tl.applying = max((e.t for e in applying), default=None)
    tl.ranges_applying = len(applying)
    tl.heirs = tuple(sorted({e.node for e in takes.values()}))
    done = []
    for take in set(takes.values()):
        later = [e.t for e in events if e.kind == "re_replicated" and e.node == take.node
                 and e.t >= take.t]
        done.append(min(later, default=None))
    finished = [t for t in done if t is not None]
    if complete and len(finished) == len(done):
        tl.re_replicated = max(finished)
    return tl


def _first_per_token(events: list[Event], kind: str, tokens: set[int]) -> dict[int, Event]:
    first: dict[int, Event] = {}
    for e in events:
        if e.kind == kind:
            for t in tokens.intersection(e.tokens):
                first.setdefault(t, e)
    return first


# ---------------------------------------------------------------- summaries

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of the values, None if there are none."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, -(-len(data) * q // 100))     # ceil(n*q/100), at least 1
    return data[int(rank) - 1]


def stage_summary(timelines: list[FailureTimeline], stage: str) -> dict:
    values = [v for v in (t.ms(stage) for t in timelines) if v is not None]
    return {"n": len(values), "missing": len(timelines) - len(values),
            "p50": percentile(values, 50), "max": max(values, default=None),
            "mean": round(statistics.fmean(values), 1) if values else None}


def by_simultaneous(timelines: list[FailureTimeline], stage: str = "applying") -> dict:
    """{k: summary} over failures that happened k at once (the paper's Fig. 8b)."""
    groups: dict[int, list[FailureTimeline]] = {}
    for t in timelines:
        groups.setdefault(t.simultaneous, []).append(t)
    return {k: stage_summary(v, stage) for k, v in sorted(groups.items())}
