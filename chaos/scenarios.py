"""Chaos scenarios as data: a cluster, a load and a fault schedule, fully determined by
a seed.

A scenario has one or more rounds; each round runs on a fresh cluster (after killing
six of twelve nodes there is nothing left to kill non-adjacently). `plan(scenario, seed)`
turns the fault specs into concrete victims and times, with no I/O: the same seed
always gives the same plan, so a failing run can be replayed exactly.

Adjacency is ring adjacency: `Ring.initial` deals tokens round-robin over the sorted
node ids, so each node's replicas are the next `r` live nodes in that order, and a
dead node's ranges pass to the next live one. A set of victims loses data only when
more than `r` of them are consecutive among the live nodes.
"""

from __future__ import annotations

import json
import random
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from floering.wire.ring import Ring

NODE_FAULTS = ("kill", "pause", "kill-mid-handoff", "restart", "rolling-restart", "hostile",
               "impostor")
# Faults of a durable cluster (chaos.durable_faults): every node is hit and comes back.
DURABLE_FAULTS = ("kill-all", "power-loss", "kill-during-replay", "disk-full")
# Network faults (chaos.netns): the round runs every node and mapper on a host of its
# own (a network namespace, root only) and makes the fault at the switch between them.
NET_FAULTS = ("partition", "lossy-link")
FAULT_KINDS = NODE_FAULTS + DURABLE_FAULTS + NET_FAULTS + ("kill-mapper",)
# What a partition cuts off, and where the mappers are: "one" cuts one node off from
# every other node while the mappers still reach both sides; "from-replicas" cuts one
# node off from its r replicas only (every other host reaches both); "minority" cuts
# `count` nodes off from the rest (never more than r neighbours), the mappers on the
# majority's side; "minority-mapper" the same with the mappers on the minority's
# side; "adjacent-minority" cuts `count` <= r consecutive nodes off, the mappers with
# the majority.
PARTITION_TARGETS = ("one", "from-replicas", "minority", "minority-mapper",
                     "adjacent-minority")
HANDOFF_SIDES = ("giver", "receiver")
HANDOFFS = ("move", "scale-out", "scale-in")
TARGETS = ("one", "consecutive", "beyond-r", "every-other", "non-adjacent", "random", "hottest",
           "hottest-piece", "mapper", "all", "from-replicas", "minority", "minority-mapper",
           "adjacent-minority") + HANDOFF_SIDES
KEY_DISTRIBUTIONS = ("zipf", "corpus", "burst")


@dataclass(frozen=True)
class Load:
    """What the mappers send: each mapper is a separate process at a fixed rate."""

    keys: str = "zipf"            # zipf | corpus | burst
    rate: float = 5000.0          # tuples per second, per mapper
    mappers: int = 1
    chunk: int = 500              # tuples emitted then flushed as one unit
    zipf_s: float = 1.1           # P(rank k) ~ 1 / (v + k)^s
    zipf_v: float = 2.72
    vocabulary: int = 10_000      # distinct keys of the zipf distribution
    burst_words: int = 3          # burst: this many words repeated over and over
    # Each tuple carries a unique id and the nodes keep the ids per key (reducer
    # floering.chaos.oracle:TupleIds), so the oracle checks every tuple, not just counts.
    ids: bool = False

    def __post_init__(self) -> None:
        if self.keys not in KEY_DISTRIBUTIONS:
            raise ValueError(f"load keys must be one of {', '.join(KEY_DISTRIBUTIONS)}, "
                             f"got {self.keys!r}")
        if self.rate <= 0 or self.mappers < 1 or self.chunk < 1:
            raise ValueError("load rate, mappers and chunk must be positive")
        if self.ids and self.chunk >= 1 << 16:
            raise ValueError("with ids, a chunk holds fewer than 65536 tuples")
        if self.zipf_s <= 0 or self.zipf_v <= -1 or self.vocabulary < 1 or self.burst_words < 1:
            raise ValueError("zipf_s > 0, zipf_v > -1, vocabulary >= 1, burst_words >= 1")


