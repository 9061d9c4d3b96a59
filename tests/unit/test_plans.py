"""Routing plans of replayable sources (mapper/plans.py): a seq's piece is a pure
function of (plan, source, seq, key), spread by a hash rather than the seq's parity,
and weighted so that the ring's load comes out even."""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from floering.chaos.load import corpus_words
from floering.mapper.plans import EVEN, Plan, PlanChooser, make_plan
from floering.mapper.sharing import chooser_for
from floering.wire.balancers import balancer
from floering.wire.pieces import base_of, is_piece, merge_pieces, parse_piece, piece_key
from floering.wire.ring import Ring

SHARING = ("pkg", "dkg", "dchoices", "wchoices", "smalops")


def ring_of(nodes: int, policy: str = "pkg") -> Ring:
    return Ring.initial({f"n{i}": f"h:{i}" for i in range(nodes)}, 1, 8, policy)


def every_other(hot: str = "zzhot", words: int = 60_000) -> list[str]:
    """The hot word at every other position: half of all tuples, all at even seqs."""
    return [w for x in corpus_words()[:words] for w in (hot, x)]


def shuffled_half(hot: str = "zzhot", words: int = 60_000) -> list[str]:
    keys = [hot] * words + list(corpus_words()[:words])
    random.Random(7).shuffle(keys)
    return keys


def plan_for(policy: str, ring: Ring, keys: list, sample: int = 20_000) -> Plan:
    counts = Counter(keys[:sample])
    return make_plan(balancer(policy), ring, dict(counts.most_common(256)), sample)


def node_loads(ring: Ring, plan: Plan, keys: list, source: str = "q#0",
               first_seq: int = 1) -> tuple[Counter, Counter]:
    place = PlanChooser(plan, source).placer(ring, ring.token_for_key)
    pieces = Counter(place(k, s)[0] for s, k in enumerate(keys, first_seq))
    return Counter({n: 0 for n in ring.nodes}) + Counter(
        ring.owner(p) for p in pieces.elements()), pieces


def max_over_mean(loads: Counter, nodes: int) -> float:
    return max(loads.values()) / (sum(loads.values()) / nodes)


def test_a_hot_word_at_every_other_position_spreads_over_both_pieces_with_pkg():
    ring, keys = ring_of(4), every_other()
    loads, pieces = node_loads(ring, plan_for("pkg", ring, keys), keys)
    hot = {p: n for p, n in pieces.items() if base_of(p) == "zzhot"}
    assert len(hot) == 2 and min(hot.values()) > 0.2 * len(keys) / 2, hot
    assert max_over_mean(loads, 4) <= 1.3
    # without a plan (nothing measured yet) the hash still halves it
    _, even = node_loads(ring, EVEN, keys)
    assert sorted(n for p, n in even.items() if base_of(p) == "zzhot")[0] > 0.45 * len(keys) / 2
    # every piece any key went to is one a read merges, and the merge is exact
    assert {parse_piece(p)[1] for p in pieces if is_piece(p)} <= {1}
    assert merge_pieces(pieces.items(), lambda a, b: a + b) == Counter(keys)


@pytest.mark.parametrize("policy", ["dkg", "wchoices"])
def test_dkg_and_wchoices_plans_even_out_a_hot_word_at_half(policy):
    ring, keys = ring_of(4, policy), shuffled_half()
    loads, pieces = node_loads(ring, plan_for(policy, ring, keys), keys)
    assert max_over_mean(loads, 4) <= 1.1, loads
    assert max(parse_piece(p)[1] for p in pieces if is_piece(p)) < balancer(policy).pieces
    assert merge_pieces(pieces.items(), lambda a, b: a + b) == Counter(keys)


