"""Failure detection: an adaptive heartbeat timeout per monitored node, probes, and a
confirmed suspicion before a node whose probes only time out is declared dead.

A replica expects heartbeats (or checkpoint shipments) from each primary it backs up.
Silence longer than the node's usual gaps plus a safety margin makes it a suspect
(an accrual detector in the spirit of phi-accrual: the timeout follows the observed
mean and spread of the gaps, within [min_timeout, max_timeout]). A suspect is probed
directly and through every other member (SWIM's indirect probes, asked of all). What
a round proves depends on how it ended:

- refused (nothing listens any more: a killed process) is conclusive, the node is
  declared dead at once, so a crash is still detected in a few hundred milliseconds;
- confirmed (no answer from the suspect, and members that answered us that they cannot
  reach it either, together with us more than half of the ring's members): the node
  may be paused, starved or cut off. It stays suspected, is probed again with a
  doubled deadline, and is declared dead only when confirmed rounds have gone on for
  `suspicion` seconds without any sign of life. Any message from it meanwhile
  (heartbeat, checkpoint, probe answer) clears the suspicion.
  When declaring the node would lose ranges (we would take over a range of it of
  which we hold no complete copy yet: it took the range over, or was handed it, and
  has not filled its replicas), confirmed rounds must go on for `lossy_suspicion`
  instead: a starved node is only slow, and removing it would drop the one complete
  copy with its state. Only a refused probe (or a restart) declares it sooner.
- unconfirmed (no quorum stands behind the suspicion: too few members answered us):
  we may be the ones cut off, alone or with a few others. The node stays suspected
  however long that lasts, and the suspicion period starts again from the next
  confirmed round: evidence gathered while cut off proves nothing about the suspect.
  A node cut off from every peer, or a minority cut off together, therefore declares
  nobody, and learns it was removed when the link comes back, instead of removing
  live peers from its own view. Once a round has a quorum again, the node first
  exchanges ring views with the others, and no round counts until a peer's view has
  reached it (`Isolation`, driven by the node machine).

Local health (from SWIM's Lifeguard): a node whose own event loop wakes up late is a
poor judge of others' silence, since their messages may be waiting unread. The monitor
reports how late each of its ticks ran; the worst lag of the last few seconds, beyond
ordinary scheduling noise, is added to every silence timeout and stretches probe
deadlines and the suspicion period.

Pure: every method takes `now`. The runtime (node/runtime/node.py) and the
deterministic simulation (tests/support/simulation.py) both drive this one class.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
import math
from typing import Sequence

ALIVE, REFUSED, TIMED_OUT = "alive", "refused", "timed out"      # what a probe found
UNCONFIRMED = "unconfirmed"     # timed out, and too few members stand behind it: no quorum
UNASKED = "unasked"             # an indirect probe the member asked did not answer
DEAD, SUSPECT, STALE = "dead", "suspect", "stale"                 # verdicts besides ALIVE
HELD = "held"       # still suspected: declared by now, were it not for the ranges it would lose


@dataclass(frozen=True)
class DetectorConfig:
    min_timeout: float = 0.2     # never suspect sooner than this (seconds)
    max_timeout: float = 1.0     # always suspect after this
    spread: float = 6.0          # timeout = mean gap + spread * stdev of gaps
    window: int = 50             # gaps remembered per node
    probe_timeout: float = 0.15  # deadline of the first probe of a suspicion
    suspicion: float = 1.0       # probes that only time out: declared dead after this long
    # ... or after this long when declaring the node would lose ranges (their only
    # complete copy is its own): a starved node must not take them with it
    lossy_suspicion: float = 30.0
    lag_window: float = 5.0      # own loop lag is remembered this long (seconds)
    lag_floor: float = 0.05      # lag up to this is ordinary scheduling noise, ignored
    max_stretch: float = 8.0     # own lag stretches deadlines at most this many times


@dataclass(frozen=True, eq=False)
class Probe:
    """One round of probing a suspect: direct and indirect, each with `deadline`."""
    node: str
    deadline: float
    started: float
    round: int
    suspected_since: float


def combine(direct: str, indirect: Sequence[str], members: int) -> str:
    """One outcome from the direct probe and the third nodes' answers (one per member
    asked: ALIVE, it reached the suspect; TIMED_OUT, it answered that it cannot;
    UNASKED, it did not answer us, or refused the call). An answer on any path means
    alive; only our own refused connection is conclusive evidence of death (a third
    node reports a bare yes/no, so its "no" never makes a timeout conclusive). A
    timeout is confirmed only by a quorum: we and the members that answered "no"
    must be more than half of the ring's `members` (the suspect included). Fewer, and
    we may be on the small side of a partition: UNCONFIRMED."""
    if direct == ALIVE or ALIVE in indirect:
        return ALIVE
    if direct == REFUSED:
        return REFUSED
    behind = 1 + sum(1 for outcome in indirect if outcome == TIMED_OUT)
    return TIMED_OUT if 2 * behind > members else UNCONFIRMED


def indirect_vias(ring, prober: str, suspect: str) -> tuple[str, ...]:
    """The members asked to probe `suspect`: every other one, in the order met walking
    clockwise from the suspect's first token, then those without tokens (ring order)."""
    order: list[str] = []
    tokens = ring.tokens_of(suspect)
    if tokens:
        start = ring.token_index(tokens[0])
        n = len(ring.tokens)
        order = [ring.owners[(start + step) % n] for step in range(1, n + 1)]
    vias: list[str] = []
    for node in [*order, *ring.nodes]:
        if node not in (prober, suspect) and node not in vias:
            vias.append(node)
    return tuple(vias)


