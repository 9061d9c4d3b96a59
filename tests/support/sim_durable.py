"""The durable half of the simulation (tests/support/simulation.py): nodes that keep a
simulated data directory (tests/support/sim_disk.py), and the faults only they have: a crash
that loses what the disk had not made durable, the whole cluster crashing at once,
a full disk. A process starts again on its directory as the runtime's does: who it
was and its ring from the disk, its core from `node.core.restore.restored_core`,
who it is now from `node.core.membership.decide_start` with the incarnation it had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from floering.node.core.batch import Limits
from floering.node.core.machine_io import RingSeen
from floering.node.core.membership import base_name, decide_start, founding_ring
from floering.node.core.startup_round import Answered, AskPeers, Startup, Stop
from floering.node.core.persistence import DiskPlan
from floering.node.core.persistence_io import Began
from floering.node.core.reducers import load_reducer
from floering.node.core.restore import restored_core
from floering.node.core.retired import RetainingCore
from floering.wire.ring import Ring
from floering.node.storage.node_store import Loaded
from tests.support.sim_disk import SimDisk, SimDurability

if TYPE_CHECKING:
    from tests.support.simulation import SimProcess

STARTUP_GRACE = 1.0         # a node back from its disk suspects no peer before this


@dataclass
class Starter:
    """A durable process started again, not serving yet: what its directory held and
    what it answers a peer's start-up question with (its ring, as starting)."""

    old: object                 # the SimProcess that crashed
    disk: SimDisk
    loaded: Loaded | None
    me: str
    incarnation: int
    initial: Ring | None
    answer: Ring | None
    since: float
    startup: Startup | None = None    # node.core.startup_round, made at the first ask