@pytest.mark.parametrize("policy", SHARING)
def test_a_seq_goes_to_the_same_piece_on_any_ring_in_any_process(policy):
    ring, keys = ring_of(4, policy), shuffled_half(words=5000)
    plan = Plan.decode(plan_for(policy, ring, keys).encode())
    moved = ring.split_token(ring.tokens[3], ring.tokens[3] - 2 ** 40).without(["n2"])
    first = PlanChooser(plan_for(policy, ring, keys), "q#1").placer(ring, ring.token_for_key)
    again = chooser_for(balancer(policy), replayable=True, source="q#1",
                        plan=plan).placer(moved, moved.token_for_key)
    seqs = [(5 << 32) + i + 1 for i in range(len(keys))]
    assert [first(k, s)[0] for s, k in zip(seqs, keys)] == \
        [again(k, s)[0] for s, k in zip(seqs, keys)]
    # the token is the ring's of the attempt
    assert all(again(k, s)[1] == moved.token_for_key(again(k, s)[0])
               for s, k in zip(seqs[:200], keys))


def test_another_source_draws_other_pieces_and_plans_survive_encoding():
    ring, keys = ring_of(4), every_other(words=2000)
    a = PlanChooser(EVEN, "q#0").placer(ring, ring.token_for_key)
    b = PlanChooser(EVEN, "q#1").placer(ring, ring.token_for_key)
    assert [a(k, s)[0] for s, k in enumerate(keys)] != [b(k, s)[0] for s, k in enumerate(keys)]
    plan = plan_for("wchoices", ring, keys)
    again = Plan.decode(plan.encode())
    assert again.heads == plan.heads and again.pairs == plan.pairs
    assert again.ring == plan.ring and Plan.decode(EVEN.encode()) == EVEN
    with pytest.raises(ValueError):
        Plan.decode(b"\x90")


def test_no_plan_for_a_policy_that_does_not_share_keys_or_nothing_measured():
    ring = ring_of(4, "none")
    assert make_plan(balancer("none"), ring, {"a": 10}, 10) is EVEN
    assert make_plan(balancer("pkg"), ring, {}, 0) is EVEN
    assert chooser_for(balancer("none"), replayable=True, source="s") is None


REPLAY_SEEDS = int(os.environ.get("FLOE_SIM_REPLAY_SEEDS", "60"))


def run_replay_seed(seed: int) -> None:
    from tests.support.sim_replay import HOT, epoch_scenario
    sim = epoch_scenario(seed)
    context = f"seed {seed}: " + "; ".join(sim.log)
    assert sim.epoch == sim.epochs, f"{context}: stopped in epoch {sim.epoch}"
    assert sim.retries + sim.driver_kills > 0
    state, lost = sim.final_state()
    assert not lost, f"{context}: ranges lost"
    assert not sim.undelivered, f"{context}: batches never delivered"
    for key in sim.sent:
        assert state[key] == sim.sent[key], \
            f"{context}: {key} holds {state[key]}, sent {sim.sent[key]}"
    # the hot word spreads whenever its candidates lie on more than one node
    candidates = 2 if sim.policy == "pkg" else balancer(sim.policy).pieces
    reach = {sim.founding.owner(piece_key(HOT, i)) for i in range(candidates)}
    assert len({p for p in sim.pieces_sent if base_of(p) == HOT}) > 1 or \
        sim.policy == "smalops" or len(reach) == 1, f"{context}: the hot word went to one piece"


@pytest.mark.parametrize("seed", range(REPLAY_SEEDS))
def test_replay_seed(seed):
    """Epoch sources on a ring sharing keys, through task retries (zombies among
    them), a driver kill and a node killed, paused or cut off: every count exact
    (tests/support/sim_replay.py)."""
    run_replay_seed(seed)


