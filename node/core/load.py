"""Load measurement and the shedding decision (paper §VI), pure: the caller feeds
samples with explicit times and carries out what `decide` returns.

A node is *overloaded* when both its inbound queue and its CPU use are above high
thresholds for a whole sampling window, and *relieved* only when both are under low
ones. CPU use is measured as the applier's busy fraction (time spent applying batches
over wall time): on a machine shared with other processes a saturated node may get
only part of a core, and its process CPU time would then never look high (hysteresis: between the two it keeps its verdict). After shedding it waits a
cool-down before it may shed again, so a move has time to show its effect and ranges
do not bounce between neighbours.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from floering.wire.ring import Ring


@dataclass(frozen=True)
class LoadConfig:
    high_queue: float = 8.0        # batches waiting, averaged over the window
    high_cpu: float = 0.80         # applier busy fraction
    low_queue: float = 2.0
    low_cpu: float = 0.50
    window: float = 0.3            # seconds a verdict averages over
    cooldown: float = 2.0          # seconds after a move before the next one
    rate_window: float = 2.0       # seconds per-token rates average over


class LoadMonitor:
    def __init__(self, config: LoadConfig = LoadConfig()) -> None:
        self.config = config
        self.samples: deque[tuple[float, float, float, float]] = deque()  # now, queue, busy s, cpu s
        self.applied: deque[tuple[float, dict[int, int]]] = deque()  # (now, applied per token)
        self.overloaded = False
        self.overloaded_since: float | None = None
        self.last_move = float("-inf")

    def sample(self, now: float, queue: float, busy_seconds: float,
               applied_by_token: dict[int, int], cpu_seconds: float = 0.0) -> None:
        """One observation: queue length, the applier's busy time so far, the cumulative
        tuples applied per token, and the process's CPU time (reported only)."""
        self.samples.append((now, queue, busy_seconds, cpu_seconds))
        self.applied.append((now, dict(applied_by_token)))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.config.window:
            self.samples.popleft()
        while len(self.applied) > 2 and now - self.applied[1][0] >= self.config.rate_window:
            self.applied.popleft()
        queue_avg, cpu = self.queue(), self.busy()
        was = self.overloaded
        if queue_avg > self.config.high_queue and cpu > self.config.high_cpu:
            self.overloaded = True
        elif queue_avg < self.config.low_queue and cpu < self.config.low_cpu:
            self.overloaded = False
        if self.overloaded and not was:
            self.overloaded_since = now
        elif not self.overloaded:
            self.overloaded_since = None

    def queue(self) -> float:
        return sum(s[1] for s in self.samples) / len(self.samples) if self.samples else 0.0

    def _fraction(self, i: int) -> float:
        if len(self.samples) < 2:
            return 0.0
        first, last = self.samples[0], self.samples[-1]
        return (last[i] - first[i]) / (last[0] - first[0]) if last[0] > first[0] else 0.0

    def busy(self) -> float:
        """Fraction of the window the applier spent applying."""
        return self._fraction(2)

    def cpu(self) -> float:
        """Fraction of one core the process used over the window."""
        return self._fraction(3)

    def token_rates(self) -> dict[int, float]:
        """Tuples applied per second per token over the rate window."""
        if len(self.applied) < 2:
            return {}
        (t0, a0), (t1, a1) = self.applied[0], self.applied[-1]
        if t1 <= t0:
            return {}
        return {t: (n - a0.get(t, 0)) / (t1 - t0) for t, n in a1.items()}

    def rate(self) -> float:
        return sum(self.token_rates().values())

    def transition(self) -> tuple[str, str, dict]:
        """(kind, text, fields) of the record of becoming overloaded or relieved."""
        kind = "overloaded" if self.overloaded else "relieved"
        return kind, (f"load: {kind} at {{t}} (queue {self.queue():.1f} batches, busy "
                      f"{100 * self.busy():.0f}%, cpu {100 * self.cpu():.0f}%, "
                      f"{self.rate():.0f} tuples/s)"), dict(
            queue=round(self.queue(), 2), busy=round(self.busy(), 3),
            cpu=round(self.cpu(), 3), rate=round(self.rate(), 1))

    def may_move(self, now: float) -> bool:
        return now - self.last_move >= self.config.cooldown

    def moved(self, now: float) -> None:
        self.last_move = now