@dataclass
class _Watch:
    last: float
    gaps: deque = field(default_factory=lambda: deque(maxlen=50))
    suspected_since: float | None = None
    # Start of the confirmed rounds of this suspicion (None: the last round had no
    # quorum behind it): the suspicion period counts from here.
    evidence_since: float | None = None
    probe: Probe | None = None          # the round in flight, if any
    next_deadline: float = 0.0          # of the next round, once a round timed out
    rounds: int = 0                     # rounds of the current suspicion so far
    held: bool = False                  # this suspicion was held back once (lossy)


class FailureDetector:
    def __init__(self, config: DetectorConfig = DetectorConfig()) -> None:
        self.config = config
        self._watches: dict[str, _Watch] = {}
        self._lags: deque[tuple[float, float]] = deque()   # (when, how late) of own ticks

    # ------------------------------------------------------------ membership

    def watch(self, nodes, now: float, grace: float = 0.0) -> None:
        """Monitor exactly `nodes` (the primaries we back up); new ones start fresh.
        A new node's silence counts only from `now + grace`: a cluster starting up must
        not declare dead a peer whose process has not finished starting. The grace
        ends at the first heartbeat heard."""
        nodes = set(nodes)
        for node in list(self._watches):
            if node not in nodes:
                del self._watches[node]
        for node in sorted(nodes):   # a stable order keeps simulations reproducible
            if node not in self._watches:
                self._watches[node] = _Watch(now + grace, deque(maxlen=self.config.window))

    @property
    def watched(self) -> set[str]:
        return set(self._watches)

    @property
    def suspected(self) -> set[str]:
        return {n for n, w in self._watches.items() if w.suspected_since is not None}

    # ---------------------------------------------------------- signs of life

    def heard(self, node: str, now: float) -> None:
        """Any message from `node`: it is alive, whatever was suspected."""
        w = self._watches.get(node)
        if w is None:
            return
        if now > w.last:
            w.gaps.append(now - w.last)
        w.last = now
        w.suspected_since = w.evidence_since = None
        w.probe = None                  # a round still in flight no longer counts
        w.held = False

    # ----------------------------------------------------------- local health

    def tick(self, scheduled: float, now: float) -> None:
        """Our monitor meant to wake at `scheduled` and woke at `now`."""
        self._lags.append((now, max(0.0, now - scheduled)))
        while self._lags and self._lags[0][0] < now - self.config.lag_window:
            self._lags.popleft()

    def last_late(self) -> float:
        """How late our monitor woke the last time it did."""
        return self._lags[-1][1] if self._lags else 0.0

    def lag(self, now: float) -> float:
        """How late our own loop ran beyond ordinary noise: the worst lateness of the
        last `lag_window` seconds, less `lag_floor`."""
        horizon = now - self.config.lag_window
        worst = max((late for when, late in self._lags if when >= horizon), default=0.0)
        return max(0.0, worst - self.config.lag_floor)

    def stretch(self, now: float) -> float:
        """How many times longer than configured our deadlines are while we lag."""
        c = self.config
        return min(c.max_stretch, 1.0 + self.lag(now) / c.probe_timeout)

    # -------------------------------------------------------------- suspicion

    def timeout(self, node: str, now: float | None = None) -> float:
        """Silence after which `node` is suspected (plus our own recent lag)."""
        c = self.config
        gaps = self._watches[node].gaps
        if len(gaps) < 3:
            base = c.min_timeout
        else:
            mean, deviation = _mean_and_deviation(gaps)
            base = min(c.max_timeout, max(c.min_timeout, mean + c.spread * deviation))
        return base + (self.lag(now) if now is not None else 0.0)

    def due_probes(self, now: float) -> list[Probe]:
        """Probe rounds to start now: nodes silent past their timeout become suspects;
        suspects whose last round timed out get their next, longer round."""
        due = []
        for node, w in self._watches.items():
            if w.probe is not None:
                continue
            if w.suspected_since is None:
                if now - w.last <= self.timeout(node, now):
                    continue
                w.suspected_since, w.evidence_since, w.rounds, w.held = now, None, 0, False
                w.next_deadline = self.config.probe_timeout * self.stretch(now)
            w.probe = Probe(node, w.next_deadline, now, w.rounds, w.suspected_since)
            w.rounds += 1
            due.append(w.probe)
        return due

    def probe_result(self, probe: Probe, outcome: str, now: float, lossy: bool = False) -> str:
        """Record how a round ended. Returns ALIVE, DEAD (the caller removes the node;
        it is no longer watched), SUSPECT (probed again by a later `due_probes`), HELD
        (as SUSPECT; said once per suspicion, when only `lossy` kept it from DEAD) or
        STALE (the round no longer counts: the node spoke or stopped being watched).
        `lossy`: declaring the node now would lose ranges (the caller holds no complete
        copy of some range it would take over), so timeouts need `lossy_suspicion`."""
        if outcome not in (ALIVE, REFUSED, TIMED_OUT, UNCONFIRMED):
            raise ValueError(f"unknown probe outcome {outcome!r}")
        w = self._watches.get(probe.node)
        if w is None or w.probe is not probe:
            return STALE
        w.probe = None
        if outcome == ALIVE:
            self.heard(probe.node, now)
            return ALIVE
        first = self.config.probe_timeout * self.stretch(now)
        if outcome == REFUSED:
            del self._watches[probe.node]
            return DEAD
        if outcome == UNCONFIRMED:
            # No quorum behind this round: whatever we saw so far may be our own
            # isolation. The period starts again with the next confirmed round.
            w.evidence_since = None
            w.next_deadline = first
            return SUSPECT
        if w.evidence_since is None:
            w.evidence_since = probe.started
        usual = self.suspicion_period(now)
        period = self.suspicion_period(now, lossy)
        if now - w.evidence_since >= period:
            del self._watches[probe.node]
            return DEAD
        # Double the deadline, but end the next round near the end of the suspicion
        # (and, while a lossy declaration waits, keep each round within the usual one).
        remaining = w.evidence_since + period - now
        w.next_deadline = max(first, min(2 * probe.deadline, remaining, usual))
        if now - w.evidence_since >= usual and not w.held:
            w.held = True
            return HELD
        return SUSPECT

    def abandon(self, probe: Probe) -> None:
        """A round that ended without an outcome (the prober was stopped or fenced):
        the suspicion stays, the next `due_probes` starts another round."""
        w = self._watches.get(probe.node)
        if w is not None and w.probe is probe:
            w.probe = None

    def suspicion_period(self, now: float, lossy: bool = False) -> float:
        c = self.config
        return (max(c.suspicion, c.lossy_suspicion) if lossy else c.suspicion) * self.stretch(now)


