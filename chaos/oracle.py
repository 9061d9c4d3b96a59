"""The end-of-run check, in the style of Jepsen's set-full checker, for counts.

The harness knows, per key, how many tuples were acknowledged (their `flush()`
returned) and how many were emitted but never acknowledged (their mapper was killed
mid-chunk, or its flush failed). Then, per key:

    acknowledged <= counted <= acknowledged + unacknowledged

- counted < acknowledged: an acknowledged tuple was lost;
- counted > acknowledged + unacknowledged: some tuple was counted twice (or a key
  nobody sent appeared);
- anything in between: the surplus is unacknowledged tuples that did arrive, which is
  allowed (at most once each).

A count cannot tell which tuple was counted, so for a key that has unacknowledged
tuples a loss and a double count of the same key within that margin cancel out; every
key without unacknowledged tuples is checked exactly. Runs without a killed mapper
have none, so there the check is plain equality with an independent count.

With per-tuple ids (`Load.ids`: the nodes run the TupleIds reducer below, which keeps
every id it applied per key) `check_ids` checks each tuple on its own: every
acknowledged id exactly once, every unacknowledged id at most once, no other id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import Reducer


@dataclass
class Verdict:
    keys: int                       # distinct keys acknowledged or counted
    acknowledged: int               # tuples
    unacknowledged: int             # tuples emitted without acknowledgement
    unacknowledged_counted: int     # of those, how many the ring counted
    lost: dict = field(default_factory=dict)        # key -> (counted, acknowledged)
    duplicated: dict = field(default_factory=dict)  # key -> (counted, most allowed)
    error: str | None = None        # the ring could not be read (e.g. a range lost)
    # ids mode: key -> {"missing": [...], "doubled": [...], "unknown": [...]} tuple ids
    tuples: dict = field(default_factory=dict)
    by_id: bool = False             # checked tuple by tuple (ids), not by counts

    @property
    def ok(self) -> bool:
        return self.error is None and not self.lost and not self.duplicated

    def describe(self, sample: int = 8) -> str:
        if self.error:
            return f"FAILED: the ring could not be read: {self.error}"
        if self.ok:
            extra = (f"; {self.unacknowledged_counted} of {self.unacknowledged} "
                     f"unacknowledged arrived, none twice" if self.unacknowledged else "")
            how = " (checked tuple by tuple, by id)" if self.by_id else ""
            return (f"exact: {self.acknowledged} acknowledged tuples over {self.keys} keys "
                    f"each counted once{extra}{how}")
        parts = []
        if self.lost:
            parts.append(f"{len(self.lost)} keys LOST acknowledged tuples, e.g. " + ", ".join(
                f"{k!r}: counted {c} < acknowledged {a}{self._ids(k)}"
                for k, (c, a) in sorted(self.lost.items(), key=_by_key)[:sample]))
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} keys counted tuples TWICE, e.g. " + ", ".join(
                f"{k!r}: counted {c} > at most {a}{self._ids(k)}"
                for k, (c, a) in sorted(self.duplicated.items(), key=_by_key)[:sample]))
        return "FAILED: " + "; ".join(parts)

    def _ids(self, key) -> str:
        detail = self.tuples.get(key)
        if not detail:
            return ""
        return " (" + "; ".join(f"{what} ids {ids[:3]}" for what, ids in detail.items()
                                if ids) + ")"

    def to_dict(self, sample: int = 50) -> dict:
        return {"ok": self.ok, "by_id": self.by_id, "keys": self.keys, "acknowledged": self.acknowledged,
                "unacknowledged": self.unacknowledged,
                "unacknowledged_counted": self.unacknowledged_counted,
                "lost_keys": len(self.lost), "duplicated_keys": len(self.duplicated),
                "lost": {str(k): v for k, v in sorted(self.lost.items(), key=_by_key)[:sample]},
                "duplicated": {str(k): v for k, v in
                               sorted(self.duplicated.items(), key=_by_key)[:sample]},
                "tuples": {str(k): v for k, v in
                           sorted(self.tuples.items(), key=_by_key)[:sample]},
                "error": self.error, "summary": self.describe()}


def _by_key(item):
    return str(item[0])


def check(counted: dict, acknowledged: Counter, unacknowledged: Counter) -> Verdict:
    """Compare what the ring counted with what the mappers were told was stored."""
    keys = set(counted) | set(acknowledged)
    lost, duplicated, surplus = {}, {}, 0
    for key in keys:
        got = counted.get(key, 0)
        acked = acknowledged.get(key, 0)
        most = acked + unacknowledged.get(key, 0)
        if type(got) is not int:
            duplicated[key] = (got, most)   # not a count at all: never what was sent
        elif got < acked:
            lost[key] = (got, acked)
        elif got > most:
            duplicated[key] = (got, most)
        else:
            surplus += got - acked
    return Verdict(len(keys), sum(acknowledged.values()), sum(unacknowledged.values()),
                   surplus, lost, duplicated)


def unreadable(error: str, acknowledged: Counter, unacknowledged: Counter) -> Verdict:
    return Verdict(len(acknowledged), sum(acknowledged.values()),
                   sum(unacknowledged.values()), 0, error=error)


def check_ids(counted: dict, acknowledged: dict, unacknowledged: dict) -> Verdict:
    """Per tuple: `counted` maps key -> the ids the ring applied (TupleIds states);
    `acknowledged` / `unacknowledged` map key -> set of ids sent."""
    keys = set(counted) | set(acknowledged)
    lost, duplicated, tuples, surplus = {}, {}, {}, 0
    for key in keys:
        got = counted.get(key, ())
        acked = acknowledged.get(key, set())
        pending = unacknowledged.get(key, set())
        seen = Counter(got) if isinstance(got, (tuple, list)) else Counter({repr(got): 2})
        missing = sorted(acked - seen.keys())
        doubled = sorted(i for i, n in seen.items() if n > 1)
        unknown = sorted(i for i in seen if i not in acked and i not in pending)
        surplus += sum(1 for i in seen if i in pending)
        if missing:
            lost[key] = (len(got), len(acked))
        if doubled or unknown:
            duplicated[key] = (len(got), len(acked) + len(pending))
        if missing or doubled or unknown:
            tuples[key] = {"missing": missing[:20], "doubled": doubled[:20],
                           "unknown": unknown[:20]}
    return Verdict(len(keys), sum(map(len, acknowledged.values())),
                   sum(map(len, unacknowledged.values())), surplus, lost, duplicated,
                   tuples=tuples, by_id=True)


class TupleIds(Reducer):
    """Keeps every tuple id applied to a key (a test reducer: state grows with the
    stream). A tuple applied twice shows up as its id twice."""

    def initial(self):
        return ()

    def reduce(self, key, value, state):
        return state + (value,)

    def merge(self, a, b):
        """The ids of two pieces of a key (a balancer that shares keys): together."""
        return a + b

    def check_value(self, value) -> None:
        if type(value) is not int:
            raise InvalidArgument(f"TupleIds values are int tuple ids, got {value!r}")

    def sort_key(self, state):
        return len(state)
