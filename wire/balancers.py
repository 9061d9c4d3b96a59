"""The load-balancing policies a ring can run, chosen when it is founded.

The policy is part of the ring (`Ring.balancer`): every node and mapper reads it from
the ring view, a view with another policy is refused like one with another
replication factor, so all agree. What each policy decides:

- `none`: static consistent hashing, the baseline; nothing moves by itself.
- `floe`: the Floe paper's: an overloaded node hands its hottest ranges (cut at the
  measured split point) to its clockwise neighbours (`floering.node.core.shedding`).
- `halving`, `doubling`: the Ray consistent-hashing paper's: an overloaded node gives
  up half of its tokens to the next owners clockwise, or cuts its ranges where the
  other nodes' doubled tokens fall and hands them the heads
  (`floering.node.core.redistribution`).
- `pkg`: partial key grouping: every key has two candidate pieces
  (`floering.wire.pieces`), and a mapper sends each tuple to the candidate whose node it
  has itself sent fewer tuples to (local load estimation). Reads merge the two.
- `dkg`: dynamic key grouping: a mapper finds its hot keys with a Space-Saving sketch
  and gives each a pool of pieces that grows while its candidates are loaded above
  the ideal share (and shrinks below it); cold keys stay on their own node. Reads
  merge every piece a key may have (up to `pieces`).
- `dchoices`, `wchoices`: partial key grouping whose keys too hot for two candidates
  (a Space-Saving sketch on the mapper) get d candidates, d from the key's share, or
  a candidate on every node (`floering.mapper.choices`).
- `smalops`: SMALOPS: a mapper finds its heavy streams (keys) per window and moves
  each whole to a less loaded node (best fit), through the key's piece that lands
  there; what it left behind is merged on reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from floering.wire.errors import InvalidArgument


@dataclass(frozen=True)
class Balancer:
    name: str
    moves_ranges: bool      # an overloaded node sheds ranges to its neighbours
    pieces: int             # pieces a key's tuples may go to (1: keys are never shared)
    summary: str


BALANCERS = {b.name: b for b in (
    Balancer("none", False, 1, "static consistent hashing"),
    Balancer("floe", True, 1, "overloaded nodes hand ranges to their neighbours"),
    Balancer("halving", True, 1, "overloaded nodes give half of their tokens to the "
                                 "next owners clockwise, as the Ray paper's halving"),
    Balancer("doubling", True, 1, "overloaded nodes give the other nodes new tokens "
                                  "inside their own ranges, as the Ray paper's "
                                  "doubling"),
    Balancer("pkg", False, 2, "partial key grouping: two candidates per key, "
                              "chosen by the mapper's own count of what it sent"),
    Balancer("dkg", False, 16, "dynamic key grouping: a hot key's pool of pieces grows "
                               "and shrinks with the load, cold keys stay on one node"),
    Balancer("dchoices", False, 16, "D-choices: partial key grouping, with d candidates "
                                    "for each key too hot for two, d from its share"),
    Balancer("wchoices", False, 16, "W-choices: partial key grouping, with every node a "
                                    "candidate for each key too hot for two"),
    Balancer("smalops", False, 16, "SMALOPS: heavy keys moved whole, each window, to "
                                   "the node that best fits them; pieces merged on reads"),
)}
DEFAULT = "none"


def described() -> str:
    """Every policy with what it does, for help texts."""
    return "; ".join(f"{b.name} ({b.summary})" for b in BALANCERS.values())


def balancer(name: str) -> Balancer:
    found = BALANCERS.get(name)
    if found is None:
        raise InvalidArgument(f"unknown balancer {name!r:.40}: one of "
                              f"{', '.join(sorted(BALANCERS))}")
    return found


def check_reducer(policy: Balancer, reducer) -> None:
    """A policy that shares keys needs the reducer's merge to read them back."""
    if policy.pieces > 1 and getattr(reducer, "merge", None) is None:
        raise InvalidArgument(f"the {policy.name} balancer spreads a key over several "
                              f"nodes, and reducer {reducer.name or type(reducer).__name__} "
                              f"has no merge to read it back whole")
