"""The ring as an immutable value.

Positions are unsigned 64-bit. A position belongs to the first token clockwise at or
after it (wrapping), so token t owns the range (previous token, t]. Every change returns
a new Ring with version + 1; nothing mutates a ring in place, so a ring can be shared
between tasks and compared by value.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import mmh3
import msgpack

from floering.wire.balancers import BALANCERS
from floering.wire.balancers import DEFAULT as DEFAULT_BALANCER
from floering.wire.errors import InvalidArgument, inert
from floering.wire.hashing import HASH_SPACE, position
from floering.wire.ring_merge import merge_rings, retiring_by_token
from floering.wire.ring_wire import (MAX_REPLICATION, MAX_VERSION,  # noqa: F401
                                          MAX_INCARNATION, decode_view, replica_walks)


@dataclass(frozen=True)
class Ring:
    version: int
    replication: int
    tokens: tuple[int, ...]
    owners: tuple[str, ...]
    addresses: tuple[tuple[str, str], ...]
    # Nodes declared dead or removed. Permanent: such a node is fenced and may only
    # come back as a new, empty member. Kept so concurrent removals merge.
    removed: frozenset[str] = frozenset()
    # Tokens whose every copy died at once (more than r consecutive failures): their
    # owner serves new tuples but refuses queries, loudly, instead of partial counts.
    lost: frozenset[int] = frozenset()
    # Per token, how often its owner or extra replicas changed. Merging two views keeps,
    # per token, the entry with the higher generation: a handoff is never undone by a
    # concurrent, unrelated ring change, and every node merges to the same ring.
    generations: tuple[int, ...] = ()
    # Extra destinations of a token beyond its r replicas, sorted by token: the nodes a
    # handoff will make destinations, filled with the range's state before it commits
    # (the "delayed transition"). Mappers send them the token's tuples too.
    extras: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # Extras that hold a complete copy: former destinations kept after a handoff until
    # the token's new replicas are filled. A removed owner's token goes to one of them.
    retiring: frozenset[tuple[int, str]] = frozenset()
    # Per member, the incarnation of the process behind it (a number each process
    # draws at start), once someone has heard it. A member seen with two different
    # incarnations restarted: the state its first process held is gone, so merging
    # removes it (its ranges pass to their replicas, as after a crash), and the new
    # process comes back under another name.
    incarnations: tuple[tuple[str, int], ...] = ()
    # The load-balancing policy (wire.balancers), fixed when the ring is founded.
    balancer: str = DEFAULT_BALANCER
    # The reducer every member runs (node.core.reducers.reducer_identity); "": not recorded.
    reducer: str = ""
    # Lookup tables derived once: lookups are on hot paths.
    _index: dict = field(init=False, repr=False, compare=False)
    _address: dict = field(init=False, repr=False, compare=False)
    _destinations: tuple = field(init=False, repr=False, compare=False)
    _walks: tuple = field(init=False, repr=False, compare=False)
    _extras: dict = field(init=False, repr=False, compare=False)
    _incarnation: dict = field(init=False, repr=False, compare=False)
    _tokens_of: dict = field(init=False, repr=False, compare=False)
    stamp: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.generations:
            object.__setattr__(self, "generations", (0,) * len(self.tokens))
        # The stamp is what RPCs carry: the version plus a digest of the content, so
        # two different rings that happen to share a version number (concurrent
        # removals not yet merged) are never taken for the same one.
        content = msgpack.packb((self.replication, self.tokens, self.owners, self.addresses,
                                 sorted(self.removed), sorted(self.lost), self.generations,
                                 self.extras, sorted(self.retiring), self.incarnations)
                                + ((self.balancer,) if self.balancer != DEFAULT_BALANCER
                                   else ()) + ((self.reducer,) if self.reducer else ()))
        digest = mmh3.hash(content, seed=0, signed=False) & 0xFFFFFF
        object.__setattr__(self, "stamp", (self.version << 24) | digest)
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})
        object.__setattr__(self, "_address", dict(self.addresses))
        object.__setattr__(self, "_extras", dict(self.extras))
        object.__setattr__(self, "_incarnation", dict(self.incarnations))
        tokens_of: dict[str, list[int]] = {}
        for token, owner in zip(self.tokens, self.owners):
            tokens_of.setdefault(owner, []).append(token)
        object.__setattr__(self, "_tokens_of", {n: tuple(ts) for n, ts in tokens_of.items()})
        walks = replica_walks(self.owners, self.replication)
        object.__setattr__(self, "_walks", walks)
        object.__setattr__(self, "_destinations",
                           tuple(self._walk(i) for i in range(len(self.tokens))))

    def _walk(self, index: int) -> tuple[str, ...]:
        """Owner of tokens[index], then up to r distinct other nodes clockwise, then
        the token's extra destinations."""
        chosen = (self.owners[index], *self._walks[index])
        more = self._extras.get(self.tokens[index], ())
        return chosen + tuple(n for n in more if n not in chosen) if more else chosen

    # ------------------------------------------------------------ building

    @classmethod
    def initial(cls, members: Mapping[str, str], replication: int,
                tokens_per_node: int, balancer: str = DEFAULT_BALANCER,
                reducer: str = "") -> "Ring":
        """Evenly spaced tokens dealt round-robin: consecutive tokens belong to
        consecutive nodes, so each node's clockwise neighbour is its replica."""
        if not members:
            raise ValueError("a ring needs at least one member")
        if replication < 0:
            raise ValueError("replication must be >= 0")
        if tokens_per_node < 1:
            raise ValueError("tokens_per_node must be >= 1")
        ids = sorted(members)
        total = len(ids) * tokens_per_node
        tokens = tuple((i + 1) * HASH_SPACE // total - 1 for i in range(total))
        owners = tuple(ids[i % len(ids)] for i in range(total))
        return cls(1, replication, tokens, owners, tuple((n, members[n]) for n in ids),
                   balancer=balancer, reducer=reducer)

    # ------------------------------------------------------------- lookups

    def token_index(self, pos: int) -> int:
        i = bisect_left(self.tokens, pos)
        return 0 if i == len(self.tokens) else i

    def token_for_position(self, pos: int) -> int:
        return self.tokens[self.token_index(pos)]

    def token_for_key(self, key) -> int:
        return self.tokens[self.token_index(position(key))]

    def has_token(self, token: int) -> bool:
        return token in self._index

    def owner_of_token(self, token: int) -> str:
        return self.owners[self._index[token]]

    def owner(self, key) -> str:
        return self.owners[self.token_index(position(key))]

    def destinations(self, token: int) -> tuple[str, ...]:
        return self._destinations[self._index[token]]

    def regular_replicas(self, token: int) -> tuple[str, ...]:
        """The r nodes clockwise after the owner, without extra destinations."""
        return self._walk_only(self._index[token])

    def _walk_only(self, index: int) -> tuple[str, ...]:
        return self._walks[index]

    def replicas_of_token(self, token: int) -> tuple[str, ...]:
        return self._destinations[self._index[token]][1:]

    def replicas(self, key) -> tuple[str, ...]:
        return self._destinations[self.token_index(position(key))][1:]

    def heir(self, token: int) -> str | None:
        replicas = self.replicas_of_token(token)
        return replicas[0] if replicas else None

    def role_of(self, node: str, token: int) -> str | None:
        dest = self.destinations(token)
        if dest[0] == node:
            return "primary"
        return "replica" if node in dest else None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.addresses)

    def address(self, node: str) -> str:
        try:
            return self._address[node]
        except KeyError:
            raise ValueError(f"node {inert(node)} is not in ring version {self.version}") from None

    def tokens_of(self, node: str) -> tuple[int, ...]:
        return self._tokens_of.get(node, ())

    def range_of_token(self, token: int) -> tuple[int, int]:
        i = self._index[token]
        return self.tokens[i - 1], token  # i - 1 == -1 wraps to the last token

    def ranges_of(self, node: str) -> list[tuple[int, int]]:
        return [self.range_of_token(t) for t in self.tokens_of(node)]

    @staticmethod
    def range_size(rng: tuple[int, int]) -> int:
        lo, hi = rng
        return (hi - lo) % HASH_SPACE or HASH_SPACE  # lo == hi: the whole ring

    def share_of(self, node: str) -> float:
        return sum(self.range_size(r) for r in self.ranges_of(node)) / HASH_SPACE

    @staticmethod
    def in_range(pos: int, rng: tuple[int, int]) -> bool:
        lo, hi = rng
        if lo < hi:
            return lo < pos <= hi
        if lo > hi:
            return pos > lo or pos <= hi
        return True  # one token: the whole ring

    # ------------------------------------------------------------- changes

    def _with(self, **changes) -> "Ring":
        values: dict[str, Any] = dict(version=self.version + 1, replication=self.replication,
                      tokens=self.tokens, owners=self.owners, addresses=self.addresses,
                      removed=self.removed, lost=self.lost, generations=self.generations,
                      extras=self.extras, retiring=self.retiring,
                      incarnations=self.incarnations, balancer=self.balancer,
                      reducer=self.reducer)
        values.update(changes)
        ring = Ring(**values)
        ring.check_invariants()
        return ring

    def with_version(self, version: int) -> "Ring":
        return self._with(version=version)

    def extras_of(self, token: int) -> tuple[str, ...]:
        return self._extras.get(token, ())

    def generation_of(self, token: int) -> int:
        return self.generations[self._index[token]]

    def with_lost(self, tokens: Iterable[int]) -> "Ring":
        return self._with(lost=self.lost | frozenset(tokens))

    def with_token_owner(self, token: int, node: str) -> "Ring":
        """Hand a token to `node`: its extra destinations become ordinary ones."""
        return self.with_owners({token: node})

    def with_owners(self, moves: Mapping[int, str]) -> "Ring":
        owners, generations = list(self.owners), list(self.generations)
        extras = dict(self._extras)
        for token, node in moves.items():
            if node not in self._address:
                raise ValueError(f"node {node!r} is not a member")
            if token not in self._index:
                raise ValueError(f"no token {token} in ring version {self.version}")
            i = self._index[token]
            owners[i] = node
            generations[i] += 1
            extras.pop(token, None)
        return self._with(owners=tuple(owners), generations=tuple(generations),
                          extras=tuple(sorted(extras.items())),
                          retiring=frozenset(p for p in self.retiring if p[0] not in moves))

    def with_extras(self, extras_by_token: Mapping[int, Iterable[str]],
                    holding: Iterable[tuple[int, str]] = ()) -> "Ring":
        """Set (or clear, with an empty list) the extra destinations of tokens;
        `holding` marks (token, node) extras that hold a complete copy."""
        holding = set(holding)
        generations = list(self.generations)
        extras = dict(self._extras)
        for token, nodes in extras_by_token.items():
            nodes = tuple(sorted(set(nodes)))
            if not set(nodes) <= set(self._address):
                raise ValueError(f"extra destinations {nodes} are not all members")
            if token not in self._index:
                raise ValueError(f"no token {token} in ring version {self.version}")
            if nodes == extras.get(token, ()) and not any(p[0] == token for p in holding):
                continue
            generations[self._index[token]] += 1
            if nodes:
                extras[token] = nodes
            else:
                extras.pop(token, None)
        # A holder stays marked while it stays an extra (re-pinned by a new prepare).
        retiring = {p for p in self.retiring if p[1] in extras.get(p[0], ())} | {
            p for p in holding if p[1] in extras.get(p[0], ())}
        return self._with(generations=tuple(generations), extras=tuple(sorted(extras.items())),
                          retiring=frozenset(retiring))

    def move_token(self, token: int, new_position: int) -> "Ring":
        i = self._index[token]
        n = len(self.tokens)
        if n > 1:
            prev, nxt = self.tokens[i - 1], self.tokens[(i + 1) % n]
            if new_position in self._index or not self.in_range(new_position, (prev, nxt)) \
                    or new_position == nxt:
                raise ValueError(f"cannot move token {token} to {new_position}: outside "
                                 f"({prev}, {nxt}) or taken")
        if not 0 <= new_position < HASH_SPACE:
            raise ValueError(f"position {new_position} outside the hash space")
        if self._extras:
            raise ValueError("cannot move a token while a handoff is in progress")
        pairs = sorted((new_position if t == token else t, o, g)
                       for t, o, g in zip(self.tokens, self.owners, self.generations))
        return self._with(tokens=tuple(p[0] for p in pairs), owners=tuple(p[1] for p in pairs),
                          generations=tuple(p[2] for p in pairs))

    def split_token(self, token: int, position: int) -> "Ring":
        """Cut the range (a, token] at `position`: a new token `position` takes (a,
        position] and `token` keeps (position, token]. Both keep the owner, the
        generation and (being empty: a split waits for handoffs to end) no extras, so
        every destination stays the same; a lost range stays lost in both halves.
        Merging keeps the new token (merge is a per-token union), so concurrent views
        converge; holders of the range split their state when they adopt it."""
        if token not in self._index:
            raise ValueError(f"no token {token} in ring version {self.version}")
        if position in self._index:
            raise ValueError(f"position {position:#x} is already a token")
        if not 0 <= position < HASH_SPACE or not self.in_range(position, self.range_of_token(token)):
            raise ValueError(f"position {position:#x} is not inside the range of token {token:#x}")
        if self.extras_of(token):
            raise ValueError(f"token {token:#x} is being handed off; split it afterwards")
        i = self._index[token]
        pairs = sorted(list(zip(self.tokens, self.owners, self.generations))
                       + [(position, self.owners[i], self.generations[i])])
        lost = self.lost | {position} if token in self.lost else self.lost
        return self._with(tokens=tuple(p[0] for p in pairs), owners=tuple(p[1] for p in pairs),
                          generations=tuple(p[2] for p in pairs), lost=lost)

    def add_node(self, node: str, address: str, tokens: Iterable[int],
                 incarnation: int = 0) -> "Ring":
        if node in self._address:
            raise ValueError(f"node {node!r} is already a member")
        new = list(tokens)
        if any(t in self._index for t in new) or len(set(new)) != len(new):
            raise ValueError("new tokens collide with existing ones")
        pairs = sorted(list(zip(self.tokens, self.owners, self.generations))
                       + [(t, node, 0) for t in new])
        known = self.incarnations + (((node, incarnation),) if incarnation else ())
        return self._with(tokens=tuple(p[0] for p in pairs), owners=tuple(p[1] for p in pairs),
                          generations=tuple(p[2] for p in pairs),
                          addresses=tuple(sorted(self.addresses + ((node, address),))),
                          incarnations=tuple(sorted(known)))

    def remove_node(self, node: str) -> "Ring":
        """Each of the node's tokens goes to its heir (the next distinct node clockwise,
        which is the first replica when r >= 1)."""
        if node not in self._address:
            raise ValueError(f"node {node!r} is not a member")
        if len(self.addresses) == 1:
            raise ValueError("cannot remove the last node")
        owners, generations = list(self.owners), list(self.generations)
        n = len(owners)
        gone = self.removed | {node}
        lost = set(self.lost)
        retiring = retiring_by_token(self)
        for i, owner in enumerate(self.owners):
            if owner == node:
                holders = sorted(retiring.get(self.tokens[i], frozenset()) - {node})
                heir = holders[0] if holders else next(
                    (self.owners[(i + s) % n] for s in range(1, n)
                     if self.owners[(i + s) % n] != node), None)
                if heir is None:
                    # The node owned every range: a member with none (one that joined
                    # or rejoined empty) takes them, with nothing to rebuild them from.
                    heir = min(x for x in self._address if x != node)
                    lost.add(self.tokens[i])
                owners[i] = heir
                generations[i] += 1
                if set(self._destinations[i]) <= gone:
                    lost.add(self.tokens[i])
        extras = {}
        for token, nodes in self.extras:
            # A handoff of the removed node's own token dies with it.
            kept = () if self.owner_of_token(token) == node else \
                tuple(x for x in nodes if x != node)
            if kept != nodes:
                generations[self._index[token]] += 1
            if kept:
                extras[token] = kept
        kept_retiring = frozenset((t, x) for t, x in self.retiring
                                  if x != node and x in extras.get(t, ()))
        kept_retiring -= {(t, x) for t, x in kept_retiring if owners[self._index[t]] == x}
        return self._with(owners=tuple(owners), generations=tuple(generations),
                          extras=tuple(sorted(extras.items())), retiring=kept_retiring,
                          addresses=tuple(a for a in self.addresses if a[0] != node),
                          removed=frozenset(gone), lost=frozenset(lost),
                          incarnations=tuple(p for p in self.incarnations if p[0] != node))

    def without(self, nodes: Iterable[str]) -> "Ring":
        """Remove several nodes in one change (version + 1). The result does not depend
        on the order: each token goes to the next token's owner that survives."""
        ring = self
        for node in sorted(set(nodes) - self.removed):
            if node in ring._address and len(ring.addresses) > 1:
                ring = ring.remove_node(node)
        if ring is self:
            return self
        # Loss is judged on the copies that existed before: removing A then its
        # replica B one at a time would otherwise look like a clean handover.
        gone = ring.removed
        lost = {t for t, dest in zip(self.tokens, self._destinations) if set(dest) <= gone}
        return ring._with(version=self.version + 1, lost=ring.lost | lost)

    def merge(self, other: "Ring") -> "Ring":
        """Combine two views; every node that merges the same two views reaches the
        same ring, whichever it held (wire.ring_merge)."""
        if other.stamp == self.stamp and other == self:
            return self
        return merge_rings(self, other)

    def content(self) -> tuple:
        """Everything but the version: two views saying the same thing."""
        return (self.replication, self.tokens, self.owners, self.addresses, self.removed,
                self.lost, self.generations, self.extras, self.retiring, self.incarnations,
                self.reducer)

    def with_membership(self, version: int, removed: frozenset,
                        addresses: tuple) -> "Ring":
        return self._with(version=version, removed=removed, addresses=addresses)

    @property
    def pristine(self) -> bool:
        """No range ever changed hands: no removal, handoff, loss or takeover."""
        return not (self.removed or self.extras or self.lost or any(self.generations))

    def incarnation_of(self, node: str) -> int:
        """The incarnation `node` runs as, 0 while nobody has heard it."""
        return self._incarnation.get(node, 0)

    def with_incarnation(self, node: str, incarnation: int) -> "Ring":
        """What a message from `node` running as `incarnation` tells: nothing new, its
        incarnation (first heard), or that it restarted (removed, as a crash would)."""
        if node not in self._address or not incarnation:
            return self
        known = self.incarnation_of(node)
        if known == incarnation:
            return self
        if known:
            return self.without([node])
        return self._with(incarnations=tuple(sorted(self.incarnations + ((node, incarnation),))))

    @staticmethod
    def version_of_stamp(stamp: int) -> int:
        return stamp >> 24

    def is_removed(self, node: str) -> bool:
        return node in self.removed

    # ---------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        if not 0 <= self.replication <= MAX_REPLICATION:
            raise AssertionError(f"replication outside [0, {MAX_REPLICATION}]")
        if self.balancer not in BALANCERS:
            raise AssertionError(f"unknown balancer {inert(self.balancer, 40)}")
        if len(self.reducer) > 1024:
            raise AssertionError("a reducer name over 1024 characters")
        if not 0 <= self.version < MAX_VERSION:
            raise AssertionError(f"version {self.version} outside [0, 2**40)")
        if len(self.tokens) != len(self.owners):
            raise AssertionError("tokens and owners differ in length")
        if not self.tokens:
            raise AssertionError("a ring needs at least one token")
        if any(a >= b for a, b in zip(self.tokens, self.tokens[1:])):
            raise AssertionError("tokens not sorted and unique")
        if not 0 <= self.tokens[0] or not self.tokens[-1] < HASH_SPACE:
            raise AssertionError("token outside the hash space")
        members = set(self._address)
        if len(members) != len(self.addresses):
            raise AssertionError("duplicate member")
        if len(set(self._address.values())) != len(members):
            raise AssertionError("two members at one address")
        if not set(self.owners) <= members:
            raise AssertionError(f"owners {set(self.owners) - members} are not members")
        if members & self.removed:
            raise AssertionError(f"removed nodes {members & self.removed} are still members")
        if len(self.generations) != len(self.tokens):
            raise AssertionError("generations and tokens differ in length")
        for token, nodes in self.extras:
            if token not in self._index or not nodes or not set(nodes) <= members:
                raise AssertionError(f"bad extra destinations {nodes} of token {token}")
        if self.retiring - {(t, x) for t, nodes in self.extras for x in nodes}:
            raise AssertionError("a retiring holder is not an extra of its token")
        if not set(self._incarnation) <= members or len(self._incarnation) != len(self.incarnations):
            raise AssertionError("incarnations of non-members, or twice")
        if any(not 0 < i < MAX_INCARNATION for i in self._incarnation.values()):
            raise AssertionError("an incarnation is a positive number under 2**63")
        if any(not 0 <= g < MAX_VERSION for g in self.generations):
            raise AssertionError("a generation outside [0, 2**40)")

    # ---------------------------------------------------------------- wire

    def to_wire(self) -> bytes:
        return msgpack.packb({"version": self.version, "replication": self.replication,
                              "tokens": list(self.tokens), "owners": list(self.owners),
                              "addresses": [list(a) for a in self.addresses],
                              "removed": sorted(self.removed), "lost": sorted(self.lost),
                              "generations": list(self.generations),
                              "extras": [[t, list(n)] for t, n in self.extras],
                              "retiring": sorted([t, x] for t, x in self.retiring),
                              "incarnations": [list(p) for p in self.incarnations],
                              **({"balancer": self.balancer}
                                 if self.balancer != DEFAULT_BALANCER else {}),
                              **({"reducer": self.reducer} if self.reducer else {})})

    @classmethod
    def from_wire(cls, data: bytes) -> "Ring":
        try:
            d = decode_view(data)
            ring = cls(int(d["version"]), int(d["replication"]),
                       tuple(int(t) for t in d["tokens"]), tuple(str(o) for o in d["owners"]),
                       tuple((str(n), str(a)) for n, a in d["addresses"]),
                       frozenset(str(n) for n in d.get("removed", ())),
                       frozenset(int(t) for t in d.get("lost", ())),
                       tuple(int(g) for g in d.get("generations", ())),
                       tuple((int(t), tuple(str(n) for n in nodes))
                             for t, nodes in d.get("extras", ())),
                       frozenset((int(t), str(x)) for t, x in d.get("retiring", ())),
                       tuple((str(n), int(i)) for n, i in d.get("incarnations", ())),
                       str(d.get("balancer", DEFAULT_BALANCER)), str(d.get("reducer", "")))
            ring.check_invariants()
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InvalidArgument(f"not a valid ring: {inert(exc, 200)}") from None
        return ring

    def describe(self) -> str:
        return (f"ring v{self.version}: {len(self.addresses)} nodes, {len(self.tokens)} tokens, "
                f"r={self.replication}")
