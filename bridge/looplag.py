"""Event-loop lag: how late a periodic timer fires (why: a blocking call on the loop stalls every
connection at once; this histogram shows it before the edges' latencies do)."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class LoopLagMonitor:
    def __init__(self, histogram: Observer, interval: float = 0.1) -> None:
        self.histogram = histogram
        self.interval = interval

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.histogram.observe(max(0.0, loop.time() - due))
