"""The Ray paper's halving and doubling, as an overloaded node plans them: which keys
go where, checked against the paper's own definitions on the ring."""

from __future__ import annotations

from collections import Counter

from floering.wire.hashing import position
from floering.node.core.redistribution import doubling_cuts, halving_moves
from floering.wire.ring import Ring
from floering.node.core.shedding import PeerLoad, cut_positions, plan_shed, with_split_tail

KEYS = [f"k{i}" for i in range(20_000)]


def ring_of(nodes: int, tokens: int, policy: str) -> Ring:
    return Ring.initial({f"n{i}": f"h:{i}" for i in range(nodes)}, 1, tokens, policy)


def carried_out(ring: Ring, me: str, positions: list[int], moves_of) -> Ring:
    """The ring once `me` cut at `positions` and handed the moves over."""
    for pos in positions:
        ring = ring.split_token(ring.token_for_position(pos), pos)
    return ring.with_owners(moves_of(ring))


def test_halving_gives_up_every_other_token_to_the_next_owner_clockwise():
    ring = ring_of(4, 8, "halving")
    moves = halving_moves(ring, "n0")
    mine = ring.tokens_of("n0")
    assert sorted(moves) == sorted(mine[1::2])
    for token, heir in moves.items():
        # the paper removes the token: its keys go to the next token's owner
        after = ring.tokens[(ring.token_index(token) + 1) % len(ring.tokens)]
        assert heir == ring.owner_of_token(after) != "n0"
    halved = ring.with_owners(moves)
    assert len(halved.tokens_of("n0")) == 4
    assert halved.share_of("n0") == ring.share_of("n0") / 2
    # keys of the other nodes stay where they were
    assert all(halved.owner(k) == ring.owner(k) for k in KEYS if ring.owner(k) != "n0")


def test_halving_runs_out_at_one_token():
    assert halving_moves(ring_of(4, 1, "halving"), "n0") == {}


def test_doubling_moves_exactly_the_keys_the_papers_doubled_tokens_take_from_us():
    ring = ring_of(4, 8, "doubling")
    cuts = doubling_cuts(ring, "n0", max_tokens=10_000)
    assert cuts and all(node != "n0" for _, node in cuts)
    plan = plan_shed(ring, "n0", {}, {n: PeerLoad(0.0, False) for n in ring.nodes},
                     {}, reach=1, tokens_per_node=8, depth=0)
    assert plan.cuts == cuts and not plan.moves and plan.split is None
    after = carried_out(ring, "n0", cut_positions(plan),
                        lambda r: with_split_tail(plan, r, "n0"))
    after.check_invariants()
    # The paper's ring: every other node's tokens doubled at hash("token-<node>-<k>").
    placed = dict(zip(ring.tokens, ring.owners))
    for node in ("n1", "n2", "n3"):
        for k in range(8, 16):
            placed[position(f"token-{node}-{k}")] = node
    paper = Ring(1, 1, tuple(sorted(placed)), tuple(placed[t] for t in sorted(placed)),
                 ring.addresses)
    for key in KEYS:
        if ring.owner(key) == "n0":
            assert after.owner(key) == paper.owner(key), key
        else:
            assert after.owner(key) == ring.owner(key), key      # nothing reshuffled
    moved = Counter(after.owner(k) for k in KEYS if ring.owner(k) == "n0")
    assert moved["n0"] < sum(moved.values()) and len(moved) == 4


def test_doubling_keeps_the_ring_within_its_token_bound_whole_doublings_only():
    ring = ring_of(4, 8, "doubling")
    first = doubling_cuts(ring, "n0", max_tokens=10_000)
    assert doubling_cuts(ring, "n0", max_tokens=len(ring.tokens) + len(first)) == first
    assert doubling_cuts(ring, "n0", max_tokens=len(ring.tokens) + len(first) - 1) == ()


def test_a_second_doubling_round_cuts_at_the_next_generation_instead_of_stalling():
    ring = ring_of(4, 8, "doubling")
    seen = set()
    for _ in range(3):
        cuts = doubling_cuts(ring, "n0", max_tokens=10_000, start=8)
        assert cuts and not seen & {pos for pos, _ in cuts}      # new positions each round
        seen |= {pos for pos, _ in cuts}
        ring = carried_out(ring, "n0", [p for p, _ in cuts],
                           lambda r: {p: n for p, n in cuts if r.owner_of_token(p) == "n0"})
        ring.check_invariants()


def test_doubling_with_a_measured_load_moves_the_hot_keys_and_never_raises_the_top():
    ring = ring_of(4, 8, "doubling")
    hot = [k for k in KEYS if ring.owner(k) == "n0"][:6]
    load = {position(k): 100.0 for k in hot}
    others = {"n1": 50.0, "n2": 50.0, "n3": 50.0}
    cuts = doubling_cuts(ring, "n0", max_tokens=256, start=8, load=load, others=others)
    after = carried_out(ring, "n0", [p for p, _ in cuts],
                        lambda r: {p: n for p, n in cuts if r.owner_of_token(p) == "n0"})
    per_node = Counter(others)
    for k in hot:
        per_node[after.owner(k)] += 100.0
    assert max(per_node.values()) < 600.0 and per_node["n0"] < 600.0
    # a single key hotter than everything else moves only to a node no busier than we were
    one = {position(hot[0]): 1000.0}
    cuts = doubling_cuts(ring, "n0", max_tokens=256, start=8, load=one,
                         others={"n1": 10.0, "n2": 10.0, "n3": 10.0})
    assert cuts == ()


def test_the_floe_ring_plans_as_before():
    ring = ring_of(4, 8, "floe")
    plan = plan_shed(ring, "n0", {t: 100.0 for t in ring.tokens_of("n0")},
                     {n: PeerLoad(1.0, False) for n in ("n1", "n2", "n3")}, {},
                     reach=1, tokens_per_node=8, depth=0)
    assert plan.moves and not plan.cuts
