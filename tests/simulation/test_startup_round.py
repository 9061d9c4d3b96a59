"""The start-up's state machine (node.core.startup_round): every transition, the
joiner that stops included, and the same stop in the runtime and the simulation."""

import asyncio
from types import SimpleNamespace

import pytest

from floering.wire.errors import Unavailable
from floering.wire.ring import Ring
from floering.node.core.startup_round import (ASK_AGAIN_SECONDS, TRANSITIONS, WAIT_LOG_SECONDS,
                                              Answered, AskPeers, Decide, StartState, Startup,
                                              StartStateError, Stop)

pytestmark = pytest.mark.fast

RING = Ring.initial({"a": "a:1", "b": "b:1", "c": "c:1"}, 1, 1)


def test_a_running_peers_answer_decides():
    start = Startup("a", False, 0.0, 5.0)
    assert start.start() == [AskPeers()]
    assert start.handle(Answered(0.1, (RING,), 0, 2)) == [Decide((RING,))]
    assert start.finished and start.state == StartState.DECIDED


def test_only_starting_answers_wait_until_all_answer_or_the_grace_passed():
    start = Startup("a", False, 0.0, 5.0)
    assert start.handle(Answered(0.1, (RING,), 1, 2)) == [AskPeers(ASK_AGAIN_SECONDS)]
    assert start.state == StartState.ASKING
    assert start.handle(Answered(0.3, (RING, RING), 2, 2)) == [Decide((RING, RING))]
    late = Startup("a", False, 0.0, 1.0)
    late.handle(Answered(0.5, (RING,), 1, 2))
    assert late.handle(Answered(1.0, (RING,), 1, 2)) == [Decide((RING,))]


def test_silence_asks_again_and_warns_every_few_seconds():
    start = Startup("a", False, 0.0, 1.0)
    assert start.handle(Answered(1.0, (), 0, 2, ("b:1: refused",))) == [
        AskPeers(ASK_AGAIN_SECONDS)]
    [ask] = start.handle(Answered(WAIT_LOG_SECONDS, (), 0, 2, ("b:1: refused",)))
    assert ask.delay == ASK_AGAIN_SECONDS and "a is waiting" in ask.warning
    assert "0 of 2 answered" in ask.warning and "b:1: refused" in ask.warning
    assert start.handle(Answered(WAIT_LOG_SECONDS + 1, (), 0, 2)) == [
        AskPeers(ASK_AGAIN_SECONDS)]          # the next warning only 5 s later


def test_no_peer_to_ask_decides_at_once():
    assert Startup("a", False, 0.0, 1.0).handle(Answered(0.0, (), 0, 0)) == [Decide(())]


def test_a_joiner_no_seed_answers_stops_and_a_starting_seed_is_not_enough():
    start = Startup("d", True, 0.0, 1.0)
    assert start.handle(Answered(0.1, (), 0, 2, ("s:1: refused", "t:1: timeout"))) == [
        Stop("no seed to join answered: s:1: refused; t:1: timeout")]
    assert start.finished and start.state == StartState.STOPPED
    waiting = Startup("d", True, 0.0, 1.0)
    assert waiting.handle(Answered(2.0, (RING,), 1, 1)) == [AskPeers(ASK_AGAIN_SECONDS)]
    assert waiting.handle(Answered(2.2, (RING,), 0, 1)) == [Decide((RING,))]


def test_finished_start_ups_take_nothing():
    assert TRANSITIONS[StartState.DECIDED] == TRANSITIONS[StartState.STOPPED] == frozenset()
    start = Startup("a", False, 0.0, 1.0)
    start.handle(Answered(0.0, (RING,), 0, 1))
    with pytest.raises(StartStateError):
        start.handle(Answered(0.1, (RING,), 0, 1))


def test_the_runtime_stops_a_joiner_whose_seeds_never_answer():
    from floering.node.runtime.startup import decide_membership

    class Silent:
        async def ring_at_start(self, address, timeout):
            raise Unavailable("deadline exceeded")

    config = SimpleNamespace(node_id="d", peers=[], rpc_timeout=0.1, startup_grace=1.0)
    with pytest.raises(Unavailable, match="no seed to join answered"):
        asyncio.run(decide_membership(config, Silent(), 1, RING, ["s:1"]))


def test_the_simulation_stops_a_joiner_no_peer_answers():
    from tests.support.simulation import Simulation
    sim = Simulation(seed=5, nodes=3)
    sim.join("n9", "n0")
    joined = sim.process("n9")
    assert joined is not None
    sim.restart("n9", answering=0.0)
    assert [(who, why[:26]) for _, who, why in sim.start_failures] == [
        ("n9", "no seed to join answered: ")]
    assert any("n9 stops: no seed to join answered" in line for line in sim.log), sim.log
    assert not sim.events or all(e[2].__name__ != "_start_again" for e in sim.events)
