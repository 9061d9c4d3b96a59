"""Who a starting process is in the ring: pure rules, no I/O.

A node id names a member, and a member's state lives only in the process that runs
it. A process that starts again under the same id (a crash and a restart, a service
restart, a rolling upgrade) has none of that state, so it must never be taken for
the member it replaces, however fast it came back: that member is dead at once (its
ranges pass to their replicas, as after a crash) and the new process joins as a new,
empty member under the next free name `id#k`.

Every process draws an incarnation number at start; the ring records each member's
(`Ring.incarnations`), and peers compare it with the one on every heartbeat and
checkpoint. Before serving anything a starting process asks its peers for their
rings and decides here what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable

from floering.wire.ring import Ring


@dataclass(frozen=True)
class StartDecision:
    node_id: str              # the name this process serves under
    ring: Ring                # its first ring view
    replaces: str = ""        # the member this process is a restart of, now removed
    why: str = ""             # why it does not come back as that member


def base_name(node_id: str) -> str:
    """`n0#2` -> `n0`: the configured id a rejoined member's name derives from."""
    return node_id.split("#", 1)[0]


# What follows a node's name in a later member of the same process: `#` and the
# rejoin number (rejoin_name), plain ASCII decimal, no sign, no leading zero.
_REJOIN_SUFFIX = re.compile(r"#[1-9][0-9]*")


def sender_matches(name: str, sender: str) -> bool:
    """A node's claimed `sender` is its certificate's name exactly, or a later member
    the same process became (`n0#1`, `n0#2` for `n0`; not `n0#`, `n0#x`, `n0#1#2`,
    `n0#01`). An empty sender matches nothing."""
    if not name or not sender.startswith(name):
        return False
    rest = sender[len(name):]
    return rest == "" or _REJOIN_SUFFIX.fullmatch(rest) is not None


def answered_by(ring: Ring, address: str, certificate: str | None) -> str:
    """Whose word a ring view answered at `address` is. `certificate`: the node the
    server's certificate names, as the TLS handshake checked it ("" when it took any
    node's; None in the clear). The member of `ring` at `address` that certificate
    is (that node, or a later member of the same process); in the clear, the one
    member the ring places there, on the address's word alone. Else nobody's:
    `@address`."""
    here = [n for n, a in ring.addresses if a == address]
    if certificate is not None:
        here = [n for n in here if sender_matches(certificate, n)]
    return here[0] if len(here) == 1 else f"@{address}"


def rejoin_name(node_id: str, ring: Ring) -> str:
    """The first `base#k` the ring has never known, live or removed."""
    base = base_name(node_id)
    taken = set(ring.nodes) | ring.removed
    k = 1
    while f"{base}#{k}" in taken:
        k += 1
    return f"{base}#{k}"


def _free(view: Ring, address: str, replaces: str) -> tuple[Ring, str]:
    """`view` without the members still at our address: the process there before us
    (rejoined under a new name, then gone); two members never share an address."""
    here = sorted(n for n, a in view.addresses if a == address)
    if not here:
        return view, replaces
    return view.without(here), replaces or here[0]


def founding_ring(initial: Ring, me: str, incarnation: int) -> Ring:
    """The ring a founding member starts from: `initial` with its own incarnation in
    it (version 1 still: founders' rings differ only by what each has heard)."""
    ring = replace(initial, incarnations=tuple(sorted(
        {**dict(initial.incarnations), me: incarnation}.items())))
    ring.check_invariants()
    return ring


def decide_start(me: str, incarnation: int, address: str, seen: Iterable[Ring],
                 initial: Ring | None = None) -> StartDecision:
    """What a process that just started as `me` is, given the rings its peers
    answered with (`seen`, possibly none) and, for a founding member, the ring it
    would build alone (`initial`; None when it joins a running ring).

    - The ring has `me` with no incarnation heard yet: a founding member takes its
      place (a joiner the same). A name the ring never knew joins empty under it.
    - The ring knows `me` as another incarnation, or removed it: this is a restart.
      The earlier member is removed (declared dead) and the process joins empty as
      the next free `me#k`.
    """
    if incarnation <= 0:
        raise ValueError("an incarnation is a positive number")
    views = list(seen)
    if initial is not None:
        initial = founding_ring(initial, me, incarnation)
    if not views:
        if initial is None:
            raise ValueError("a joining node needs the ring of at least one peer")
        return StartDecision(me, initial)
    view = views[0]
    for other in views[1:]:
        view = view.merge(other)
    known = view.incarnation_of(me)
    if me in view.removed:
        why = f"{me} was removed from the ring (declared dead, or it left)"
    elif known and known != incarnation:
        why = f"{me} is running as incarnation {known} in the ring, this process is {incarnation}"
    elif me in view.nodes:
        mine = view.with_incarnation(me, incarnation)
        return StartDecision(me, mine if initial is None else mine.merge(initial))
    else:   # a name the ring never knew: join under it
        view, replaces = _free(view, address, "")
        return StartDecision(me, view.add_node(me, address, (), incarnation), replaces,
                             f"{replaces} was the process at {address}" if replaces else "")
    replaces = me if me in view.nodes else ""
    if replaces:
        view = view.without([me])
    view, replaces = _free(view, address, replaces)
    name = rejoin_name(me, view)
    return StartDecision(name, view.add_node(name, address, (), incarnation), replaces, why)


