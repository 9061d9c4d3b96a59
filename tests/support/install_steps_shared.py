"""Helpers of tests/unit/test_install_steps.py that other test files use too: Steps.
"""

from __future__ import annotations

import asyncio
import time


class Steps:
    """The loop's steps while a coroutine runs beside a ticker: how many turns the
    ticker got and the longest gap between two, in the thread's CPU time (other
    processes on a loaded machine do not count)."""

    def __init__(self) -> None:
        self.turns, self.longest, self.done = 0, 0.0, False

    async def tick(self) -> None:
        while not self.done:
            cpu = time.thread_time()
            await asyncio.sleep(0)
            self.longest = max(self.longest, time.thread_time() - cpu)
            self.turns += 1

    async def run(self, coro):
        ticker = asyncio.get_running_loop().create_task(self.tick())
        try:
            return await coro
        finally:
            self.done = True
            await ticker
