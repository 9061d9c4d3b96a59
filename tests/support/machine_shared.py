"""Helpers of tests/unit/test_machine.py that other test files use too: INCARNATIONS, MEMBERS,
kinds, machine, probe_of, ring.
"""

from dataclasses import replace

from floering.node.core.detector import DetectorConfig, FailureDetector
from floering.node.core.load import LoadMonitor
from floering.node.core.machine import NodeMachine
from floering.node.core.machine_io import MonitorDue, Record, StartProbe
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring


MEMBERS = {f"n{i}": f"a:{i}" for i in range(4)}


INCARNATIONS = {n: 100 + i for i, n in enumerate(MEMBERS)}


def ring() -> Ring:
    return replace(Ring.initial(MEMBERS, 1, 2), incarnations=tuple(sorted(INCARNATIONS.items())))


def machine(name: str = "n0", balance: bool = False, repair_delay: float = 0.0) -> NodeMachine:
    def make_core(node_id, r):
        return NodeCore(node_id, r, load_reducer("count"))
    m = NodeMachine(make_core(name, ring()), INCARNATIONS[name],
                    FailureDetector(DetectorConfig()), LoadMonitor(), make_core,
                    listen=MEMBERS[name], balance=balance, repair_delay=repair_delay)
    m.watch_peers(0.0, 0.0)
    return m


def kinds(effects) -> list[str]:
    return [e.kind for e in effects if isinstance(e, Record)]


def probe_of(m: NodeMachine, now: float) -> StartProbe:
    probes = [e for e in m.handle(MonitorDue(now), now) if isinstance(e, StartProbe)]
    assert probes, "nobody suspected"
    return probes[0]
