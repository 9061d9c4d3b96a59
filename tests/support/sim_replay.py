"""Epoch sources in the simulation, as the Spark driver runs them on a ring sharing
keys: each epoch (a micro-batch) gets a routing plan recorded before its first attempt
(mapper/plans.py: from the keys of earlier epochs and a sample of this one, on the
driver's ring view), and every member (a partition) sends its slice under the source
`q#<member>` with seqs from (epoch, position), each piece drawn by the plan.

Attempts die and are retried: a task dies after sending part of its slice (its
messages in flight lost with it, or still going as a zombie), the driver dies and every
attempt of the epoch with it (the new driver has measured nothing, and reads the
recorded plan), and nodes are killed meanwhile. A retry sends the whole slice again on
the newest ring, by the same plan. Epoch e + 1 starts once every batch of epoch e is
acknowledged by all its nodes (the group's promise, wire.epochs)."""

from __future__ import annotations

from collections import Counter, defaultdict

from floering.mapper.outbox import PendingBatch
from floering.mapper.plans import History, PlanChooser
from floering.node.core.batch import encode_payload, encode_seqs
from floering.wire.epochs import epoch_seq, epoch_source
from tests.support.simulation import SimMapper, Simulation

HOT = "w0"


class EpochSimulation(Simulation):
    tasks = 3
    slice_len = 40
    epochs = 16

    def __init__(self, seed: int, **kwargs) -> None:
        super().__init__(seed, mappers=0, **kwargs)
        self.policy = self.founding.balancer
        self.history = History()
        self.plans: dict[int, object] = {}      # epoch -> its plan, as recorded
        self.epoch = -1
        self.attempts = 0
        self.current: dict[int, SimMapper] = {}  # member -> its live attempt
        self.whole: set[SimMapper] = set()       # attempts that sent their whole slice
        self.retries = self.driver_kills = 0

    def slice_of(self, epoch: int, member: int) -> list[str]:
        """The hot word at every other position, other words drawn per (epoch, member)."""
        import random
        pick = random.Random(f"{self.seed}/{epoch}/{member}")
        return [HOT if i % 2 == 0 else f"w{pick.randrange(1, 40)}"
                for i in range(self.slice_len)]

    # ------------------------------------------------------------ the driver

    def start_epochs(self) -> None:
        self.next_epoch()

    def next_epoch(self) -> None:
        if self.epoch >= 0 and not (
                len(self.current) == self.tasks and self.whole >= set(self.current.values())
                and not any(m.outbox.undelivered for m in self.current.values())):
            self.at(self.now + 0.02, self.next_epoch)       # not acknowledged yet
            return
        self.epoch += 1
        if self.epoch >= self.epochs:
            return
        for member in range(self.tasks):
            self.sent.update(self.slice_of(self.epoch, member))
        self.log.append(f"{self.now:.3f} epoch {self.epoch} starts")
        self.launch_all()
        self.at(self.now + 0.02, self.next_epoch)

    def plan_for(self, epoch: int):
        recorded = self.plans.get(epoch)
        if recorded is None:
            ring = self.driver_ring()
            # as the driver: a sample of the epoch's input, added to what earlier
            # epochs measured, on the driver's ring view
            sample = Counter(k for m in range(self.tasks) for k in self.slice_of(epoch, m)[:10])
            scale = self.slice_len / 10
            self.history.add({k: c * scale for k, c in sample.items()},
                             sum(sample.values()) * scale)
            recorded = self.plans[epoch] = self.history.plan(ring)
        return recorded

    def driver_ring(self):
        views = [p.core.ring for p in self.procs if self._usable(p)]
        return max(views, key=lambda r: r.version) if views else self.founding

    def launch_all(self) -> None:
        plan = self.plan_for(self.epoch)
        for member in range(self.tasks):
            forced = (self.epoch, member) == (1, 0) and not self.retries
            self.launch(member, plan, forced or self.rng.random() < 0.15)

    def kill_driver(self) -> None:
        """Every attempt of the running epoch dies; a new driver (nothing measured)
        starts it again a little later, by the plan recorded for it."""
        if not 0 <= self.epoch < self.epochs:
            return
        self.log.append(f"{self.now:.3f} driver killed in epoch {self.epoch}")
        self.driver_kills += 1
        for mapper in self.current.values():
            mapper.alive = False
        self.current.clear()
        self.history = History()
        self.at(self.now + self.rng.uniform(0.05, 0.3), self.launch_all)

    # ------------------------------------------------------------- the tasks

    def launch(self, member: int, plan, fail: bool) -> None:
        """An attempt of `member`'s slice; `fail`: it dies after part of it."""
        self.attempts += 1
        mapper = SimMapper(f"task{self.attempts}", self.driver_ring())
        mapper.name = epoch_source("q", member)
        for address in list(self.listening):
            self.reconnect(mapper, address)
        old = self.current.get(member)
        if old is not None:
            old.alive = False
        self.current[member] = mapper
        self.at(self.now + 0.1, self.mapper_tick, mapper)
        keys = self.slice_of(self.epoch, member)
        cut = self.rng.randint(1, len(keys) - 1) if fail else len(keys)
        self.send_slice(mapper, keys[:cut], plan)
        if not fail:
            self.whole.add(mapper)
        if fail:
            self.at(self.now + self.rng.uniform(0.0, 0.05), self.task_failed, mapper, member,
                    plan, self.rng.random() < 0.3)

    def task_failed(self, mapper: SimMapper, member: int, plan, zombie: bool) -> None:
        if self.current.get(member) is not mapper:
            return                                   # the driver died meanwhile
        self.retries += 1
        self.log.append(f"{self.now:.3f} q#{member} attempt fails"
                        + (" (its sends go on)" if zombie else ""))
        del self.current[member]
        if not zombie:
            mapper.alive = False
        self.at(self.now + self.rng.uniform(0.01, 0.1), self.launch, member, plan, False)

    def send_slice(self, mapper: SimMapper, keys: list[str], plan) -> None:
        place = PlanChooser(plan, mapper.name).placer(mapper.ring, mapper.ring.token_for_key)
        by_token = defaultdict(lambda: ([], []))
        for position, key in enumerate(keys):
            seq = epoch_seq(self.epoch, position)
            piece, token = place(key, seq)
            self.pieces_sent.add(piece)
            by_token[token][0].append(piece)
            by_token[token][1].append(seq)
        for token, (k, s) in sorted(by_token.items()):
            self.batch_ids += 1
            batch = PendingBatch(self.batch_ids, token, mapper.name, s[0], s[-1], len(s),
                                 encode_payload(k, [1] * len(k)), encode_seqs(s),
                                 tokens=mapper.ring.tokens)
            self._send_batches(mapper, mapper.machine.submit(batch))

    # ---------------------------------------------------------- bookkeeping

    def mapper_tick(self, mapper: SimMapper) -> None:
        if mapper.alive:
            super().mapper_tick(mapper)

    def delivered(self, mapper: SimMapper, batch: PendingBatch) -> None:
        pass        # attempts resend what others delivered: only the ring's state is compared

    @property
    def undelivered(self) -> dict:
        return {(m.address, i): b for m in self.current.values()
                for i, b in m.outbox.undelivered.items()}

    def run_epochs(self, until: float, faults: list) -> None:
        self.at(0.05, self.start_epochs)
        self.run(until=until, emit_until=0.0, faults=faults)


