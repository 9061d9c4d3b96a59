"""Helpers of tests/simulation/test_member_attacks.py that other test files use too:
held_against_forgeries.
"""

from tests.support.simulation_shared import check


def held_against_forgeries(sim, seed) -> list:
    """A run with forged views from a member kept its meaning: exact counts, nobody
    fenced but a fault's victim, and one ring among the live members (no split).
    Returns those members."""
    check(sim, seed)                              # exact counts, nothing lost
    from tests.support.simulation_shared import assert_forgery_changed_no_verdict
    assert_forgery_changed_no_verdict(sim.log)    # nobody fenced but a fault's victim
    live = [p for p in sim.procs if p.alive and not p.core.fenced]
    stamps = {p.core.ring.stamp for p in live}
    assert len(stamps) == 1, (seed, sim.log)      # converged: no split
    return live