@dataclass(frozen=True)
class Fault:
    """One fault of a round. `at` is seconds after the load starts (plus a seeded
    uniform jitter); `count` is how many nodes for non-adjacent and random, and how
    many ranges a kill-mid-handoff `move` hands over, and how many nodes a minority
    partition cuts off.

    The network faults run on hosts of their own (chaos.netns): partition cuts the
    target off for `hold` seconds, then heals (see PARTITION_TARGETS); lossy-link
    drops a random `loss` share of the frames on one node's link, both ways, for
    `hold` seconds.

    kill-mid-handoff starts a live handoff at `at` (`handoff`: a move of ranges to the
    giver's clockwise neighbour, a scale-out onto a new node, or a scale-in of a
    node) and SIGKILLs its giver or its receiver once the giver has logged that the
    handoff is under way, before it commits.

    The durable faults (target all, a scenario with `durable`) hit every node:
    kill-all SIGKILLs them at once and starts them again on their data directories;
    power-loss also tears every node's newest log record first; kill-during-replay
    SIGKILLs a seeded node again while it restores (after up to `lag` seconds) and
    starts it once more; disk-full fills the data directories' filesystem for `hold`
    seconds."""

    kind: str                     # kill (SIGKILL) | pause (SIGSTOP, then SIGCONT) | kill-mapper
    #                               | kill-mid-handoff | restart (SIGKILL, then the same
    #                               command at once) | rolling-restart (target all: each
    #                               node leaves, restarts empty and takes ranges back)
    #                               | hostile (forged and oversized requests to a node,
    #                               chaos.hostile: each must be refused) | kill-all
    #                               | power-loss | kill-during-replay | disk-full
    target: str = "one"           # which processes; see TARGETS
    at: float = 1.0
    jitter: float = 0.0
    count: int = 1
    pause: float = 2.5            # pause: seconds between SIGSTOP and SIGCONT
    handoff: str = "move"         # kill-mid-handoff: move | scale-out | scale-in
    lag: float = 0.0              # kill-mid-handoff: kill up to this many seconds (seeded)
    #                               after the handoff is under way, if it still is;
    #                               kill-during-replay: after the directory is open
    hold: float = 3.0             # disk-full: seconds the disk stays full; partition,
    #                               lossy-link: seconds until the network heals
    loss: float = 0.0             # lossy-link: share of frames dropped (0 < loss < 1)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, "
                             f"got {self.kind!r}")
        if self.target not in TARGETS:
            raise ValueError(f"fault target must be one of {', '.join(TARGETS)}, "
                             f"got {self.target!r}")
        if (self.kind == "kill-mapper") != (self.target == "mapper"):
            raise ValueError("kill-mapper goes with target 'mapper', and only it")
        if (self.kind in ("rolling-restart", *DURABLE_FAULTS)) != (self.target == "all"):
            raise ValueError("rolling-restart and the durable faults go with target "
                             "'all', and only they")
        if (self.kind == "kill-mid-handoff") != (self.target in HANDOFF_SIDES):
            raise ValueError("kill-mid-handoff goes with target 'giver' or 'receiver', "
                             "and only it")
        if self.kind == "partition" and self.target not in PARTITION_TARGETS:
            raise ValueError(f"a partition's target is one of {', '.join(PARTITION_TARGETS)}")
        if self.target in PARTITION_TARGETS[1:] and self.kind != "partition":
            raise ValueError(f"targets {', '.join(PARTITION_TARGETS[1:])} go with a "
                             f"partition only")
        if self.kind == "lossy-link" and (self.target != "one" or not 0 < self.loss < 1):
            raise ValueError("a lossy-link has target 'one' and 0 < loss < 1")
        if self.loss and self.kind != "lossy-link":
            raise ValueError("loss goes with a lossy-link fault only")
        if self.handoff not in HANDOFFS:
            raise ValueError(f"fault handoff must be one of {', '.join(HANDOFFS)}, "
                             f"got {self.handoff!r}")
        if (self.at < 0 or self.jitter < 0 or self.count < 1 or self.pause <= 0
                or self.lag < 0 or self.hold <= 0):
            raise ValueError("fault at/jitter/lag >= 0, count >= 1, pause and hold > 0")


