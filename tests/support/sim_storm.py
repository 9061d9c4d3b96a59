"""A redistribution storm: every node of the simulated ring overloaded from the start
(a hair-trigger load monitor, a round every 0.5 s), so halving or doubling rounds from
several nodes cross each other while a node is killed, at a random moment or just
after a handoff event that concerns it. This is the chaos scenario kill-while-doubling
(docs/chaos.md) in the simulation, where a range's replica marks once went missing in
concurrent ring changes and a single death lost the range."""

from __future__ import annotations

from floering.node.core.load import LoadConfig
from floering.node.core.machine import NodeMachine
from floering.node.core.machine_io import Record
from floering.wire.ring import Ring
from tests.support.simulation import Simulation, make_machine

HAIR_TRIGGER = LoadConfig(high_queue=-1, high_cpu=-1, low_queue=-2, low_cpu=-2, cooldown=0.5)


class StormSimulation(Simulation):
    """`kill_after`: "target" kills a node a handoff was just committed to, "giver" a
    node that just prepared one, "time" nobody on an event (a kill is scheduled)."""
    kill_after = "time"
    armed_at = 0.5
    delay = 0.01
    fired = False
    calm = False

    def _record(self, e: Record) -> None:
        super()._record(e)
        if self.fired or self.kill_after == "time" or self.now < self.armed_at:
            return
        victim = None
        if self.kill_after == "target" and e.kind == "handoff_committed":
            victim = self.rng.choice(list(dict(e.fields)["to"]))
        elif self.kill_after == "giver" and e.kind == "handoff_prepared":
            victim = e.node
        if victim is not None and self.process(victim) is not None:
            self.fired = True
            self.at(self.now + self.rng.uniform(0, self.delay), self.kill, victim)

    def make_machine(self, node_id: str, ring: Ring, incarnation: int,
                     address: str) -> NodeMachine:
        return make_machine(node_id, ring, incarnation, address,
                            LoadConfig() if self.calm else HAIR_TRIGGER)

    def calm_down(self) -> None:
        """End the storm (normal load thresholds), so the ring settles before the end."""
        self.log.append(f"{self.now:.3f} the storm ends")
        self.calm = True
        for proc in self.procs:
            proc.machine.load.config = LoadConfig()
