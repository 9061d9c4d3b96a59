"""The ring as an immutable value.

Positions are unsigned 64-bit. A position belongs to the first token clockwise at or
after it (wrapping), so token t owns the range (previous token, t]. Every change returns
a new Ring with version + 1; nothing mutates a ring in place, so a ring can be shared
between tasks and compared by value.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import mmh3
import msgpack

from node.core.errors import InvalidArgument
from node.core.hashing import HASH_SPACE, position


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
    # Lookup tables derived once: lookups are on hot paths.
    _index: dict = field(init=False, repr=False, compare=False)
    _address: dict = field(init=False, repr=False, compare=False)
    _destinations: tuple = field(init=False, repr=False, compare=False)
    stamp: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The stamp is what RPCs carry: the version plus a digest of the content, so
        # two different rings that happen to share a version number (concurrent
        # removals not yet merged) are never taken for the same one.
        content = msgpack.packb((self.replication, self.tokens, self.owners, self.addresses,
                                 sorted(self.removed), sorted(self.lost)))
        digest = mmh3.hash(content, seed=0, signed=False) & 0xFFFFFF
        object.__setattr__(self, "stamp", (self.version << 24) | digest)
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})
        object.__setattr__(self, "_address", dict(self.addresses))
        object.__setattr__(self, "_destinations",
                           tuple(self._walk(i) for i in range(len(self.tokens))))

    def _walk(self, index: int) -> tuple[str, ...]:
        """Owner of tokens[index], then up to r distinct other nodes clockwise."""
        owner = self.owners[index]
        chosen = [owner]
        n = len(self.tokens)
        for step in range(1, n):
            if len(chosen) > self.replication:
                break
            node = self.owners[(index + step) % n]
            if node not in chosen:
                chosen.append(node)
        return tuple(chosen)

    # ------------------------------------------------------------ building

    @classmethod
    def initial(cls, members: Mapping[str, str], replication: int,
                tokens_per_node: int) -> "Ring":
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
        return cls(1, replication, tokens, owners, tuple((n, members[n]) for n in ids))

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
            raise ValueError(f"node {node!r} is not in ring version {self.version}") from None

    def tokens_of(self, node: str) -> tuple[int, ...]:
        return tuple(t for t, o in zip(self.tokens, self.owners) if o == node)

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
        values = dict(version=self.version + 1, replication=self.replication,
                      tokens=self.tokens, owners=self.owners, addresses=self.addresses,
                      removed=self.removed, lost=self.lost)
        values.update(changes)
        ring = Ring(**values)
        ring.check_invariants()
        return ring

    def with_version(self, version: int) -> "Ring":
        return self._with(version=version)

    def with_token_owner(self, token: int, node: str) -> "Ring":
        if node not in self._address:
            raise ValueError(f"node {node!r} is not a member")
        owners = list(self.owners)
        owners[self._index[token]] = node
        return self._with(owners=tuple(owners))

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
        pairs = sorted((new_position if t == token else t, o)
                       for t, o in zip(self.tokens, self.owners))
        return self._with(tokens=tuple(t for t, _ in pairs), owners=tuple(o for _, o in pairs))

    def add_node(self, node: str, address: str, tokens: Iterable[int]) -> "Ring":
        if node in self._address:
            raise ValueError(f"node {node!r} is already a member")
        new = list(tokens)
        if any(t in self._index for t in new) or len(set(new)) != len(new):
            raise ValueError("new tokens collide with existing ones")
        pairs = sorted(list(zip(self.tokens, self.owners)) + [(t, node) for t in new])
        return self._with(tokens=tuple(t for t, _ in pairs), owners=tuple(o for _, o in pairs),
                          addresses=tuple(sorted(self.addresses + ((node, address),))))

    def remove_node(self, node: str) -> "Ring":
        """Each of the node's tokens goes to its heir (the next distinct node clockwise,
        which is the first replica when r >= 1)."""
        if node not in self._address:
            raise ValueError(f"node {node!r} is not a member")
        if len(self.addresses) == 1:
            raise ValueError("cannot remove the last node")
        owners = list(self.owners)
        n = len(owners)
        gone = self.removed | {node}
        lost = set(self.lost)
        for i, owner in enumerate(self.owners):
            if owner == node:
                owners[i] = next(self.owners[(i + s) % n] for s in range(1, n)
                                 if self.owners[(i + s) % n] != node)
                if set(self._destinations[i]) <= gone:
                    lost.add(self.tokens[i])
        return self._with(owners=tuple(owners),
                          addresses=tuple(a for a in self.addresses if a[0] != node),
                          removed=frozenset(gone), lost=frozenset(lost))

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
        """Combine two views. A newer view that already has every removal we know is
        adopted as is; otherwise the missing removals are applied on top of the newer
        one and the version moves past both, so every node that merges the same two
        views reaches the same ring."""
        if other.version == self.version and other == self:
            return self
        newer, older = (other, self) if other.version > self.version else (self, other)
        missing = older.removed - newer.removed
        gone = newer.removed | older.removed
        # Members that joined in one view only (with no tokens yet) survive the merge.
        joined = tuple(a for a in older.addresses
                       if a[0] not in newer._address and a[0] not in gone)
        if not missing and not joined:
            return newer
        if not missing:
            return newer._with(version=max(self.version, other.version) + 1,
                               addresses=tuple(sorted(newer.addresses + joined)))
        # Apply each side's missing removals to the other; both give the same owners,
        # and the union of what each judged lost keeps the merge symmetric.
        merged = newer.without(missing)
        mirror = older.without(newer.removed - older.removed)
        joined = tuple(a for a in joined if a[0] not in merged._address)
        return merged._with(version=max(self.version, other.version) + 1,
                            lost=merged.lost | mirror.lost,
                            addresses=tuple(sorted(merged.addresses + joined)))

    @staticmethod
    def version_of_stamp(stamp: int) -> int:
        return stamp >> 24

    def is_removed(self, node: str) -> bool:
        return node in self.removed

    # ---------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        if self.replication < 0:
            raise AssertionError("replication < 0")
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
        if not set(self.owners) <= members:
            raise AssertionError(f"owners {set(self.owners) - members} are not members")
        if members & self.removed:
            raise AssertionError(f"removed nodes {members & self.removed} are still members")

    # ---------------------------------------------------------------- wire

    def to_wire(self) -> bytes:
        return msgpack.packb({"version": self.version, "replication": self.replication,
                              "tokens": list(self.tokens), "owners": list(self.owners),
                              "addresses": [list(a) for a in self.addresses],
                              "removed": sorted(self.removed), "lost": sorted(self.lost)})

    @classmethod
    def from_wire(cls, data: bytes) -> "Ring":
        try:
            d = msgpack.unpackb(data)
            ring = cls(int(d["version"]), int(d["replication"]),
                       tuple(int(t) for t in d["tokens"]), tuple(str(o) for o in d["owners"]),
                       tuple((str(n), str(a)) for n, a in d["addresses"]),
                       frozenset(str(n) for n in d.get("removed", ())),
                       frozenset(int(t) for t in d.get("lost", ())))
            ring.check_invariants()
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InvalidArgument(f"not a valid ring: {exc!r}") from None
        return ring

    def describe(self) -> str:
        return (f"ring v{self.version}: {len(self.addresses)} nodes, {len(self.tokens)} tokens, "
                f"r={self.replication}")