@dataclass(frozen=True)
class Round:
    faults: tuple[Fault, ...]
    label: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    replicas: int
    rounds: tuple[Round, ...]
    load: Load = field(default_factory=Load)
    duration: float = 3.0         # seconds of load per round
    settle: float = 0.5           # extra seconds after the last fault before the load stops
    tokens_per_node: int = 8
    ci: bool = False              # small enough for the test suite
    node_args: tuple[str, ...] = ()   # extra flags for every node process
    # Mutual TLS on every call, as deployed; False serves in the clear, for a fault
    # that must show what a node refuses without knowing who is calling.
    tls: bool = True
    # Every node keeps its data directory (--data-dir) in the round's work dir, or
    # on a tmpfs of `disk_mb` MiB mounted for the round (root only): what a
    # disk-full fault fills.
    durable: bool = False
    disk_mb: int = 0
    # How long a mapper's flush may wait for its acknowledgements: a durable
    # cluster's whole outage (kill, restart, replay) must fit in it.
    client_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.replicas < 0 or not self.rounds:
            raise ValueError("a scenario needs nodes >= 1, replicas >= 0 and a round")
        if self.duration <= 0 or self.settle < 0:
            raise ValueError("duration must be > 0 and settle >= 0")
        object.__setattr__(self, "node_args", tuple(str(a) for a in self.node_args))
        if self.tls and any(f.kind == "hostile" for r in self.rounds for f in r.faults):
            raise ValueError("a hostile fault sends unauthenticated requests, which TLS "
                             "would stop at the handshake: give the scenario tls = false")
        kinds = {f.kind for r in self.rounds for f in r.faults}
        if "impostor" in kinds and not self.tls:
            raise ValueError("an impostor fault is refused by certificates: give the "
                             "scenario TLS (tls = true)")
        if kinds & set(DURABLE_FAULTS) and not self.durable:
            raise ValueError("a durable fault needs a durable scenario (durable = true)")
        if "disk-full" in kinds and not self.disk_mb:
            raise ValueError("a disk-full fault fills a disk of its own: give the scenario "
                             "disk_mb (a tmpfs of that size is mounted for each round)")
        if self.disk_mb < 0 or (self.disk_mb and not self.durable):
            raise ValueError("disk_mb holds the data directories: a durable scenario, "
                             "disk_mb > 0")
        if self.client_timeout <= 0:
            raise ValueError("client_timeout must be > 0")
        mixed = kinds - {"kill", "pause", *NET_FAULTS}
        if kinds & set(NET_FAULTS) and (mixed or self.durable):
            raise ValueError("network faults run on hosts of their own (network "
                             "namespaces): they mix only with kill and pause, in memory")

    @property
    def netns(self) -> bool:
        """Every node and mapper on a host of its own (chaos.netns; root only)."""
        return any(f.kind in NET_FAULTS for r in self.rounds for f in r.faults)

    @property
    def reducer(self) -> str:
        return "floering.chaos.oracle:TupleIds" if self.load.ids else "count"

    @property
    def round_seconds(self) -> float:
        """Load time of a round: the duration, stretched to outlast its last fault."""
        last = max((f.at + f.jitter + (f.pause if f.kind == "pause" else 0.0)
                    + (f.hold if f.kind in ("disk-full", *NET_FAULTS) else 0.0)
                    for r in self.rounds for f in r.faults), default=0.0)
        return max(self.duration, last + self.settle)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Scenario":
        """Build from plain data (JSON/TOML). Unknown fields are an error."""
        data = dict(data)
        _no_unknown(cls, data, "scenario")
        load = data.pop("load", {}) or {}
        _no_unknown(Load, load, "load")
        rounds = []
        for r in data.pop("rounds", []):
            _no_unknown(Round, r, "round")
            faults = []
            for f in r.get("faults", []):
                _no_unknown(Fault, f, "fault")
                faults.append(Fault(**f))
            rounds.append(Round(tuple(faults), r.get("label", "")))
        return cls(load=Load(**load), rounds=tuple(rounds), **data)


def _no_unknown(kind, data: dict, what: str) -> None:
    unknown = set(data) - {f.name for f in fields(kind)}
    if unknown:
        raise ValueError(f"unknown {what} fields: {', '.join(sorted(unknown))}")


# ------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class PlannedFault:
    at: float                     # seconds after the load starts
    kind: str
    victims: tuple[str, ...]      # node ids, or "mapper-<i>"
    pause: float = 0.0
    # (victim, the tokens it owns when hit): what its heirs must take over
    ranges: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # kill-mid-handoff: which handoff, every (giver, token, receiver) it moves, the
    # new node a scale-out starts, and the giver whose handoff the kill waits for
    handoff: str = ""
    moves: tuple[tuple[str, int, str], ...] = ()
    newcomer: str = ""
    watch: str = ""
    lag: float = 0.0
    again: str = ""               # kill-during-replay: the node killed while it restores
    hold: float = 0.0             # disk-full: seconds the disk stays full; network
    #                               faults: seconds until the network heals
    loss: float = 0.0             # lossy-link: share of frames dropped
    # partition: the side the mappers are on (both, majority, minority), and the
    # nodes cut off from the victims (the other side)
    mappers_with: str = ""
    apart: tuple[str, ...] = ()


def _initial_ring(nodes: int, replicas: int, tokens_per_node: int) -> Ring:
    """The ring the nodes build at start (token positions do not depend on addresses)."""
    return Ring.initial({f"n{i}": f"127.0.0.1:{i + 1}" for i in range(nodes)}, replicas,
                        tokens_per_node)


def ring_order(nodes: int, tokens_per_node: int = 8) -> list[str]:
    """Node ids in clockwise ring order, as the nodes themselves will build the ring."""
    return list(dict.fromkeys(_initial_ring(nodes, 0, tokens_per_node).owners))


def owner_of(key: str, nodes: int, tokens_per_node: int = 8) -> str:
    return _initial_ring(nodes, 0, tokens_per_node).owner(key)


def hottest_piece_holder(scenario: "Scenario", seed: int) -> str:
    """The node holding the first piece of the hottest key placed away from the key's
    own node (the first a sharing balancer spreads it to)."""
    from floering.chaos.load import hottest_key
    from floering.wire.pieces import piece_key
    ring = _initial_ring(scenario.nodes, 0, scenario.tokens_per_node)
    key = hottest_key(scenario.load, seed)
    return next(ring.owner(piece_key(key, i)) for i in range(1, 64)
                if ring.owner(piece_key(key, i)) != ring.owner(key))


def loses_data(live: list[str], victims, replicas: int) -> bool:
    """Would killing `victims` at once leave a range with no live copy? True when more
    than `replicas` of them are consecutive among the live nodes (cyclically)."""
    dead = [n in set(victims) for n in live]
    if all(dead):
        return True
    start = dead.index(False)            # walk from a survivor, so runs do not wrap
    run = 0
    for i in range(1, len(dead) + 1):
        if dead[(start + i) % len(dead)]:
            run += 1
            if run > replicas:
                return True
        else:
            run = 0
    return False


