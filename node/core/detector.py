"""Failure detection: an adaptive heartbeat timeout per monitored node, then probes.

A replica expects heartbeats (or checkpoint shipments) from each primary it backs up.
Silence longer than the node's usual gaps plus a safety margin makes it a suspect
(an accrual detector in the spirit of phi-accrual: the timeout follows the observed
mean and spread of the gaps, within [min_timeout, max_timeout]). A suspect is probed
directly and through a third node; only when both probes fail is it declared dead.
Pure: every method takes `now`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import fmean, pstdev


@dataclass(frozen=True)
class DetectorConfig:
    min_timeout: float = 0.2     # never suspect sooner than this (seconds)
    max_timeout: float = 1.0     # always suspect after this
    spread: float = 6.0          # timeout = mean gap + spread * stdev of gaps
    window: int = 50             # gaps remembered per node
    probe_timeout: float = 0.15  # deadline of each probe


@dataclass
class _Watch:
    last: float
    gaps: deque = field(default_factory=lambda: deque(maxlen=50))
    probing: bool = False


class FailureDetector:
    def __init__(self, config: DetectorConfig = DetectorConfig()) -> None:
        self.config = config
        self._watches: dict[str, _Watch] = {}

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

    def heard(self, node: str, now: float) -> None:
        w = self._watches.get(node)
        if w is None:
            return
        if now > w.last:
            w.gaps.append(now - w.last)
        w.last = now
        w.probing = False

    def timeout(self, node: str) -> float:
        c = self.config
        gaps = self._watches[node].gaps
        if len(gaps) < 3:
            return c.min_timeout
        return min(c.max_timeout, max(c.min_timeout, fmean(gaps) + c.spread * pstdev(gaps)))

    def suspects(self, now: float) -> list[str]:
        """Nodes silent past their timeout and not already being probed; marks them."""
        found = []
        for node, w in self._watches.items():
            if not w.probing and now - w.last > self.timeout(node):
                w.probing = True
                found.append(node)
        return found

    def probe_failed(self, node: str) -> None:
        """Both probes failed: the caller declares the node dead. Stop watching it."""
        self._watches.pop(node, None)

    def probe_succeeded(self, node: str, now: float) -> None:
        self.heard(node, now)

    @property
    def watched(self) -> set[str]:
        return set(self._watches)