def test_the_driver_records_a_batchs_plan_before_it_runs_and_a_new_driver_reads_it(
        tmp_path, monkeypatch):
    from floering.spark_driver import plans as driver_plans
    ring = ring_of(4, "dkg")

    class Client:
        ring = None

        def refresh_ring(self):
            return ring

    sampled = []

    def sample(df, map_spec, batch_id, fraction):
        sampled.append(batch_id)
        keys = shuffled_half(words=2000)[:int(4000 * fraction)]
        return Counter(keys), len(keys)

    monkeypatch.setattr(driver_plans, "sample_counts", sample)
    first = driver_plans.BatchPlans(str(tmp_path), Client(), "m:f")
    data = first.plan_for(None, 3)
    assert Plan.decode(data).heads and (tmp_path / "floe-plans" / "3").read_bytes() == data
    # a restarted driver has measured nothing, and replays batch 3 by its record
    again = driver_plans.BatchPlans(str(tmp_path), Client(), "m:f")
    assert again.plan_for(None, 3) == data and sampled == [3] and again.recorded == 1
    again.plan_for(None, 3 + driver_plans.KEPT_PLANS + 1)
    assert not (tmp_path / "floe-plans" / "3").exists()          # far behind: removed
    assert driver_plans.BatchPlans.usable("file:///x") and not \
        driver_plans.BatchPlans.usable("hdfs://nn/x")


def test_a_batchs_plan_goes_once_spark_committed_it_and_a_later_batch_was_planned(tmp_path):
    import os
    from floering.mapper.kept_plans import STALE_TMP, prune_batches
    plans, commits = tmp_path / "floe-plans", tmp_path / "commits"
    plans.mkdir()
    commits.mkdir()
    for batch in range(6):
        (plans / str(batch)).write_bytes(b"p")
    for batch in (0, 1, 2, 4):                 # 3 never committed (a zombie's), 5 running
        (commits / str(batch)).write_text("v1")
    (plans / ".7.tmp").write_bytes(b"half")   # a crash's leftover, old
    (plans / ".8.tmp").write_bytes(b"half")   # being written now
    os.utime(plans / ".7.tmp", (0, 0))
    assert prune_batches(plans, 5, commits, keep=200) == [0, 1, 2, 4]
    assert sorted(p.name for p in plans.iterdir()) == [".8.tmp", "3", "5"]
    # uncommitted, but far behind: no attempt replays it
    assert prune_batches(plans, 203, commits, keep=200) == [3]
    assert prune_batches(plans, 5, None, keep=200) == []          # no commit log: kept
    assert prune_batches(tmp_path / "none", 5, commits, keep=200) == []
    assert STALE_TMP > 0


def test_a_files_plan_goes_when_unused_past_the_source_expiry_and_past_the_bound(tmp_path):
    import os
    from floering.mapper.kept_plans import mark_used, prune_idle
    now = 1_000_000.0
    for i in range(6):
        path = tmp_path / f"s{i}.plan"
        path.write_bytes(b"p")
        os.utime(path, (now - 100 * i, now - 100 * i))     # s0 used last, s5 first
    (tmp_path / "feed.key").write_bytes(b"k")             # not a plan: never touched
    assert prune_idle(tmp_path, idle=450, most=10, now=now) == ["s5.plan"]
    assert prune_idle(tmp_path, idle=450, most=3, now=now) == ["s3.plan", "s4.plan"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feed.key", "s0.plan", "s1.plan",
                                                          "s2.plan"]
    os.utime(tmp_path / "s2.plan", (now - 1000, now - 1000))
    mark_used(tmp_path / "s2.plan")                        # read by a rerun: used now
    assert prune_idle(tmp_path, idle=450, most=3) == ["s0.plan", "s1.plan"]
    assert (tmp_path / "s2.plan").exists()


def test_floe_feed_keeps_a_files_plan_marks_it_used_and_prunes_the_idle(tmp_path):
    import os
    from floering.floe import feed
    ring = ring_of(4, "pkg")

    class Client:
        pass
    client = Client()
    client.ring = ring
    item = feed.Input("words.txt", 10, "src-a")
    plans = tmp_path / "feed-plans"
    plans.mkdir()
    old = plans / "src-old.plan"
    old.write_bytes(b"x")
    os.utime(old, (1, 1))                                  # unused for decades
    first = feed.file_plan(client, item, ["a", "b", "a"], plans)
    assert (plans / "src-a.plan").exists() and not old.exists()
    os.utime(plans / "src-a.plan", (2, 2))
    again = feed.file_plan(client, item, ["zzz"], plans)   # a rerun reads it back
    assert again == first and (plans / "src-a.plan").stat().st_mtime > 2