class Isolation:
    """Whether we may have been cut off, and since when we may trust our suspicions.

    A probe round with no quorum behind it means we may be the ones cut off (alone, or
    with a few others), and the rest of the ring may have removed us meanwhile. Once a
    round reaches a quorum again, we exchange ring views with everyone before any
    suspicion counts: the view we get back fences us if we were removed, instead of
    our declaring a live peer on suspicions formed while cut off (and the others
    adopting that view). Until a peer's view has reached us, rounds count as
    unconfirmed, so the suspicion period starts only after the exchange."""

    NOTE = ("a probe round found no quorum of the ring behind a suspicion: we may be cut "
            "off; declaring nobody until a quorum answers and a peer's view reaches us")

    def __init__(self) -> None:
        self.state = ""            # "", CUT_OFF, or RECONNECTED (waiting for a view)

    def judge(self, outcome: str) -> tuple[str, str]:
        """What a round's outcome counts as, and what to do now: CUT_OFF (we just
        became unsure of ourselves: say so), EXCHANGE (exchange ring views with
        everyone) or nothing."""
        if outcome == UNCONFIRMED:
            newly, self.state = not self.state, CUT_OFF
            return outcome, CUT_OFF if newly else ""
        if outcome == TIMED_OUT and self.state:
            self.state = RECONNECTED
            return UNCONFIRMED, EXCHANGE
        return outcome, ""

    def view_seen(self) -> bool:
        """A peer's ring view reached us (and was merged). True if that ends the wait."""
        if self.state != RECONNECTED:
            return False
        self.state = ""
        return True


