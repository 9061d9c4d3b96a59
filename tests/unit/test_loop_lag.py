"""The event-loop lag figure of a node's stats (node.loop_lag)."""

import asyncio
import time

from floering.node import loop_lag
from floering.node.loop_lag import LoopLag
from tests.support.helpers import wait_until


async def test_a_blocked_loop_shows_as_its_lag_and_old_samples_age_out(monkeypatch):
    monkeypatch.setattr(loop_lag, "LAG_INTERVAL", 0.02)
    lag = LoopLag()
    lag._samples = type(lag._samples)(maxlen=5)       # a window of 5 samples
    lag.start()
    try:
        await asyncio.sleep(0.1)                       # a window of idle samples
        assert lag.worst_ms() < 100
        time.sleep(0.3)                                # a step that holds the loop
        await wait_until(lambda: lag.worst_ms() >= 250, 5, "the blocked step's lag")
        # five samples later it is gone
        await wait_until(lambda: lag.worst_ms() < 100, 5, "the lag aged out")
    finally:
        lag.close()