def epoch_scenario(seed: int) -> EpochSimulation:
    """4-6 nodes, r 1 or 2, a balancer sharing keys; a task retry or two, maybe a
    driver kill, and a node killed, paused or cut off, at random moments."""
    import random
    pick = random.Random(seed * 7561)
    policy = pick.choice(["pkg", "dkg", "dchoices", "wchoices", "smalops"])
    nodes = pick.randint(4, 6)
    sim = EpochSimulation(seed, nodes=nodes, replication=pick.choice([1, 1, 2]),
                          tokens=pick.randint(1, 4), policy=policy)
    names = sorted(sim.nodes)
    faults = []
    if pick.random() < 0.5:
        faults.append((pick.uniform(0.05, 0.6), sim.kill_driver, ()))
    victim = names[pick.randrange(nodes)]
    kind = pick.choice(["kill", "kill", "pause", "partition"])
    when = pick.uniform(0.05, 0.6)
    if kind == "kill":
        faults.append((when, sim.kill, (victim,)))
    elif kind == "pause":
        faults.append((when, sim.pause, (victim, pick.uniform(0.1, 0.8))))
    else:
        other = names[(names.index(victim) + 1) % nodes]
        faults.append((when, sim.partition, (victim, [other], pick.uniform(0.3, 1.0))))
    sim.run_epochs(until=6.0, faults=faults)
    return sim

