"""Ring views no honest member can have sent: what a node's checks on an arriving view
must refuse whatever its sender's certificate. Pure; the hostile tool pushes them to
real nodes and the simulation forges them under a member's name."""

from __future__ import annotations

from dataclasses import replace

from floering.wire.ring import Ring


def forged_views(ring: Ring) -> dict[str, Ring]:
    """Views no honest member can have sent."""
    victim = ring.nodes[-1]
    return {"replication": replace(ring, replication=ring.replication + 1)
            .with_version(ring.version + 1),
            "moved member": replace(ring, addresses=tuple(
                (n, "127.0.0.1:1" if n == victim else a) for n, a in ring.addresses))
            .with_version(ring.version + 1),
            "every range lost": replace(ring, lost=frozenset(ring.tokens))
            .with_version(ring.version + 1)}
