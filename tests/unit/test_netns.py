"""Nodes on hosts of their own: every node in its own network namespace with its own
address, joined by veth pairs to a bridge in a namespace of its own, a mapper on
another host, and the test's own process on the switch as a read-only observer
(chaos.netns). Faults are made at the switch, so the hosts see silence, as on a real
network: a node's cable pulled, a partition between chosen hosts, a lossy link.

Counts are exact throughout, checked against a Counter of everything fed (here) or
tuple by tuple against the mappers' journals (the chaos scenarios below).

Needs root, iproute2 and tc; skipped otherwise. Every namespace and link is made here
(or by the harness) and removed pass or fail, and a test fails if any is left; every
process is stopped by its own pid."""

from __future__ import annotations


import pytest

from floering.chaos import netns
from floering.chaos.harness import run_scenario
from floering.chaos.scenarios import BUILTIN


# ------------------------------------------------------------------- pure parts

def run_bpf(program: str, frame: bytes, rand: int = 0) -> int:
    """Run a classic BPF program as `tc ... bytecode` takes it, on one frame, with
    the kernel's random number `rand` (only what bpf_program emits)."""
    ops = [tuple(int(x) for x in op.split()) for op in program.split(",")[1:]]
    assert len(ops) == int(program.split(",")[0])
    a, pc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x28:                               # ldh [k]
            a = int.from_bytes(frame[k:k + 2], "big")
        elif code == 0x20:                             # ld [k], or ld rand
            a = rand if k == netns.SKF_AD_RANDOM else int.from_bytes(frame[k:k + 4], "big")
        elif code == 0x05:                             # ja
            pc += k
        elif code in (0x15, 0x25):                     # jeq, jgt
            pc += jt if (a == k if code == 0x15 else a > k) else jf
        elif code == 0x06:                             # ret
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


def frame(source: str, ethertype: int = 0x0800) -> bytes:
    import ipaddress
    ip = bytes(12) + ipaddress.IPv4Address(source).packed + bytes(4)
    return bytes(12) + ethertype.to_bytes(2, "big") + ip


def test_the_switch_drops_the_blocked_sources_and_a_random_share():
    drop, keep = netns.TC_ACT_SHOT, netns.TC_ACT_OK
    both = netns.bpf_program(["10.77.1.1", "10.77.1.3"], 0.25)
    assert run_bpf(both, frame("10.77.1.1")) == drop
    assert run_bpf(both, frame("10.77.1.3"), rand=2 ** 32 - 1) == drop
    assert run_bpf(both, frame("10.77.1.2"), rand=2 ** 31) == keep        # 0.5 > 0.25
    assert run_bpf(both, frame("10.77.1.2"), rand=2 ** 29) == drop        # 0.125
    assert run_bpf(both, frame("10.77.1.1", ethertype=0x0806)) == keep    # ARP passes
    blocked = netns.bpf_program(["10.77.1.1"], 0.0)
    assert run_bpf(blocked, frame("10.77.1.1")) == drop
    assert run_bpf(blocked, frame("10.77.1.2")) == keep
    lossy = netns.bpf_program([], 0.1)
    kept = sum(run_bpf(lossy, frame("10.77.1.2"), rand=r) == keep
               for r in range(0, 2 ** 32, 2 ** 22))
    assert kept == 1024 - 103                                             # 10% dropped