def adjacent(live: list[str], victims) -> bool:
    """Are two of `victims` neighbours among the live nodes?"""
    return loses_data(live, victims, 1) if len(live) > 1 else False


def plan(scenario: Scenario, seed: int) -> list[list[PlannedFault]]:
    """Concrete victims and times for every round. Pure: same seed, same plan."""
    order = ring_order(scenario.nodes, scenario.tokens_per_node)
    planned = []
    for index, rnd in enumerate(scenario.rounds):
        rng = random.Random(f"{scenario.name}/{seed}/{index}")
        live = list(order)
        ring = _initial_ring(scenario.nodes, scenario.replicas, scenario.tokens_per_node)
        faults = []
        handed = False
        for fault in sorted(rnd.faults, key=lambda f: f.at):
            at = fault.at + (rng.uniform(0, fault.jitter) if fault.jitter else 0.0)
            if handed and fault.kind in NODE_FAULTS:
                # Which ranges a node owns after a disturbed handoff depends on how
                # the race went; later node faults could not be planned.
                raise ValueError(f"{scenario.name}: a kill-mid-handoff must be the last "
                                 f"node fault of its round")
            extra = {}
            if fault.kind == "kill-mid-handoff":
                extra = plan_handoff(scenario, fault, live, ring, rng)
                victims = extra.pop("victims")
                handed = True
            elif fault.kind == "rolling-restart":
                victims = tuple(live)
                handed = True      # ranges move around: later node faults cannot be planned
            elif fault.kind in DURABLE_FAULTS:
                victims = tuple(live)
                extra = _plan_durable(fault, live, rng)
            elif fault.kind in NET_FAULTS:
                victims = _net_victims(scenario, fault, live, rng)
                extra = {"hold": fault.hold, "loss": fault.loss}
                if fault.kind == "partition":
                    extra["mappers_with"] = {"minority": "majority", "adjacent-minority":
                                             "majority", "minority-mapper": "minority"
                                             }.get(fault.target, "both")
                    extra["apart"] = tuple(n for n in live if n not in victims) if \
                        fault.target != "from-replicas" else \
                        ring.replicas_of_token(ring.tokens_of(victims[0])[0])
            else:
                victims = _victims(scenario, fault, live, rng, seed)
            ranges: tuple[tuple[str, tuple[int, ...]], ...] = ()
            if (fault.kind in NODE_FAULTS and fault.kind != "rolling-restart") or \
                    (fault.kind == "partition" and fault.target != "from-replicas"):
                # a paused node is declared dead and fenced too, and so is one cut
                # off by a partition; a restarted one is a new member with no range
                ranges = tuple((v, ring.tokens_of(v) if v in ring.nodes else ())
                               for v in victims)
                live = [n for n in live if n not in victims]
                ring = ring.without(set(victims) & set(ring.nodes))
            faults.append(PlannedFault(round(at, 3), fault.kind, victims,
                                       fault.pause if fault.kind == "pause" else 0.0, ranges,
                                       **extra))
        planned.append(sorted(faults, key=lambda f: f.at))
    return planned


def _net_victims(scenario: Scenario, fault: Fault, live: list[str],
                 rng: random.Random) -> tuple[str, ...]:
    """The node a lossy link or a one-node partition hits; or the minority a
    partition cuts off: fewer than half the live nodes, and never more than r
    neighbours, so the majority's takeover of their ranges loses none."""
    if len(live) < 3:
        raise ValueError(f"{scenario.name}: a network fault needs 3 live nodes")
    if fault.kind == "lossy-link" or fault.target in ("one", "from-replicas"):
        return (rng.choice(live),)
    if not fault.count < len(live) / 2:
        raise ValueError(f"{scenario.name}: a minority of {fault.count} among "
                         f"{len(live)} nodes is no minority")
    if fault.target == "adjacent-minority":
        if fault.count > scenario.replicas:
            raise ValueError(f"{scenario.name}: {fault.count} neighbours cut off hold "
                             f"every copy of some range with r={scenario.replicas}")
        start = rng.randrange(len(live))
        return tuple(live[(start + i) % len(live)] for i in range(fault.count))
    for _ in range(10_000):
        victims = rng.sample(live, fault.count)
        if not loses_data(live, victims, scenario.replicas):
            return tuple(sorted(victims, key=live.index))
    raise ValueError(f"{scenario.name}: no minority of {fault.count} keeps every range "
                     f"on the majority's side with r={scenario.replicas}")


def _plan_durable(fault: Fault, live: list[str], rng: random.Random) -> dict:
    """Every live node is hit and comes back as itself, so the ring stays as it was;
    kill-during-replay picks the node to kill again and when."""
    if fault.kind == "disk-full":
        return {"hold": fault.hold}
    if fault.kind == "kill-during-replay":
        return {"again": rng.choice(live),
                "lag": round(rng.uniform(0, fault.lag), 4) if fault.lag else 0.0}
    return {}