CUT_OFF, RECONNECTED, EXCHANGE = "cut off", "reconnected", "exchange"


def suspicion_note(probe: Probe, verdict: str, losing, detector: "FailureDetector",
                   now: float) -> tuple | None:
    """What a round that declared nobody tells the log, as (kind, text, level, fields):
    a suspicion begins, or (once) a declaration is held back (`losing`: the ranges it
    would lose) until the lossy suspicion has passed; else None."""
    node, wait = probe.node, detector.suspicion_period(now, lossy=True)
    if verdict == SUSPECT and probe.round == 0:
        ms = round(1000 * probe.deadline)
        return ("suspected", f"suspecting {node}: no answer within {ms} ms, probing again",
                logging.INFO, dict(about=[node], deadline_ms=ms))
    if verdict == HELD:
        return ("declaration_held", f"not declaring {node} dead yet: we hold no complete copy "
                f"of {len(losing)} of its ranges, which would be lost with it; it may be only "
                f"starved, so timeouts alone declare it after {wait:.0f} s",
                logging.WARNING, dict(about=[node], tokens=list(losing)))
    return None


def declaration(outcome: str, failure: str, indirect, members: int, probe: Probe,
                now: float) -> str:
    """Why a round declares its suspect dead, for the log and the `detected` event."""
    if outcome == REFUSED:
        return f"it refused our probe{failure}" + (
            f" and none of the {len(indirect)} other members reached it" if indirect else "")
    behind = sum(1 for x in indirect if x == TIMED_OUT)
    return (f"neither we nor {behind} of the {members - 2} other members could reach it "
            f"in {1000 * (now - probe.suspected_since):.0f} ms of suspicion "
            f"({probe.round + 1} probe rounds)")


def _mean_and_deviation(gaps) -> tuple[float, float]:
    """Mean and population standard deviation in floats: statistics.pstdev is exact
    (fractions) and costs a node several percent of its CPU, asked every tick."""
    n = len(gaps)
    mean = math.fsum(gaps) / n
    return mean, math.sqrt(math.fsum((g - mean) ** 2 for g in gaps) / n)