def test_network_faults_are_planned_on_hosts_of_their_own():
    from floering.chaos.scenarios import Fault, Load, Round, Scenario, loses_data, plan, ring_order
    for name in ("minority-partition", "minority-partition-mapper"):
        scenario = BUILTIN[name]
        for seed in range(20):
            (fault,), = plan(scenario, seed)
            assert len(fault.victims) == 2 and fault.hold > 0
            assert not loses_data(ring_order(5), fault.victims, 1)        # never neighbours
            assert set(fault.apart) == {f"n{i}" for i in range(5)} - set(fault.victims)
    (fault,), = plan(BUILTIN["minority-partition-mapper"], 1)
    assert fault.mappers_with == "minority"
    (fault,), = plan(BUILTIN["partition-primary"], 1)
    assert fault.mappers_with == "both" and dict(fault.ranges)[fault.victims[0]]
    (fault,), = plan(BUILTIN["partition-from-replica"], 1)
    order = ring_order(3)
    (victim,) = fault.victims
    assert fault.apart == (order[(order.index(victim) + 1) % 3],) and not fault.ranges
    (fault,), = plan(BUILTIN["adjacent-minority-r2"], 1)
    assert loses_data(ring_order(5), fault.victims, 1)                  # neighbours
    (fault,), = plan(BUILTIN["lossy-link"], 1)
    assert fault.loss == 0.1 and len(fault.victims) == 1 and not fault.ranges
    kinds = {s.name: {f.kind for r in s.rounds for f in r.faults} for s in BUILTIN.values()}
    assert all(s.netns and s.load.ids for s in BUILTIN.values()
               if kinds[s.name] & {"partition", "lossy-link"})
    with pytest.raises(ValueError, match="loss"):
        Fault("lossy-link", "one", loss=1.5)
    with pytest.raises(ValueError, match="partition"):
        Fault("kill", "minority")
    with pytest.raises(ValueError, match="no minority"):
        plan(Scenario("t", "", 4, 1, (Round((Fault("partition", "minority", count=2),)),)), 1)
    with pytest.raises(ValueError, match="every copy"):
        plan(Scenario("t", "", 5, 1, (Round((Fault("partition", "adjacent-minority",
                                                   count=2),)),)), 1)
    with pytest.raises(ValueError, match="hosts of their own"):
        Scenario("t", "", 4, 1, (Round((Fault("partition"), Fault("restart"))),), Load())


def test_a_network_scenario_is_skipped_with_its_reason_unless_root(tmp_path, monkeypatch):
    from floering.chaos.harness import summary_table
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    result = run_scenario(BUILTIN["lossy-link"], seed=1, out=tmp_path, plots=False)
    assert "need root" in result["skipped"] and not result["rounds"] and not result["ok"]
    assert summary_table(result).startswith("SKIP: lossy-link seed 1: network namespaces")


def test_a_confirmation_after_a_long_unconfirmed_suspicion_starts_the_suspicion_anew():
    """The detector side of partition-primary-long (docs/chaos.md), on an explicit
    clock: 20 s of unconfirmed rounds (no quorum answered: we may be the one cut off),
    then one round a quorum answers. That round is the first evidence against the
    suspect; it starts the suspicion period (1 s) rather than ending it (it used to
    declare at once). The node machine besides counts no round until a peer's ring
    view reached it after the heal (tests/unit/test_machine.py, tests/simulation/test_partitions.py)."""
    from floering.node.core.detector import (DEAD, SUSPECT, TIMED_OUT, UNCONFIRMED,
                                    DetectorConfig, FailureDetector)
    d = FailureDetector(DetectorConfig(min_timeout=0.2, probe_timeout=0.15, suspicion=1.0))
    d.watch({"n0"}, now=0.0)
    now = 0.3
    while now < 20.0:
        (probe,) = d.due_probes(now)
        now += probe.deadline
        assert d.probe_result(probe, UNCONFIRMED, now) == SUSPECT
    (probe,) = d.due_probes(now)
    now += probe.deadline
    assert d.probe_result(probe, TIMED_OUT, now) == SUSPECT       # it was DEAD
    while True:
        (probe,) = d.due_probes(now)
        now += probe.deadline
        if d.probe_result(probe, TIMED_OUT, now) == DEAD:
            break
    assert now >= 21.0


# ----------------------------------------------------------------- three hosts


# ------------------------------------------------------- the chaos scenarios on hosts