def _heir(ring: Ring, token: int) -> str:
    heir = ring.heir(token)
    if heir is None:
        raise ValueError(f"range {token} has no replica to pass to")
    return heir


def plan_handoff(scenario: Scenario, fault: Fault, live: list[str], ring: Ring,
                 rng: random.Random) -> dict:
    """The handoff a kill-mid-handoff disturbs, and its victim. Pure.

    move: `count` of the giver's ranges go to its clockwise neighbour (already their
    first replica; the neighbour's own replica becomes the extra copy).
    scale-out: a new node (the next free id, as LocalCluster.add_nodes names it)
    joins and takes ranges by mapper.admin.plan_scale_out; the giver is one of the
    donors, the receiver is the new node.
    scale-in: the giver leaves, spreading its ranges as a leave does (each to its
    first replica while that one stays within the mean share, else to the smallest
    member; node.core.shares); the receiver is its first replica, one of them."""
    from floering.mapper.admin import plan_scale_out
    if scenario.replicas < 1:
        raise ValueError(f"{scenario.name}: a kill during a handoff needs r >= 1, or the "
                         f"victim's ranges have no other copy")
    if len(live) < 3:
        raise ValueError(f"{scenario.name}: a kill during a handoff needs 3 live nodes")
    newcomer = ""
    if fault.handoff == "scale-out":
        newcomer = f"n{scenario.nodes}"
        grown = ring.add_node(newcomer, "127.0.0.1:0", ())
        by_donor = plan_scale_out(grown, [newcomer])
        moves = tuple((donor, token, target) for donor, tokens in sorted(by_donor.items())
                      for token, target in sorted(tokens.items()))
        donors = sorted(by_donor, key=live.index)
        giver = rng.choice(donors)
        receiver = newcomer
    else:
        giver = rng.choice(live)
        receiver = live[(live.index(giver) + 1) % len(live)]
        tokens = ring.tokens_of(giver)
        if fault.handoff == "move":
            if fault.count > len(tokens) - 1:
                raise ValueError(f"{scenario.name}: {giver} owns {len(tokens)} ranges; a "
                                 f"move hands over at most all but one")
            tokens = tuple(sorted(rng.sample(tokens, fault.count)))
        moves = tuple((giver, t, _heir(ring, t)) for t in tokens)
        if {m[2] for m in moves} != {receiver}:
            raise ValueError(f"{scenario.name}: {giver}'s ranges do not all pass to {receiver}")
    victim = giver if fault.target == "giver" else receiver
    lag = round(rng.uniform(0, fault.lag), 4) if fault.lag else 0.0
    return {"victims": (victim,), "handoff": fault.handoff, "moves": moves,
            "newcomer": newcomer, "watch": giver, "lag": lag}


def _victims(scenario: Scenario, fault: Fault, live: list[str], rng: random.Random,
             seed: int):
    r, n = scenario.replicas, len(live)
    target = fault.target
    if target == "all":
        return tuple(live)
    if target == "mapper":
        return (f"mapper-{rng.randrange(scenario.load.mappers)}",)
    if n < 2:
        raise ValueError(f"{scenario.name}: no node left to fault")
    if target == "one":
        return (rng.choice(live),)
    if target == "hottest":
        from floering.chaos.load import hottest_key
        owner = owner_of(hottest_key(scenario.load, seed), scenario.nodes, scenario.tokens_per_node)
        if owner not in live:
            raise ValueError(f"{scenario.name}: the hottest key's owner {owner} is already down")
        return (owner,)
    if target == "hottest-piece":
        owner = hottest_piece_holder(scenario, seed)
        if owner not in live:
            raise ValueError(f"{scenario.name}: {owner} is already down")
        return (owner,)
    if target == "consecutive":
        if r < 1 or r >= n:
            raise ValueError(f"{scenario.name}: 'consecutive' needs 1 <= r < live nodes")
        start = rng.randrange(n)
        return tuple(live[(start + i) % n] for i in range(r))
    if target == "beyond-r":
        # r+1 consecutive: some range loses every copy. The run must say so and fail.
        start = rng.randrange(n)
        return tuple(live[(start + i) % n] for i in range(min(r + 1, n)))
    if target == "every-other":
        # Keep one node of every r+1: n*r/(r+1) victims, never more than r in a row.
        shift = rng.randrange(n)
        return tuple(sorted((live[(shift + i) % n] for i in range(n) if i % (r + 1)),
                            key=live.index))
    if target in ("non-adjacent", "random"):
        if target == "non-adjacent" and fault.count > n // 2:
            raise ValueError(f"{scenario.name}: {fault.count} non-adjacent nodes out of {n} "
                             f"is impossible")
        bad = adjacent if target == "non-adjacent" else (lambda lv, v: loses_data(lv, v, r))
        for _ in range(100_000):
            victims = rng.sample(live, fault.count)
            if not bad(live, victims):
                return tuple(sorted(victims, key=live.index))
        raise ValueError(f"{scenario.name}: found no {fault.count} {target} victims "
                         f"among {n} nodes that keep every range alive")
    raise ValueError(f"unknown target {target!r}")