class DurableNodes:
    """Methods of `Simulation` for durable nodes (it inherits them)."""

    def _keep_on_disk(self, proc: SimProcess, disk: SimDisk, disk_member: str | None,
                      loaded: Loaded | None = None) -> None:
        """`proc` serves from here on with `disk` as its data directory (which held
        `loaded`), as the runtime's Durability.begin: the production DiskPlan decides
        what is written."""
        plan = DiskPlan(proc.machine.incarnation, disk.next_record, disk.synced)
        proc.durable = SimDurability(self, proc, disk, plan)
        if loaded is None:
            began = Began(proc.core, disk_member)
        else:
            ring = Ring.from_wire(loaded.ring_wire) if loaded.ring_wire else None
            began = Began(proc.core, disk_member, ring, frozenset(loaded.copies),
                          frozenset(loaded.corrupt))
        proc.durable.do(plan.handle(began))

    def crash(self, name: str, downtime: float) -> None:
        """The machine of durable node `name` loses power: the records its log had not
        synced and the copy writes not done are lost. After `downtime` the same
        command starts again on the same directory."""
        proc = self.process(name)
        if proc is None or not proc.alive or proc.durable is None:
            return
        self._power_off(proc)
        self.at(self.now + downtime, self._boot, proc)

    def crash_cluster(self, spread: float, damage: bool = False) -> None:
        """Every durable node loses power at once; each starts again on its directory
        within `spread` seconds. With `damage`, one copy on one disk rots meanwhile."""
        self.log.append(f"{self.now:.3f} power loss of the whole cluster")
        procs = [p for p in self.procs if p.alive and p.durable is not None]
        for proc in procs:
            self._power_off(proc)
            self.at(self.now + self.rng.uniform(0.0, spread), self._boot, proc)
        if damage and procs:
            proc = self.rng.choice(procs)
            token = proc.durable.disk.damage(self.rng)
            self.log.append(f"{self.now:.3f} the copy of token {token} on {proc.name}'s "
                            f"disk is damaged")

    def fill_disk(self, name: str, seconds: float) -> None:
        """The disk of durable node `name` is full for `seconds`: its writes and
        fsyncs fail; it refuses batches, serves reads, and takes batches again once a
        repair finds space."""
        proc = self.process(name)
        if proc is None or not proc.alive or proc.durable is None:
            return
        self.log.append(f"{self.now:.3f} disk of {proc.name} full for {seconds:.2f}s")
        proc.durable.disk.full_until = self.now + seconds

    def _power_off(self, proc: SimProcess) -> None:
        lost = proc.durable.disk.crash(self.rng)
        proc.alive = False
        # Its streams die with it: the process started again there (the same member,
        # from its disk) never receives what a mapper sends on them.
        for link, stream in list(self.streams.items()):
            if link[1] == proc.address:
                self._kill_stream(link, stream, self.sent_on_link[link] + 1)
        self.log.append(f"{self.now:.3f} crash {proc.name}: {lost} records not synced lost")

    def _boot(self, old: SimProcess) -> None:
        """The process starts on its directory: who it was (node id, incarnation) and
        its ring come from the disk, as in the runtime's NodeRuntime."""
        disk = old.durable.disk
        loaded = disk.load()
        base = base_name(old.started_as)
        me = loaded.node_id if loaded else base
        incarnation = loaded.incarnation if loaded else self._incarnation()
        initial = (Ring.from_wire(loaded.ring_wire) if loaded and loaded.ring_wire
                   else self.founding if base in self.members else None)
        answer = founding_ring(initial, me, incarnation) if initial is not None else None
        starter = Starter(old, disk, loaded, me, incarnation, initial, answer, self.now)
        self.starting[old.address] = starter
        self._decide(starter)

    def _decide(self, starter: Starter) -> None:
        """Ask the members its ring names (starting ones answer with their own ring,
        as starting); decide who it is once a running member answered, or every one
        answered as starting (the whole cluster is coming back), or after the
        start-up grace with whatever answered: node/runtime/startup.py's rules."""
        address = starter.old.address
        if starter.initial is not None:
            targets = sorted({a for _, a in starter.initial.addresses if a != address})
        else:
            targets = sorted({p.address for p in self.procs if p.alive and p.address != address})
        seen, starting = [], 0
        for target in targets:
            if frozenset((address, target)) in self.cut:
                continue
            running, other = self.listening.get(target), self.starting.get(target)
            if running is not None and self._usable(running):
                seen.append(running.core.ring)
            elif other is not None and other.answer is not None:
                seen.append(other.answer)
                starting += 1
        joining = starter.initial is None
        if starter.startup is None:
            starter.startup = Startup(starter.me, joining, starter.since, STARTUP_GRACE)
        match starter.startup.handle(Answered(self.now, tuple(seen), starting, len(targets))):
            case [AskPeers(delay=delay)]:
                self.at(self.now + delay, self._decide, starter)
                return
            case [Stop(reason=reason)]:           # as the runtime: the process exits
                del self.starting[address]
                self.log.append(f"{self.now:.3f} {base_name(starter.me)} stops: {reason}")
                self.start_failures.append((self.now, base_name(starter.me), reason))
                return
        del self.starting[address]
        decision = decide_start(starter.me, starter.incarnation, address, seen,
                                None if joining else starter.initial)
        self.log.append(f"{self.now:.3f} {base_name(starter.me)} starts from its disk as "
                        f"{decision.node_id}" + (f", declaring {decision.replaces} dead"
                                                 if decision.replaces else ""))
        if decision.replaces:
            self.declared.append((self.now, decision.node_id, decision.replaces))
        machine = self.make_machine(decision.node_id, decision.ring, starter.incarnation, address)
        proc = self._spawn_process(machine, address, base_name(starter.old.started_as))
        loaded = starter.loaded
        for ranges in starter.disk.retired.values():     # kept across the restart
            self.run_retiring(proc, machine.retiring.loaded(list(ranges)))
        if loaded is not None and decision.node_id == starter.me:     # the same member
            ring = starter.initial or decision.ring
            machine.begin(starter.me, ring, restored_core(
                starter.me, ring, load_reducer("count"), Limits(), loaded.copies,
                loaded.batches, self.now, corrupt=frozenset(loaded.corrupt),
                make=RetainingCore))
            self.handle(proc, RingSeen(decision.ring, pulled=True))
        self._keep_on_disk(proc, starter.disk, loaded.node_id if loaded else None, loaded)
        if loaded is not None and decision.node_id != starter.me:
            # removed while it was down: what its directory held is kept (as `began`)
            self.run_retiring(proc, machine.retiring.keep_directory(
                loaded, load_reducer("count"), Limits(), self.now, decision.node_id))
        self._start_loops(proc, STARTUP_GRACE)