MOVE_MARGIN = 0.05


def clockwise_nodes(ring: Ring, token: int, reach: int) -> list[str]:
    """The first `reach` distinct nodes after the token's owner walking clockwise: its
    heir (first replica, which holds the range) first, then the heir's neighbour..."""
    owner = ring.owner_of_token(token)
    n = len(ring.tokens)
    start = ring.token_index(token)
    found: list[str] = []
    for step in range(1, n):
        node = ring.owners[(start + step) % n]
        if node != owner and node not in found:
            found.append(node)
            if len(found) == reach:
                break
    return found


def choose_shed(ring: Ring, me: str, rates: dict[int, float], heir_rates: dict[str, float],
                busy: set[str], reach: int = 2) -> dict[int, str]:
    """Which of my ranges go to which node: hottest range first, each to the least
    loaded of the first `reach` nodes clockwise after it that is not busy (its heir,
    which already holds the range, wins ties; a node further on receives the state in
    the background first), as long as the move lowers the larger of the two loads.
    The cascade along the ring is thus planned in one step: a range the neighbour
    cannot absorb goes past it. The split point comes from measured per-range load,
    not from halving the share. `heir_rates` holds the measured rate of every node
    that may receive. Returns {} when no move helps."""
    mine = list(ring.tokens_of(me))
    if len(mine) < 2:
        return {}
    left = sum(rates.get(t, 0.0) for t in mine)
    moves: dict[int, str] = {}
    load = dict(heir_rates)
    # hottest first: the fewest ranges moved for the most relief
    for token in sorted(mine, key=lambda t: -rates.get(t, 0.0)):
        r = rates.get(token, 0.0)
        if r <= 0 or len(mine) - len(moves) <= 1:
            continue
        candidates = [n for n in clockwise_nodes(ring, token, reach)
                      if n not in busy and n in load]
        if not candidates:
            continue
        heir = ring.heir(token)
        target = min(candidates, key=lambda n: (load[n] + r, n != heir))
        # worth it only if the receiver ends clearly below where I was: the pair gets
        # more even (the larger load falls), by a margin that measurement noise cannot
        # turn into ranges bouncing back and forth
        if load[target] + r < left * (1 - MOVE_MARGIN):
            moves[token] = target
            left -= r
            load[target] += r
    return moves


def halving_shed(ring: Ring, me: str) -> dict[int, str]:
    """The paper's simplification for comparison: hand half of my share (widest-first
    ranges up to half the space I own) to the ranges' first replicas."""
    mine = sorted(ring.tokens_of(me), key=lambda t: -Ring.range_size(ring.range_of_token(t)))
    half = sum(Ring.range_size(ring.range_of_token(t)) for t in mine) / 2
    moves, moved = {}, 0
    for token in mine:
        if moved >= half:
            break
        heir = ring.heir(token)
        if heir is not None:
            moves[token] = heir
            moved += Ring.range_size(ring.range_of_token(token))
    return moves


def autoscale(ring: Ring, stats: dict[str, dict], *, min_nodes: int, max_nodes: int) -> tuple[str, str | None]:
    """The operator's rule (paper §VI): add a node when every node is overloaded and the
    limit allows it; remove one when it and its clockwise neighbour are both lightly
    loaded (relieved and their applier mostly idle). Returns ("add", None),
    ("remove", node) or ("hold", None). `stats` maps node -> its NodeStats fields."""
    nodes = [n for n in ring.nodes if n in stats]
    if not nodes or len(nodes) < len(ring.nodes):
        return "hold", None                     # someone is unreachable: not now
    if all(stats[n]["overloaded"] for n in nodes):
        return ("add", None) if len(nodes) < max_nodes else ("hold", None)
    if len(nodes) > min_nodes:
        def light(n):
            return not stats[n]["overloaded"] and stats[n]["busy"] < 0.2
        for node in sorted(nodes, key=lambda n: stats[n]["apply_rate"]):
            tokens = ring.tokens_of(node)
            heir = ring.heir(tokens[0]) if tokens else None
            if light(node) and (heir is None or light(heir)):
                return "remove", node
    return "hold", None