# -------------------------------------------------------------- the catalogue

def _kill(target: str, at: float = 1.0, count: int = 1, **kw) -> Fault:
    return Fault("kill", target, at=at, count=count, **kw)


def simultaneous_kills(name: str, description: str, nodes: int, counts, repeats: int,
                       rate: float, duration: float = 3.5, at: float = 1.5,
                       mappers: int = 1) -> Scenario:
    """k non-adjacent nodes SIGKILLed at once, for each k, `repeats` rounds each."""
    rounds = tuple(Round((_kill("non-adjacent", at=at, count=k),), f"{k} at once")
                   for k in counts for _ in range(repeats))
    return Scenario(name, description, nodes, 1, rounds,
                    Load("zipf", rate=rate, mappers=mappers, chunk=max(100, int(rate / 20))),
                    duration=duration)


def mid_handoff(name: str, description: str, handoff: str, side: str, count: int = 1,
                at: float = 1.0, lag: float = 0.0) -> Scenario:
    """n=4, r=1 under a Zipf load with tuple ids: one handoff, one SIGKILL inside it."""
    return Scenario(name, description, 4, 1,
                    (Round((Fault("kill-mid-handoff", side, at=at, count=count,
                                  handoff=handoff, lag=lag),)),),
                    Load("zipf", rate=3000, chunk=300, ids=True), duration=3.5, ci=True)


def durable(name: str, description: str, fault: Fault, disk_mb: int = 0) -> Scenario:
    """n=4, r=1, durable, under a Zipf load with tuple ids: one fault of the whole
    cluster, then 3 s more of load once it is back (the mapper's channels reconnect
    on gRPC's backoff, 1 s and more). The mapper's flush may wait 90 s, far past the
    outage."""
    return Scenario(name, description + "; every tuple checked by its id", 4, 1,
                    (Round((fault,)),), Load("zipf", rate=2000, chunk=200, ids=True),
                    duration=2.0, settle=3.0, ci=True, durable=True, disk_mb=disk_mb,
                    client_timeout=90.0)


def network(name: str, description: str, nodes: int, replicas: int, fault: Fault,
            ci: bool = True, settle: float = 3.0, rate: float = 2000) -> Scenario:
    """Every node and the mapper on a host of its own (chaos.netns: network
    namespaces, root only), a Zipf load with tuple ids, one network fault held
    `fault.hold` seconds, then `settle` more seconds of load once it healed (a node
    declared dead meanwhile is fenced and rejoins empty; connections that timed out
    during the partition come back on TCP's and gRPC's retry backoff, seconds). The
    mapper's flush may wait 60 s, past any hold here: a mapper cut off with a
    minority waits for the heal."""
    return Scenario(name, description + "; every tuple checked by its id", nodes, replicas,
                    (Round((fault,)),), Load("zipf", rate=rate, chunk=200, ids=True),
                    duration=2.0, settle=settle, ci=ci, client_timeout=60.0)


