"""How late the node's event loop runs: sampled every LAG_INTERVAL, the longest lag of
the last WINDOW seconds is a figure of the node's stats (`floe status`; the metrics
keep every sample in a histogram)."""

from __future__ import annotations

import asyncio
from collections import deque

LAG_INTERVAL = 0.25     # seconds between two samples
WINDOW = 10.0           # seconds of samples the figure covers


class LoopLag:
    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=int(WINDOW / LAG_INTERVAL))
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self._samples.append(max(0.0, loop.time() - due))

    def worst_ms(self) -> float:
        """The longest lag sampled in the last WINDOW seconds, in milliseconds."""
        return 1000.0 * max(self._samples, default=0.0)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
