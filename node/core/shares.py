"""Ring shares back to even after a membership change, decided from the ring alone
(pure: the same ring gives every node the same answer).

- A member with no range pulls (a crashed node back as a new, empty incarnation, a
  node that joined and was given nothing, any member left with nothing): it asks the
  member with the largest share of the ring for ranges, and that member hands over
  whole ranges until the two are as close to the mean share as whole ranges allow.
  Under a policy that does not move ranges by load (`none`, and the key-grouping
  ones) it goes on asking the largest member while it is below the mean share and a
  range brings it closer; under `floe`, `halving` and `doubling` it pulls once, as
  their load shedding makes uneven shares on purpose. A member that held ranges all
  along never pulls, so an operator's `floe move` is not undone, except after a
  member was removed from the ring (`short_after_removal`): a crash with no restart
  is a scale-in whose heirs took the dead member's ranges over (one may hold a
  double share), so a member then below the mean while the ring is uneven pulls as
  an empty one does, while below the mean and until no whole range brings it
  closer; from then on a later `floe move` stays too.
- A leaving member spreads its ranges (`spread_leave`): each goes to its first
  replica (which already holds it) while that one stays within the mean share the
  ring will have without the leaver, otherwise to the member with the smallest share
  (filled in the background first, as in a scale-out), so no neighbour ends with a
  double share.

The pull is the receiver's to start, since only it knows it is not leaving (a member
on its way out neither pulls nor gives: `begin_leaving`); the donor recomputes the
plan from its own ring and hands over only what the rule names.
Nothing is planned while any handoff is under way (the ring has extra destinations):
an operator's moves, a refill or another pull go first, and the next plan sees them.
Nor does a donor hand a share over while a range of its own lacks a copy on a replica
the ring names (re-replication after a member left): the handoff's ring changes would
turn the full copies in flight away as stale and they would start again, each time
(`copies_owed`; a replica whose checkpoints keep failing does not hold it back). The
member asks again after --share-pull-interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from floering.wire.balancers import balancer
from floering.wire.hashing import HASH_SPACE
from floering.wire.ring import Ring

if TYPE_CHECKING:
    from floering.node.core.node_core import NodeCore

# Checkpoint rounds a replica may fail in a row (5 s at the default interval: longer
# than any detection) before it is reported (NodeMachine): its copy of the range is
# going stale and the batches backed up for it pile up.
FAILING_ROUNDS = 25
# Seconds a member stays short before it pulls: an operator who just added it
# (`floe scale --add`) hands it ranges first.
PULL_GRACE = 3.0
# Seconds between two pulls of one member (a handoff shows in the ring well before).
PULL_INTERVAL = 2.0
# After a member is removed, a member below the mean share pulls when it or the
# largest member is further than this part of the mean from it.
REMOVAL_SLACK = 0.1


def _size(ring: Ring, token: int) -> float:
    return Ring.range_size(ring.range_of_token(token)) / HASH_SPACE


def short_of_share(ring: Ring, node: str, filling: bool = True) -> bool:
    """Does `node` own too little of the ring? With no range, always; `filling` (it
    had none when it started pulling), while below the mean share, under a policy
    that does not move ranges by load."""
    if node not in ring.nodes or len(ring.nodes) < 2:
        return False
    if not ring.tokens_of(node):
        return True
    if not filling or balancer(ring.balancer).moves_ranges:
        return False
    return ring.share_of(node) < 1 / len(ring.nodes) - 1e-12


def short_after_removal(ring: Ring, node: str) -> bool:
    """Asked when a member was just removed from the ring: is `node` below the mean
    share while the ring is uneven (`node` below the mean by more than REMOVAL_SLACK
    of it, or the largest share above it by more)? Then it pulls, as a member with no
    range does."""
    if node not in ring.nodes or len(ring.nodes) < 2:
        return False
    mean, mine = 1 / len(ring.nodes), ring.share_of(node)
    largest = max(ring.share_of(n) for n in ring.nodes)
    return mine < mean - 1e-12 and (mine < (1 - REMOVAL_SLACK) * mean
                                    or largest > (1 + REMOVAL_SLACK) * mean)


def pull_plan(ring: Ring, node: str, filling: bool = True) -> tuple[str, dict[int, str]]:
    """(donor, {token: node}): the ranges the member with the largest share hands to
    `node`, which is short of its share; ("", {}) when there is nothing to pull.
    Largest ranges first, each only if it brings `node` closer to the mean share and
    keeps the donor at the mean at least; when no range does, one that narrows the
    pair's larger distance from the mean (whole ranges are coarse). Either way every
    pull lowers the sum of squared shares, so pulls end. The donor keeps a range."""
    if ring.extras or not short_of_share(ring, node, filling):
        return "", {}
    shares = {n: ring.share_of(n) for n in ring.nodes}
    donor = max((n for n in ring.nodes if n != node), key=lambda n: (shares[n], n))
    moves = _take(ring, donor, shares[node], shares[donor], strict=True) or \
        _take(ring, donor, shares[node], shares[donor], strict=False)
    return (donor, dict.fromkeys(moves, node)) if moves else ("", {})


def _take(ring: Ring, donor: str, mine: float, theirs: float, strict: bool) -> list[int]:
    mean = 1 / len(ring.nodes)
    owned = ring.tokens_of(donor)
    taken: list[int] = []
    for token in sorted((t for t in owned if t not in ring.lost),
                        key=lambda t: (-_size(ring, t), t)):
        if len(taken) + 1 >= len(owned):
            break
        size = _size(ring, token)
        if strict and abs(mine + size - mean) >= abs(mine - mean):
            continue
        worst = max(abs(mine - mean), abs(theirs - mean))
        if theirs - size >= mean - 1e-12 if strict else \
                max(abs(mine + size - mean), abs(theirs - size - mean)) < worst - 1e-12:
            taken.append(token)
            mine, theirs = mine + size, theirs - size
    return taken


def spread_leave(ring: Ring, me: str) -> dict[int, str]:
    """{token: member}: where each of `me`'s ranges goes when `me` leaves. Largest
    first; to its first replica while that one stays within the mean share of the
    ring without `me`, else to the member with the smallest share (ties: by name)."""
    others = [n for n in ring.nodes if n != me]
    if not others:
        return {}
    mean = 1 / len(others)
    shares = {n: ring.share_of(n) for n in others}
    moves = {}
    for token in sorted(ring.tokens_of(me), key=lambda t: (-_size(ring, t), t)):
        size, heir = _size(ring, token), ring.heir(token)
        if heir in shares and shares[heir] + size <= mean + 1e-12:
            to = heir
        else:
            to = min(others, key=lambda n: (shares[n], n))
        moves[token] = to
        shares[to] += size
    return moves


@dataclass(frozen=True)
class PullRanges:
    """Effect: ask `donor` (at `address`) for ranges; it hands what the rule names."""

    donor: str
    address: str
    ranges: int


class SharePulling:
    """The node machine's part (a mixin of NodeMachine): when a member short of its
    share pulls, and what a donor hands to a member that asks."""

    core: NodeCore                       # the machine's
    leaving: bool                        # the machine's: on its way out of the ring
    failing: dict[tuple[int, str], int]  # the machine's: (token, replica) -> failed rounds
    short_since: float | None = None     # first seen short (None: not short)
    pull_after: float = 0.0              # no new pull before this time
    filling = False                      # had no range, or a member was removed,
                                         # when it began pulling
    members_seen = 0                     # members of the ring at the last look
    departing = False                    # handing everything away to leave
    pull_grace = PULL_GRACE              # the node's --share-pull-grace
    pull_interval = PULL_INTERVAL        # the node's --share-pull-interval

    def begin_leaving(self) -> None:
        """A member on its way out neither pulls nor hands ranges to one that asks."""
        self.departing = True

    def _pull_due(self, now: float, out: list) -> None:
        core = self.core
        if self.departing:
            return
        ring, me = core.ring, core.node_id
        shrank, self.members_seen = len(ring.nodes) < self.members_seen, len(ring.nodes)
        self.filling = (not ring.tokens_of(me) or (shrank and short_after_removal(ring, me))
                        or (self.filling and short_of_share(ring, me)))
        donor, moves = pull_plan(ring, me, self.filling)
        if not moves:
            # Filled as far as whole ranges allow: from now on only an empty ring
            # share or another removal makes it pull, so an operator's move stays.
            self.filling = self.filling and bool(ring.extras)
            self.short_since = None
            return
        if self.short_since is None:
            self.short_since = now
        if now < self.short_since + self.pull_grace or now < self.pull_after:
            return
        self.pull_after = now + self.pull_interval
        out.append(PullRanges(donor, core.ring.address(donor), len(moves)))

    def share_moves_for(self, sender: str) -> dict[int, str] | None:
        """What we hand to `sender`, which asked us to shed: None when it is not short
        of its share (an ordinary shedding request), else the ranges the rule names
        from us (empty: another member is the donor, or a handoff runs somewhere)."""
        core = self.core
        if self.leaving or core.fenced or not short_of_share(core.ring, sender):
            return None
        donor, moves = pull_plan(core.ring, sender)
        if donor != core.node_id or self.departing or self.copies_owed():
            return {}
        return moves

    def copies_owed(self) -> bool:
        """Whether a range of ours lacks a copy on a replica the ring names, one whose
        checkpoints are not failing round after round (FAILING_ROUNDS)."""
        core = self.core
        replicas_of = core.ring.replicas_of_token
        return any(rng.replica_seq.get(r) is None
                   and self.failing.get((token, r), 0) < FAILING_ROUNDS
                   for token, rng in core.primaries.items() for r in replicas_of(token))