BUILTIN: dict[str, Scenario] = {s.name: s for s in [
    Scenario("kill-one", "SIGKILL one node under a Zipf load", 4, 1,
             (Round((_kill("one", at=1.0),)),), Load("zipf", rate=4000), ci=True),
    Scenario("kill-consecutive", "SIGKILL r consecutive nodes at once (n=5, r=2)", 5, 2,
             (Round((_kill("consecutive", at=1.0),)),), Load("zipf", rate=3000), ci=True),
    Scenario("kill-every-other", "SIGKILL every other node at once: n*r/(r+1) of them", 6, 1,
             (Round((_kill("every-other", at=1.0),)),), Load("zipf", rate=3000), ci=True),
    Scenario("kill-random", "two SIGKILLs of random nodes at random times, never more "
             "than r neighbours down at once", 5, 1,
             (Round((_kill("random", at=0.8, jitter=0.4), _kill("random", at=2.2, jitter=0.4))),),
             Load("zipf", rate=3000), duration=3.5, ci=True),
    Scenario("pause", "SIGSTOP one node past detection, then SIGCONT: it is fenced and "
             "rejoins empty", 4, 1,
             (Round((Fault("pause", "one", at=0.8, pause=2.5),)),), Load("zipf", rate=3000),
             ci=True),
    Scenario("kill-mapper", "SIGKILL a mapper process between emitting a chunk and its "
             "acknowledgement, then SIGKILL a node; every tuple checked by its id", 4, 1,
             (Round((Fault("kill-mapper", "mapper", at=0.8), _kill("one", at=1.6))),),
             Load("zipf", rate=3000, mappers=2, chunk=300, ids=True), ci=True),
    Scenario("burst", "a few words repeated over and over; SIGKILL the hottest word's owner",
             4, 1, (Round((_kill("hottest", at=1.0),)),), Load("burst", rate=4000), ci=True),
    Scenario("kill-shared-hot-key", "a ring running dynamic key grouping under three hot "
             "words: once the mapper has spread the hottest over a pool of pieces, SIGKILL "
             "the node holding its first piece away from its own node; reads merge the "
             "pieces; every tuple checked by its id", 4, 1,
             (Round((_kill("hottest-piece", at=3.0),)),),
             Load("burst", rate=6000, chunk=300, ids=True), duration=4.5, ci=True,
             node_args=("--balancer", "dkg")),
    *(Scenario(f"kill-while-{policy}", f"a ring running the Ray paper's {policy} with "
               "a hair trigger (every node counts as overloaded, a round every 0.5 s), "
               "so ranges are cut and handed off all along; SIGKILL the "
               "hottest word's owner mid-way; every tuple checked by its id", 4, 1,
               (Round((_kill("hottest", at=1.5),)),),
               # every handoff holds its ranges' writes until it commits, and
               # here one is on its way almost always: 5 s let over 1,000 tuples
               # through whatever the machine's speed
               Load("burst", rate=4000, chunk=200, ids=True), duration=5.0,
               ci=True,
               node_args=("--balancer", policy, "--high-queue", "-1", "--high-cpu",
                          "-1", "--low-queue", "-2", "--low-cpu", "-2",
                          "--balance-cooldown", "0.5"))
      for policy in ("halving", "doubling")),
    Scenario("corpus", "the bundled corpus in order; SIGKILL two non-adjacent nodes", 6, 1,
             (Round((_kill("non-adjacent", at=1.0, count=2),)),), Load("corpus", rate=4000),
             ci=True),
    Scenario("lose-range", "SIGKILL r+1 consecutive nodes: ranges lose every copy; the run "
             "must FAIL and report them lost (checks the checker)", 4, 1,
             (Round((_kill("beyond-r", at=1.0),)),), Load("zipf", rate=3000), ci=True),
    replace(simultaneous_kills("fig8b-mini", "Fig. 8b in small: n=6, r=1, 1..3 non-adjacent "
                               "SIGKILLs at once, one round each", 6, range(1, 4), 1,
                               rate=4000, duration=3.0, at=1.0), ci=True),
    mid_handoff("kill-giver-mid-move", "move two ranges to the giver's clockwise neighbour; "
                "SIGKILL the giver before it commits: its heirs take the ranges over",
                "move", "giver", count=2),
    mid_handoff("kill-receiver-mid-move", "move two ranges to the giver's clockwise "
                "neighbour; SIGKILL the receiver before the commit", "move", "receiver",
                count=2),
    mid_handoff("kill-joiner-mid-scale-out", "scale out 4 -> 5; SIGKILL the new node while a "
                "donor is handing it ranges", "scale-out", "receiver"),
    mid_handoff("kill-donor-mid-scale-out", "scale out 4 -> 5; SIGKILL a donor while it is "
                "handing ranges to the new node", "scale-out", "giver"),
    mid_handoff("kill-leaver-mid-scale-in", "scale in: SIGKILL the leaving node while it "
                "hands its ranges over", "scale-in", "giver"),
    mid_handoff("kill-heir-mid-scale-in", "scale in: SIGKILL the first replica while it "
                "receives some of the leaving node's ranges", "scale-in", "receiver"),
    Scenario("fast-restart", "SIGKILL one node and start it again at once, under load, "
             "before its peers' detector could notice (peers suspect silence only after "
             "3 s): the new process declares its old self dead and joins empty; every "
             "tuple checked by its id", 4, 1,
             (Round((Fault("restart", "one", at=1.0),)),),
             Load("zipf", rate=3000, chunk=300, ids=True), duration=3.5, ci=True,
             node_args=("--suspect-min", "3", "--suspect-max", "4")),
    Scenario("rolling-restart-memory", "every node in turn leaves, restarts with no data "
             "dir, joins empty and takes its share back, under load; the next waits for "
             "every range to be on r+1 nodes again; every tuple checked by its id", 3, 1,
             (Round((Fault("rolling-restart", "all", at=0.8),)),),
             Load("zipf", rate=2000, chunk=200, ids=True), duration=2.0, ci=True),
    Scenario("hostile-clients", "a hostile client sends one node forged ring views, "
             "queries past its limits, an oversized source id and a NaN timeout while the "
             "load runs: each is refused with its status, nobody is declared dead, every "
             "tuple checked by its id; in the clear, so that what is refused is refused "
             "by validation alone, with no certificate to stop it", 4, 1,
             (Round((Fault("hostile", "one", at=0.8),)),),
             Load("zipf", rate=3000, chunk=300, ids=True), duration=2.5, ci=True,
             tls=False),
    Scenario("hostile-members", "on a TLS ring under load, callers without the right "
             "credentials each call one node once: no certificate, a member's name "
             "certified by another CA, a client's and an operator's certificate sending "
             "ring views, heartbeats, checkpoints and a leave, and a member's certificate "
             "forging another member's ring view, heartbeat and checkpoint: each is refused "
             "(UNAVAILABLE at the handshake, PERMISSION_DENIED, or FAILED_PRECONDITION for "
             "a checkpoint of a range the sender does not own), nobody is declared dead, "
             "every tuple checked by its id", 4, 1,
             (Round((Fault("impostor", "one", at=0.8),)),),
             Load("zipf", rate=3000, chunk=300, ids=True), duration=2.5, ci=True),
    durable("whole-cluster-kill", "SIGKILL every node at once at a seeded moment under "
            "load and start them all again on their data directories: each comes back as "
            "itself, the mapper rides through the outage",
            Fault("kill-all", "all", at=0.8, jitter=0.4)),
    durable("power-loss", "the whole cluster SIGKILLed under load, and every node's newest "
            "log segment ends in a record only partly written (a power cut mid-write) "
            "before they start again: the torn tails are cut, nothing acknowledged is lost",
            Fault("power-loss", "all", at=0.8, jitter=0.4)),
    durable("kill-during-replay", "the whole cluster SIGKILLed and started again, then one "
            "node SIGKILLed again while it restores from its data directory, and started "
            "once more", Fault("kill-during-replay", "all", at=0.8, jitter=0.4, lag=0.02)),
    durable("disk-full", "the data directories' filesystem (a 64 MiB tmpfs the harness "
            "mounts: root only) filled under load and held full for 3 s: nodes refuse "
            "batches and still serve reads; freed, they take writes again",
            Fault("disk-full", "all", at=0.8, jitter=0.4, hold=3.0), disk_mb=64),
    durable("rolling-restart", "`floe restart --rolling` on data directories under load: "
            "every node in turn leaves (its ranges go to their replicas), starts again on "
            "its data directory, finds its member left, starts as a new member in it and "
            "takes its share back; the next waits for every range to be on r+1 nodes "
            "again; acknowledgements go on throughout",
            Fault("rolling-restart", "all", at=0.8)),
    network("partition-primary", "one node (a primary of some ranges, the replica of "
            "others) cut off from every other node for 3.5 s while the mapper still "
            "reaches it: the others declare it dead and take its ranges over, it declares "
            "nobody, and once the network heals it is fenced and rejoins empty", 3, 1,
            Fault("partition", "one", at=1.0, hold=3.5)),
    network("partition-from-replica", "one node cut off from its replica only for 3 s "
            "(the third node and the mapper reach both): its replica's probes through "
            "the third node find it alive, so nobody is declared; its checkpoints wait, "
            "the replica's backups grow, and drain once the link heals", 3, 1,
            Fault("partition", "from-replicas", at=1.0, hold=3.0)),
    network("minority-partition", "two non-adjacent nodes of five cut off from the other "
            "three for 4 s, the mapper with the majority: the majority declares both "
            "and takes their ranges over, the minority declares nobody; healed, both are "
            "fenced and rejoin empty", 5, 1,
            Fault("partition", "minority", at=1.0, count=2, hold=4.0)),
    network("minority-partition-mapper", "two non-adjacent nodes of five and the mapper "
            "cut off from the other three for 3 s: no chunk is acknowledged until the "
            "partition heals, then the mapper resends to the majority's ring", 5, 1,
            Fault("partition", "minority-mapper", at=1.0, count=2, hold=3.0), settle=6.0),
    network("adjacent-minority-r2", "two neighbouring nodes of five (r=2) cut off from "
            "the other three for 4 s, the mapper with the majority: each can reach the "
            "other, but two of five are no quorum, so the minority declares nobody; "
            "healed, it is fenced and rejoins", 5, 2,
            Fault("partition", "adjacent-minority", at=1.0, count=2, hold=4.0)),
    network("lossy-link", "10% of the frames on one node's link lost, both ways, for 4 s "
            "under load", 4, 1, Fault("lossy-link", "one", at=1.0, hold=4.0, loss=0.1)),
    network("partition-primary-long", "partition-primary held 20 s: how long after the "
            "heal the cut-off node hears it was removed; it declares nobody before it "
            "has exchanged ring views after the heal", 3, 1,
            Fault("partition", "one", at=1.0, hold=20.0), ci=False, settle=10.0),
    network("lossy-link-long", "10% of the frames on one node's link lost, both ways, for "
            "60 s under load: how often it is suspected, and whether it is ever declared",
            4, 1, Fault("lossy-link", "one", at=1.0, hold=60.0, loss=0.1), ci=False),
    simultaneous_kills("target-n8", "n=8, r=1: 1..4 non-adjacent SIGKILLs at once, 5 "
                       "rounds each (the recovery target)", 8, range(1, 5), 5, rate=10_000),
    simultaneous_kills("fig8b", "the paper's Fig. 8b: n=12, r=1, 1..6 non-adjacent "
                       "SIGKILLs at once at a fixed rate, 3 rounds each", 12, range(1, 7), 3,
                       rate=10_000),
]}


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a .json / .toml file with the same fields."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".json", ".toml") and path.exists():
        data = json.loads(path.read_text()) if path.suffix == ".json" else \
            tomllib.loads(path.read_text())
        return Scenario.from_dict(data)
    raise ValueError(f"no scenario {name_or_path!r}: use one of {', '.join(BUILTIN)} "
                     f"or a .json/.toml file")


def with_overrides(scenario: Scenario, **changes) -> Scenario:
    return replace(scenario, **{k: v for k, v in changes.items() if v is not None})