def idle_members(ring: Ring) -> list[str]:
    """Members that own no range and are no extra destination of one (joined or
    rejoined empty, and not being handed anything)."""
    busy = set(ring.owners) | {x for t in ring.tokens for x in ring.extras_of(t)}
    return sorted(n for n in ring.nodes if n not in busy)


# Seconds a member that handed us ranges is no refill target: it is emptying itself
# (a leave, an operator's move), and a refill would hand them straight back; a
# leaver of a ring of r+1 members would bounce its ranges until its leave ended.
DONOR_QUIET = 10.0


class RecentDonors:
    """Members still in the ring that handed us ranges, and when (bounded by the
    ring's members: an entry goes once it is DONOR_QUIET old)."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def saw(self, ring: Ring, previous_owners, now: float) -> None:
        for node in previous_owners:
            if node in ring.nodes:
                self.since[node] = now

    def quiet(self, ring: Ring, now: float) -> frozenset[str]:
        self.since = {n: t for n, t in self.since.items()
                      if n in ring.nodes and now - t < DONOR_QUIET}
        return frozenset(self.since)


def refill_moves(ring: Ring, me: str, quiet: frozenset[str] = frozenset()) -> dict[int, str]:
    """The ranges `me` hands to an idle member because the ring has too few owners
    to keep r replicas of `me`'s ranges (a restarted node comes back empty, and a
    member with no range backs up none). Empty when replication is whole, when a
    handoff is under way anywhere (wait for it: it may be the refill), or when `me`
    owns a single range. Each owner gives an equal share; the first idle member
    takes it, so owners that decide at once agree on the target. Members in `quiet`
    (RecentDonors) are never the target."""
    mine = [t for t in ring.tokens_of(me) if t not in ring.lost]
    idle = [n for n in idle_members(ring) if n not in quiet]
    if len(mine) < 2 or not idle or ring.extras:
        return {}
    want = min(ring.replication, len(ring.nodes) - 1)
    if all(len(ring.regular_replicas(t)) >= want for t in mine):
        return {}
    owners = len(set(ring.owners))
    give = max(1, len(mine) // (owners + 1))
    step = len(mine) / give
    return {mine[int(i * step)]: idle[0] for i in range(give)}


def removal_losses(core, node: str) -> list[int]:
    """The ranges of `node` that removing it would lose, as far as `core` (a NodeCore)
    can tell: those the removal itself marks lost (every copy on removed nodes), and
    those it would hand `core`'s node while it holds no complete copy of them (it
    would take them over empty: its copy is filled by their owner's checkpoints after
    a takeover or a handoff). Sorted; empty when the removal loses nothing we know of."""
    ring, me = core.ring, core.node_id
    if node not in ring.nodes or node == me:
        return []
    try:
        new = ring.without([node])
    except ValueError:
        return []
    return sorted(t for t in ring.tokens_of(node) if t not in ring.lost and (
        t in new.lost or (new.owner_of_token(t) == me and not core.replicas.is_complete(t))))


def restarted(ring: Ring, node: str, incarnation: int) -> bool:
    """A message from `node` sent by another process than the one the ring knows for
    it: the member restarted and its state is gone (0 says nothing either way)."""
    known = ring.incarnation_of(node)
    return bool(incarnation and known and known != incarnation)


def ready_to_decide(answered: int, starting: int, asked: int, joining: bool,
                    waited_out: bool) -> bool:
    """May a starting process decide who it is, having asked `asked` peers, of which
    `answered` answered and `starting` of those are starting too? Yes once a running
    peer answered; a founder also once every peer answered as starting (a fresh
    cluster) or, after its start-up grace, any did. With no peer to ask, at once."""
    if not asked:
        return True
    if answered > starting:
        return True
    return not joining and answered > 0 and (answered == asked or waited_out)
